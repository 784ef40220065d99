"""Hopper-only kernels (sm_90), written in Gluon: FlashAttention-3's forward v8 (``hopper.fa3``), its backward b6
(``hopper.fa3_backward``), b7 with dQ added by Triton 3.9's TMA reduce-add (``hopper.fa3_backward_tma``) and b8,
the same at head dim 256 (``hopper.fa3_backward_d256``), and the FP8 forward on v8's design (``hopper.fa3_fp8``),
each in measured stages (lesson 13, docs/KERNELS.md; b8 not yet measured).

Nothing here is imported by ``flashcourse.kernels`` or dispatched by its public API: Gluon's API moves between
Triton releases, so a Triton without what these modules use must still import the library. Import a module by
name (``from flashcourse.kernels.hopper import fa3``); each lists the Triton versions it was compiled with
(``TESTED_TRITON``). This package imports nothing itself.
"""
