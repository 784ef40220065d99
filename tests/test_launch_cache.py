"""The launch cache (kernels/launch.py): tensors swapped into the remembered argument list, stale pointers
refused, keys that change whenever Triton's specialisation would, used only where Triton's compiled kernels
follow the launcher convention it relies on (else, or when turned off, every call takes the plain launch); on a
GPU, repeat calls that hit it give the same results as the reference, new layouts miss it, and a forced fallback
gives the same results with nothing cached."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
from flashcourse import kernels, reference  # noqa: E402
from flashcourse.kernels import forward, plan  # noqa: E402
from flashcourse.kernels.launch import LaunchCache, cached_launch_supported, layout_key  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _kernel(Q, O, n, BLOCK=16):  # a stand-in for a @triton.jit function: launch.py reads only its signature
    pass


class FakeJit:
    fn = staticmethod(_kernel)


class FakeSource:
    signature = {"Q": "*fp32", "O": "*fp32", "n": "i32", "BLOCK": "constexpr"}  # every parameter, by name


class FakeCompiled:
    """What Triton 3.6's CompiledKernel offers the cache: packed_metadata, src.signature and [grid](*args)."""

    packed_metadata = object()
    src = FakeSource()

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


def test_a_hit_swaps_this_calls_tensors_into_the_remembered_arguments():
    cache, compiled = LaunchCache(), FakeCompiled()
    q, o = torch.zeros(4), torch.zeros(4)
    cache.remember("key", FakeJit, compiled, (3, 2), {"Q": q, "O": o, "n": 4}, ("Q", "O"))
    q2, o2 = torch.ones(4), torch.ones(4)
    assert cache.run("key", (q2, o2))
    grid, args = compiled.launches[-1]
    assert grid == (3, 2, 1) and args[0] is q2 and args[1] is o2 and args[2:] == (4, 16)  # the default filled in
    assert not cache.run("other key", (q2, o2)) and not cache.run(None, (q2, o2))


def test_arguments_are_slotted_by_name_so_one_tensor_passed_twice_is_two_slots():
    cache, compiled, x = LaunchCache(), FakeCompiled(), torch.zeros(4)
    cache.remember("key", FakeJit, compiled, (1,), {"Q": x, "O": x, "n": 4}, ("Q", "O"))  # q is o at first
    q, o = torch.zeros(4), torch.ones(4)
    cache.run("key", (q, o))
    assert compiled.launches[-1][1][:2] == (q, o)


def _kernel_tensors_last(n, Q, O, BLOCK=16):  # per-call tensors after a constant: swapped in one by one
    pass


class TensorsLastJit:
    fn = staticmethod(_kernel_tensors_last)


class TensorsLastSource:
    signature = {"n": "i32", "Q": "*fp32", "O": "*fp32", "BLOCK": "constexpr"}


class TensorsLastCompiled(FakeCompiled):
    src = TensorsLastSource()


@pytest.mark.parametrize("jit,compiled,order", [(FakeJit, FakeCompiled, ("Q", "O", "n", "BLOCK")),
                                                 (TensorsLastJit, TensorsLastCompiled, ("n", "Q", "O", "BLOCK"))],
                         ids=["tensors-first", "tensors-after-a-constant"])
def test_tensors_land_in_their_parameters_wherever_the_signature_puts_them(jit, compiled, order):
    cache, compiled = LaunchCache(), compiled()
    cache.remember("key", jit, compiled, (1,), {"Q": torch.zeros(4), "O": torch.zeros(4), "n": 4}, ("O", "Q"))
    q, o = torch.ones(4), torch.ones(4)
    cache.run("key", (o, q))  # in the order of the names given: O first
    got = dict(zip(order, compiled.launches[-1][1], strict=True))
    assert got["Q"] is q and got["O"] is o and got["n"] == 4 and got["BLOCK"] == 16


