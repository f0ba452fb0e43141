"""`generate()` with a decoding step's small float32 products split over the threads (cpu_inference.split_linear,
the default on AMD CPUs, forced here on any CPU) and without (`SPLIT_LINEAR_MAX_ROWS = 0`: `F.linear`), interleaved
rep by rep, in the bench's generation rows (tiny and base configurations, greedy and beam 4, batch 1 and 16, exactly
NEW_TOKENS new tokens).

    .venv/bin/python -m bench.split_linear [--configs tiny base] [--threads 2] [--reps 3]

Prints milliseconds per call (medians), the median of per-rep ratios (without / with: above 1, splitting is faster)
and whether both settings gave the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from bench.common import (
    CONFIGS,
    build_models,
    environment,
    generation,
    generation_cases,
    interleaved,
    paired_ratio,
)
from hf_vanilla_transformer.inference import cpu_inference, prepare_for_cpu_inference


def generate_with(model: torch.nn.Module, max_rows: int, ids: torch.Tensor, mask: torch.Tensor, beams: int):
    """A function that runs the bench's generate() call with `SPLIT_LINEAR_MAX_ROWS = max_rows` (its tokens)."""
    run = generation(model, ids, mask, beams, "fp32")

    def call() -> torch.Tensor:
        saved = cpu_inference.SPLIT_LINEAR_MAX_ROWS
        cpu_inference.SPLIT_LINEAR_MAX_ROWS = max_rows
        try:
            return run()
        finally:
            cpu_inference.SPLIT_LINEAR_MAX_ROWS = saved

    return call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["tiny", "base"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu_inference.few_row_split_pays = lambda: True  # measure the split itself, on any CPU
    env = environment(args.threads)
    print(json.dumps(env))
    print("| config | case | split (ms) | F.linear (ms) | speed-up | same tokens |\n|---|---|---|---|---|---|")
    for config in args.configs:
        size = CONFIGS[config]
        model = prepare_for_cpu_inference(build_models(size)["ours"].eval())
        for suffix, ids, mask, beams in generation_cases(size):
            fns = {
                "split": generate_with(model, cpu_inference.SPLIT_LINEAR_MAX_ROWS, ids, mask, beams),
                "plain": generate_with(model, 0, ids, mask, beams),
            }
            times, values, _ = interleaved(fns, args.reps, args.warmup)
            ratio = paired_ratio(times["plain"], times["split"])["median"]
            same = all(torch.equal(a, b) for a, b in zip(values["split"], values["plain"], strict=True))
            split_ms, plain_ms = (statistics.median(times[name]) * 1e3 for name in ("split", "plain"))
            print(f"| {config} | {suffix} | {split_ms:.1f} | {plain_ms:.1f} | {ratio:.2f}x | {same} |", flush=True)


if __name__ == "__main__":
    main()
