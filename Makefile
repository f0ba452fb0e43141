# One command each, on a fresh machine: `make test` (set-up + test suite), `make train` (the main job).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint walkthrough train train-quick train-1h train-2h train-tiny train-gpu bench bench-all clean

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

# Re-execute the walk-through notebooks (docs/walkthrough, English and Japanese) offline and rewrite them in place,
# with their outputs.
walkthrough: setup
	$(PY) docs/walkthrough/execute.py

# transformers' own common model tests need its test machinery that is not in its wheel; tests/hf_common/run.sh
# assembles it from the transformers sdist and a folder of the rest (TRANSFORMERS_TESTS_SOURCE, by default
# ../shared/transformers_tests beside the clone, as CI lays it out). Without that folder they are not run.
HF_TESTS_SOURCE ?= $(or $(TRANSFORMERS_TESTS_SOURCE),../shared/transformers_tests)

test: setup lint
	$(VENV)/bin/pytest -q
	@if [ -d "$(HF_TESTS_SOURCE)" ]; then \
		TRANSFORMERS_TESTS_SOURCE="$(HF_TESTS_SOURCE)" PYTHON=$(PY) bash tests/hf_common/run.sh; \
	else echo "transformers' common model tests not run: no $(HF_TESTS_SOURCE) (see tests/hf_common/run.sh)"; fi

# The main job: train on the bundled Multi30k EN->DE, evaluate, write the run folder outputs/multi30k-en-de
# (its model folder: outputs/multi30k-en-de/model). ARGS="..." adds options.
# --bf16 auto (every recipe's default): bf16 autocast where the CPU/GPU has bf16 matrix units (AMX, AVX512-BF16,
# GPUs of compute capability 8.0+), fp32 elsewhere.
train: setup
	$(VENV)/bin/hf-vanilla-transformer train --bf16 auto $(ARGS)

# A trial of the whole path in about three minutes (recipe quick in hf_vanilla_transformer/training/recipes.py):
# 2 minutes of training, then the first 200 test sentences decoded greedily (the card says so), into
# outputs/multi30k-en-de-quick. `make train ARGS="--max-time 2m"` is no trial: it still decodes all of test_2016
# with beam 4, twice, which an untrained model makes slow.
train-quick: setup
	$(VENV)/bin/hf-vanilla-transformer train --recipe quick --output-dir outputs/multi30k-en-de-quick $(ARGS)

# The longer runs (recipes multi30k-1h and multi30k-2h in hf_vanilla_transformer/training/recipes.py, with their evidence):
# a wall-clock budget, bf16 autocast where the device has bf16 matrix units, checkpoints and learning-curve snapshots every
# 10 minutes; the 2-hour run warms up over 800 updates (docs/runs/sweep.md, runs N and O). To plot a reference curve
# beside the run's: ARGS="--compare-curve docs/runs/marian_learning_curves.json".
train-1h: setup
	$(VENV)/bin/hf-vanilla-transformer train --recipe multi30k-1h --output-dir runs/multi30k-en-de-1h $(ARGS)

train-2h: setup
	$(VENV)/bin/hf-vanilla-transformer train --recipe multi30k-2h --output-dir runs/multi30k-en-de-2h $(ARGS)

# The model that ships with the package (recipe multi30k-tiny): an hour of the 4+4-layer d_model 128 model. Then
# `.venv/bin/python -m hf_vanilla_transformer.pretrained.bundle runs/multi30k-en-de-tiny/model DEST` stores it in fp16
# and records its BLEU as stored: hf_vanilla_transformer/pretrained/multi30k-en-de-tiny was made so
# (docs/runs/multi30k-en-de-tiny-1h-epyc).
train-tiny: setup
	$(VENV)/bin/hf-vanilla-transformer train --recipe multi30k-tiny --output-dir runs/multi30k-en-de-tiny $(ARGS)

# One GPU, one minute (recipe multi30k-gpu in hf_vanilla_transformer/training/recipes.py, with its reasons): the
# multi30k-1h model with bf16, CUDA graphs over 8 fixed batch shapes and 8192-token batches, meant to reach test_2016
# BLEU >= 40 on an H100/H200; not measured yet (bench/gpu_check.sh measures it). On a CPU it says so in one line.
train-gpu: setup
	$(VENV)/bin/hf-vanilla-transformer train --recipe multi30k-gpu --output-dir runs/multi30k-en-de-gpu $(ARGS)

# The decoding table: ours against MarianMTModel and CTranslate2 (at both of its CPU settings), tiny and base
# configurations, greedy and beam 4, batch 1 and 16, fp32 / bf16 / int8, interleaved reps, then the speed targets
# (not part of the tests). ARGS="--quick": a check.
bench: setup
	$(PY) -m bench.bench --sections decode --reps 3 --warmup 1 $(ARGS)

# The whole bench against MarianMTModel: training, encoder, generation, memory, bf16 loss curve (tiny by default).
bench-all: setup
	$(PY) -m bench.bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
