"""Split-KV decoding against the float64 reference: contiguous and paged caches, GQA, uneven lengths."""

from __future__ import annotations

import numpy as np
import pytest
from child_env import child_pythonpath

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels, reference  # noqa: E402
from flashcourse.kernels import plan, quantize_kv_cache  # noqa: E402
from flashcourse.kernels.decode import DecodeSwitches, v_keys_adjacent  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def expected(q, k, v, lens):
    """Per sequence, per query head: reference attention over the first lens[b] keys of its KV head."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    batch, h_q, d = q.shape
    group = h_q // k.shape[1]
    out = np.zeros((batch, h_q, d))
    for b in range(batch):
        kb = np.repeat(k[b, :, : lens[b]], group, axis=0)  # (H_q, L, D)
        vb = np.repeat(v[b, :, : lens[b]], group, axis=0)
        if lens[b] > 0:
            out[b] = reference.attention(q[b][:, None], kb, vb)[:, 0]
    return out


def paged(k, v, page_size, rng):
    """The cache cut into pages stored in shuffled order, and the block table that finds them."""
    batch, h_kv, n, d = k.shape
    pages = -(-n // page_size)
    perm = torch.tensor(rng.permutation(batch * pages), dtype=torch.int32)
    table = perm.reshape(batch, pages).to(k.device)

    def store(x):
        padded = torch.zeros(batch, h_kv, pages * page_size, d, dtype=x.dtype, device=x.device)
        padded[:, :, :n] = x
        blocks = padded.reshape(batch, h_kv, pages, page_size, d).permute(0, 2, 1, 3, 4).reshape(-1, h_kv, page_size, d)
        out = torch.empty_like(blocks)
        out[perm.long().to(x.device)] = blocks
        return out

    return store(k), store(v), table


def make(rng, batch, h_q, h_kv, n, d, dtype):
    arrays = [rng.standard_normal(s) for s in ((batch, h_q, d), (batch, h_kv, n, d), (batch, h_kv, n, d))]
    return [torch.tensor(a, dtype=dtype, device=DEVICE) for a in arrays]


@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (4, 4), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_contiguous_cache_uneven_lengths(rng, h_q, h_kv, dtype):
    q, k, v = make(rng, 3, h_q, h_kv, 70, 64, dtype)
    lens = [1, 70, 33]
    o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             num_splits=3)
    assert o.shape == q.shape and o.dtype == dtype
    assert_close(o, expected(q, k, v, lens), what="decode output")


# (page size, block_n): the interpreter's 16-key tiles lie inside a page of 16 or 64; 64-key tiles cover four
# pages of 16 or two of 32 (one table read per page, spread over the tile's rows).
PAGED_TILINGS = [(16, None), (64, None), (16, 64), (32, 64)]


@pytest.mark.parametrize("page_size,block_n", PAGED_TILINGS)
def test_paged_cache_shuffled_table(rng, page_size, block_n):
    """Ragged lengths, none a multiple of the page; the longest sequence is last, so its final tile reaches past
    the block table's last column (entries that must not be read)."""
    q, k, v = make(rng, 3, 8, 2, 75, 80, torch.float16)
    lens = [40, 1, 75]
    kp, vp, table = paged(k, v, page_size, rng)
    o = kernels.flash_decode(q, kp, vp, block_table=table, block_n=block_n,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    assert_close(o, expected(q, k, v, lens), what=f"paged decode output (page size {page_size}, block_n {block_n})")


@pytest.mark.parametrize("num_splits", [1, 3, 100])
@pytest.mark.parametrize("page_size,block_n", [(16, 32), (32, None)])
def test_paged_cache_any_number_of_splits(rng, num_splits, page_size, block_n):
    """Splits start on tile boundaries, never inside a tile's pages, whatever their number."""
    q, k, v = make(rng, 2, 4, 4, 150, 32, torch.float32)
    lens = [150, 97]
    kp, vp, table = paged(k, v, page_size, rng)
    o = kernels.flash_decode(q, kp, vp, block_table=table, block_n=block_n, num_splits=num_splits,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    assert_close(o, expected(q, k, v, lens), what=f"paged decode with {num_splits} splits (page size {page_size})")


@pytest.mark.parametrize("page_size", [8, 24, 1])
def test_bad_page_size(rng, page_size):
    q, k, v = make(rng, 1, 4, 2, 48, 16, torch.float32)
    kp, vp, table = paged(k, v, page_size, rng)
    with pytest.raises(ValueError, match=rf"page_size = {page_size} .*power of two >= 16"):
        kernels.flash_decode(q, kp, vp, block_table=table)


def test_bad_block_n(rng):
    q, k, v = make(rng, 1, 4, 2, 48, 16, torch.float32)
    with pytest.raises(ValueError, match="block_n = 48: expected a power of two >= 16"):
        kernels.flash_decode(q, k, v, block_n=48)


@pytest.mark.parametrize("num_splits", [1, 2, 5, 100])
def test_any_number_of_splits_gives_the_same_answer(rng, num_splits):
    """The combine step is the merge of lesson 02: how the keys are split must not matter."""
    q, k, v = make(rng, 1, 4, 2, 90, 32, torch.float32)
    o = kernels.flash_decode(q, k, v, num_splits=num_splits)
    assert_close(o, expected(q, k, v, [90]), what=f"decode with {num_splits} splits")


def test_split_outputs_combine_with_merge_partials(rng, monkeypatch):
    """What the combine kernel computes, written with reference.merge_partials: the split kernel's two partial
    outputs and lses (read as the combine kernel receives them) are each attention over their own keys, and the
    combine's output is their merge. A call that never splits launches no combine and fails here."""
    from flashcourse.kernels import decode

    combine = decode._decode_combine_kernel
    received = []

    class Spy:  # the combine kernel, its partials copied as it receives them
        def __getattr__(self, name):  # what the launch cache reads of the kernel
            return getattr(combine, name)

        def __getitem__(self, grid):
            def launch(**kwargs):
                received.append((kwargs["O_PART"].clone(), kwargs["LSE_PART"].clone()))
                return combine[grid](**kwargs)
            return launch

    monkeypatch.setattr(decode, "_decode_combine_kernel", Spy())
    q, k, v = make(rng, 1, 2, 2, 50, 16, torch.float64)
    # Key tiles of 16: each split covers whole tiles, cdiv(cdiv(50, 2), 16) * 16 = 32 keys, the second the rest.
    o = kernels.flash_decode(q.float(), k.float(), v.float(), num_splits=2, block_n=16)
    assert len(received) == 1, "two splits must be merged by one combine launch"
    o_part, lse_part = (x[:, :, 0] for x in received[0])  # (1, H_q, 2, BLOCK_D), (1, H_q, 2) of the one new token
    qn, kn, vn = q.numpy()[0][:, None], k.numpy()[0], v.numpy()[0]
    split_len = 32
    o1, lse1 = reference.attention_lse(qn, kn[:, :split_len], vn[:, :split_len])
    o2, lse2 = reference.attention_lse(qn, kn[:, split_len:], vn[:, split_len:])
    assert_close(o_part[0, :, 0, :16], o1[:, 0], what="the first split's partial output")
    assert_close(o_part[0, :, 1, :16], o2[:, 0], what="the second split's partial output")
    assert_close(lse_part[0, :, 0], lse1[:, 0], what="the first split's lse")
    assert_close(lse_part[0, :, 1], lse2[:, 0], what="the second split's lse")
    merged, _ = reference.merge_partials(o1, lse1, o2, lse2)
    assert_close(o, merged[:, 0][None], what="decode vs merge_partials of two splits")


def test_empty_sequence_gives_zero(rng):
    q, k, v = make(rng, 2, 2, 1, 16, 16, torch.float32)
    o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor([0, 16], dtype=torch.int32, device=DEVICE))
    assert torch.all(o[0] == 0)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"q": (2, 3, 16)}, ValueError, "multiple of H_kv"),
        ({"q": (2, 4, 4), "kv": (2, 2, 10, 4)}, ValueError, "head dim 4 is not supported: expected 8 to 256"),
        ({"q": (3, 4, 16)}, ValueError, "batch"),
        ({"q": (2, 4, 1, 1, 16)}, ValueError, r"\(B, H_q, D\).*\(B, H_q, n_new, D\)"),
    ],
)
def test_bad_inputs(rng, kwargs, error, words):
    q = torch.zeros(kwargs["q"], device=DEVICE)
    k = torch.zeros(kwargs.get("kv", (2, 2, 10, 16)), device=DEVICE)
    with pytest.raises(error, match=words):
        kernels.flash_decode(q, k, k.clone())