def test_a_stand_in_follows_the_tensor_it_stands_in_for():
    cache, compiled, q = LaunchCache(), FakeCompiled(), torch.zeros(4)
    cache.remember("key", FakeJit, compiled, (1,), {"Q": q, "O": q, "n": 4}, ("Q",))  # O: q as a stand-in
    q2 = torch.ones(4)
    cache.run("key", (q2,))
    assert compiled.launches[-1][1][0] is q2 and compiled.launches[-1][1][1] is q2


def test_the_cache_keeps_no_tensor_of_the_call_that_filled_it_alive():
    import weakref

    cache, q = LaunchCache(), torch.zeros(4)
    cache.remember("key", FakeJit, FakeCompiled(), (1,), {"Q": q, "O": q, "n": 4}, ("Q",))
    gone = weakref.ref(q)
    del q
    assert gone() is None


def test_a_tensor_that_is_not_a_per_call_tensor_is_refused():
    q, stale = torch.zeros(4), torch.zeros(4)
    with pytest.raises(ValueError, match="stale pointer"):
        LaunchCache().remember("key", FakeJit, FakeCompiled(), (1,), {"Q": q, "O": stale, "n": 4}, ("Q",))


def test_nothing_is_kept_without_a_key_or_a_compiled_kernel_and_the_oldest_goes_first():
    cache, q = LaunchCache(capacity=2), torch.zeros(4)
    cache.remember(None, FakeJit, FakeCompiled(), (1,), {"Q": q, "O": q, "n": 4}, ("Q",))
    cache.remember("interpreted", FakeJit, None, (1,), {"Q": q, "O": q, "n": 4}, ("Q",))  # the interpreter's
    assert len(cache) == 0
    for key in ("a", "b", "c"):
        cache.remember(key, FakeJit, FakeCompiled(), (1,), {"Q": q, "O": q, "n": 4}, ("Q",))
    assert len(cache) == 2 and not cache.run("a", (q,)) and cache.run("c", (q,))


class FakeDriver:
    """Triton's active driver as the direct launch asks it: the current device, then its current stream."""

    @staticmethod
    def get_current_device():
        return 0

    @staticmethod
    def get_current_stream(device):
        return 1000 + device


class DirectCompiled(FakeCompiled):
    """Triton 3.6's CompiledKernel as its runner uses it: ``run`` (the launcher), ``function``, ``packed_metadata``."""

    function = 77
    packed_metadata = (4, 1, 0)

    def run(self, *args):
        self.launches.append(("run", args))

    def __getitem__(self, grid):
        return lambda *args: self.launches.append(("runner", grid, args))


def _direct_setup(monkeypatch, versions=("3.6", "3.9")):
    import triton
    from triton.runtime import driver

    from flashcourse.kernels import launch

    monkeypatch.setattr(driver, "_active", FakeDriver())
    monkeypatch.setattr(launch, "DIRECT_LAUNCH_TRITON", versions)
    monkeypatch.setattr(triton, "__version__", "3.6.0")


def test_a_prepared_launch_calls_the_launcher_as_tritons_runner_would_when_no_hook_is_installed(monkeypatch):
    _direct_setup(monkeypatch)
    cache, compiled = LaunchCache(), DirectCompiled()
    cache.remember("key", FakeJit, compiled, (3, 2), {"Q": torch.zeros(4), "O": torch.zeros(4), "n": 4}, ("Q", "O"))
    q, o = torch.ones(4), torch.ones(4)
    assert cache.run("key", (q, o))
    how, args = compiled.launches[-1]
    # grid, the current stream, the function, the metadata, no launch metadata and no hooks, then every argument
    assert how == "run" and args[:9] == (3, 2, 1, 1000, 77, (4, 1, 0), None, None, None)
    assert args[9] is q and args[10] is o and args[11:] == (4, 16)


