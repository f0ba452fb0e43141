#!/usr/bin/env bash
# The GPU numbers in one go, at most 8 minutes on one H100/H200, compiling included (each step has its own limit, so a
# slow one costs its own numbers and no more); prints (a)-(d) at the end:
#   (a) the paper's base model step (bf16, 25,000-token batches), ours against MarianMTModel, eager and compiled
#       (bench.bench --config base --sections train);
#   (b) `train`'s loop over the model step: the loop's target tok/s in (c) (its "Loop:" log line: medians between
#       training logs, the first two left out) over the eager model step's at the same shape (bench.bench --config
#       tiny, the Multi30k model, at multi30k-gpu's 8192-token batches); the goal is >= 0.9;
#   (c) `make train-gpu` (recipe multi30k-gpu): test_2016 BLEU (the recipe's own decoding), training seconds,
#       updates/s, the compile's seconds;
#   (d) the paper-base recipe's hours for the paper's 100,000 steps (12 h on 8 P100s) at the loop rate measured in a
#       short run of it (recipe as is: compiled on a GPU).
# Usage: bash bench/gpu_check.sh OUT_DIR [--cpu-smoke]
#   --cpu-smoke: every step tiny on a CPU (no compiling, small models and data, 10 updates), so that the script is
#   tested between GPU loans (tests/bench/test_bench.py); its numbers mean nothing.
#   PYTHON=... picks the interpreter; GPU_WHEELS=DIR pip-installs DIR/*.whl first (e.g. a newer transformers than
#   the machine's, whose dependencies must be there or in DIR: no index is reached).
set -uo pipefail
out=${1:?usage: bash bench/gpu_check.sh OUT_DIR [--cpu-smoke]}
smoke=${2:-}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$SECONDS
failed=0
# Each step's exit status, counted: the script exits 1 when any step failed or ran out of its time.
step() {
    local rc=$1
    shift
    [ "$rc" = 0 ] || failed=$((failed + 1))
    echo "[gpu_check $((SECONDS - started)) s] $*: rc $rc"
}

if [ -n "${GPU_WHEELS:-}" ]; then
    timeout 60 "$python" -m pip install -q --no-index --find-links "$GPU_WHEELS" "$GPU_WHEELS"/*.whl \
        > "$out/wheels.log" 2>&1
    step $? "wheels from $GPU_WHEELS ($out/wheels.log)"
fi
"$python" -c "import torch, transformers as t; print('torch', torch.__version__, 'transformers', t.__version__)" \
    | tee "$out/versions.txt"

if [ "$smoke" = --cpu-smoke ]; then
    device=cpu
    # Limits per step in seconds (generous: on a 2-core host shared with other work the smoke took 10-19 minutes),
    # and the steps' options: the smallest bench batches, a tiny model on 1,500 pairs for 10 updates; no compiling
    # (so (a)'s eager step would repeat its last one, and is left out).
    limit_b=400 limit_c=400 limit_d=400
    bench_a="--config tiny --token-budget 100 --bf16 no --no-compile --reps 1 --warmup 1"
    bench_b=$bench_a
    tiny="--max-train-pairs 1500 --vocab-size 500 --max-tokens 500 --preset transformer-tiny --max-steps 10"
    tiny="$tiny --logging-steps 2"
    # --length_buckets 8: the static batch shapes of CUDA graphs go through the Trainer here too. --no-eval: an
    # untrained model decodes every sentence to its length limit, minutes on a busy 2-core host.
    train_c="$tiny --no-eval --length_buckets 8"
    train_d=$tiny
    budget=${GPU_CHECK_SECONDS:-2000}
else
    device=cuda
    nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
    # (c) first: the headline (its 60 s of training count the compile; then tokenizer, averaging and decoding), the
    # compiled base step last, with what is left of the 8 minutes (ours and Marian compiled at dynamic shapes took
    # minutes on the H100: it may not finish, and then says so).
    limit_a=40 limit_b=35 limit_c=160 limit_d=90
    bench_a="--config base --token-budget 25000 --bf16 only --reps 3 --warmup 1"
    bench_b="--config tiny --token-budget 8192 --bf16 only --no-compile --reps 5 --warmup 2"
    train_c=""
    # Eager: paper-base's compile (dynamic shapes, a few recompiles) took about 3 minutes on the H100 (bench/gpu.sh).
    train_d="--max-time 60s --torch-compile no"
    budget=${GPU_CHECK_SECONDS:-480}
fi

# (c) the GPU recipe, as `make train-gpu` runs it (the Makefile's .venv is not this machine's interpreter)
# shellcheck disable=SC2086  # the options are words
timeout "$limit_c" "$python" -m hf_vanilla_transformer train --recipe multi30k-gpu --no-progress \
    --output-dir "$out/train-gpu" $train_c > "$out/train_gpu.log" 2>&1
step $? "(c) train --recipe multi30k-gpu ($out/train_gpu.log)"

# (a) the base model step, ours and MarianMTModel: eager, then (last, below) compiled
if [ "$smoke" != --cpu-smoke ]; then
    # shellcheck disable=SC2086
    timeout "$limit_a" "$python" -m bench.bench --device "$device" --sections train $bench_a --no-compile \
        --json "$out/base_step_eager.json" > "$out/base_step_eager.log" 2>&1
    step $? "(a) bench.bench base train step, eager ($out/base_step_eager.log)"
fi

# (b) the model step alone at (c)'s shape
# shellcheck disable=SC2086
timeout "$limit_b" "$python" -m bench.bench --device "$device" --sections train $bench_b \
    --json "$out/gpu_recipe_step.json" > "$out/gpu_recipe_step.log" 2>&1
step $? "(b) bench.bench model step at multi30k-gpu's shape ($out/gpu_recipe_step.log)"

# (d) the paper-base recipe's loop rate
# shellcheck disable=SC2086
timeout "$limit_d" "$python" -m hf_vanilla_transformer train --recipe paper-base --no-eval --no-progress \
    --save-every 600m --logging-steps 10 --output-dir "$out/paper-base" $train_d > "$out/paper_base.log" 2>&1
step $? "(d) train --recipe paper-base ($out/paper_base.log)"

# (a) compiled (in the smoke, --no-compile again: the path, not the compile)
left=$((budget - (SECONDS - started) - 15))
# shellcheck disable=SC2086
timeout "$((left > 1 ? left : 1))" "$python" -m bench.bench --device "$device" --sections train $bench_a \
    --json "$out/base_step.json" > "$out/base_step.log" 2>&1
step $? "(a) bench.bench base train step, eager and compiled, in the ${left} s left ($out/base_step.log)"

"$python" -m bench.gpu_check_report "$out" | tee "$out/report.txt"
echo "[gpu_check $((SECONDS - started)) s] done, $failed step(s) failed"
[ "$failed" = 0 ]