def test_bad_block_table_and_lengths(rng):
    q, k, v = make(rng, 2, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="int32"):
        kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor([1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="int32"):
        kernels.flash_decode(q, k, v, block_table=torch.zeros(2, 3, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("as_type", [list, tuple])
def test_lengths_as_a_list_or_tuple(rng, as_type):
    q, k, v = make(rng, 3, 4, 2, 40, 16, torch.float32)
    o = kernels.flash_decode(q, k, v, cache_seqlens=as_type([40, 0, 17]), num_splits=2)
    assert_close(o, expected(q, k, v, [40, 0, 17]), what=f"decode with lengths as a {as_type.__name__}")
    with pytest.raises(TypeError, match="expected an int, a list of ints"):
        kernels.flash_decode(q, k, v, cache_seqlens=[40, 0.5, 17])


@pytest.mark.parametrize("lengths,bad", [([41, 3], r"cache_seqlens\[0\] = 41"), ([3, -1], r"cache_seqlens\[1\] = -1")])
@pytest.mark.parametrize("as_tensor", [False, True])
@pytest.mark.parametrize("page_size", [None, 16])
def test_lengths_past_the_cache_are_refused(rng, lengths, bad, as_tensor, page_size):
    """A contiguous cache holds N_max = 40 rows; a paged one max_blocks * page_size = 3 * 16 = 48."""
    q, k, v = make(rng, 2, 4, 2, 40, 16, torch.float32)
    cache = {"k_cache": k, "v_cache": v}
    n_max = 40
    if page_size is not None:
        kp, vp, table = paged(k, v, page_size, rng)
        cache = {"k_cache": kp, "v_cache": vp, "block_table": table}
        n_max = 48
        lengths = [n + 8 if n > 40 else n for n in lengths]  # 49: one row past the table's pages
        bad = bad.replace("41", "49")
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE) if as_tensor else lengths
    with pytest.raises(ValueError, match=rf"{bad}: expected a length from 0 to {n_max}"):
        kernels.flash_decode(q, **cache, cache_seqlens=lens)


@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("page_size", [None, 16])
def test_the_kernel_clamps_lengths_it_was_not_checked_on(rng, monkeypatch, page_size, window):
    """A call that reuses a kept plan does not read a GPU tensor's lengths again; the kernel clamps them to
    0 .. N_max, so a length past the cache reads this sequence's rows alone: two splits of 32 keys cover 64
    rows of a 40-row cache (48 in pages), and a window would start past the cache."""
    from flashcourse.kernels import _checks

    monkeypatch.setattr(_checks, "check_lengths", lambda *args: None)  # as on a kept plan's later calls
    q, k, v = make(rng, 3, 4, 2, 40, 16, torch.float32)
    cache, n_max = {"k_cache": k, "v_cache": v}, 40
    if page_size is not None:
        kp, vp, table = paged(k, v, page_size, rng)
        cache, n_max = {"k_cache": kp, "v_cache": vp, "block_table": table}, 48
    options = {} if window is None else {"window": (window, 0)}
    lens = torch.tensor([200, -5, 23], dtype=torch.int32, device=DEVICE)
    o = kernels.flash_decode(q, **cache, cache_seqlens=lens, num_splits=2, **options)
    k_rows, v_rows = (torch.cat([x, torch.zeros_like(x[:, :, : n_max - 40])], dim=2) for x in (k, v))
    want = expected_variant(q, k_rows, v_rows, [n_max, 0, 23], window_left=window)
    assert_close(o, want, what=f"decode with lengths clamped (pages {page_size}, window {window})")


def test_a_kept_plan_checks_list_lengths_and_clamps_tensor_lengths(rng, monkeypatch):
    """The GPU's path on the CPU: plans kept by key. The second call reuses the first's plan (no second
    check of the inputs); a list's lengths are still checked; a tensor's, changed in place, are clamped."""
    from flashcourse.kernels import call

    made = []
    first_call = call.decode_plan_for
    monkeypatch.setattr(call, "_decode_key", lambda *args: ("one layout",))
    monkeypatch.setattr(call, "decode_plan_for", lambda *args: made.append(1) or first_call(*args))
    monkeypatch.setattr(plan.PLANS, "plans", {})
    q, k, v = make(rng, 2, 4, 2, 32, 16, torch.float32)
    lens = torch.tensor([32, 9], dtype=torch.int32, device=DEVICE)
    kernels.flash_decode(q, k, v, cache_seqlens=lens)
    lens[0] = 100  # in place, past the cache: not read on the host again
    o = kernels.flash_decode(q, k, v, cache_seqlens=lens)
    assert len(made) == 1, "the second call made a plan of its own"
    assert_close(o, expected(q, k, v, [32, 9]), what="a kept plan's call with a length past the cache")
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = 33"):
        kernels.flash_decode(q, k, v, cache_seqlens=[32, 33])


@pytest.mark.parametrize("num_splits,combines", [(1, 0), (3, 1)])
def test_one_split_is_one_launch(rng, monkeypatch, num_splits, combines):
    """One split writes o itself: no partials and no combine kernel (a launch less of host time)."""
    from flashcourse.kernels import decode

    launches = []
    combine = decode._decode_combine_kernel

    class Counted:
        fn = combine.fn

        def __getitem__(self, grid):
            launches.append(grid)
            return combine[grid]

    monkeypatch.setattr(decode, "_decode_combine_kernel", Counted())
    q, k, v = make(rng, 2, 4, 2, 50, 32, torch.float16)
    o = kernels.flash_decode(q, k, v, cache_seqlens=[50, 20], num_splits=num_splits)
    assert len(launches) == combines
    assert_close(o, expected(q, k, v, [50, 20]), what=f"decode in {num_splits} splits")


@pytest.mark.parametrize("num_splits", [1, 3])
def test_a_repeat_call_replays_its_plans_prepared_launches(rng, monkeypatch, num_splits):
    """The GPU's repeat path on the CPU: the first call launches through Triton and its plan keeps the prepared
    launches; the second only swaps its own tensors into them (a slot mixed up would show in its output)."""
    import inspect
    from types import SimpleNamespace

    from triton.runtime.interpreter import InterpretedFunction

    from flashcourse.kernels import call, decode
    from flashcourse.kernels.launch import LaunchCache

    interpreted = InterpretedFunction.__getitem__
    replayed = []

    class Replayed:  # the compiled kernel kernel[grid](...) returns on a GPU; launching it runs the interpreter
        packed_metadata = ()

        def __init__(self, kernel):
            self.kernel, self.params = kernel, list(inspect.signature(kernel.fn).parameters)
            self.src = SimpleNamespace(signature=dict.fromkeys(self.params))

        def __getitem__(self, grid):
            def run(*args):
                replayed.append(self.kernel.fn.__name__)
                interpreted(self.kernel, grid)(**dict(zip(self.params, args, strict=True)))

            return run

    def full_launch(kernel, grid):
        def run(**kwargs):
            interpreted(kernel, grid)(**kwargs)
            return Replayed(kernel)

        return run

    monkeypatch.setattr(InterpretedFunction, "__getitem__", full_launch)
    monkeypatch.setattr(call, "_decode_key", lambda *args: ("one layout", args[-1]))  # kept, as on a GPU
    monkeypatch.setattr(plan.PLANS, "plans", {})
    monkeypatch.setattr(decode, "_LAUNCHES", LaunchCache())
    for step in range(2):
        q, k, v = make(rng, 2, 4, 2, 48, 16, torch.float32)
        lengths = [48, 13 + step]
        o = kernels.flash_decode(q, k, v, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                                 num_splits=num_splits)
        assert_close(o, expected(q, k, v, lengths), what=f"step {step}, {num_splits} splits")
        if step == 0:
            assert replayed == [], "the first call launches through Triton and prepares"
    combine = ["_decode_combine_kernel"] if num_splits > 1 else []
    assert replayed == ["_decode_split_kernel", *combine], "the second call replays the plan's launches"


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), -float("inf"), 0.0, -0.05])
def test_scale_follows_the_attention_rule(rng, scale):
    """Decode and attention share one scale rule (a number from 1e-30 to 1e30): decode's own check let 0 and negatives
    through, and scale=0.0 or -0.05 gave all NaN."""
    q, k, v = make(rng, 1, 4, 2, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"scale is .*: expected a number from 1e-30 to 1e"):
        kernels.flash_decode(q, k, v, scale=scale)
    q4 = q[:, :, None, :]
    with pytest.raises(ValueError, match=r"scale is .*: expected a number from 1e-30 to 1e"):
        kernels.flash_attention(q4, k, v, scale=scale, enable_gqa=True)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_long_cache(rng, dtype, page_size):
    """The GPU's 128-key tiles: a page of 16 gives 8 pages per tile, a page of 256 two tiles per page."""
    q, k, v = make(rng, 2, 32, 8, 20000, 128, dtype)
    lens = [12345, 20000]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if page_size is None:
        o = kernels.flash_decode(q, k, v, cache_seqlens=lens_t)
    else:
        kp, vp, table = paged(k, v, page_size, rng)
        o = kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens_t)
    assert_close(o, expected(q, k, v, lens), what=f"decode at 20K keys (page size {page_size})")


