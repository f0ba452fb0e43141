"""What a Python user gets on the CPU from `from_pretrained` + `generate()`, with and without the one-line step
`prepare_for_cpu_inference(model)`: the same model (transformers' default attention, sdpa, as a plain
`from_pretrained` gives; or `--attn-implementation eager`, what `translate` loads), plain and prepared, timed
interleaved rep by rep in one process (ABBA), with the tokens compared.

    .venv/bin/python -m bench.prepare_step [--configs tiny base] [--reps 5] [--threads 2] [--json out.json]

Cases: the bench's generation rows (batch 1 and 16, greedy and beam 4, exactly 40 new tokens), float32, random
weights. Prints the median milliseconds per call and the median of per-rep ratios plain / prepared (1.30 means the
prepared model is 1.3x faster). Not part of the tests.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch

from bench.common import CONFIGS, build_ours, environment, generation, generation_cases, interleaved, paired_ratio
from hf_vanilla_transformer import prepare_for_cpu_inference


def measure(config: str, reps: int, warmup: int, attention: str) -> dict[str, dict[str, float | bool]]:
    size = CONFIGS[config]
    torch.manual_seed(0)
    plain = build_ours(size).eval()
    plain.set_attn_implementation(attention)
    prepared = prepare_for_cpu_inference(copy.deepcopy(plain))
    rows: dict[str, dict[str, float | bool]] = {}
    for case, input_ids, attention_mask, beams in generation_cases(size):
        fns = {
            name: generation(model, input_ids, attention_mask, beams, "fp32")
            for name, model in (("plain", plain), ("prepared", prepared))
        }
        times, values, _ = interleaved(fns, reps, warmup)
        ratio = paired_ratio(times["plain"], times["prepared"])
        rows[f"{config}/{case}"] = {
            "plain_ms": 1000 * statistics.median(times["plain"]),
            "prepared_ms": 1000 * statistics.median(times["prepared"]),
            "plain_over_prepared": ratio["median"],
            "same_tokens": all(torch.equal(a, b) for a, b in zip(values["plain"], values["prepared"], strict=True)),
        }
        row = rows[f"{config}/{case}"]
        print(
            f"  {config}/{case:<14} plain {row['plain_ms']:8.1f} ms  prepared {row['prepared_ms']:8.1f} ms  "
            f"plain/prepared {row['plain_over_prepared']:.2f}x  same tokens: {row['same_tokens']}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["tiny", "base"], choices=sorted(CONFIGS))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"])
    parser.add_argument("--json", help="write the environment and every row to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    env = environment(args.threads)
    print(
        f"{env['cpu']} ({env['cpu_flags']}), {args.threads} threads, torch {env['torch']}, {args.attn_implementation}"
    )
    rows: dict[str, dict[str, float | bool]] = {}
    for config in args.configs:
        rows |= measure(config, args.reps, args.warmup, args.attn_implementation)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"environment": env, "attention": args.attn_implementation, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
