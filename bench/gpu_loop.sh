#!/usr/bin/env bash
# Where the training loop loses the GPU's time (docs/runs/gpu.md, "Compiled training on the H100: it learns, and the
# training loop is the limit"): the paper-base recipe trained eagerly for TRAIN_MINUTES on the bundled Multi30k, two
# ways in one go on a machine with one CUDA GPU, then each way's target tokens per second between logs:
#   default          as `train` sets it up: batches read and padded in 2 worker processes, pinned, copied without
#                    blocking, no read-back from the GPU in an ordinary update (docs/training.md, "The training loop");
#   main-process     --dataloader_num_workers 0: the batches read and padded in the main process;
# then the host's cost of one such batch read and padded in the main process (bench/batch_prep.py, ~20 s).
# Usage: bash bench/gpu_loop.sh OUT_DIR [TRAIN_MINUTES]   (PYTHON=... picks the interpreter; EXTRA="..." adds
# `train` options to every way, e.g. EXTRA="--preset transformer-tiny --max-tokens 1000" for a trial on a CPU)
# Time: 2 x (TRAIN_MINUTES + about 40 s of start-up and saving), then about 20 s.
set -uo pipefail
out=${1:?usage: bash bench/gpu_loop.sh OUT_DIR [TRAIN_MINUTES]}
minutes=${2:-1}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
declare -A ways=(
    [default]=""
    [main-process]="--dataloader_num_workers 0"
)
for way in default main-process; do
    # shellcheck disable=SC2086  # the options are words
    "$python" -m hf_vanilla_transformer train --recipe paper-base --torch-compile no --bf16 auto \
        --max-time "${minutes}m" --save-every 600m --logging-steps 25 --no-eval --no-progress \
        --output-dir "$(mktemp -d)/run" ${ways[$way]} ${EXTRA:-} > "$out/$way.log" 2>&1
    echo "$way: rc $?"
done
"$python" -m bench.batch_prep --max-tokens 25000 --json "$out/batch_prep.json"
"$python" - "$out" <<'EOF'
import ast
import statistics
import sys
from pathlib import Path

print("| way | updates logged | target tok/s between logs (median, after the first two logs) |")
print("|---|---|---|")
for way in ("default", "main-process"):
    logs = [
        ast.literal_eval(line)
        for line in (Path(sys.argv[1]) / f"{way}.log").read_text().splitlines()
        if line.startswith("{'loss'")
    ]
    rates = [float(log["tgt_tokens_per_second"]) for log in logs[2:]]
    median = f"{statistics.median(rates):,.0f}" if rates else "none"
    print(f"| {way} | {len(logs)} | {median} |")
EOF
