# One command each, on a fresh machine: `make test` (set-up + test suite), `make train` (the main job).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint train train-1h train-2h bench clean

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

# transformers' own common model tests need its test machinery that is not in its wheel; tests/hf_common/run.sh
# assembles it from the transformers sdist and a folder of the rest (TRANSFORMERS_TESTS_SOURCE, by default
# ../shared/transformers_tests beside the clone, as CI lays it out). Without that folder they are not run.
HF_TESTS_SOURCE ?= $(or $(TRANSFORMERS_TESTS_SOURCE),../shared/transformers_tests)

test: setup lint
	$(VENV)/bin/pytest -q
	@if [ -d "$(HF_TESTS_SOURCE)" ]; then \
		TRANSFORMERS_TESTS_SOURCE="$(HF_TESTS_SOURCE)" PYTHON=$(PY) bash tests/hf_common/run.sh; \
	else echo "transformers' common model tests not run: no $(HF_TESTS_SOURCE) (see tests/hf_common/run.sh)"; fi

# The main job: train on the bundled Multi30k EN->DE, evaluate, write outputs/multi30k-en-de. ARGS="..." adds options.
# --bf16 auto: bf16 autocast where the CPU/GPU has bf16 matrix units (AMX, AVX512-BF16), fp32 elsewhere.
train: setup
	$(VENV)/bin/hf-vanilla-transformer train --bf16 auto $(ARGS)

# The longer runs of the README's table (issue 8): a wall-clock budget, bf16 autocast, a learning curve.
train-1h: setup
	$(VENV)/bin/hf-vanilla-transformer train --max-time 1h --bf16 auto --save-every 10m --curve-every 10m \
		--output-dir runs/multi30k-en-de-1h $(ARGS)

# Warmup 800 (not 400) for about 4,000 updates: chosen on val (docs/runs/sweep.md, runs N and O; the 2-hour runs).
train-2h: setup
	$(VENV)/bin/hf-vanilla-transformer train --max-time 2h --bf16 auto --warmup-steps 800 --save-every 10m \
		--curve-every 10m --output-dir runs/multi30k-en-de-2h $(ARGS)

# Ours against MarianMTModel, same architecture, same run (not part of the tests).
bench: setup
	$(PY) -m bench.bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
