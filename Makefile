# One command each, on a fresh machine: `make test` (set-up + test suite), `make train` (the main job).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint train bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 first: pip takes the local CPU wheel instead of several GB of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup lint
	$(VENV)/bin/pytest -q

# The main job: train on the bundled Multi30k EN->DE, evaluate, write outputs/multi30k-en-de. ARGS="..." adds options.
train: setup
	$(VENV)/bin/hf-vanilla-transformer train $(ARGS)

# Ours against MarianMTModel, same architecture, same run (not part of the tests).
bench: setup
	$(PY) -m bench.bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
