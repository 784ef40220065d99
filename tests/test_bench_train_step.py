"""The host-time (``bench overhead``) and training-step (``bench train-step``) benchmarks on CPU: their calls run
for real on tiny CPU tensors (our kernels in the Triton interpreter, or stand-ins where the fixed shapes would take
the interpreter minutes); the times come from a fake clock, so the ratio arithmetic is checked exactly."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from flashcourse import device  # noqa: E402

if not device.triton_available():
    pytest.skip("Triton is not installed here", allow_module_level=True)
import torch.nn.functional as F  # noqa: E402

from flashcourse import kernels  # noqa: E402  (sets the interpreter up before triton loads elsewhere)
from flashcourse.bench import __main__ as cli  # noqa: E402
from flashcourse.bench import overhead, save_results, train_step  # noqa: E402
from flashcourse.bench.attention import Shape, make_inputs  # noqa: E402
from flashcourse.kernels import plan  # noqa: E402
from flashcourse.tolerance import assert_close  # noqa: E402


@pytest.fixture
def sdpa_kernels(monkeypatch):
    """Our two entry points replaced by SDPA (the overhead benchmark's fixed shapes are too big for the
    interpreter); records whether autograd was on in each call."""
    grad_modes = {"flash_attention": [], "flash_decode": []}

    def flash_attention(q, k, v, *, causal=False):
        grad_modes["flash_attention"].append(torch.is_grad_enabled())
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def flash_decode(q, k_cache, v_cache):
        grad_modes["flash_decode"].append(torch.is_grad_enabled())
        return F.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, enable_gqa=True)[:, :, 0]

    monkeypatch.setattr(kernels, "flash_attention", flash_attention)
    monkeypatch.setattr(kernels, "flash_decode", flash_decode)
    return grad_modes


def test_overhead_times_each_call_beside_plain_sdpa(sdpa_kernels):
    rows = overhead.run(log=lambda _: None, device="cpu", rounds=3, calls=2, warmup=1)
    assert [r["provider"] for r in rows] == [name for pair in overhead.PAIRS for name in pair]
    for r in rows:
        assert r["us_min"] <= r["us_per_call"] <= r["us_max"] and (r["calls"], r["rounds"]) == (2, 3)
        assert len(r["us_rounds"]) == 3
    for ours, _ in overhead.PAIRS:
        mine = next(r for r in rows if r["provider"] == ours)
        assert mine["ratio_vs_sdpa_min"] <= mine["ratio_vs_sdpa_q1"] <= mine["ratio_vs_sdpa"]
        assert mine["ratio_vs_sdpa"] <= mine["ratio_vs_sdpa_q3"] <= mine["ratio_vs_sdpa_max"]
    # inference calls under no_grad; the training step with autograd on (its backward runs, or grad would raise)
    assert sdpa_kernels["flash_decode"] and not any(sdpa_kernels["flash_decode"])
    assert False in sdpa_kernels["flash_attention"] and True in sdpa_kernels["flash_attention"]
    assert overhead.meta()["sdpa_call"] == "plain" and "alternating" in overhead.meta()["method"]
    ran = {r["provider"]: r.get("kernels") for r in rows}  # which of our kernels each row timed (kernels.explain)
    assert (ran["flashcourse_forward"], ran["flashcourse_train_step"]) == ("v7", "v7 + b1")
    assert ran["flashcourse_train_step_1024"] == "v7 + b1"  # off Hopper; the Gluon backward's least work there
    assert overhead.HEADS_1024 * 1024 == plan.B7_MIN_ROWS and plan.B7_MIN_N == 1024


class DriftingHost:
    """A fake host whose clock moves only when a call runs, by the call's cost times the host's slowness then.

    The slowness follows the rounds of :func:`overhead.alternate` (two blocks of ``calls`` calls a round, no
    warm-up): 1 in the first half of the rounds and 2 in the second (a clock or a turbo state that changes mid-run),
    and in every fourth round of the first half the round's second block runs 3x slower (another process waking up
    during one block only). Within every round without that wake-up both providers see one slowness, so their ratio
    there is exactly the ratio of their costs."""

    def __init__(self, rounds: int, calls: int):
        self.rounds, self.calls, self.now, self.done = rounds, calls, 0.0, 0

    def slowness(self) -> float:
        round_, second_block = (self.done // (2 * self.calls)) % self.rounds, (self.done // self.calls) % 2
        drift = 1.0 if round_ < self.rounds // 2 else 2.0
        woken = second_block and round_ < self.rounds // 2 and round_ % 4 == 0
        return drift * (3.0 if woken else 1.0)

    def call(self, cost_us: float):
        def fn():
            self.now += cost_us * 1e-6 * self.slowness()
            self.done += 1
        return fn

    def clock(self) -> float:
        return self.now


COSTS_US = {"flashcourse_forward": 30.0, "sdpa_forward": 20.0, "flashcourse_decode": 10.0, "sdpa_decode": 20.0,
            "flashcourse_train_step": 300.0, "sdpa_train_step": 150.0,
            "flashcourse_train_step_1024": 900.0, "sdpa_train_step_1024": 300.0}


def test_overhead_ratio_is_the_median_of_matched_rounds_through_drift(monkeypatch):
    """On a host that doubles its slowness halfway and is interrupted in some blocks, each pair's ratio is still
    the ratio of their costs: timing each provider in its own stretch of the run would put the 2x drift into it,
    and a ratio of the two medians (rounds unmatched) the interruptions, 0.75x the truth here."""
    rounds, calls = 8, 3
    host = DriftingHost(rounds, calls)
    monkeypatch.setattr(overhead, "providers", lambda device: {n: host.call(c) for n, c in COSTS_US.items()})
    rows = overhead.run(log=lambda _: None, device="cpu", rounds=rounds, calls=calls, warmup=0, clock=host.clock)
    by_name = {r["provider"]: r for r in rows}
    for ours, theirs in overhead.PAIRS:
        truth = COSTS_US[ours] / COSTS_US[theirs]
        mine = by_name[ours]
        assert mine["ratio_vs_sdpa"] == pytest.approx(truth, rel=1e-9)
        assert mine["ratio_vs_sdpa_q1"] == pytest.approx(truth, rel=1e-9)
        assert mine["ratio_vs_sdpa_q3"] == pytest.approx(truth, rel=1e-9)
        # the interrupted rounds (SDPA's block second there, 3x slower) set the low end of the range
        assert mine["ratio_vs_sdpa_min"] == pytest.approx(truth / 3)
        assert mine["ratio_vs_sdpa_max"] == pytest.approx(truth)
        assert len(mine["ratio_rounds"]) == rounds and "ratio_vs_sdpa" not in by_name[theirs]
        # the rows' own times did see the drift: the slow half of the rounds took twice as long per call
        assert max(by_name[theirs]["us_rounds"][rounds // 2:]) == pytest.approx(2 * COSTS_US[theirs])
        assert min(by_name[theirs]["us_rounds"]) == pytest.approx(COSTS_US[theirs])


def test_overhead_rounds_swap_which_provider_goes_first():
    order = []
    blocks = overhead.alternate(lambda: order.append("ours"), lambda: order.append("theirs"), rounds=4, calls=2,
                                warmup=1, sync=lambda: None)
    assert [len(times) for times in blocks] == [4, 4]
    assert order[:2] == ["ours", "theirs"]  # the warm-up calls each once
    firsts = order[2::2]  # the first call of each block of two
    assert firsts == ["ours", "theirs", "theirs", "ours", "ours", "theirs", "theirs", "ours"]
    assert order[2:] == [name for name in firsts for _ in range(2)]


def fake_timer(ms_values):
    """A ``time_repeats`` timer: runs the call once (so it must work), then returns the next of ``ms_values``."""
    values = iter(ms_values)

    def timer(fn, grad_to_none):
        fn()
        return next(values)

    return timer


def test_train_step_row_on_a_tiny_shape_in_the_interpreter(monkeypatch):
    monkeypatch.setattr(train_step, "validate_ours", lambda shape: {"ok": True})
    shapes = train_step.shape_grid(["float16"], [(1, 2, 32, 16)])
    # ms per repeat, in provider order: ours, plain SDPA, SDPA flash (cuDNN raises on CPU before its timer returns)
    timer = fake_timer([0.4, 0.5, 0.3, 0.2, 0.25, 0.1, 0.4, 0.4, 0.4])
    saved = []
    [row] = train_step.run(shapes, modes=["eager"], log=lambda _: None, on_row=saved.append, device="cpu",
                           timer=timer)
    assert saved == [[row]]
    assert {k: row[k] for k in ("dtype", "batch", "heads", "n", "head_dim", "causal", "mode")} == \
        {"dtype": "float16", "batch": 1, "heads": 2, "n": 32, "head_dim": 16, "causal": True, "mode": "eager"}
    assert row["status"] == row["sdpa_plain_status"] == row["sdpa_flash_status"] == "ok"
    assert (row["forward_kernel"], row["backward_kernel"]) == ("v7", "b1")  # what "ours" ran (kernels.explain)
    assert (row["us"], row["us_min"], row["us_max"]) == pytest.approx((400, 300, 500))
    assert (row["sdpa_plain_us"], row["sdpa_plain_us_min"], row["sdpa_plain_us_max"]) == pytest.approx((200, 100, 250))
    assert row["ratio_vs_sdpa_plain"] == pytest.approx(400 / 200)
    assert (row["ratio_vs_sdpa_plain_min"], row["ratio_vs_sdpa_plain_max"]) == pytest.approx((300 / 250, 500 / 100))
    assert row["ratio_vs_sdpa_flash"] == pytest.approx(1.0)
    flops = 3.5 * 4 * 1 * 2 * 32 * 32 * 16 / 2  # forward + backward (2.5x), causal
    assert row["tflops"] == pytest.approx(flops / 400e-6 / 1e12)
    # a backend that cannot run (cuDNN on CPU) leaves its status and error, and no time or ratio
    assert row["sdpa_cudnn_status"] == "unsupported" and row["sdpa_cudnn_error"]
    assert "sdpa_cudnn_us" not in row and "ratio_vs_sdpa_cudnn" not in row
    assert "unsupported" in train_step.format_table([row])


def test_recorded_modes_give_one_row_each_with_ratios_in_the_same_mode(monkeypatch, tmp_path):
    """cuda_graph runs for real and fails on this CPU (no CUDA stream to capture on): each provider's row says so
    and the run goes on. reduce_overhead's compile is replaced by the eager step (Inductor would need a C++ compiler
    and minutes here), so its rows check the ratio arithmetic, the check against eager and the JSON."""
    monkeypatch.setattr(train_step, "validate_ours", lambda shape: {"ok": True})
    compiled_for = []

    def fake_compiled_step(attend, q, k, v, do):
        compiled_for.append(tuple(q.shape))
        return train_step.eager_step(attend, q, k, v, do)

    monkeypatch.setitem(train_step.STEP_BUILDERS, "reduce_overhead", fake_compiled_step)
    shapes = train_step.shape_grid(["float16"], [(1, 2, 32, 16)])
    # eager: ours, plain SDPA, SDPA flash (cuDNN fails first); cuda_graph: none; reduce_overhead: ours, plain SDPA
    timer = fake_timer([0.4, 0.5, 0.3, 0.2, 0.25, 0.1, 0.4, 0.4, 0.4, 0.06, 0.05, 0.07, 0.03, 0.04, 0.02])
    saved = []
    rows = train_step.run(shapes, log=lambda _: None, on_row=lambda rows: saved.append(len(rows)), device="cpu",
                          timer=timer)
    assert saved == [1, 2, 3] and [r["mode"] for r in rows] == list(train_step.MODES)
    eager, graph, compiled = rows
    assert eager["ratio_vs_sdpa_plain"] == pytest.approx(2.0) and "replay_error" not in eager
    for prefix in ("", "sdpa_plain_", "sdpa_flash_", "sdpa_cudnn_"):
        assert graph[f"{prefix}status"] == "failed" and graph[f"{prefix}error"].startswith("RuntimeError: "), prefix
        assert f"{prefix}us" not in graph
    assert all("CUDA" in graph[f"{prefix}error"] for prefix in ("", "sdpa_plain_", "sdpa_flash_"))  # cuDNN: no backend
    assert not any(key.startswith("ratio_vs_") for key in graph)
    assert compiled_for == [(1, 2, 32, 16)] * 2  # ours and plain SDPA only
    assert (compiled["us"], compiled["us_min"], compiled["us_max"]) == pytest.approx((60, 50, 70))
    assert compiled["sdpa_plain_us"] == pytest.approx(30)
    assert compiled["ratio_vs_sdpa_plain"] == pytest.approx(2.0)
    assert (compiled["ratio_vs_sdpa_plain_min"], compiled["ratio_vs_sdpa_plain_max"]) == pytest.approx((50 / 40,
                                                                                                         70 / 20))
    assert compiled["replay_error"] == 0.0 and compiled["cudagraph_skips"] == 0  # the same kernels on the same inputs
    assert not any(key.startswith(("sdpa_flash", "sdpa_cudnn", "ratio_vs_sdpa_flash")) for key in compiled)
    flops = 3.5 * 4 * 1 * 2 * 32 * 32 * 16 / 2
    assert compiled["tflops"] == pytest.approx(flops / 60e-6 / 1e12)
    table = train_step.format_table(rows)
    assert "cuda_graph" in table and "reduce_overhead" in table and "failed" in table
    saved_rows = json.loads(save_results("train-step", rows, directory=tmp_path, kind="train-step").read_text())
    assert saved_rows["rows"] == rows and saved_rows["meta"]["kind"] == "train-step"


def test_a_replay_that_differs_from_eager_is_not_timed(monkeypatch):
    def wrong_step(attend, q, k, v, do):
        return lambda: tuple(t * 2 for t in train_step.step(attend, q, k, v, do))

    monkeypatch.setitem(train_step.STEP_BUILDERS, "reduce_overhead", wrong_step)
    shape = train_step.shape_grid(["float16"], [(1, 1, 16, 16)])[0]
    result = train_step.time_step(shape, "sdpa_plain", mode="reduce_overhead", device="cpu", timer=fake_timer([]))
    assert result["status"] == "failed" and "differs from the eager step" in result["error"]
    assert "us" not in result


def test_an_unknown_mode_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="cuda_graph"):
        train_step.run(train_step.shape_grid(["float16"], [(1, 1, 16, 16)]), modes=["graphs"], device="cpu")


def test_train_step_grid_is_the_issue_shapes_in_both_dtypes():
    grid = train_step.shape_grid()
    assert len(grid) == 8 and all(s.causal for s in grid)
    assert {(s.batch, s.heads, s.n, s.head_dim) for s in grid} == {
        (8, 12, 1024, 64), (16, 12, 1024, 64), (8, 16, 2048, 64), (4, 32, 2048, 128)}
    assert {s.dtype for s in grid} == {"bfloat16", "float16"}


def test_a_kernel_that_fails_validation_is_never_timed(monkeypatch):
    monkeypatch.setattr(train_step, "validate_ours", lambda shape: {"ok": False, "o": 1.0})
    with pytest.raises(AssertionError, match="wrong"):
        train_step.run(train_step.shape_grid(["float16"], [(1, 1, 16, 16)]), log=lambda _: None, device="cpu",
                       timer=fake_timer([]))


@pytest.mark.parametrize("command, module, name, kind", [
    (["train-step", "--dtype", "float16"], train_step, "train-step", "train-step"),
    (["overhead"], overhead, "overhead", "overhead"),
])
def test_cli_writes_the_results_file(monkeypatch, tmp_path, command, module, name, kind):
    monkeypatch.setattr(cli, "_need_gpu", lambda: None)
    asked = {}

    def fake_run(shapes=None, **kwargs):
        asked["shapes"] = shapes
        return [{"dtype": "float16", "batch": 1, "heads": 1, "n": 16, "head_dim": 16, "status": "failed"}]

    monkeypatch.setattr(module, "run", fake_run)
    cli.main([*command, "--out", str(tmp_path)])
    [path] = tmp_path.glob(f"*-{name}.json")
    meta = json.loads(path.read_text())["meta"]
    assert meta["kind"] == kind
    if module is overhead:
        assert meta["sdpa_call"] == "plain"
    else:
        assert [s.dtype for s in asked["shapes"]] == ["float16"] * 4


@pytest.mark.parametrize("gpu_dtypes, measured", [
    (["float16", "bfloat16"], ["bfloat16"] * 4 + ["float16"] * 4),
    (["float16"], ["float16"] * 4),  # a GPU without bfloat16 tensor cores (a T4)
])
def test_train_step_measures_bfloat16_only_where_the_gpu_has_it(monkeypatch, tmp_path, gpu_dtypes, measured):
    monkeypatch.setattr(cli, "_need_gpu", lambda: None)
    monkeypatch.setattr(cli, "default_dtypes", lambda: gpu_dtypes)
    asked = []
    monkeypatch.setattr(train_step, "run", lambda shapes, **kwargs: asked.extend(shapes) or [])
    cli.main(["train-step", "--out", str(tmp_path)])
    assert [s.dtype for s in asked] == measured


@pytest.mark.parametrize("options, modes", [([], list(train_step.MODES)),
                                            (["--modes", "eager", "cuda_graph"], ["eager", "cuda_graph"])])
def test_train_step_cli_times_every_mode_unless_told(monkeypatch, tmp_path, options, modes):
    monkeypatch.setattr(cli, "_need_gpu", lambda: None)
    asked = {}
    monkeypatch.setattr(train_step, "run", lambda shapes, **kwargs: asked.update(kwargs) or [])
    cli.main(["train-step", "--dtype", "float16", "--out", str(tmp_path), *options])
    assert list(asked["modes"]) == modes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["cuda_graph", "reduce_overhead"])
def test_gpu_a_recorded_step_of_ours_computes_what_eager_does(mode):
    """Record our step once, then put new values into its static inputs: each replay must compute o and the
    gradients of those new values, as the eager step does (a kernel left out of the graph would keep the old ones,
    or garbage)."""
    shape = Shape("float16", 1, 2, 64, 256, True)
    q, k, v, do = make_inputs(shape)
    attend = train_step.attend_fn("flashcourse")
    replay = train_step.STEP_BUILDERS[mode](attend, q, k, v, do)
    generator = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, do):
                t.copy_(torch.randn(t.shape, generator=generator, device="cuda", dtype=t.dtype))
        got = tuple(t.clone() for t in replay())
        want = train_step.step(attend, q, k, v, do)
        for name, g, w in zip(("o", "dq", "dk", "dv"), got, want, strict=True):
            assert_close(g, w, what=f"{mode} {name}")


def step_row(mode, ours, sdpa, **extra):
    """A train-step row as the benchmark writes it (only the fields lesson 08's table reads)."""
    row = {"dtype": "bfloat16", "batch": 8, "heads": 12, "n": 1024, "head_dim": 64, "causal": True, "mode": mode,
           "status": "ok", "us": ours, "sdpa_plain_status": "ok", "sdpa_plain_us": sdpa,
           "ratio_vs_sdpa_plain": ours / sdpa}
    row.update(extra)
    return row


def write_run(directory, date, rows):
    meta = {"date": date, "device": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "kind": "train-step"}
    (directory / f"{date}-nvidia-h200-train-step.json").write_text(json.dumps({"meta": meta, "rows": rows}))


def test_lesson_reads_the_newest_run_with_recorded_modes(tmp_path):
    from flashcourse.bench import summary

    write_run(tmp_path, "2026-12-01", [{k: v for k, v in step_row("eager", 400, 200).items() if k != "mode"}])
    assert summary.train_step_modes(tmp_path) is None  # rows without a mode are eager: nothing recorded yet
    failed = step_row("reduce_overhead", 90, 80, sdpa_plain_cudagraph_skips=1)
    failed.update(status="failed", error="RuntimeError: capture refused")
    del failed["us"], failed["ratio_vs_sdpa_plain"]
    write_run(tmp_path, "2026-12-03", [step_row("eager", 400, 200), step_row("cuda_graph", 150, 120), failed])
    write_run(tmp_path, "2026-12-04", [step_row("eager", 390, 210)])  # newer, but eager only
    data = summary.train_step_modes(tmp_path)
    assert data["meta"]["date"] == "2026-12-03"
    text = summary.train_step_modes_markdown(data)
    assert "eager / CUDA graph / reduce-overhead" in text
    assert "| bf16 B8 H12 N1024 D64 | 400 / 150 / failed | 200 / 120 / 80 (no graph) | 2.00x / 1.25x / - |" in text
    assert "ours 250 us of 400, plain SDPA 80 us of 200" in text  # what the graph took off each eager step
    assert "reduce-overhead, ours, bf16 B8 H12 N1024 D64: RuntimeError: capture refused" in text
    assert "(no graph): torch.compile declined" in text
    assert "the graph keeps 25% of the gap, so much of our extra time was host time" in text


def test_graph_verdict_says_gpu_time_when_the_graph_keeps_the_gap(tmp_path):
    from flashcourse.bench import summary

    small, big = step_row("eager", 270, 200), {**step_row("eager", 480, 360), "batch": 16}
    write_run(tmp_path, "2026-12-03", [small, big, step_row("cuda_graph", 266, 198),
                                       {**step_row("cuda_graph", 461, 359), "batch": 16},
                                       step_row("reduce_overhead", 729, 774)])
    text = summary.train_step_modes_markdown(summary.train_step_modes(tmp_path))
    assert ("reduce-overhead made both steps slower than eager at bf16 B8 H12 N1024 D64 (ours 729 against 270 us, "
            "plain SDPA 774 against 200)") in text
    assert "B16 H12 N1024 D64 (ours" not in text  # no reduce-overhead row there
    assert "eager 1.33-1.35x, replayed from a CUDA graph 1.28-1.34x" in text
    assert "the graph keeps 92% of the gap, so almost all of our extra time is GPU time" in text


def test_host_time_note_reads_the_overhead_and_the_smallest_eager_step(tmp_path):
    from flashcourse.bench import summary

    assert summary.host_time_note(tmp_path) is None
    big = {**step_row("eager", 900, 800), "batch": 16}
    write_run(tmp_path, "2026-12-03", [big, step_row("eager", 400, 200), step_row("cuda_graph", 150, 120)])
    meta = {"date": "2026-12-02", "device": "NVIDIA H200", "kind": "overhead"}
    rows = [{"provider": "flashcourse_train_step", "us_per_call": 279.4}, {"provider": "sdpa_train_step",
                                                                          "us_per_call": 167.9}]
    (tmp_path / "2026-12-02-nvidia-h200-overhead.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    note = summary.host_time_note(tmp_path)
    assert "ours **279 us**, plain SDPA **168 us**" in note
    assert "bf16 B8 H12 N1024 D64" in note and "ours **400 us**, plain SDPA **200 us**" in note


def test_host_split_table_shows_each_pieces_median_and_range_in_order(tmp_path):
    from flashcourse.bench import summary

    assert summary.host_split_table(tmp_path) is None
    meta = {"date": "2026-12-02", "device": "NVIDIA H200", "kind": "train-step-host-split", "rounds": 3, "calls": 1000}
    pieces = {"sdpa_train_step": (212.0, 150.4, 205.0), "bare_function_step": (164.0, 106.0, 157.0),
              "not_a_piece_shown": (1.0, 2.0, 3.0)}
    rows = [{"piece": piece, "round": r, "us_per_call": us} for piece, times in pieces.items()
            for r, us in enumerate(times)]
    path = tmp_path / "2026-12-02-nvidia-h200-train-step-host-split.json"
    path.write_text(json.dumps({"meta": meta, "rows": rows}))
    table = summary.host_split_table(tmp_path)
    lines = table.splitlines()
    sdpa = lines.index("| plain SDPA: the whole step | 205 (150-212) |")
    bare = lines.index("| a Python autograd.Function that launches nothing | 157 (106-164) |")
    assert sdpa < bare and "not_a_piece_shown" not in table and "3 rounds of 1000 calls" in table
    assert "ours: the whole step" not in table  # a piece the run lacks gets no row
    assert "costs **77%** of plain SDPA's whole step" in table  # 157 / 205


def test_a_recorded_measurement_that_fails_in_its_child_is_a_failed_row_and_the_run_goes_on(monkeypatch):
    """With isolation on (as on a GPU), each recorded measurement goes to ``in_child``; eager ones never do. Here the
    child of our cuda_graph measurement dies (simulated): its row says so, and every later measurement still runs."""
    monkeypatch.setattr(train_step, "validate_ours", lambda shape: {"ok": True})
    monkeypatch.setitem(train_step.MODE_PROVIDERS, "cuda_graph", ("flashcourse", "sdpa_plain"))
    sent = []

    def fake_in_child(target, shape, provider, *, mode, device):
        sent.append((target, provider, mode))
        if provider == "flashcourse" and mode == "cuda_graph":
            return {"status": "failed", "error": "ChildProcessError: the child process ended without an answer "
                    "(exit code -11)", "traceback": ""}
        return target(shape, provider, mode="eager", device=device, timer=fake_timer([0.1, 0.1, 0.1]))

    monkeypatch.setattr(train_step, "in_child", fake_in_child)
    shapes = train_step.shape_grid(["float16"], [(1, 1, 16, 16), (1, 2, 16, 16)])
    timer = fake_timer([0.2] * 12)  # eager, in this process: ours and plain SDPA, three repeats, both shapes
    monkeypatch.setitem(train_step.MODE_PROVIDERS, "eager", ("flashcourse", "sdpa_plain"))
    rows = train_step.run(shapes, modes=["eager", "cuda_graph"], log=lambda _: None, device="cpu", timer=timer,
                          isolate=True)
    assert [(r["heads"], r["mode"]) for r in rows] == [(1, "eager"), (1, "cuda_graph"), (2, "eager"),
                                                       (2, "cuda_graph")]
    assert sent == [(train_step.time_step, p, "cuda_graph") for p in ("flashcourse", "sdpa_plain")] * 2
    for graph in rows[1::2]:
        assert graph["status"] == "failed" and graph["error"].startswith("ChildProcessError")
        assert graph["sdpa_plain_status"] == "ok" and graph["sdpa_plain_us"] == pytest.approx(100)
        assert "ratio_vs_sdpa_plain" not in graph
    assert all(r["status"] == "ok" and r["us"] == pytest.approx(200) for r in rows[::2])


def test_in_child_returns_the_answer_the_error_with_its_traceback_or_the_exit_code():
    """Three real child processes (spawned, so each starts Python afresh: a few seconds in all)."""
    import os

    assert train_step.in_child(dict, a=1) == {"a": 1}
    raised = train_step.in_child(int, "not a number")
    assert raised["status"] == "failed" and raised["error"].startswith("ValueError: invalid literal")
    assert "Traceback" in raised["traceback"] and raised["traceback"].splitlines()[-1].startswith("ValueError")
    died = train_step.in_child(os._exit, 3)
    assert died["status"] == "failed" and died["error"].endswith("(exit code 3)")


def test_a_check_that_raises_leaves_failed_rows_for_its_shape_and_the_run_goes_on(monkeypatch):
    def validate(shape):
        if shape.heads == 1:
            raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
        return {"ok": True}

    monkeypatch.setattr(train_step, "validate_ours", validate)
    monkeypatch.setitem(train_step.MODE_PROVIDERS, "eager", ("flashcourse", "sdpa_plain"))
    saved = []
    shapes = train_step.shape_grid(["float16"], [(1, 1, 16, 16), (1, 2, 16, 16)])
    rows = train_step.run(shapes, modes=["eager"], log=lambda _: None, on_row=lambda rows: saved.append(len(rows)),
                          device="cpu", timer=fake_timer([0.1] * 6))  # the second shape only: ours, plain SDPA
    assert saved == [1, 2] and [r["heads"] for r in rows] == [1, 2]
    failed, timed = rows
    assert failed["status"] == "failed" and failed["mode"] == "eager"
    assert failed["error"] == "validate_ours: RuntimeError: Offset increment outside graph capture encountered " \
        "unexpectedly."
    assert "in validate" in failed["traceback"] and "sdpa_plain_status" not in failed and "us" not in failed
    assert timed["status"] == timed["sdpa_plain_status"] == "ok"
    assert "failed" in train_step.format_table(rows)
