# The README's two commands: `make lab` and `make test` (also `make test-fast`, `make test-gpu`). Both start from
# nothing but Python and pip.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# PyTorch 2.13.0, the default build pip picks for this platform (on Linux x86-64 that is the CUDA build unless
# TORCH_PIP_ARGS points at the CPU index). Override: `make lab TORCH_SPEC=torch` or pass an index with
# TORCH_PIP_ARGS="--index-url <PyTorch's CPU wheel index>" (see README, "CPU-only Linux").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# One timed stage: `$(call timed,name,command)` prints how long the command took.
timed = t0=$$(date +%s); $(2); rc=$$?; echo "[make test] stage '$(1)' took $$(( $$(date +%s) - t0 )) s"; exit $$rc

.PHONY: setup setup-course setup-test lab test test-fast test-gpu lint book serve-book clean

# One install into $(VENV): PyTorch first (TORCH_SPEC), then the course in editable mode with the extra $(1), then
# the course's Jupyter kernel as "Python 3" (flashcourse/lab_kernel.py: IPython's, reporting no Python version, so
# JupyterLab opens a notebook without changing it); the stamp file is the target.
define install
@t0=$$(date +%s); \
test -x $(PY) || $(PYTHON) -m venv $(VENV); \
$(PY) -m pip install -q --upgrade pip && \
$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && \
$(PY) -m pip install -q -e ".[$(1)]" && \
$(PY) -m flashcourse.lab_kernel install --sys-prefix >/dev/null && \
touch $@ && echo "[make] set-up ($(1)) took $$(( $$(date +%s) - t0 )) s"
endef

# `make test`: the dev extra, which holds every other extra (course, grading, interview) and the test tools.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(call install,dev)

# `make test-fast`: the test extra (pytest, ruff and what the unit tests import; no JupyterLab, nbgrader, MkDocs or
# Playwright). A venv set up for `make test` has all of it, so that one is used where it exists.
setup-test: $(if $(wildcard $(VENV)/.installed),$(VENV)/.installed,$(VENV)/.installed-test)

$(VENV)/.installed-test: pyproject.toml
	$(call install,test)

# `make lab`: the course extra (JupyterLab, ipywidgets, matplotlib, PyYAML). A venv set up for the tests has it.
setup-course: $(VENV)/.installed-course

$(VENV)/.installed-course: pyproject.toml
	$(call install,course)

# Served from the repository root (lessons link to ../exercises/), opening on notebooks/: the LabApp's default_url,
# since `jupyter lab` ignores the ServerApp's. Containers often run as root, which JupyterLab refuses unless told.
lab: setup-course
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks \
		$$(test "$$(id -u)" = 0 && echo --allow-root) $(LAB_ARGS)

lint: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)

# Two pytest stages: the second builds the website from the lessons the first executed (build/executed/), then
# tests it and JupyterLab on two workers, a file to each (the site is built once, before them). The first
# hands its tests to the two workers one at a time, longest first (tests/conftest.py orders them): by default each
# worker takes a quarter of the suite at once, and one of them got every slow test.
test: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest,$(PY) -m pytest -n 2 --maxschedchunk 1 --durations=15 -m "not gpu and not full" \
		--ignore=tests/browser --ignore=tests/test_site.py)
	@$(call timed,site and browser,$(PY) scripts/build_site.py >/dev/null && FLASHCOURSE_SITE_BUILT=1 \
		$(PY) -m pytest -n 2 --dist loadfile --durations=10 tests/test_site.py tests/browser)

# `make test-fast`: ruff, the unit tests and a kernel smoke set (tests/test_kernel_smoke.py: the forward, the
# backward and decoding against float64 at N = 1 and 17, D = 16 and 32, causal and not). Measured on 2026-12-06
# (README, "Two commands"). Left to `make test`, each for its cost:
# - whatever executes notebooks (the lessons, the exercises' solutions and stubs, the batch grader, nbgrader), the
#   wheel build, the site and the browser;
# - ahead-of-time compiles (the launch fit for every supported GPU, the Gluon and FP8 stages for sm_90) and
#   torch.compile of the kernels;
# - the Triton interpreter's kernel tests but for the smoke set and FAST_SMOKE (bad inputs refused, lse, empty
#   rows, a backward, decode's combine, the grader on kernels, the block mask's refusals, dropout's mask, several
#   new tokens): every version, variant, dropout case, mask classification, document tiles and tile range, and
#   the interview's hand-written kernels;
# - the benchmarks' and measurement scripts' CPU runs (bench variants and train-step, the launch sweeps);
# - the terminal quiz through a pseudo-terminal and the widgets (every step's figure drawn);
# - tests marked slow and those that start process groups or fresh interpreters (FAST_DESELECT).
# The files are named one by one rather than as `tests` with --ignore: pytest drops a node id (FAST_SMOKE's) whose
# file it was told to ignore or already holds as part of a folder. tests/test_make_targets.py collects these
# arguments and checks every FAST_SMOKE id is among the tests.
FAST_IGNORE := test_site.py test_notebooks.py test_wheel.py test_grading_nbgrader.py test_grading_batch.py \
	test_exercises.py test_kernels_forward.py test_kernels_backward.py test_kernels_variants.py test_decode.py \
	test_fp8.py test_grading_triton.py test_grading_ex10.py test_launch_fit.py test_make_targets.py test_block_mask.py \
	test_fa3_fp8_compile.py test_fa3_backward_compile.py test_b7_compile.py test_b8_compile.py test_compile.py \
	test_decode_compile.py test_mask_classification.py test_document_tiles.py test_tile_lists.py test_kernels_common.py \
	test_grading_ex15.py test_bench_variants.py test_bench_train_step.py test_sweep_backward_launches.py \
	test_sweep_forward_rules.py \
	test_quiz_cli.py test_widgets.py test_dropout.py test_decode_new_tokens.py
