"""Exercise 17 on a GPU: compile the solution notebook's six CUDA C++ kernels with nvcc (torch's
``cpp_extension.load_inline``) and check each against NumPy in float64 on the sizes the CPU checks use.

    PYTHONPATH=src python3 scripts/ex17_gpu_check.py --out $OUT

Writes ``$OUT/ex17-gpu-check.json`` (per kernel: the cases, the largest error, passed) and exits 1 if one fails.
The CPU checks (``flashcourse.grading.ex17``, g++ against ``cuda_sim.h``) judge the same sources; this is the
check that they also compile and run as real CUDA. Needs torch with CUDA and nvcc; no Jupyter.
"""

from __future__ import annotations

import argparse
import json
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
    body = "\n#undef TILE\n".join(sources[k] for k in KERNELS)  # transpose and sgemm each define their TILE
    module = load_inline("flashcourse_ex17", cpp_sources=DECLARATIONS,
                         cuda_sources="#include <torch/extension.h>\n" + body + LAUNCHERS,
                         functions=[f"run_{k}" for k in KERNELS], extra_cuda_cflags=["-O2"], verbose=False)
    rng = np.random.default_rng(0)
    gpu = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    report, failed = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": {}}, False

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
    for kernel, rows in report["kernels"].items():
        print(f"{kernel}: {sum(r['passed'] for r in rows)}/{len(rows)} cases passed, "
              f"largest error {max(r['max_error'] for r in rows):.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