# ------------------------------------------------------------------------------------------ variants (lesson 11)
def expected_variant(q, k, v, lens, *, window_left=None, softcap=None, slopes=None):
    """Float64 decode written from the rules: the new token at position L-1 sees keys max(0, L-1-left)..L-1,
    scores capped as softcap * tanh(s / softcap), then biased by -slope_h * (L - 1 - j)."""
    q, k, v = (t.detach().cpu().double().numpy() for t in (q, k, v))
    batch, h_q, d = q.shape
    group = h_q // k.shape[1]
    out = np.zeros((batch, h_q, d))
    for b in range(batch):
        n = lens[b]
        first = 0 if window_left is None else max(0, n - 1 - window_left)
        for h in range(h_q):
            keys, values = k[b, h // group, first:n], v[b, h // group, first:n]
            s = keys @ q[b, h] / np.sqrt(d)
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            if slopes is not None:
                s = s - float(slopes[h]) * (n - 1 - np.arange(first, n))
            if n > first:
                p = np.exp(s - s.max())
                out[b, h] = p @ values / p.sum()
    return out


@pytest.mark.parametrize("paged_size,block_n", [(None, None), *PAGED_TILINGS])
def test_window_reads_only_the_window(rng, paged_size, block_n):
    """Keys before the window are NaN: a kernel that read them would return NaN (0 * NaN in P V). Paged tiles
    start on a tile boundary, so the first one begins before the window: its early rows must stay unread."""
    q, k, v = make(rng, 3, 4, 2, 90, 32, torch.float32)
    lens = [90, 7, 50]
    left = 20
    for b, n in enumerate(lens):
        k[b, :, : max(0, n - 1 - left)] = float("nan")
        v[b, :, : max(0, n - 1 - left)] = float("nan")
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if paged_size is None:
        o = kernels.flash_decode(q, k, v, cache_seqlens=lens_t, window=(left, 0), num_splits=2)
    else:
        kp, vp, table = paged(k, v, paged_size, rng)
        o = kernels.flash_decode(q, kp, vp, block_table=table, cache_seqlens=lens_t, window=(left, 0),
                                 block_n=block_n)
    assert_close(o, expected_variant(q, k, v, lens, window_left=left),
                 what=f"windowed decode (pages {paged_size}, block_n {block_n})")


@pytest.mark.parametrize("num_splits,page_size", [(1, None), (3, None), (3, 16)])
def test_softcap_and_alibi(rng, num_splits, page_size):
    q, k, v = make(rng, 2, 4, 2, 70, 16, torch.float32)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    lens = [70, 33]
    cache = {"k_cache": k, "v_cache": v}
    if page_size is not None:  # 32-key tiles over pages of 16
        kp, vp, table = paged(k, v, page_size, rng)
        cache = {"k_cache": kp, "v_cache": vp, "block_table": table, "block_n": 32}
    o = kernels.flash_decode(q * 4, **cache, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             softcap=2.0, alibi_slopes=slopes, window=(40, -1), num_splits=num_splits)
    want = expected_variant(q * 4, k, v, lens, window_left=40, softcap=2.0, slopes=slopes.cpu().numpy())
    assert_close(o, want, what=f"decode with softcap, ALiBi and a window ({num_splits} splits, pages {page_size})")


@pytest.mark.parametrize(
    "options,error,words",
    [({"window": 8}, TypeError, "pair of ints"), ({"softcap": 0}, ValueError, "softcap is 0"),
     ({"alibi_slopes": torch.ones(2)}, ValueError, r"expected \(4,\) float32")],
)
def test_bad_variant_options(rng, options, error, words):
    q, k, v = make(rng, 1, 4, 2, 16, 16, torch.float32)
    options = {n: o.to(DEVICE) if isinstance(o, torch.Tensor) else o for n, o in options.items()}
    with pytest.raises(error, match=words):
        kernels.flash_decode(q, k, v, **options)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_window_softcap_alibi(rng, dtype, page_size):
    q, k, v = make(rng, 2, 32, 8, 20000, 128, dtype)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 32) for h in range(32)], device=DEVICE)
    lens = [20000, 12345]
    cache = {"k_cache": k, "v_cache": v}
    if page_size is not None:
        kp, vp, table = paged(k, v, page_size, rng)
        cache = {"k_cache": kp, "v_cache": vp, "block_table": table}
    o = kernels.flash_decode(q, **cache, cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE),
                             window=(4096, 0), softcap=30.0, alibi_slopes=slopes)
    want = expected_variant(q, k, v, lens, window_left=4096, softcap=30.0, slopes=slopes.cpu().numpy())
    assert_close(o, want, what=f"decode at 20K keys, window 4096, softcap 30, ALiBi (page size {page_size})")