FAST_DESELECT := test_iomodel.py::test_scaling_laws_at_n4096 \
	test_distributed.py::test_the_launcher_returns_each_ranks_output_in_rank_order \
	test_distributed.py::test_an_error_in_one_rank_stops_the_run_and_shows_what_the_ranks_printed \
	test_support.py::test_device_falls_back_to_the_interpreter_and_says_so_once \
	test_support.py::test_device_warns_when_triton_was_imported_first
FAST_SMOKE := test_kernels_forward.py::test_bad_inputs_raise_clear_errors \
	test_kernels_forward.py::test_lse_matches_numpy_logsumexp \
	test_kernels_forward.py::test_no_keys_gives_zero_and_minus_inf \
	test_kernels_forward.py::test_more_keys_than_queries_and_custom_scale \
	test_kernels_backward.py::test_public_backward_from_saved_output_matches_autograd \
	test_kernels_variants.py::test_bad_options_raise_clear_errors \
	test_kernels_variants.py::test_rows_that_see_nothing_give_zero_and_minus_inf \
	test_decode.py::test_bad_inputs test_decode.py::test_empty_sequence_gives_zero \
	test_decode.py::test_split_outputs_combine_with_merge_partials \
	test_fp8.py::test_bad_fp8_inputs_raise_clear_errors test_fp8.py::test_without_an_fp8_gpu_the_call_says_what_is_needed \
	test_grading_triton.py::test_ex07_rejects test_grading_ex10.py::test_the_exercise_is_registered_with_its_parts \
	test_exercises.py::test_every_exercise_has_its_solution_source \
	test_exercises.py::test_committed_exercises_equal_a_fresh_release \
	test_exercises.py::test_release_replaces_regions_with_a_stub_and_rejects_unpaired_markers \
	test_block_mask.py::test_wrong_shapes_raise test_block_mask.py::test_other_rules_raise \
	test_block_mask.py::test_bad_arguments_raise \
	test_dropout.py::test_bad_dropout_p_is_refused_by_name \
	test_dropout.py::test_flash_attention_is_repeatable_under_manual_seed_and_draws_a_new_mask_per_call \
	test_decode_new_tokens.py::test_a_length_shorter_than_the_new_tokens_is_refused \
	test_decode_new_tokens.py::test_causal_false_lets_every_new_token_see_the_whole_sequence
FAST_FILES := $(filter-out $(addprefix tests/,$(FAST_IGNORE)),$(sort $(wildcard tests/test_*.py)))
FAST_PYTEST_ARGS := -m "not gpu and not slow" $(addprefix --deselect=tests/,$(FAST_DESELECT)) $(FAST_FILES) \
	$(addprefix tests/,$(FAST_SMOKE))
test-fast: setup-test
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest (fast),$(PY) -m pytest -n 2 --maxschedchunk 1 --durations=10 $(FAST_PYTEST_ARGS))

# `make print-NAME` prints a variable of this file (tests/test_make_targets.py reads FAST_PYTEST_ARGS so).
print-%:
	@echo '$($*)'

# The GPU tier on a CUDA machine whose Python already has torch and triton (no venv, nothing installed).
test-gpu:
	PYTHONPATH=src $(PYTHON) scripts/gpu_tests.py $(GPU_TEST_ARGS)

# Timed under its own name (the `timed` stages above report as part of `make test`).
book: setup
	@t0=$$(date +%s); $(PY) scripts/build_site.py; rc=$$?; \
		echo "[make book] built the site in $$(( $$(date +%s) - t0 )) s"; exit $$rc

serve-book: book
	$(PY) -m http.server --directory build/site --bind 127.0.0.1 8000

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
