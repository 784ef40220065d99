"""Kernel versions that teach and do not serve calls: the steps the lessons take towards the kernels that do.

- ``teaching.forward``: forward v1-v6 (lesson 07 reads them one after another), each a whole kernel, with
  their registry entries. The public API runs v7 (``kernels/forward.py``), which is v6 plus the variant rules.
- ``teaching.backward``: the registry entries of b2, b4 and b5, three dQ schemes lesson 08 and the benchmarks
  compare with b1's. Their code is a compile-time switch inside b1's dK/dV kernel, which serves calls, so that
  kernel stays in ``kernels/backward.py`` (``teaching/backward.py`` says more).

Every version stays runnable by name: ``kernels.forward.FORWARD_VERSIONS`` and ``kernels.backward.BACKWARD_VERSIONS``
hold all of them, served and teaching alike, and ``run_forward`` / ``run_backward`` launch any of them. This
package imports nothing itself; the library's ``forward.py`` and ``backward.py`` import its modules.
"""
