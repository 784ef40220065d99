# The README's two commands: `make lab` and `make test`. Both start from nothing but Python and pip.
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

.PHONY: setup lab test lint book serve-book clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@t0=$$(date +%s); \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip && \
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && \
	$(PY) -m pip install -q -e ".[dev]" && \
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (flashcourse)" >/dev/null && \
	touch $@ && echo "[make] set-up took $$(( $$(date +%s) - t0 )) s"

# Served from the repository root (lessons link to ../exercises/), opening on notebooks/. Containers often run
# as root, which JupyterLab refuses unless told.
lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --ServerApp.default_url=/lab/tree/notebooks \
		$$(test "$$(id -u)" = 0 && echo --allow-root) $(LAB_ARGS)

lint: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)

# Two pytest stages: the second builds the website from the lessons the first executed (build/executed/).
test: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest,$(PY) -m pytest -n 2 --durations=15 -m "not gpu" --ignore=tests/browser --ignore=tests/test_site.py)
	@$(call timed,site and browser,$(PY) -m pytest --durations=10 tests/test_site.py tests/browser)

book: setup
	@$(call timed,book,$(PY) scripts/build_site.py)

serve-book: book
	$(PY) -m http.server --directory build/site --bind 127.0.0.1 8000

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
