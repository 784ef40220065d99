"""flashcourse: FlashAttention from first principles to a fast Triton kernel.

Submodules are imported on demand, so that `import flashcourse` stays light and works without Triton:
``from flashcourse import reference, tiled, iomodel`` (NumPy only), ``from flashcourse import kernels``
(PyTorch + Triton).
"""

__version__ = "0.1.0"
