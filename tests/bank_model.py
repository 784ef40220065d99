"""Shared-memory bank conflicts of one warp's store or load, counted exactly from Gluon's linear layouts.

A register layout (``to_linear_layout`` of a distributed layout: which tensor element each register, lane and warp
holds) and a shared layout (which element each offset of the buffer holds) fix the byte address every lane touches.
One instruction moves ``vector`` consecutive registers a lane (as the compiler vectorizes: read the PTX, e.g.
``st.shared.v2.b32`` is two float32). The hardware model: 32 banks of 4 bytes, each serving one distinct 4-byte
word a wavefront, lanes touching the same word sharing it (CUDA C++ Programming Guide, "Shared Memory" of compute
capability 5.x and later). Assumed, not stated by the guide: a request of 4-byte words is served for the whole warp,
of 8-byte words a half-warp at a time, of 16-byte words a quarter-warp at a time (128 bytes a phase). The one check
against a GPU so far agrees: under this rule b7d's dQ store predicts 134 million extra wavefronts, where Nsight
Compute counted 141 million more conflicts in b7d than in b7c (H100, 2026-12-07), and its per-instruction view
charged 134.2 million excess wavefronts to that store's 32 STS.64 and to no other instruction; served whole-warp,
the store would have none. A phase costs as many wavefronts as its busiest bank has distinct words; ``ideal`` is
what its bytes need at 128 bytes a wavefront. Used by tests/test_b7_compile.py for b7's dS and dQ tiles.
"""

from __future__ import annotations

BANKS = 32
WORD = 4  # bytes a bank serves a wavefront


def _apply(bases, index: int, rank: int) -> tuple[int, ...]:
    """The coordinate a linear layout gives ``index``: the XOR of the bases of its set bits."""
    out = [0] * rank
    for bit, base in enumerate(bases):
        if index >> bit & 1:
            out = [a ^ b for a, b in zip(out, base, strict=True)]
    return tuple(out)


def shared_offsets(offset_bases, shape) -> dict[tuple[int, ...], int]:
    """Element coordinate -> element offset in the buffer, inverting a SharedLinearLayout's ``offset_bases``."""
    table = {_apply(offset_bases, offset, len(shape)): offset for offset in range(1 << len(offset_bases))}
    assert len(table) == 1 << len(offset_bases), "the shared layout is not one-to-one"
    return table


def wavefronts(reg_bases, lane_bases, offsets: dict, element_bytes: int, vector: int,
               warp_coord=None, first_register: int = 0) -> tuple[int, int]:
    """(wavefronts, ideal) of the instruction that moves registers [first_register, first_register + vector) of
    every lane of one warp (``warp_coord``: the coordinate the warp's own bases add, zeros for warp 0).
    ``reg_bases``/``lane_bases``: a DistributedLinearLayout's; ``offsets``: ``shared_offsets`` of the buffer."""
    rank = len(next(iter(offsets)))
    warp_coord = warp_coord or (0,) * rank
    access = element_bytes * vector
    assert access in (1, 2, 4, 8, 16), f"{access} bytes a lane is not one shared-memory access"
    lanes_per_phase = {8: 16, 16: 8}.get(access, 32)
    total = ideal = 0
    for phase in range(32 // lanes_per_phase):
        words = set()
        for lane in range(phase * lanes_per_phase, (phase + 1) * lanes_per_phase):
            lane_coord = _apply(lane_bases, lane, rank)
            for r in range(first_register, first_register + vector):
                coord = tuple(a ^ b ^ c for a, b, c in zip(_apply(reg_bases, r, rank), lane_coord, warp_coord,
                                                            strict=True))
                words.add(offsets[coord] * element_bytes // WORD)
        per_bank = {}
        for word in words:
            per_bank[word % BANKS] = per_bank.get(word % BANKS, 0) + 1
        total += max(per_bank.values())
        ideal += -(-len(words) * WORD // (BANKS * WORD))
    return total, ideal


def instruction_starts(reg_bases, vector: int) -> list[int]:
    """The first register of each instruction when ``vector`` consecutive registers go together."""
    return [r for r in range(1 << len(reg_bases)) if r % vector == 0]


def tile_wavefronts(reg_bases, lane_bases, offsets, element_bytes, vector) -> tuple[int, int]:
    """(wavefronts, ideal) over every instruction of one warp's share of a tile (warp 0)."""
    total = ideal = 0
    for start in instruction_starts(reg_bases, vector):
        got, best = wavefronts(reg_bases, lane_bases, offsets, element_bytes, vector, first_register=start)
        total, ideal = total + got, ideal + best
    return total, ideal


def layouts(register_layout, shared_layout, shape):
    """(reg_bases, lane_bases, shared offsets) of a Gluon register layout and shared layout at ``shape``,
    computed by Triton's own conversion to linear layouts (no GPU: an MLIR context is enough)."""
    from triton._C.libtriton import ir
    from triton._C.libtriton.gluon_ir import GluonOpBuilder

    context = ir.context()
    ir.load_dialects(context)
    builder = GluonOpBuilder(context)
    regs = builder.to_linear_layout(register_layout._to_ir(builder), list(shape))
    shared = builder.to_linear_layout(shared_layout._to_ir(builder), list(shape))
    return regs.reg_bases, regs.lane_bases, shared_offsets(shared.offset_bases, shape)
