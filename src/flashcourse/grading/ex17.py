"""Exercise 17, hand-written CUDA C++ (手撕 CUDA): a block reduce, a row softmax (online, one warp per row), a
transpose through shared memory, RMSNorm, a tiled SGEMM and top-k sampling, the kernels an interview for a GPU or
inference role asks to write by hand (lesson 10).

The learner's function returns the CUDA C++ source of a kernel with a given signature. Without a GPU the source is
compiled by g++ against ``cuda/cuda_sim.h``, which executes CUDA's thread model on the CPU: threads as coroutines,
``__syncthreads()`` as a barrier every thread of the block must reach, warp shuffles that check their mask, global
buffers with guard zones. Each case runs twice, the threads scheduled in increasing and in decreasing order; a
result that depends on the order is a race on shared memory (a missing ``__syncthreads()``). The checks compare
with NumPy in float64 and name the usual mistakes, in English and Chinese: a missing barrier, a wrong shuffle mask
or offset, a missing bounds guard, a bank-conflicting tile (with the bank arithmetic), an online softmax whose
running sum is not rescaled. On a machine with CUDA, ``scripts/ex17_gpu_check.py`` compiles the same sources
with nvcc (``torch.utils.cpp_extension.load_inline``) and checks them on the GPU.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._core import Part, run_check

__all__ = ["KERNELS", "SIM_HEADER", "check_block_sum", "check_rmsnorm", "check_sgemm", "check_softmax_rows_cuda",
           "check_topk_sample", "check_transpose_cuda", "compile_and_run"]

SIM_HEADER = Path(__file__).with_name("cuda") / "cuda_sim.h"
BLOCK = 256  # threads per block of the block reduce
ROWS_PER_BLOCK = 4  # warps per block of the row softmax: block (32, 4)
TILE = 32  # the transpose's tile side, block (32, 8)
GEMM_TILE = 16  # the SGEMM's tile side, block (16, 16)
NORM_THREADS = 128  # threads per row of RMSNorm
EPS = 1e-6


@dataclass(frozen=True)
class Kernel:
    """A kernel to write: its name, C++ signature, and the harness body that loads the inputs (from ``dir``),
    launches it with ``sim::launch`` and saves the outputs; ``ints`` are the integer arguments passed on the
    command line (``arg[0]``, ``arg[1]``, ...)."""

    name: str
    signature: str
    harness: str


KERNELS = {
    "block_sum": Kernel("block_sum", "__global__ void block_sum(const float* x, float* partial, int n)", """
    int n = arg[0], blocks = (n + 255) / 256;
    sim::Buffer<float> x(n), partial(blocks);
    load(dir + "/x.bin", x);
    sim::launch(dim3(blocks), dim3(256), block_sum, (const float*)x.data(), partial.data(), n);
    guards(partial, "partial"); save(dir + "/out.bin", partial);"""),
    "softmax_rows": Kernel("softmax_rows", "__global__ void softmax_rows(const float* x, float* y, int rows, "
                           "int cols)", """
    int rows = arg[0], cols = arg[1];
    sim::Buffer<float> x(rows * cols), y(rows * cols);
    load(dir + "/x.bin", x);
    sim::launch(dim3((rows + 3) / 4), dim3(32, 4), softmax_rows, (const float*)x.data(), y.data(), rows, cols);
    guards(y, "y"); save(dir + "/out.bin", y);"""),
    "transpose": Kernel("transpose", "__global__ void transpose(const float* in, float* out, int rows, int cols)", """
    int rows = arg[0], cols = arg[1];
    sim::Buffer<float> in(rows * cols), out(rows * cols);
    load(dir + "/x.bin", in);
    sim::launch(dim3((cols + 31) / 32, (rows + 31) / 32), dim3(32, 8), transpose, (const float*)in.data(),
                out.data(), rows, cols);
    guards(out, "out"); save(dir + "/out.bin", out);"""),
    "rmsnorm": Kernel("rmsnorm", "__global__ void rmsnorm(const float* x, const float* w, float* y, int cols, "
                      "float eps)", """
    int rows = arg[0], cols = arg[1];
    sim::Buffer<float> x(rows * cols), w(cols), y(rows * cols);
    load(dir + "/x.bin", x); load(dir + "/w.bin", w);
    sim::launch(dim3(rows), dim3(128), rmsnorm, (const float*)x.data(), (const float*)w.data(), y.data(), cols,
                1e-6f);
    guards(y, "y"); save(dir + "/out.bin", y);"""),
    "sgemm": Kernel("sgemm", "__global__ void sgemm(const float* A, const float* B, float* C, int M, int N, int K)",
                    """
    int M = arg[0], N = arg[1], K = arg[2];
    sim::Buffer<float> A(M * K), B(K * N), C(M * N);
    load(dir + "/a.bin", A); load(dir + "/b.bin", B);
    sim::launch(dim3((N + 15) / 16, (M + 15) / 16), dim3(16, 16), sgemm, (const float*)A.data(),
                (const float*)B.data(), C.data(), M, N, K);
    guards(C, "C"); save(dir + "/out.bin", C);"""),
    "topk_sample": Kernel("topk_sample", "__global__ void topk_sample(const float* logits, const float* u, "
                          "int* token, int vocab, int k)", """
    int rows = arg[0], vocab = arg[1], k = arg[2];
    sim::Buffer<float> logits(rows * vocab), u(rows);
    sim::Buffer<int> token(rows);
    load(dir + "/x.bin", logits); load(dir + "/u.bin", u);
    sim::launch(dim3(rows), dim3(32), topk_sample, (const float*)logits.data(), (const float*)u.data(),
                token.data(), vocab, k);
    guards(token, "token"); save(dir + "/out.bin", token);"""),
}

_MAIN = """
#line 1 "harness"
#include <fstream>
#include <iostream>
template <typename T> static void load(const std::string& path, sim::Buffer<T>& into) {
    std::ifstream file(path, std::ios::binary);
    file.read(reinterpret_cast<char*>(into.data()), into.n * sizeof(T));
}
template <typename T> static void save(const std::string& path, sim::Buffer<T>& from) {
    std::ofstream file(path, std::ios::binary);
    file.write(reinterpret_cast<const char*>(from.data()), from.n * sizeof(T));
}
template <typename T> static void guards(const sim::Buffer<T>& buffer, const char* name) {
    if (!buffer.guards_intact()) sim::fail(std::string("a write past the end (or before the start) of ") + name);
}
int main(int argc, char** argv) {
    sim::reverse_order = argv[1][0] == '1';
    std::string dir = argv[2];
    std::vector<int> arg;
    for (int i = 3; i < argc; ++i) arg.push_back(std::atoi(argv[i]));
    %s
    return 0;
}
"""


def _bilingual(en: str, zh: str) -> str:
    return f"{en}\n中文：{zh}"


# What the simulator's errors mean, in Chinese (its messages are English).
_SIM_ERRORS_ZH = [
    ("leaves out lane", "shuffle 的 mask 漏掉了调用它的 lane：mask 必须包含每个调用它的 lane"
                        "（整个 warp 用 0xffffffff）。"),
    ("names lanes that do not call it", "shuffle 的 mask 包含了没有调用它的 lane：越界的 lane 也要参加 shuffle，"
                                        "不要把 shuffle 放在 `if (i < n)` 里面。"),
    ("reads lane", "shuffle 读了一个没有参加的 lane。"),
    ("is stuck", "warp 卡住了：一部分 lane 在等 shuffle，另一部分已经走到 __syncthreads() 或 return 了。shuffle "
                 "放进了只有部分 lane 走的分支（`if (i < n)`）：越界的 lane 也要参加 shuffle。"),
    ("is not reached by every thread", "不是 block 里每个线程都到达了 __syncthreads()：barrier 放在分支里，"
                                       "或者之前提前 return 了。"),
    ("a write past the end", "写越界：缺少边界判断（`if (i < n)`），最后一个 block 的多余线程写到了数组外面。"),
    ("more than 1024 threads", "一个 block 超过 1024 个线程。"),
    ("no thread can make progress", "没有线程能继续执行（死锁）。"),
]


def _explain_sim_error(message: str) -> str:
    zh = next((text for key, text in _SIM_ERRORS_ZH if key in message), "模拟器报错，见上面的英文说明。")
    return _bilingual(f"the CUDA thread model on the CPU stopped: {message}", zh)


def _build_dir() -> Path:
    folder = Path(tempfile.gettempdir()) / "flashcourse-cuda-sim"
    folder.mkdir(exist_ok=True)
    return folder


def _compile(kernel: Kernel, source: str) -> Path:
    """The simulator binary for this source (compiled once per source, cached by its hash)."""
    if shutil.which("g++") is None:
        raise AssertionError(_bilingual("exercise 17 needs g++ to run CUDA kernels on the CPU: install it "
                                        "(Debian/Ubuntu: apt-get install g++; macOS: xcode-select --install)",
                                        "练习 17 需要 g++ 在 CPU 上执行 CUDA kernel，请先安装 g++。"))
    if not isinstance(source, str) or f"{kernel.name}(" not in source:
        raise AssertionError(_bilingual(f"expected the CUDA source of `{kernel.signature}` as a string",
                                        f"应返回 `{kernel.signature}` 的 CUDA 源代码字符串"))
    program = f'#include "cuda_sim.h"\n#line 1 "your_kernel.cu"\n{source}\n' + _MAIN % kernel.harness
    digest = hashlib.sha256((program + SIM_HEADER.read_text()).encode()).hexdigest()[:16]
    binary = _build_dir() / f"{kernel.name}-{digest}"
    if binary.exists():
        return binary
    cpp = binary.with_suffix(".cpp")
    cpp.write_text(program)
    result = subprocess.run(["g++", "-std=c++17", "-O1", "-w", f"-I{SIM_HEADER.parent}", str(cpp), "-o",
                             str(binary) + ".tmp"], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if "your_kernel.cu" in line and "error" in line]
        shown = "\n".join(errors[:6]) or result.stderr[-1500:]
        raise AssertionError(_bilingual(f"your kernel does not compile:\n{shown}", "kernel 编译失败，见上面的错误。"))
    Path(str(binary) + ".tmp").replace(binary)
    return binary


def compile_and_run(kernel_name: str, source: str, inputs: dict[str, np.ndarray], ints: list[int],
                    out_dtype=np.float32) -> dict:
    """Run the kernel on the CPU simulator in both schedule orders: {"forward", "reverse"} outputs (arrays) and
    "error" (the simulator's message, "" when none)."""
    kernel = KERNELS[kernel_name]
    binary = _compile(kernel, source)
    results = {"error": ""}
    with tempfile.TemporaryDirectory(prefix="flashcourse-ex17-") as folder:
        for name, array in inputs.items():
            np.ascontiguousarray(array, dtype=np.float32).tofile(Path(folder) / f"{name}.bin")
        for order, label in ((0, "forward"), (1, "reverse")):
            run = subprocess.run([str(binary), str(order), folder, *map(str, ints)], capture_output=True, text=True,
                                 timeout=120)
            if run.returncode != 0:
                found = re.search(r"SIM-ERROR: (.*)", run.stderr)
                results["error"] = found[1] if found else f"the program crashed ({run.returncode}): " \
                                                          f"{run.stderr[-500:] or 'a read far out of bounds?'}"
                results["forward"] = results["reverse"] = np.zeros(0, out_dtype)
                return results
            results[label] = np.fromfile(Path(folder) / "out.bin", dtype=out_dtype)
    return results


def _outputs(results: dict) -> dict:
    return {"forward": results["forward"], "reverse": results["reverse"], "error": np.asarray(results["error"])}


def _judge_common(what: str, out: dict, expected: np.ndarray, *, rtol: float, atol: float) -> np.ndarray | None:
    """The checks every kernel shares: the simulator's errors, a race (the two schedules disagree), a read out of
    bounds (NaN from the guard zones), then the values. Returns None when right, else the forward result (for a
    kernel's own diagnosis, raised by the caller)."""
    error = str(out["error"])
    if error:
        raise AssertionError(_explain_sim_error(error))
    forward, reverse = out["forward"], out["reverse"]
    expected = np.asarray(expected).reshape(-1)
    if forward.shape != expected.shape:
        raise AssertionError(_bilingual(f"{what}: expected {expected.size} values, got {forward.size}",
                                        f"{what}：应有 {expected.size} 个值，实际 {forward.size} 个"))
    if not np.array_equal(forward, reverse, equal_nan=True):
        index = int(np.flatnonzero(~((forward == reverse) | (np.isnan(forward) & np.isnan(reverse))))[0])
        raise AssertionError(_bilingual(
            f"{what}: a race on shared memory. Run with the threads of a block scheduled in increasing order the "
            f"result at [{index}] is {forward[index]:.6g}, in decreasing order {reverse[index]:.6g}: a thread reads "
            "shared memory that another thread writes in the same stretch between barriers. Put __syncthreads() "
            "between the writes and the reads (and after the reads, before the next writes)",
            f"{what}：共享内存上有数据竞争。线程按递增顺序调度时 [{index}] 的结果是 {forward[index]:.6g}，按递减顺序是 "
            f"{reverse[index]:.6g}：一个线程读了另一个线程在同一段（两个 barrier 之间）写的共享内存。写和读之间要加 "
            "__syncthreads()（读完、下一轮写之前也要加）"))
    if np.isnan(forward).any() and not np.isnan(expected).any():
        index = int(np.flatnonzero(np.isnan(forward))[0])
        raise AssertionError(_bilingual(
            f"{what}: NaN at [{index}] where the reference has {expected[index]:.6g}: a read past the end of an input "
            "(the guard zones around every buffer hold NaN). Guard every load with the bounds, `if (i < n)`, or "
            "load a neutral value (0 for a sum, -INFINITY for a max)",
            f"{what}：[{index}] 是 NaN，参考值是 {expected[index]:.6g}：读越界了（每个数组两边的保护区是 NaN）。"
            "每次读都要有边界判断 `if (i < n)`，或者越界时用中性值（求和用 0，求最大值用 -INFINITY）"))
    if np.allclose(forward, expected, rtol=rtol, atol=atol):
        return None
    return forward


def _mismatch(what: str, got: np.ndarray, expected: np.ndarray, en: str = "", zh: str = "") -> AssertionError:
    expected = np.asarray(expected).reshape(-1)
    index = int(np.argmax(np.abs(got - expected)))
    return AssertionError(_bilingual(
        f"{what}: at [{index}] yours is {got[index]:.6g}, expected {expected[index]:.6g}" + (f". {en}" if en else ""),
        f"{what}：[{index}] 你的结果是 {got[index]:.6g}，应为 {expected[index]:.6g}" + (f"。{zh}" if zh else "")))


def _source(fns: dict, name: str) -> str:
    return fns[name]()


# ------------------------------------------------------------------------------------------ (a) block reduce
def _sum_cases(rng, hidden):
    sizes = [1, 31, 256, 1000, 2049] + ([257, 4096, 777] if hidden else [])
    return [{"x": rng.standard_normal(n).astype(np.float32)} for n in sizes]


def _sum_run(fns, case):
    return _outputs(compile_and_run("block_sum", _source(fns, "block_sum_cuda"), {"x": case["x"]},
                                    [case["x"].size]))


def _sum_judge(case, out):
    x = case["x"].astype(np.float64)
    blocks = -(-x.size // BLOCK)
    expected = np.array([x[b * BLOCK:(b + 1) * BLOCK].sum() for b in range(blocks)])
    got = _judge_common("the block sums", out, expected, rtol=1e-4, atol=1e-4)
    if got is None:
        return
    lanes = np.pad(x, (0, blocks * BLOCK - x.size)).reshape(blocks, BLOCK // 32, 32)
    if np.allclose(got, lanes[:, :, 0].sum(axis=1), rtol=1e-4, atol=1e-4):
        raise _mismatch("the block sums", got, expected,
                        "Each block's sum is the sum of lane 0 of each warp only: the warp's values were never "
                        "combined. A shuffle tree adds the value `offset` lanes away for offset = 16, 8, 4, 2, 1",
                        "每个 block 的结果只是各 warp 的 lane 0 之和：warp 内的值没有合并。shuffle 树要依次加上相距 "
                        "offset = 16、8、4、2、1 的 lane 的值")
    if np.allclose(got, lanes[:, 0, :].sum(axis=1), rtol=1e-4, atol=1e-4):
        raise _mismatch("the block sums", got, expected,
                        "Each block's sum is warp 0's alone: the warps' partial sums were never combined through "
                        "shared memory (lane 0 of each warp writes its sum, then warp 0 reduces those)",
                        "每个 block 的结果只有 warp 0 的和：各 warp 的部分和没有通过共享内存合并（每个 warp 的 lane 0 "
                        "写出部分和，再由 warp 0 归约）")
    raise _mismatch("the block sums", got, expected,
                    "Check the tree's offsets (16, 8, 4, 2, 1 within a warp; each halves the last) and that every "
                    "element is added exactly once",
                    "检查归约树的 offset（warp 内为 16、8、4、2、1，每次减半），以及每个元素恰好加一次")


BLOCK_SUM = Part("ex17_a", 3, "block_sum in CUDA C++ (shared memory, then warp shuffles)", ("block_sum_cuda",),
                 _sum_cases, _sum_run, _sum_judge)


def check_block_sum(block_sum_cuda, *, hidden=False, seed=None):
    """Check ``block_sum_cuda() -> str``, the source of ``block_sum(x, partial, n)``: 256 threads a block, one
    element a thread, ``partial[blockIdx.x]`` the sum of the block's elements."""
    __tracebackhide__ = True
    run_check(BLOCK_SUM, {"block_sum_cuda": block_sum_cuda}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (b) row softmax
def _softmax_cases(rng, hidden):
    shapes = [(1, 1), (3, 31), (5, 100), (6, 257)] + ([(9, 64), (2, 1000)] if hidden else [])
    cases = [{"x": (rng.standard_normal(shape) * 3).astype(np.float32)} for shape in shapes]
    # rows whose max grows from column to column: a running sum that is never rescaled shows at once
    cases.append({"x": np.sort(rng.standard_normal((4, 96)) * 8, axis=1).astype(np.float32)})
    return cases


def _softmax_run(fns, case):
    rows, cols = case["x"].shape
    return _outputs(compile_and_run("softmax_rows", _source(fns, "softmax_rows_cuda"), {"x": case["x"]},
                                    [rows, cols]))


def _softmax_judge(case, out):
    x = case["x"].astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    got = _judge_common("the softmax", out, expected, rtol=1e-4, atol=1e-6)
    if got is None:
        return
    rows = got.reshape(x.shape)
    sums = rows.sum(axis=1)
    if not np.allclose(sums, 1.0, rtol=1e-3):
        raise _mismatch("the softmax", got, expected,
                        f"Row sums are {np.round(sums[:3], 4).tolist()}, not 1: the running sum l was not rescaled "
                        "when the running max grew (l = l * exp(m_old - m_new) + exp(x - m_new)), or the lanes' "
                        "(m, l) were merged without rescaling both to the common max",
                        f"各行之和是 {np.round(sums[:3], 4).tolist()}，不是 1：running max 变大时没有 rescale 指数和 "
                        "l（l = l * exp(m_old - m_new) + exp(x - m_new)），或者合并各 lane 的 (m, l) 时没有先都换到"
                        "共同的最大值")
    raise _mismatch("the softmax", got, expected)


SOFTMAX = Part("ex17_b", 3, "softmax_rows in CUDA C++ (online, one warp per row)", ("softmax_rows_cuda",),
               _softmax_cases, _softmax_run, _softmax_judge)


def check_softmax_rows_cuda(softmax_rows_cuda, *, hidden=False, seed=None):
    """Check ``softmax_rows_cuda() -> str``, the source of ``softmax_rows(x, y, rows, cols)``: block (32, 4), one
    warp per row (row ``blockIdx.x * 4 + threadIdx.y``), one pass for the online (m, l), shuffles to merge."""
    __tracebackhide__ = True
    run_check(SOFTMAX, {"softmax_rows_cuda": softmax_rows_cuda}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (c) transpose
_SHARED_2D = re.compile(r"__shared__\s+float\s+(\w+)\s*\[\s*(\w+)\s*\]\s*\[\s*(\w+)\s*\]")


def bank_conflict(source: str) -> str | None:
    """The diagnosis of a shared tile whose rows are a multiple of 32 floats long, read down a column: the bank
    arithmetic of a warp's 32 lanes. None when the tile is padded (or absent)."""
    defines = dict(re.findall(r"#define\s+(\w+)\s+(\d+)", source))
    defines.update(re.findall(r"constexpr\s+int\s+(\w+)\s*=\s*(\d+)", source))
    for name, rows, cols in _SHARED_2D.findall(source):
        try:
            width = int(defines.get(cols, cols)) if not re.fullmatch(r"\w+\s*\+\s*1", cols) else None
        except ValueError:
            continue
        if width and width % 32 == 0:
            ways = math.gcd(width, 32)
            return _bilingual(
                f"`__shared__ float {name}[{rows}][{cols}]`: a warp reads a column, lane i at word i * {width}, in "
                f"bank (i * {width}) mod 32 = 0 for every lane: a {ways}-way bank conflict, the 32 reads served one "
                f"after another. Pad each row by one float, `[{rows}][{width} + 1]`: lane i's bank is then "
                f"(i * {width + 1}) mod 32 = i, 32 different banks",
                f"`__shared__ float {name}[{rows}][{cols}]`：warp 按列读，lane i 读第 i * {width} 个字，所在 bank 是 "
                f"(i * {width}) mod 32 = 0，所有 lane 都在同一个 bank：{ways} 路 bank conflict，32 次读被串行化。每行"
                f"多补一个 float，`[{rows}][{width} + 1]`，lane i 的 bank 就是 (i * {width + 1}) mod 32 = i，"
                "正好 32 个不同的 bank")
    return None


def _transpose_cases(rng, hidden):
    shapes = [(1, 1), (33, 65), (64, 32), (100, 7)] + ([(31, 97), (128, 128)] if hidden else [])
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for shape in shapes]


def _transpose_run(fns, case):
    source = _source(fns, "transpose_cuda")
    rows, cols = case["x"].shape
    out = _outputs(compile_and_run("transpose", source, {"x": case["x"]}, [rows, cols]))
    out["conflict"] = np.asarray(bank_conflict(source) or "")
    return out


def _transpose_judge(case, out):
    expected = case["x"].T.astype(np.float64)
    got = _judge_common("the transpose", out, expected, rtol=0, atol=0)
    if got is not None:
        raise _mismatch("the transpose", got, expected,
                        "out[c][r] = in[r][c]: read the tile with (row, column) = (blockIdx.y * 32 + y, blockIdx.x * "
                        "32 + threadIdx.x), write it with the block indices swapped",
                        "out[c][r] = in[r][c]：读 tile 时行列是 (blockIdx.y * 32 + y, blockIdx.x * 32 + threadIdx.x)，"
                        "写回时交换 block 下标")
    if str(out["conflict"]):
        raise AssertionError(str(out["conflict"]))


TRANSPOSE = Part("ex17_c", 2, "transpose in CUDA C++ (a shared tile without bank conflicts)", ("transpose_cuda",),
                 _transpose_cases, _transpose_run, _transpose_judge)


def check_transpose_cuda(transpose_cuda, *, hidden=False, seed=None):
    """Check ``transpose_cuda() -> str``, the source of ``transpose(in, out, rows, cols)``: block (32, 8), a 32 x 32
    tile through shared memory, padded so that reading a column is free of bank conflicts."""
    __tracebackhide__ = True
    run_check(TRANSPOSE, {"transpose_cuda": transpose_cuda}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (d) RMSNorm
def _norm_cases(rng, hidden):
    shapes = [(1, 1), (3, 7), (2, 128), (4, 300), (2, 1000)] + ([(5, 513)] if hidden else [])
    return [{"x": rng.standard_normal(shape).astype(np.float32),
             "w": (1 + 0.1 * rng.standard_normal(shape[1])).astype(np.float32)} for shape in shapes]


def _norm_run(fns, case):
    rows, cols = case["x"].shape
    return _outputs(compile_and_run("rmsnorm", _source(fns, "rmsnorm_cuda"), {"x": case["x"], "w": case["w"]},
                                    [rows, cols]))


def _norm_judge(case, out):
    x, w = case["x"].astype(np.float64), case["w"].astype(np.float64)
    rms = np.sqrt((x * x).mean(axis=1, keepdims=True) + EPS)
    expected = x / rms * w
    got = _judge_common("RMSNorm", out, expected, rtol=1e-4, atol=1e-5)
    if got is None:
        return
    ratio = (got.reshape(x.shape) / np.where(expected == 0, 1, expected))[:, 0]
    if np.allclose(ratio, ratio[0], rtol=1e-3) and not np.isclose(ratio[0], 1, rtol=1e-3):
        raise _mismatch("RMSNorm", got, expected,
                        "Every element is off by the same factor in a row: the mean of x^2 divides by the wrong count "
                        "(cols, not blockDim.x) or the block's partial sums were not all added",
                        "同一行每个元素差同一个倍数：x^2 的均值除错了数（应除以 cols，不是 blockDim.x），或者 block "
                        "的部分和没有全部加起来")
    raise _mismatch("RMSNorm", got, expected)


RMSNORM = Part("ex17_d", 2, "rmsnorm in CUDA C++ (a block reduce of x^2)", ("rmsnorm_cuda",), _norm_cases,
               _norm_run, _norm_judge)


def check_rmsnorm(rmsnorm_cuda, *, hidden=False, seed=None):
    """Check ``rmsnorm_cuda() -> str``, the source of ``rmsnorm(x, w, y, cols, eps)``: one block of 128 threads
    per row, ``y = x / sqrt(mean(x^2) + eps) * w``."""
    __tracebackhide__ = True
    run_check(RMSNORM, {"rmsnorm_cuda": rmsnorm_cuda}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (e) tiled SGEMM
def _gemm_cases(rng, hidden):
    shapes = [(1, 1, 1), (17, 33, 20), (32, 48, 40), (5, 70, 3)] + ([(64, 64, 64), (33, 1, 17)] if hidden else [])
    return [{"a": rng.standard_normal((m, k)).astype(np.float32), "b": rng.standard_normal((k, n)).astype(np.float32)}
            for m, n, k in shapes]


def _gemm_run(fns, case):
    (m, k), n = case["a"].shape, case["b"].shape[1]
    return _outputs(compile_and_run("sgemm", _source(fns, "sgemm_cuda"), {"a": case["a"], "b": case["b"]},
                                    [m, n, k]))


def _gemm_judge(case, out):
    a, b = case["a"].astype(np.float64), case["b"].astype(np.float64)
    expected = a @ b
    got = _judge_common("C = A B", out, expected, rtol=1e-4, atol=1e-4)
    if got is None:
        return
    k = a.shape[1]
    full = k // GEMM_TILE * GEMM_TILE
    if full < k and np.allclose(got, (a[:, :full] @ b[:full]).reshape(-1), rtol=1e-4, atol=1e-4):
        raise _mismatch("C = A B", got, expected,
                        f"The last, partial tile of K ({k - full} of {GEMM_TILE} columns) is missing: loop over "
                        "(K + TILE - 1) / TILE tiles and load 0 past the edge",
                        f"K 的最后一个不满的 tile（{GEMM_TILE} 列中的 {k - full} 列）漏掉了："
                        "循环 (K + TILE - 1) / TILE 次，越界处读 0")
    raise _mismatch("C = A B", got, expected,
                    "Load As[ty][tx] = A[row][t * 16 + tx] and Bs[ty][tx] = B[t * 16 + ty][col], 0 past the edges",
                    "As[ty][tx] = A[row][t * 16 + tx]，Bs[ty][tx] = B[t * 16 + ty][col]，越界处读 0")


SGEMM = Part("ex17_e", 3, "sgemm in CUDA C++ (16 x 16 shared tiles)", ("sgemm_cuda",), _gemm_cases, _gemm_run,
             _gemm_judge)


def check_sgemm(sgemm_cuda, *, hidden=False, seed=None):
    """Check ``sgemm_cuda() -> str``, the source of ``sgemm(A, B, C, M, N, K)`` (row-major): block (16, 16), grid
    (ceil(N / 16), ceil(M / 16)), tiles of A and B staged in shared memory."""
    __tracebackhide__ = True
    run_check(SGEMM, {"sgemm_cuda": sgemm_cuda}, hidden=hidden, seed=seed)


# ------------------------------------------------------------------------------------------ (f) top-k sampling
def topk_reference(logits: np.ndarray, u: np.ndarray, k: int, *, normalise_over_vocab: bool = False) -> np.ndarray:
    """The token each row samples: the k largest logits (ties: the lower index first), their softmax, and the
    first of them, largest first, whose cumulative probability exceeds u. ``normalise_over_vocab`` computes the
    usual mistake instead: probabilities normalised over the whole vocabulary (then the walk may run out, and the
    k-th is taken)."""
    tokens = []
    for row, draw in zip(logits.astype(np.float64), u, strict=True):
        top = np.argsort(-row, kind="stable")[:k]
        p = np.exp(row[top] - row.max())
        p = p / (np.exp(row - row.max()).sum() if normalise_over_vocab else p.sum())
        tokens.append(top[min(int(np.searchsorted(np.cumsum(p), draw, side="right")), k - 1)])
    return np.array(tokens)


def _topk_cases(rng, hidden):
    cases = []
    for rows, vocab, k in [(1, 1, 1), (3, 50, 5), (4, 100, 1), (3, 257, 8)] + ([(5, 1000, 20)] if hidden else []):
        logits = (rng.standard_normal((rows, vocab)) * 2).astype(np.float32)
        u = []
        for row in logits.astype(np.float64):  # u in the middle of a token's interval: no tie on rounding
            top = np.argsort(-row, kind="stable")[:k]
            p = np.exp(row[top] - row[top].max())
            edges = np.concatenate([[0.0], np.cumsum(p / p.sum())])
            j = int(rng.integers(k))
            u.append((edges[j] + edges[j + 1]) / 2)
        cases.append({"x": logits, "u": np.array(u, np.float32), "k": k})
    return cases


def _topk_run(fns, case):
    rows, vocab = case["x"].shape
    return _outputs(compile_and_run("topk_sample", _source(fns, "topk_sample_cuda"),
                                    {"x": case["x"], "u": case["u"]}, [rows, vocab, int(case["k"])],
                                    out_dtype=np.int32))


def _topk_judge(case, out):
    logits, u, k = case["x"], case["u"].astype(np.float64), int(case["k"])
    expected = topk_reference(logits, u, k)
    got = _judge_common("the sampled tokens", {**out, "forward": out["forward"].astype(np.float64),
                                               "reverse": out["reverse"].astype(np.float64)},
                        expected.astype(np.float64), rtol=0, atol=0)
    if got is None:
        return
    row = int(np.flatnonzero(got != expected)[0])
    top = set(np.argsort(-logits[row], kind="stable")[:k].tolist())
    whole = topk_reference(logits, u, k, normalise_over_vocab=True)
    if got[row] == whole[row]:
        en, zh = ("the softmax was taken over the whole vocabulary, not the k largest logits only",
                  "softmax 算在了整个词表上，应该只在 k 个最大的 logit 上算")
    elif int(got[row]) not in top:
        en, zh = (f"token {int(got[row])} is not among the {k} largest logits",
                  f"token {int(got[row])} 不在前 {k} 大里")
    else:
        en, zh = ("walk the k tokens from the largest logit down, adding probabilities, and stop at the first "
                  "whose running total exceeds u",
                  "从最大的 logit 往下走，累加概率，在累加和第一次超过 u 的 token 停下")
    raise AssertionError(_bilingual(f"the sampled tokens: row {row} sampled {int(got[row])}, expected "
                                    f"{int(expected[row])}: {en}",
                                    f"采样结果：第 {row} 行采到 {int(got[row])}，应为 {int(expected[row])}：{zh}"))


TOPK = Part("ex17_f", 2, "topk_sample in CUDA C++ (one warp per row)", ("topk_sample_cuda",), _topk_cases,
            _topk_run, _topk_judge)


def check_topk_sample(topk_sample_cuda, *, hidden=False, seed=None):
    """Check ``topk_sample_cuda() -> str``, the source of ``topk_sample(logits, u, token, vocab, k)``: one warp
    (32 threads) per row, the k largest logits by repeated warp arg-max, their softmax, then the token whose
    cumulative probability first exceeds ``u[row]``."""
    __tracebackhide__ = True
    run_check(TOPK, {"topk_sample_cuda": topk_sample_cuda}, hidden=hidden, seed=seed)


PARTS = [BLOCK_SUM, SOFTMAX, TRANSPOSE, RMSNORM, SGEMM, TOPK]