def test_with_a_launch_hook_installed_a_prepared_launch_takes_tritons_runner(monkeypatch):
    from triton import knobs

    _direct_setup(monkeypatch)
    cache, compiled = LaunchCache(), DirectCompiled()
    cache.remember("key", FakeJit, compiled, (3, 2), {"Q": torch.zeros(4), "O": torch.zeros(4), "n": 4}, ("Q", "O"))

    def hook(metadata):  # a profiler's
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        cache.run("key", (torch.ones(4), torch.ones(4)))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert compiled.launches[-1][:2] == ("runner", (3, 2, 1))  # the runner builds the metadata and calls the hooks
    cache.run("key", (torch.ones(4), torch.ones(4)))
    assert compiled.launches[-1][0] == "run"  # hook gone: direct again


def test_on_a_triton_whose_runner_was_not_read_a_prepared_launch_takes_the_runner(monkeypatch):
    _direct_setup(monkeypatch, versions=())
    cache, compiled = LaunchCache(), DirectCompiled()
    cache.remember("key", FakeJit, compiled, (3,), {"Q": torch.zeros(4), "O": torch.zeros(4), "n": 4}, ("Q", "O"))
    cache.run("key", (torch.ones(4), torch.ones(4)))
    assert compiled.launches[-1][:2] == ("runner", (3, 1, 1))


class ShortSource:
    signature = {"Q": "*fp32", "O": "*fp32", "n": "i32"}  # no constexpr BLOCK


class OtherConventionCompiled(FakeCompiled):
    """A compiled kernel whose launcher would take the non-constexpr arguments only: its signature is shorter."""

    src = ShortSource()


class NoSignatureCompiled(FakeCompiled):
    src = None


@pytest.mark.parametrize("compiled", [None, OtherConventionCompiled(), NoSignatureCompiled()],
                         ids=["interpreter", "constexprs-not-passed", "no-signature"])
def test_without_the_launcher_convention_nothing_is_kept_and_calls_take_the_plain_launch(compiled):
    cache, q = LaunchCache(), torch.zeros(4)
    cache.remember("key", FakeJit, compiled, (1,), {"Q": q, "O": q, "n": 4}, ("Q",))
    assert len(cache) == 0 and not cache.run("key", (q,))  # run() False: the caller launches kernel[grid](...)


def test_the_convention_is_judged_by_attributes():
    params = ("Q", "O", "n", "BLOCK")
    assert cached_launch_supported(FakeCompiled(), params)
    assert not cached_launch_supported(FakeCompiled(), params[:3])  # another kernel's parameters
    assert not cached_launch_supported(OtherConventionCompiled(), params)
    assert not cached_launch_supported(object(), params)


def test_the_cache_can_be_turned_off(monkeypatch):
    q = torch.zeros(4)
    for cache in (LaunchCache(enabled=False), _with_env(monkeypatch, "0")):
        cache.remember("key", FakeJit, FakeCompiled(), (1,), {"Q": q, "O": q, "n": 4}, ("Q",))
        assert len(cache) == 0 and not cache.run("key", (q,))
    assert _with_env(monkeypatch, "1").enabled


def _with_env(monkeypatch, value: str) -> LaunchCache:
    monkeypatch.setenv("FLASHCOURSE_LAUNCH_CACHE", value)
    return LaunchCache()


def test_the_layout_key_changes_with_everything_triton_specialises_on():
    x = torch.zeros(2, 3, 32, 16)
    key = layout_key(x)
    assert layout_key(torch.zeros(2, 3, 32, 16)) == key
    assert layout_key(x.transpose(1, 2)) != key  # strides
    assert layout_key(torch.zeros(2, 3, 33, 16)) != key  # shape
    assert layout_key(x.half()) != key  # dtype
    unaligned = torch.zeros(2 * 3 * 32 * 16 + 1)[1:].view(2, 3, 32, 16)  # 4 bytes past an aligned start
    assert layout_key(unaligned) != key