# ------------------------------------------------------------------------------------------ FP8 cache
FP8 = torch.float8_e4m3fn


def dequantised(x8, scale):
    """float32 x8 * scale, one factor per (sequence or page, KV head): what the kernel multiplies with."""
    return x8.float() * scale[:, :, None, None]


def unpaged(pool, table):
    """A paged cache (pages, H_kv, page_size, D) read back through its block table: (B, H_kv, pages * size, D)."""
    pages = pool[table.long()]  # (B, max_blocks, H_kv, page_size, D)
    batch, blocks, h_kv, size, d = pages.shape
    return pages.permute(0, 2, 1, 3, 4).reshape(batch, h_kv, blocks * size, d)


def e4m3_rounding_bound(x, scale):
    """How far a value may move when quantised: 3 mantissa bits round a normal number by at most half a step,
    2^-4 of its magnitude; below e4m3's normal range (2^-6 of the scale unit) steps are 2^-9 units, so half of
    that, 2^-10 * scale, absolutely."""
    return 2.0**-4 * x.abs() + 2.0**-10 * scale[:, :, None, None]


@pytest.mark.parametrize("h_q,h_kv", [(4, 2), (4, 4), (8, 1)])
def test_fp8_cache_reads_exactly_the_dequantised_cache(rng, h_q, h_kv):
    """Widening e4m3 to float16 is exact and the scales are two factors per program, so the FP8 cache's output
    is the float16 kernel's on the dequantised cache: float16's tolerance, against float64 on those values.
    Lengths 1, 70 (not a multiple of the 16-key tile) and 33; 3 splits."""
    q, k, v = make(rng, 3, h_q, h_kv, 70, 64, torch.float16)
    lens = [1, 70, 33]
    k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
    assert k8.dtype == v8.dtype == FP8 and k_scale.shape == v_scale.shape == (3, h_kv)
    o = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, num_splits=3,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    assert o.shape == q.shape and o.dtype == torch.float16
    assert_close(o, expected(q, dequantised(k8, k_scale), dequantised(v8, v_scale), lens),
                 what="decode on the FP8 cache vs float64 on its dequantised values")


@pytest.mark.parametrize("page_size,block_n", PAGED_TILINGS)
def test_fp8_paged_cache(rng, page_size, block_n):
    """Shuffled pages quantised through the block table: each sequence's scale comes from its own pages."""
    q, k, v = make(rng, 3, 8, 2, 75, 64, torch.float16)
    lens = [40, 1, 75]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    kp, vp, table = paged(k, v, page_size, rng)
    k8, v8, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens_t)
    o = kernels.flash_decode(q, k8, v8, block_table=table, cache_seqlens=lens_t, block_n=block_n,
                             k_scale=k_scale, v_scale=v_scale)
    k_true = dequantised(unpaged(k8, table), k_scale)  # every page of sequence b read with b's scale
    v_true = dequantised(unpaged(v8, table), v_scale)
    assert_close(o, expected(q, k_true, v_true, lens), what=f"FP8 paged decode (page size {page_size})")


@pytest.mark.parametrize("page_size", [None, 16])
def test_fp8_cache_with_window_softcap_and_alibi(rng, page_size):
    """k_scale joins the score scale before the cap and the bias, so the variants see the true scores."""
    q, k, v = make(rng, 2, 4, 2, 70, 16, torch.float32)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)
    lens = [70, 33]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if page_size is None:
        k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
        cache = {"k_cache": k8, "v_cache": v8}
        k_true, v_true = dequantised(k8, k_scale), dequantised(v8, v_scale)
    else:
        kp, vp, table = paged(k, v, page_size, rng)
        k8, v8, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens_t)
        cache = {"k_cache": k8, "v_cache": v8, "block_table": table, "block_n": 32}
        k_true, v_true = dequantised(unpaged(k8, table), k_scale), dequantised(unpaged(v8, table), v_scale)
    o = kernels.flash_decode(q * 4, **cache, k_scale=k_scale, v_scale=v_scale, cache_seqlens=lens_t, softcap=2.0,
                             alibi_slopes=slopes, window=(40, -1), num_splits=3)
    want = expected_variant(q * 4, k_true, v_true, lens, window_left=40, softcap=2.0, slopes=slopes.cpu().numpy())
    assert_close(o, want, what=f"FP8 decode with softcap, ALiBi and a window (pages {page_size})")


