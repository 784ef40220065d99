"""The process group a distributed function runs in: its size, this rank, peers as global ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ring:
    """This process's place in a group: ``world`` ranks, this one is ``rank``; ``group`` None = the default."""

    group: dist.ProcessGroup | None
    world: int
    rank: int

    def global_rank(self, group_rank: int) -> int:
        """Point-to-point ops name peers by their rank in the default group, not in ``group``."""
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def shift(self, tensors: list[torch.Tensor]) -> _Shift:
        """Start sending ``tensors`` to rank + 1 and receiving the same shapes from rank - 1; returns at once."""
        tensors = [t.contiguous() for t in tensors]  # gloo and NCCL send dense memory (a transposed view is not)
        received = [torch.empty_like(t) for t in tensors]
        after, before = self.global_rank((self.rank + 1) % self.world), self.global_rank((self.rank - 1) % self.world)
        ops = [dist.P2POp(dist.isend, t, after, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, before, self.group) for t in received]
        return _Shift(dist.batch_isend_irecv(ops), received)


@dataclass
class _Shift:
    """A transfer in flight: ``wait()`` returns the received tensors once they have arrived."""

    works: list
    received: list[torch.Tensor]

    def wait(self) -> list[torch.Tensor]:
        for work in self.works:
            work.wait()
        return self.received


def current(group=None, *, what: str) -> Ring:
    """The caller's ring, or a RuntimeError saying how to start a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            f"{what} needs a started process group, and none is: call torch.distributed.init_process_group "
            "('nccl' on GPUs, 'gloo' on CPU) in every process first, e.g. under torchrun, or run your function "
            "with flashcourse.distributed.launch"
        )
    return Ring(group, dist.get_world_size(group), dist.get_rank(group))
