"""What every GPU benchmark shares: PyTorch's SDPA backends by name, and our speed ratio against each of them."""

from __future__ import annotations

from collections.abc import Callable, Iterable

SDPA_BACKENDS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math")


def sdpa(provider: str, **sdpa_kwargs) -> Callable:
    """fn(q, k, v, causal) -> o: ``scaled_dot_product_attention`` pinned to one backend (``sdpa_flash`` etc.)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION, "sdpa_math": SDPBackend.MATH}
    if provider not in backends:
        raise ValueError(f"unknown SDPA provider {provider!r}: expected one of {sorted(backends)}")
    backend = backends[provider]

    def run(q, k, v, causal=False):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **sdpa_kwargs)

    return run


def add_ratios(rows: list[dict], *, key: Callable[[dict], tuple], rate: str, ours: Iterable[str]) -> None:
    """Give each of our rows (provider in ``ours``) ``ratio_vs_<provider>`` = its ``rate`` over every other
    provider's on the same ``key`` (shape and mode), counting only rows whose status is ok. Where both rows
    carry the repeats' range (``<rate>_min``, ``<rate>_max``), the ratio's range goes beside it:
    ``ratio_vs_<provider>_min`` (our slowest repeat over their fastest) and ``..._max``."""
    ours = set(ours)
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    for group in groups.values():
        for mine in group:
            if mine["provider"] not in ours or mine.get("status") != "ok" or not mine.get(rate):
                continue
            for other in group:
                if other["provider"] not in ours and other.get("status") == "ok" and other.get(rate):
                    name = f"ratio_vs_{other['provider']}"
                    mine[name] = mine[rate] / other[rate]
                    if all(r.get(f"{rate}_{end}") for r in (mine, other) for end in ("min", "max")):
                        mine[f"{name}_min"] = mine[f"{rate}_min"] / other[f"{rate}_max"]
                        mine[f"{name}_max"] = mine[f"{rate}_max"] / other[f"{rate}_min"]