def test_fp8_cache_error_within_the_e4m3_bound(rng):
    """Against float64 on the float16 cache, the FP8 cache's error is bounded by its roundings, to first order:
    |do| <= sum_j p_j |dv_j| + sum_j p_j |v_j - o| |ds_j|, ds_j = scale * sum_d |q_d| |dk_jd| (the scores'
    error), with dk, dv the quantisation errors themselves; a quarter of margin for second-order terms, plus
    float16's tolerance for the kernel's own roundings. It also exceeds float16's error: the bound is not idle."""
    q, k, v = make(rng, 2, 8, 2, 300, 64, torch.float16)
    k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
    o8 = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale).double().numpy()
    o16 = kernels.flash_decode(q, k, v).double().numpy()
    exact = expected(q, k, v, [300, 300])
    qn, kn, vn = (t.double().numpy() for t in (q, k, v))
    dk = np.abs(dequantised(k8, k_scale).double().numpy() - kn)
    dv = np.abs(dequantised(v8, v_scale).double().numpy() - vn)
    group = 4
    for b in range(2):
        for h in range(8):
            s = kn[b, h // group] @ qn[b, h] / 8.0
            p = np.exp(s - s.max())
            p /= p.sum()
            ds = dk[b, h // group] @ np.abs(qn[b, h]) / 8.0
            first_order = p @ dv[b, h // group] + (p * ds) @ np.abs(vn[b, h // group] - exact[b, h])
            err = np.abs(o8[b, h] - exact[b, h])
            assert np.all(err <= 1.25 * first_order + 2e-3), f"(b, h) = ({b}, {h}): {err.max():.3g}"
    assert np.abs(o8 - exact).max() > np.abs(o16 - exact).max()


def test_quantize_kv_cache_round_trip(rng):
    """Scales are amax / 448 per (sequence, KV head); every value comes back within e4m3's rounding; a head of
    zeros gets scale 1 and stays zero."""
    _, k, v = make(rng, 2, 2, 2, 40, 16, torch.float32)
    k[1, 0] = 0.0
    k[0, 1, 3, 5] = 1000.0  # an outlier: its head's scale follows it
    k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
    want = k.abs().amax(dim=(2, 3)) / 448.0
    want[1, 0] = 1.0
    assert torch.allclose(k_scale, want) and k_scale.dtype == torch.float32
    assert float(dequantised(k8, k_scale)[0, 1, 3, 5]) == pytest.approx(1000.0)
    for x, x8, scale in ((k, k8, k_scale), (v, v8, v_scale)):
        assert torch.all((dequantised(x8, scale) - x).abs() <= e4m3_rounding_bound(x, scale))
    assert torch.all(k8[1, 0].float() == 0)


def test_quantize_paged_cache_scales_follow_the_block_table(rng):
    """Without shared pages a sequence's scale is the amax of its own pages (its contiguous cache's scale);
    sequences that share a page (a common prompt prefix) share a scale, the largest of theirs, and each reads
    back its values within e4m3's rounding."""
    _, k, v = make(rng, 3, 2, 2, 64, 16, torch.float32)
    kp, vp, table = paged(k, v, 16, rng)
    _, _, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table)
    _, _, k_scale_c, v_scale_c = quantize_kv_cache(k, v)
    assert torch.equal(k_scale, k_scale_c) and torch.equal(v_scale, v_scale_c)

    pool = torch.tensor(rng.standard_normal((6, 2, 16, 16)), dtype=torch.float32, device=DEVICE)
    pool[5] *= 50  # only sequence 2 lists page 5; sequence 1 shares page 3 with it, sequence 0 shares nothing
    shared = torch.tensor([[0, 1], [2, 3], [3, 5]], dtype=torch.int32, device=DEVICE)
    k8, _, k_scale, _ = quantize_kv_cache(pool, pool, block_table=shared)
    assert k_scale[1].tolist() == k_scale[2].tolist() and torch.all(k_scale[1] > 10 * k_scale[0])
    true = unpaged(pool, shared)
    assert torch.all((dequantised(unpaged(k8, shared), k_scale) - true).abs()
                     <= e4m3_rounding_bound(true, k_scale))


def test_quantize_paged_cache_counts_only_pages_in_use(rng):
    """Pages past a sequence's length (here a stale, huge one) do not set its scale."""
    pool = torch.tensor(rng.standard_normal((4, 1, 16, 16)), dtype=torch.float32, device=DEVICE)
    pool[3] = 1e4
    table = torch.tensor([[0, 3], [1, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([16, 32], dtype=torch.int32, device=DEVICE)
    _, _, k_scale, _ = quantize_kv_cache(pool, pool, block_table=table, cache_seqlens=lens)
    assert float(k_scale[0, 0]) == pytest.approx(float(pool[0].abs().max()) / 448)


def test_quantize_contiguous_cache_counts_only_rows_in_use(rng):
    """Rows past a sequence's length (stale, huge) do not set its scale; they are clamped, never NaN."""
    _, k, v = make(rng, 2, 1, 2, 32, 16, torch.float32)
    k[0, :, 20:] = 1e4
    lens = torch.tensor([20, 32], dtype=torch.int32, device=DEVICE)
    k8, _, k_scale, _ = quantize_kv_cache(k, v, cache_seqlens=lens)
    assert torch.allclose(k_scale[0], k[0, :, :20].abs().amax(dim=(1, 2)) / 448)
    assert torch.allclose(k_scale[1], k[1].abs().amax(dim=(1, 2)) / 448)
    assert not torch.isnan(k8.float()).any()
    with pytest.raises(ValueError, match="one length per sequence"):
        quantize_kv_cache(k, v, cache_seqlens=lens[:1])


@pytest.mark.parametrize("page_size", [16, 32])
def test_quantize_one_stale_row_rule_for_both_layouts(rng, page_size):
    """Rows past a sequence's length set no scale, in a contiguous cache and on a paged sequence's last page
    alike: the same cache, cut into pages, gets the same scales. Lengths 20 and 41 end inside a page."""
    _, k, v = make(rng, 2, 2, 2, 64, 16, torch.float32)
    lens = torch.tensor([20, 41], dtype=torch.int32, device=DEVICE)
    for b, n in enumerate(lens.tolist()):
        k[b, :, n:] = 1e4  # stale rows, huge
    _, _, k_scale, v_scale = quantize_kv_cache(k, v, cache_seqlens=lens)
    kp, vp, table = paged(k, v, page_size, rng)
    k8, _, k_scale_p, v_scale_p = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens)
    assert torch.equal(k_scale_p, k_scale) and torch.equal(v_scale_p, v_scale)
    assert torch.all(k_scale < 10 / 448), "a stale row set a scale"
    assert not torch.isnan(k8.float()).any()


def test_quantize_shared_page_covers_every_sharers_rows(rng):
    """Page 1 is sequence 0's last page (2 rows in use) and sequence 1's full middle page: its rows past
    sequence 0's length are in use by sequence 1, so they set the scale both share."""
    pool = torch.tensor(rng.standard_normal((3, 1, 16, 16)), dtype=torch.float32, device=DEVICE)
    pool[1, :, 10] = 300.0  # a row sequence 0 does not use and sequence 1 does
    table = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([18, 32], dtype=torch.int32, device=DEVICE)
    k8, _, k_scale, _ = quantize_kv_cache(pool, pool, block_table=table, cache_seqlens=lens)
    assert float(k_scale[0, 0]) == float(k_scale[1, 0]) == pytest.approx(300.0 / 448)
    assert float(dequantised(k8[1:2], k_scale[:1])[0, 0, 10, 0]) == pytest.approx(300.0)


def fp8_call(rng, **change):
    q, k, v = make(rng, 2, 4, 2, 32, 16, torch.float32)
    k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
    args = {"q": q, "k_cache": k8, "v_cache": v8, "k_scale": k_scale, "v_scale": v_scale} | change
    return lambda: kernels.flash_decode(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)


@pytest.mark.parametrize(
    "change,error,words",
    [({"k_scale": None}, ValueError, r"float8_e4m3fn but k_scale is None"),
     ({"v_scale": torch.ones(2, 4)}, ValueError, r"v_scale is \(2, 4\) torch.float32: expected \(2, 2\) float32"),
     ({"k_scale": torch.ones(2, 2, dtype=torch.float16)}, ValueError, r"expected \(2, 2\) float32"),
     ({"k_scale": 0.5}, ValueError, "k_scale is float: expected"),
     ({"v_cache": torch.zeros(2, 2, 32, 16)}, TypeError, "float8_e4m3fn but v_cache is torch.float32")],
)
def test_bad_fp8_cache_inputs(rng, change, error, words):
    change = {n: c.to(DEVICE) if isinstance(c, torch.Tensor) else c for n, c in change.items()}
    with pytest.raises(error, match=words):
        fp8_call(rng, **change)()


def test_scales_for_a_16_bit_cache_are_refused(rng):
    q, k, v = make(rng, 2, 4, 2, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="k_scale given, but the cache is torch.float32"):
        kernels.flash_decode(q, k, v, k_scale=torch.ones(2, 2, device=DEVICE))


# The split kernel's switches (chosen per call unless given), and V stored keys-adjacent.
def fp8_cache(rng, h_q, h_kv, page_size, v_layout, n=70, batch=3):
    """(q, k8, v8, options, k_true, v_true): an FP8 cache, contiguous or in shuffled pages, V in the given layout,
    with the dequantised values it holds (contiguous)."""
    q, k, v = make(rng, batch, h_q, h_kv, n, 64, torch.float16)
    lens = torch.tensor([1, n, 33][:batch], dtype=torch.int32, device=DEVICE)
    options = {"cache_seqlens": lens}
    if page_size is None:
        k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
        k_true, v_true = dequantised(k8, k_scale), dequantised(v8, v_scale)
    else:
        kp, vp, table = paged(k, v, page_size, rng)
        k8, v8, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens)
        k_true, v_true = dequantised(unpaged(k8, table), k_scale), dequantised(unpaged(v8, table), v_scale)
        options["block_table"] = table
    if v_layout == "keys_adjacent":
        v8 = v_keys_adjacent(v8)
        assert v8.stride(2) == 1 and torch.equal(v8.float(), v8.contiguous().float())
    return q, k8, v8, options | {"k_scale": k_scale, "v_scale": v_scale}, k_true, v_true


# (V's layout, switches): the defaults (whole tiles unmasked exactly for V keys-adjacent), and each layout with
# the other choice forced, so that both loops run on both layouts.
LAYOUT_SWITCHES = {"as given": ("as_given", None), "keys-adjacent": ("keys_adjacent", None),
                   "as given, tail apart": ("as_given", DecodeSwitches(mask_tail_only=True)),
                   "keys-adjacent, masked": ("keys_adjacent", DecodeSwitches(programs_per_sm=2, mask_tail_only=False))}


@pytest.mark.parametrize("page_size", [None, 16])
@pytest.mark.parametrize("case", list(LAYOUT_SWITCHES))
def test_fp8_cache_reads_the_dequantised_cache_in_either_v_layout(rng, case, page_size):
    """V as given and stored keys-adjacent, with the default switches and the other choice forced, contiguous and
    paged, GQA groups 1 and 4: the output is attention in float64 on the dequantised cache, at float16's
    tolerance. Lengths 1, 70 and 33 (not multiples of the 16-key tile), 3 splits: whole tiles, tails, and a split
    with no key."""
    v_layout, switches = LAYOUT_SWITCHES[case]
    for h_q, h_kv in ((2, 2), (8, 2)):
        q, k8, v8, options, k_true, v_true = fp8_cache(rng, h_q, h_kv, page_size, v_layout)
        o = kernels.flash_decode(q, k8, v8, num_splits=3, switches=switches, **options)
        assert_close(o, expected(q, k_true, v_true, options["cache_seqlens"].tolist()),
                     what=f"FP8 decode, V {case}, pages {page_size}, GQA {h_q // h_kv}")


def test_float16_cache_with_v_keys_adjacent(rng):
    q, k, v = make(rng, 3, 8, 2, 70, 64, torch.float16)
    lens = [1, 70, 33]
    o = kernels.flash_decode(q, k, v_keys_adjacent(v), num_splits=3,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    assert_close(o, expected(q, k, v, lens), what="float16 decode, V keys-adjacent")


def test_v_keys_adjacent_with_a_window_softcap_and_alibi(rng):
    """A paged window keeps its masks on every tile (its first tile may start before the window)."""
    q, k8, v8, options, k_true, v_true = fp8_cache(rng, 8, 2, 16, "keys_adjacent")
    slopes = torch.linspace(0.5, 0.0625, 8, device=DEVICE)
    o = kernels.flash_decode(q * 4, k8, v8, num_splits=2, window=(40, -1), softcap=2.0, alibi_slopes=slopes,
                             **options)
    want = expected_variant(q * 4, k_true, v_true, options["cache_seqlens"].tolist(), window_left=40, softcap=2.0,
                            slopes=slopes.cpu().numpy())
    assert_close(o, want, what="FP8 decode, V keys-adjacent, with a window, softcap and ALiBi")


@pytest.mark.parametrize("gpu,block_d,fp8_cache,keys_adjacent,want", [
    ("H200", 128, True, False, DecodeSwitches(2, False)),   # measured: 1.26-1.49x the float16 cache
    ("H200", 128, True, True, DecodeSwitches(2, True)),     # V keys-adjacent: up to 1.79x
    ("H100", 64, True, False, DecodeSwitches(2, False)),    # the same SM, a smaller row
    ("H200", 128, False, False, DecodeSwitches(1, False)),  # the float16 cache streams near the bandwidth alone
    ("H200", 128, False, True, DecodeSwitches(1, True)),
    ("H200", 256, True, False, DecodeSwitches(1, False)),   # 512-byte rows: its own launch, unmeasured
    ("L4", 128, True, False, DecodeSwitches(1, False)),     # unmeasured
])
def test_default_switches(gpu, block_d, fp8_cache, keys_adjacent, want):
    from flashcourse.kernels import configs, decode

    got = decode.default_switches(configs.KNOWN_DEVICES[gpu], block_d, 2, fp8_cache=fp8_cache,
                                  v_keys_adjacent=keys_adjacent)
    assert got == want


def test_a_call_takes_the_default_switches_and_fills_in_what_it_leaves(rng, monkeypatch):
    """On an H200 (its properties, the kernels in the interpreter) the FP8 cache's plan gets two programs per SM
    and the float16 cache's one; whole tiles run unmasked exactly for V stored keys-adjacent; a DecodeSwitches
    with a field left None gets that field chosen as by default."""
    from flashcourse.kernels import configs

    monkeypatch.setattr(configs, "device_props", lambda device: configs.KNOWN_DEVICES["H200"])
    planned = []
    make_plan = plan.DecodePlan.__init__

    def record(self, *args, **kwargs):
        planned.append(args[-3])  # the switches, before the padded head dim and the products' precision
        make_plan(self, *args, **kwargs)

    monkeypatch.setattr(plan.DecodePlan, "__init__", record)
    q, k8, v8, options, k_true, v_true = fp8_cache(rng, 8, 2, None, "as_given")
    lens = options["cache_seqlens"].tolist()
    for v, switches in ((v8, None), (v_keys_adjacent(v8), None), (v8, DecodeSwitches(mask_tail_only=True)),
                        (v_keys_adjacent(v8), DecodeSwitches(programs_per_sm=1))):
        o = kernels.flash_decode(q, k8, v, switches=switches, **options)
        assert_close(o, expected(q, k_true, v_true, lens), what="FP8 decode with an H200's launch")
    k, v = (x.to(torch.float16) for x in (k_true, v_true))
    kernels.flash_decode(q, k, v, cache_seqlens=options["cache_seqlens"])
    assert planned == [DecodeSwitches(2, False), DecodeSwitches(2, True), DecodeSwitches(2, True),
                       DecodeSwitches(1, True), DecodeSwitches(1, False)]


@pytest.mark.parametrize("switches,error,words", [
    ("no programs", ValueError, "programs_per_sm = 0: expected an int, at least 1"),
    ("half a program", ValueError, "programs_per_sm = 1.5: expected an int"),
    ("a dict", TypeError, "switches is a dict: expected a DecodeSwitches"),
])
def test_bad_switches(rng, switches, error, words):
    bad = {"no programs": DecodeSwitches(programs_per_sm=0), "half a program": DecodeSwitches(programs_per_sm=1.5),
           "a dict": {"programs_per_sm": 2}}[switches]
    q, k, v = make(rng, 1, 2, 2, 20, 64, torch.float32)
    with pytest.raises(error, match=words):
        kernels.flash_decode(q, k, v, switches=bad)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_fp8_cache_v_keys_adjacent_long(rng, page_size):
    """V stored keys-adjacent on the GPU at 20K keys, the default launch (on sm_90 two programs per SM, whole
    tiles unmasked), against the dequantised values; lengths 20000 and 1 off the tile."""
    q, k8, v8, options, k_true, v_true = fp8_cache(rng, 32, 8, page_size, "keys_adjacent", n=20000, batch=2)
    o = kernels.flash_decode(q, k8, v8, **options)
    assert_close(o, expected(q, k_true, v_true, options["cache_seqlens"].tolist()),
                 what=f"FP8 decode at 20K keys, V keys-adjacent, pages {page_size}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("page_size", [None, 16, 256])
def test_gpu_fp8_cache_long(rng, dtype, page_size):
    """The GPU's default launch for the FP8 cache (on sm_90 two programs per SM) at 20K keys, against its
    dequantised values."""
    q, k, v = make(rng, 2, 32, 8, 20000, 128, dtype)
    lens = [12345, 20000]
    lens_t = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    if page_size is None:
        k8, v8, k_scale, v_scale = quantize_kv_cache(k, v)
        o = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, cache_seqlens=lens_t)
        k_true, v_true = dequantised(k8, k_scale), dequantised(v8, v_scale)
    else:
        kp, vp, table = paged(k, v, page_size, rng)
        k8, v8, k_scale, v_scale = quantize_kv_cache(kp, vp, block_table=table, cache_seqlens=lens_t)
        o = kernels.flash_decode(q, k8, v8, k_scale=k_scale, v_scale=v_scale, block_table=table, cache_seqlens=lens_t)
        k_true, v_true = dequantised(unpaged(k8, table), k_scale), dequantised(unpaged(v8, table), v_scale)
    assert_close(o, expected(q, k_true, v_true, lens), what=f"FP8 cache decode at 20K keys (page size {page_size})")


@pytest.mark.parametrize("gpu,refused", [("T4", True), ("A100", True), ("A10", True), ("L4", False), ("H200", False)])
def test_fp8_cache_needs_compute_capability_8_9(monkeypatch, gpu, refused):
    """Triton compiles float8_e4m3fn from sm_89 on: older GPUs get an error naming what is needed."""
    from flashcourse.kernels import _checks, configs

    monkeypatch.setattr(configs, "device_props", lambda device: configs.KNOWN_DEVICES[gpu])
    cache = torch.zeros(1, 1, 16, 16).to(FP8)
    if refused:
        with pytest.raises(RuntimeError, match=r"compute capability 8\.9 or newer .*L4"):
            _checks.check_fp8_cache_device(cache, "k_cache")
    else:
        _checks.check_fp8_cache_device(cache, "k_cache")


# ------------------------------------------------------------------------------------------ the benchmark's rows
def test_decode_benchmark_rows_on_cpu(monkeypatch):
    """``bench.decode.run`` end to end at a tiny size (kernels in the interpreter, fake timers): one contiguous
    row per KV length, one paged row per page size with ``page_size`` and ``ratio_vs_contiguous``, every figure
    a median with its range; the table renders these rows and the older files' alike."""
    from flashcourse.bench import decode as decode_bench
    from flashcourse.bench import load_results

    times = iter([1.0, 2.0, 1.0, 1.2, 2.0, 1.1] * 10)  # contiguous, paged 16, paged 32, one round after another
    monkeypatch.setattr(decode_bench, "graph_ms", lambda fn, rep=0: next(times))
    monkeypatch.setattr(decode_bench, "copy_bandwidth", lambda: 3e12)
    monkeypatch.setattr(decode_bench, "read_bandwidth", lambda: 2.9e12)
    make_cache = decode_bench.make_cache
    monkeypatch.setattr(decode_bench, "make_cache", lambda *shape: make_cache(*shape, dtype=torch.float32,
                                                                              device=DEVICE))
    rows = decode_bench.run(shapes=((1, 4, 2, 16, 64),), providers=("flashcourse", "flashcourse_paged"),
                            page_sizes=(16, 32), kv_dtypes=("float16",), rotate_bytes=0, log=lambda line: None)
    ours = [r for r in rows if r["provider"] == "flashcourse"]
    paged_rows = {r["page_size"]: r for r in rows if r["provider"] == "flashcourse_paged"}
    assert len(ours) == 1 and sorted(paged_rows) == [16, 32]
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-5 and r["repeats"] == 3
               for r in [*ours, *paged_rows.values()])
    assert ours[0]["ms"] == 1.0 and (ours[0]["ms_min"], ours[0]["ms_max"]) == (1.0, 1.2)
    assert paged_rows[16]["ms"] == 2.0 and paged_rows[32]["ms"] == 1.0
    assert paged_rows[16]["ratio_vs_contiguous"] == pytest.approx(0.5)
    assert paged_rows[16]["ratio_vs_contiguous_min"] == pytest.approx(1.0 / 2.0)  # its slowest over their fastest
    assert paged_rows[32]["ratio_vs_contiguous_max"] == pytest.approx(1.2 / 1.0)
    assert ours[0]["bandwidth_tbs_min"] < ours[0]["bandwidth_tbs"] == ours[0]["bandwidth_tbs_max"]
    table = decode_bench.format_table(rows)
    assert "flashcourse_paged" in table and "0.50" in table
    for recorded in load_results("*-decode.json"):  # history: no page_size, no ranges
        assert "flashcourse_paged" in decode_bench.format_table(recorded["rows"])


# ------------------------------------------------------------------------------------------ the compiled pipeline
SM90_SHARED_MEMORY = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flashcourse.kernels.decode import _decode_split_kernel as kernel

names = kernel.arg_names
shared, byte_reads = {}, {}
copies = {}
# (page size, K/V dtype, V's layout): the default kernel, then the FP8 cache with V stored keys-adjacent (whole
# tiles unmasked, as flash_decode runs that layout), contiguous and in pages of 256
cases = [(None, "fp16", ""), (16, "fp16", ""), (256, "fp16", ""), (None, "fp8e4nv", ""), (16, "fp8e4nv", ""),
         (None, "fp8e4nv", "keys_adjacent"), (256, "fp8e4nv", "keys_adjacent")]
for page_size, kv, v_layout in cases:
    # what the launcher specialises: 1, or divisible by 16 (SPLIT_LEN is a multiple of BLOCK_N, N_MAX here 32K)
    unit_strides = ("stride_qd", "stride_kd", "stride_od", "stride_vn" if v_layout else "stride_vd")
    pointers = {"Q": "*fp16", "K": f"*{kv}", "V": f"*{kv}", "BLOCK_TABLE": "*i32", "SEQLENS": "*i32",
                "K_SCALE": "*fp32", "V_SCALE": "*fp32", "O_PART": "*fp32", "LSE_PART": "*fp32", "ALIBI_SLOPES": "*fp32",
                "OUT": "*fp16", "LEFTPAD": "*i32"}
    values = dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_N=128, PAGED=page_size is not None,
                  PAGE_SIZE=page_size or 1, HAS_SEQLENS=True, HAS_WINDOW=False, HAS_SOFTCAP=False,
                  HAS_ALIBI=False, DOT_PRECISION="ieee", KV_FP8=kv != "fp16", DIRECT=False,
                  MASK_TAIL_ONLY=bool(v_layout), ROW_MASKS=False, CAUSAL=False, HAS_LEFTPAD=False,
                  **dict.fromkeys(unit_strides, 1))
    signature = {n: "constexpr" if n in values else pointers.get(n, "fp32" if n in ("qk_scale", "softcap2") else "i32")
                 for n in names}
    constexprs = {(names.index(n),): v for n, v in values.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if n in pointers or n in ("N_MAX", "SPLIT_LEN")
             or (n.startswith("stride_") and n not in unit_strides and "_bt_" not in n)}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
    name = f"{kv} {page_size}" + (f" {v_layout}" if v_layout else "")
    shared[name] = compiled.metadata.shared
    byte_reads[name] = len(re.findall(r"ld\.shared\.[bus]8", compiled.asm["ptx"]))
    sizes = re.findall(r"cp\.async\.\w+\.shared\.global \[[^]]*\], \[[^]]*\], (\w+)", compiled.asm["ptx"])
    copies[name] = {size: sizes.count(size) for size in sorted(set(sizes))}  # asynchronous copies by bytes (0x10)
json.dump({"shared": shared, "byte_reads": byte_reads, "copies": copies}, sys.stdout)
"""


def test_paged_tiles_keep_the_contiguous_pipeline():
    """Compiled for an H100/H200 (sm_90, no GPU needed), the paged kernel holds as many K/V tiles in flight in
    shared memory as the contiguous one. A block-table load that feeds the K/V addresses in the same loop step
    (the old per-row lookup) made Triton's pipeliner prefetch one tile ahead instead of two: half the buffers,
    0.66x the contiguous cache's bandwidth on the H200. The FP8 cache's kernel stages one-byte tiles: about half
    the float16 kernel's shared memory, contiguous and paged alike. With V as given it copies V in 8-byte pieces
    and reads it from shared memory a byte at a time (P V's operand wants the keys adjacent; sm_90 has no 8-bit
    ldmatrix.trans); with V stored keys-adjacent, contiguous and in pages of 256, its copies are 16 bytes wide and
    no read is one byte."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", SM90_SHARED_MEMORY], capture_output=True, text=True, env=env,
                          timeout=600)
    no_ptxas = "ptxas" in done.stderr and ("not found" in done.stderr or "No such file" in done.stderr)
    if done.returncode != 0 and no_ptxas:
        pytest.skip("Triton's ptxas is missing here: cannot compile for sm_90")
    assert done.returncode == 0, f"the decode kernel does not compile for sm_90:\n{done.stderr[-3000:]}"
    compiled = json.loads(done.stdout.strip().splitlines()[-1])
    shared, byte_reads, copies = compiled["shared"], compiled["byte_reads"], compiled["copies"]
    assert shared["fp16 16"] == shared["fp16 256"] == shared["fp16 None"], f"shared memory (bytes): {shared}"
    assert shared["fp8e4nv 16"] == shared["fp8e4nv None"] <= 0.6 * shared["fp16 None"], shared
    assert byte_reads["fp16 None"] == 0 and byte_reads["fp8e4nv None"] >= 64, byte_reads
    adjacent = ("fp8e4nv None keys_adjacent", "fp8e4nv 256 keys_adjacent")
    assert all(byte_reads[name] == 0 for name in adjacent), byte_reads
    # V as given: its copies 8 bytes wide; keys-adjacent: as many copies, all 16 bytes wide (V masked along the
    # keys on every tile would be loaded through registers instead, a byte at a time)
    assert "0x8" in copies["fp8e4nv None"] and "0x8" not in copies["fp16 None"], copies
    assert all(copies[name] == {"0x10": sum(copies["fp8e4nv None"].values())} for name in adjacent), copies
