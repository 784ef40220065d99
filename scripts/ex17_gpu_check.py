"""Exercise 17 on a GPU: compile the solution notebook's six CUDA C++ kernels for the GPU and check each against
NumPy in float64 on the sizes the CPU checks use (the hidden-test sizes included).

The kernels are compiled with NVRTC, the CUDA runtime compiler that ships with torch's CUDA wheels, and launched
through the driver API (ctypes), so neither nvcc nor ninja is needed; where NVRTC cannot be found, torch's
``cpp_extension.load_inline`` (nvcc and ninja) is used instead.

    PYTHONPATH=src python3 scripts/ex17_gpu_check.py --out $OUT

Writes ``$OUT/ex17-gpu-check.json`` (per kernel: the cases, the largest error, passed) and exits 1 if one fails.
The CPU checks (``flashcourse.grading.ex17``, g++ against ``cuda_sim.h``) judge the same sources; this is the
check that they also compile and run as real CUDA. Needs torch with CUDA; no Jupyter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("block_sum", "softmax_rows", "transpose", "rmsnorm", "sgemm", "topk_sample")

# Host launchers: the grid and block each kernel's exercise text fixes (flashcourse.grading.ex17.KERNELS).
LAUNCHERS = r"""
torch::Tensor run_block_sum(torch::Tensor x) {
    int n = x.numel(), blocks = (n + 255) / 256;
    auto partial = torch::empty({blocks}, x.options());
    block_sum<<<blocks, 256>>>(x.data_ptr<float>(), partial.data_ptr<float>(), n);
    return partial;
}
torch::Tensor run_softmax_rows(torch::Tensor x) {
    int rows = x.size(0), cols = x.size(1);
    auto y = torch::empty_like(x);
    softmax_rows<<<(rows + 3) / 4, dim3(32, 4)>>>(x.data_ptr<float>(), y.data_ptr<float>(), rows, cols);
    return y;
}
torch::Tensor run_transpose(torch::Tensor x) {
    int rows = x.size(0), cols = x.size(1);
    auto out = torch::empty({cols, rows}, x.options());
    transpose<<<dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8)>>>(x.data_ptr<float>(), out.data_ptr<float>(),
                                                                         rows, cols);
    return out;
}
torch::Tensor run_rmsnorm(torch::Tensor x, torch::Tensor w) {
    auto y = torch::empty_like(x);
    rmsnorm<<<x.size(0), 128>>>(x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), x.size(1), 1e-6f);
    return y;
}
torch::Tensor run_sgemm(torch::Tensor a, torch::Tensor b) {
    int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    sgemm<<<dim3((N + 15) / 16, (M + 15) / 16), dim3(16, 16)>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                               c.data_ptr<float>(), M, N, K);
    return c;
}
torch::Tensor run_topk_sample(torch::Tensor logits, torch::Tensor u, int64_t k) {
    auto token = torch::empty({logits.size(0)}, logits.options().dtype(torch::kInt32));
    topk_sample<<<logits.size(0), 32>>>(logits.data_ptr<float>(), u.data_ptr<float>(), token.data_ptr<int>(),
                                        logits.size(1), k);
    return token;
}
"""
DECLARATIONS = """
torch::Tensor run_block_sum(torch::Tensor x);
torch::Tensor run_softmax_rows(torch::Tensor x);
torch::Tensor run_transpose(torch::Tensor x);
torch::Tensor run_rmsnorm(torch::Tensor x, torch::Tensor w);
torch::Tensor run_sgemm(torch::Tensor a, torch::Tensor b);
torch::Tensor run_topk_sample(torch::Tensor logits, torch::Tensor u, int64_t k);
"""

# NVRTC lacks the host headers: INFINITY and size_t as nvcc's headers define them.
NVRTC_PRELUDE = """
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
typedef decltype(sizeof(0)) flashcourse_size_t;
#define size_t flashcourse_size_t
"""
# Each kernel's launch: grid and block from the inputs, and its arguments (the exercise text fixes them).
LAUNCHES = {
    "block_sum": lambda x: ((-(-x.numel() // 256), 1, 1), (256, 1, 1)),
    "softmax_rows": lambda x: ((-(-x.shape[0] // 4), 1, 1), (32, 4, 1)),
    "transpose": lambda x: ((-(-x.shape[1] // 32), -(-x.shape[0] // 32), 1), (32, 8, 1)),
    "rmsnorm": lambda x: ((x.shape[0], 1, 1), (128, 1, 1)),
    "sgemm": lambda a, n: ((-(-n // 16), -(-a.shape[0] // 16), 1), (16, 16, 1)),
    "topk_sample": lambda x: ((x.shape[0], 1, 1), (32, 1, 1)),
}


def _find_library(patterns: list[str]) -> str | None:
    import glob
    import site

    import torch

    roots = [os.path.dirname(torch.__file__), *site.getsitepackages()]
    for root in roots:
        for pattern in patterns:
            found = sorted(glob.glob(os.path.join(root, "**", pattern), recursive=True))
            if found:
                return found[-1]
    return None


class NvrtcModule:
    """The kernels compiled by NVRTC for this GPU and loaded with the driver API; ``launch(name, grid, block,
    *args)`` runs one on torch's current stream (tensors pass their device pointers, ints and floats by value)."""

    def __init__(self, source: str, names: list[str]):
        import ctypes

        import torch

        path = _find_library(["libnvrtc.so*"])
        if path is None:
            raise FileNotFoundError("libnvrtc not found next to torch")
        self.ctypes, self.torch = ctypes, torch
        nvrtc, self.cuda = ctypes.CDLL(path), ctypes.CDLL("libcuda.so.1")
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes torch's (primary) context current on this thread
        program = ctypes.c_void_p()
        self._nvrtc(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), (NVRTC_PRELUDE + source).encode(),
                                                    b"ex17.cu", 0, None, None), "create")
        for name in names:  # the kernels' addresses, whose mangled names the driver needs
            nvrtc.nvrtcAddNameExpression(program, f"&{name}".encode())
        major, minor = torch.cuda.get_device_capability()
        options = [f"--gpu-architecture=compute_{major}{minor}".encode(), b"-std=c++17", b"-default-device"]
        status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
        if status != 0:
            size = ctypes.c_size_t()
            nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise RuntimeError(f"NVRTC could not compile the kernels:\n{log.value.decode(errors='replace')}")
        size = ctypes.c_size_t()
        self._nvrtc(nvrtc, nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size)), "PTX size")
        ptx = ctypes.create_string_buffer(size.value)
        self._nvrtc(nvrtc, nvrtc.nvrtcGetPTX(program, ptx), "PTX")
        module = ctypes.c_void_p()
        self._cu(self.cuda.cuModuleLoadData(ctypes.byref(module), ptx), "cuModuleLoadData")
        self.functions = {}
        for name in names:
            lowered = ctypes.c_char_p()
            self._nvrtc(nvrtc, nvrtc.nvrtcGetLoweredName(program, f"&{name}".encode(), ctypes.byref(lowered)), name)
            function = ctypes.c_void_p()
            self._cu(self.cuda.cuModuleGetFunction(ctypes.byref(function), module, lowered.value), name)
            self.functions[name] = function

    @staticmethod
    def _nvrtc(nvrtc, status: int, what: str) -> None:
        if status != 0:
            import ctypes

            nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"NVRTC {what}: {nvrtc.nvrtcGetErrorString(status).decode()}")

    @staticmethod
    def _cu(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"CUDA driver {what}: error {status}")

    def launch(self, name: str, grid, block, *args) -> None:
        ctypes, torch = self.ctypes, self.torch
        values = []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                values.append(ctypes.c_void_p(arg.data_ptr()))
            elif isinstance(arg, float):
                values.append(ctypes.c_float(arg))
            else:
                values.append(ctypes.c_int(int(arg)))
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._cu(self.cuda.cuLaunchKernel(self.functions[name], *map(ctypes.c_uint, grid), *map(ctypes.c_uint, block),
                                          ctypes.c_uint(0), stream, pointers, None), f"launch of {name}")


