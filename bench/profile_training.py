"""Where the time of one training step goes, eager and compiled: torch.profiler over the bench's four
token-budget batches (bench/common.py's `bench_batches`), ours and `MarianMTModel`, after a warm-up that compiles.

    .venv/bin/python -m bench.profile_training --config tiny --dtype bf16 [--json out.json]

Prints, per (model, mode), the operators with the most self CPU time and their share of the step, grouped into
GEMMs (mm/addmm/bmm/linear and their oneDNN forms), compiled kernels (inductor's fused C++ kernels), the optimizer,
and the rest.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from bench.common import CONFIGS, MODELS, bench_batches, build_models, environment
from bench.training import train_steps

GEMM = ("mm", "addmm", "bmm", "linear", "matmul", "mkldnn", "onednn", "_weight_int8", "baddbmm")


def group(name: str) -> str:
    lowered = name.lower()
    if "cpp_fused" in lowered or "graph_" in lowered or "compiled" in lowered or lowered.startswith("kernel"):
        return "compiled kernels"
    if any(lowered.split("::")[-1].startswith(token) or token in lowered for token in GEMM):
        return "GEMM"
    if "adam" in lowered or "foreach" in lowered or "optimizer" in lowered:
        return "optimizer"
    return "other"


def profile_step(config: str, name: str, mode: str, dtype: str, top: int) -> dict[str, Any]:
    size = CONFIGS[config]
    batches = bench_batches(size["vocab_size"])
    model = build_models(size)[name]
    step = train_steps(torch.compile(model) if mode == "compiled" else model, batches, dtype)
    step()
    step()  # compiled: the recompile for the batches' other shapes happened in the first call
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = [event for event in prof.key_averages() if event.self_cpu_time_total > 0]
    total = sum(event.self_cpu_time_total for event in events)
    groups: dict[str, float] = defaultdict(float)
    for event in events:
        groups[group(event.key)] += event.self_cpu_time_total / total
    ranked = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return {
        "self_cpu_seconds": total / 1e6,
        "groups": dict(sorted(groups.items(), key=lambda item: -item[1])),
        "top": [
            {"op": event.key, "share": event.self_cpu_time_total / total, "calls": event.count} for event in ranked
        ],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"environment": environment(torch.get_num_threads()), "config": args.config}
    results["dtype"] = args.dtype
    for name in args.models:
        for mode in args.modes:
            row = profile_step(args.config, name, mode, args.dtype, args.top)
            results[f"{name}/{mode}"] = row
            print(f"\n{name} {mode} {args.dtype}: {row['self_cpu_seconds']:.2f} s self CPU time in one step")
            print("  " + ", ".join(f"{key} {share:.0%}" for key, share in row["groups"].items()))
            for op in row["top"]:
                print(f"  {op['share']:6.1%}  {op['calls']:5d}  {op['op']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