def test_cpu_tensors_and_rules_with_tensors_of_their_own_are_never_cached():
    from flashcourse.kernels.rules import Rules, causal_rules

    v7, q = forward.FORWARD_VERSIONS["v7"], torch.zeros(1, 2, 4, 16)
    assert forward._launch_key(v7, causal_rules(True), None, None, q, q, q) is None  # the interpreter's tensors
    if DEVICE == "cuda":
        q = q.cuda()
        assert forward._launch_key(v7, causal_rules(True), None, None, q, q, q) is not None
        slopes = Rules(alibi_slopes=torch.ones(2, device="cuda"))
        assert forward._launch_key(v7, slopes, None, None, q, q, q) is None


@pytest.mark.gpu
@needs_cuda
def test_gpu_repeat_calls_hit_the_cache_and_stay_right(rng):
    forward._LAUNCHES.clear()
    shapes = [(1, 2, 100, 64), (2, 4, 257, 128), (1, 2, 100, 64)]
    for causal in (False, True):
        for shape in shapes:
            for _ in range(2):  # the second call of a shape is a hit
                q, k, v = (torch.tensor(rng.standard_normal(shape), dtype=torch.float16, device="cuda")
                           for _ in range(3))
                o = kernels.flash_attention(q, k, v, causal=causal)
                want = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=causal)
                assert_close(o, want, dtype=torch.float16, what=f"cached launch {shape} causal={causal}")
    assert len(forward._LAUNCHES) == 4  # two shapes, two causal settings
    q = torch.randn(2, 4, 257, 128, device="cuda", dtype=torch.float16)
    transposed = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides: a new entry
    o = kernels.flash_attention(transposed, q, q)
    assert len(forward._LAUNCHES) == 5
    np.testing.assert_allclose(o.float().cpu(), kernels.flash_attention(q, q, q).float().cpu(), atol=2e-3)
    k, v = torch.randn_like(q), torch.randn_like(q)  # the layout of the (q, q, q) entry, now three tensors
    want = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)))
    assert_close(kernels.flash_attention(q, k, v), want, dtype=torch.float16, what="k and v no longer q")


@pytest.mark.gpu
@needs_cuda
def test_gpu_decode_repeat_calls_hit_the_cache_and_stay_right():
    from flashcourse.kernels import decode

    decode._LAUNCHES.clear()
    plan.PLANS.clear()  # a plan made by an earlier test would launch its own prepared launch, remembering none
    x = torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.float16)
    kernels.flash_decode(x[:, :, 0].repeat_interleave(2, 1), x, x)  # k is v in the call that fills the cache
    for _ in range(2):
        q = torch.randn(2, 8, 64, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(2, 4, 300, 64, device="cuda", dtype=torch.float16) for _ in range(2))
        kk, vv = (t.double().repeat_interleave(2, 1) for t in (k, v))
        p = torch.softmax(torch.einsum("bhd,bhnd->bhn", q.double(), kk) / 8.0, -1)
        assert_close(kernels.flash_decode(q, k, v), torch.einsum("bhn,bhnd->bhd", p, vv).cpu().numpy(),
                     dtype=torch.float16, what="cached decode")
    assert len(decode._LAUNCHES) == 1  # 300 keys need one split: the split launch writes o, no combine launch


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cache_on", [True, False], ids=["cached", "forced-fallback"])
def test_gpu_forward_and_decode_agree_with_and_without_the_cache(cache_on, monkeypatch):
    """The fallback forced (as on a Triton without the convention): same results, nothing remembered."""
    from flashcourse.kernels import decode

    for cache in (forward._LAUNCHES, decode._LAUNCHES):
        cache.clear()
        monkeypatch.setattr(cache, "enabled", cache_on)
    plan.PLANS.clear()  # a decode plan keeps its launches: a plan made before would launch them
    q, k, v = (torch.randn(1, 2, 200, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    want = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=True)
    for _ in range(2):
        assert_close(kernels.flash_attention(q, k, v, causal=True), want, dtype=torch.float16,
                     what=f"forward, cache {'on' if cache_on else 'off'}")
        kernels.flash_decode(q[:, :, -1], k, v)
    assert (len(forward._LAUNCHES) > 0) == cache_on and (len(decode._LAUNCHES) > 0) == cache_on