class NvrtcKernels:
    """The six launches of the exercise through :class:`NvrtcModule`, with the same calls as the load_inline path."""

    def __init__(self, sources: dict[str, str]):
        self.module = NvrtcModule("\n#undef TILE\n".join(sources[k] for k in KERNELS), list(KERNELS))

    def _run(self, name, out, grid_block, *args):
        self.module.launch(name, *grid_block, *args)
        return out

    def run_block_sum(self, x):
        out = x.new_empty(-(-x.numel() // 256))
        return self._run("block_sum", out, LAUNCHES["block_sum"](x), x, out, x.numel())

    def run_softmax_rows(self, x):
        y = x.new_empty(x.shape)
        return self._run("softmax_rows", y, LAUNCHES["softmax_rows"](x), x, y, x.shape[0], x.shape[1])

    def run_transpose(self, x):
        out = x.new_empty(x.shape[1], x.shape[0])
        return self._run("transpose", out, LAUNCHES["transpose"](x), x, out, x.shape[0], x.shape[1])

    def run_rmsnorm(self, x, w):
        y = x.new_empty(x.shape)
        return self._run("rmsnorm", y, LAUNCHES["rmsnorm"](x), x, w, y, x.shape[1], 1e-6)

    def run_sgemm(self, a, b):
        c = a.new_empty(a.shape[0], b.shape[1])
        return self._run("sgemm", c, LAUNCHES["sgemm"](a, b.shape[1]), a, b, c, a.shape[0], b.shape[1], a.shape[1])

    def run_topk_sample(self, logits, u, k):
        import torch

        token = torch.empty(logits.shape[0], dtype=torch.int32, device=logits.device)
        return self._run("topk_sample", token, LAUNCHES["topk_sample"](logits), logits, u, token, logits.shape[1], k)


def solution_sources() -> dict[str, str]:
    cells = json.loads((ROOT / "solutions" / "ex17_cuda_kernels.ipynb").read_text(encoding="utf-8"))["cells"]
    sources = {}
    for cell in cells:
        text = "".join(cell["source"])
        for kernel in KERNELS:
            if cell["cell_type"] == "code" and f"def {kernel}_cuda()" in text:
                sources[kernel] = text.split("### BEGIN SOLUTION", 1)[1].split('r"""', 1)[1].split('"""', 1)[0]
    return sources


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch
    from torch.utils.cpp_extension import load_inline

    from flashcourse.grading import ex17

    sources = solution_sources()
    try:
        module, compiler = NvrtcKernels(sources), "NVRTC"
    except FileNotFoundError:  # no NVRTC beside torch: nvcc and ninja through torch's extension builder
        body = "\n#undef TILE\n".join(sources[k] for k in KERNELS)  # transpose and sgemm each define their TILE
        module = load_inline("flashcourse_ex17", cpp_sources=DECLARATIONS,
                             cuda_sources="#include <torch/extension.h>\n" + body + LAUNCHERS,
                             functions=[f"run_{k}" for k in KERNELS], extra_cuda_cflags=["-O2"], verbose=False)
        compiler = "nvcc (load_inline)"
    rng = np.random.default_rng(0)
    gpu = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "compiler": compiler, "kernels": {}}
    failed = False

    def record(kernel: str, got: np.ndarray, expected: np.ndarray, tolerance: float, case: str) -> None:
        nonlocal failed
        error = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
        ok = error <= tolerance
        failed |= not ok
        report["kernels"].setdefault(kernel, []).append({"case": case, "max_error": error, "passed": ok})

    for case in ex17._sum_cases(rng, True):
        x = case["x"]
        blocks = -(-x.size // 256)
        expected = np.array([x[b * 256:(b + 1) * 256].astype(np.float64).sum() for b in range(blocks)])
        record("block_sum", module.run_block_sum(gpu(x)).cpu().numpy(), expected, 1e-3, f"n={x.size}")
    for case in ex17._softmax_cases(rng, True):
        x = case["x"].astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        record("softmax_rows", module.run_softmax_rows(gpu(case["x"])).cpu().numpy(),
               e / e.sum(axis=1, keepdims=True), 1e-5, f"shape={x.shape}")
    for case in ex17._transpose_cases(rng, True):
        record("transpose", module.run_transpose(gpu(case["x"])).cpu().numpy(), case["x"].T.astype(np.float64), 0.0,
               f"shape={case['x'].shape}")
    for case in ex17._norm_cases(rng, True):
        x, w = case["x"].astype(np.float64), case["w"].astype(np.float64)
        expected = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + ex17.EPS) * w
        record("rmsnorm", module.run_rmsnorm(gpu(case["x"]), gpu(case["w"])).cpu().numpy(), expected, 1e-4,
               f"shape={x.shape}")
    for case in ex17._gemm_cases(rng, True):
        expected = case["a"].astype(np.float64) @ case["b"].astype(np.float64)
        record("sgemm", module.run_sgemm(gpu(case["a"]), gpu(case["b"])).cpu().numpy(), expected, 1e-3,
               f"a={case['a'].shape}, b={case['b'].shape}")
    for case in ex17._topk_cases(rng, True):
        expected = ex17.topk_reference(case["x"], case["u"].astype(np.float64), case["k"])
        got = module.run_topk_sample(gpu(case["x"]), gpu(case["u"]), int(case["k"])).cpu().numpy()
        record("topk_sample", got, expected.astype(np.float64), 0.0, f"shape={case['x'].shape}, k={case['k']}")
    torch.cuda.synchronize()
    report["passed"] = not failed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ex17-gpu-check.json").write_text(json.dumps(report, indent=1))
    print(f"compiled with {compiler} on {report['device']}")
    for kernel, rows in report["kernels"].items():
        print(f"{kernel}: {sum(r['passed'] for r in rows)}/{len(rows)} cases passed, "
              f"largest error {max(r['max_error'] for r in rows):.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
