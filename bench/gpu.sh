#!/usr/bin/env bash
# The GPU rows of docs/runs/gpu.md ("Compiled training on one H100"), in one go on a machine with one CUDA GPU:
#   1. the paper's base configuration (d_model 512, 6 + 6 layers, 37k vocabulary) on Multi30k-like batches of the
#      paper's size (25,000 tokens a side, §5.1), bf16 autocast, ours and MarianMTModel, eager and compiled, in one
#      interleaved run: target tokens/s, MFU, peak GPU memory;
#   2. a short compiled training run of the paper-base recipe on the bundled Multi30k, then its validation BLEU.
# Usage: bash bench/gpu.sh OUT_DIR [TRAIN_MINUTES]   (PYTHON=... picks the interpreter; SKIP_BENCH=1 runs step 2 alone)
# Time on one H100: step 1 about 7 minutes, 400 s of it compiling (2026-11-26); step 2 TRAIN_MINUTES (compiling
# included, about 3 minutes of it) plus about 2 minutes of tokenizer, decoding and scoring (2026-11-27, 5 minutes:
# 8 minutes in all). The training log gives the reason for each recompile (TORCH_LOGS=recompiles).
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh OUT_DIR [TRAIN_MINUTES]}
minutes=${2:-3}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv | tee "$out/gpu.txt"

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    "$python" -m bench.bench --device cuda --config base --sections train memory --bf16 only --token-budget 25000 \
        --reps 5 --warmup 1 --json "$out/gpu_base_train.json" 2>&1 | tee "$out/bench.log"
fi

run=$(mktemp -d)/paper-base-gpu
TORCH_LOGS=recompiles "$python" -m hf_vanilla_transformer train --recipe paper-base --torch-compile yes --bf16 auto \
    --max-time "${minutes}m" --curve-every 1m --save-every 1m --average-last 2 --no-progress \
    --output-dir "$run" 2>&1 | tee "$out/train.log"
cp "$run/model/results.json" "$out/train_results.json"
cp "$run/learning_curve.json" "$out/learning_curve.json"
"$python" -m hf_vanilla_transformer evaluate "$run/model" --split validation --no-progress 2>&1 | tee "$out/eval_val.log"
