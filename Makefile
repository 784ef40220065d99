# The README's two commands: `make lab` and `make test`. Both start from nothing but Python and pip.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of PyTorch 2.13.0. Elsewhere, override: `make lab TORCH_SPEC=torch` or pass an index with
# TORCH_PIP_ARGS="--index-url <PyTorch's CPU wheel index>" (see README, "CPU-only Linux").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# One timed stage: `$(call timed,name,command)` prints how long the command took.
timed = t0=$$(date +%s); $(2); rc=$$?; echo "[make test] stage '$(1)' took $$(( $$(date +%s) - t0 )) s"; exit $$rc

.PHONY: setup lab test lint unit notebooks clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@t0=$$(date +%s); \
	test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip && \
	$(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)" && \
	$(PY) -m pip install -q -e ".[dev]" && \
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (flashcourse)" >/dev/null && \
	touch $@ && echo "[make] set-up took $$(( $$(date +%s) - t0 )) s"

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks

lint: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)

test: setup
	@$(call timed,ruff,$(VENV)/bin/ruff check .)
	@$(call timed,pytest,$(PY) -m pytest -n 2 --durations=15 -m "not gpu")

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
