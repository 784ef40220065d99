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

.PHONY: setup setup-course lab test test-fast test-gpu lint book serve-book clean

# One install into $(VENV): PyTorch first (TORCH_SPEC), then the course in editable mode with the extra $(1), then
# the Jupyter kernel; the stamp file is the target.
define install
@t0=$$(date +%s); \
test -x $(PY) || $(PYTHON) -m venv $(VENV); \
$(PY) -m pip install -q --upgrade pip && \
$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && \
$(PY) -m pip install -q -e ".[$(1)]" && \
$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (flashcourse)" >/dev/null && \
touch $@ && echo "[make] set-up ($(1)) took $$(( $$(date +%s) - t0 )) s"
endef

# `make test`: the dev extra, which holds every other extra (course, grading, interview) and the test tools.
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(call install,dev)

# `make lab`: the course extra (JupyterLab, ipywidgets, matplotlib, PyYAML). A venv set up for the tests has it.
setup-course: $(VENV)/.installed-course

$(VENV)/.installed-course: pyproject.toml
	$(call install,course)

# Served from the repository root (lessons link to ../exercises/), opening on notebooks/. Containers often run
# as root, which JupyterLab refuses unless told.
lab: setup-course
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --ServerApp.default_url=/lab/tree/notebooks \
		$$(test "$$(id -u)" = 0 && echo --allow-root) $(LAB_ARGS)

lint: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)

# Two pytest stages: the second builds the website from the lessons the first executed (build/executed/).
test: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest,$(PY) -m pytest -n 2 --durations=15 -m "not gpu" --ignore=tests/browser --ignore=tests/test_site.py)
	@$(call timed,site and browser,$(PY) -m pytest --durations=10 tests/test_site.py tests/browser)

# Lint and the unit tests in about a minute: no notebook executed, no wheel built, no nbgrader, no browser, and of
# the interpreter's kernel tests only a smoke subset (tests marked slow, and the files below, are left to make test).
FAST_IGNORE := tests/browser tests/test_site.py tests/test_notebooks.py tests/test_wheel.py tests/test_grading_nbgrader.py
test-fast: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest (fast),$(PY) -m pytest -n 2 --durations=10 -m "not gpu and not slow" $(addprefix --ignore=,$(FAST_IGNORE)))

# The GPU tier on a CUDA machine whose Python already has torch and triton (no venv, nothing installed).
test-gpu:
	PYTHONPATH=src $(PYTHON) scripts/gpu_tests.py $(GPU_TEST_ARGS)

book: setup
	@$(call timed,book,$(PY) scripts/build_site.py)

serve-book: book
	$(PY) -m http.server --directory build/site --bind 127.0.0.1 8000

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
