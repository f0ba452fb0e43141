"""Where a `generate()` call's time goes for our model: the decoder steps' forward (`model(...)`, the model's own
work), the encoder, and the rest, transformers' generic per-step work (logits processors, stopping criteria, cache
and kwargs bookkeeping, beam search bookkeeping) plus our generation hooks.

    .venv/bin/python -m bench.profile_decoding --config tiny [--threads 1] [--reps 5] [--cprofile greedy/batch1]

Settings as the bench's generation rows (the same weights, sources, exactly NEW_TOKENS new tokens, greedy and beam
4, batch 1 and 16), our model prepared for CPU inference (`prepare_for_cpu_inference`) and decoded by transformers'
own loop; times are medians. `--cprofile CASE` prints cProfile's top functions (by own time) for one case, to
attribute the generic part.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

import torch

from bench.common import CONFIGS, NEW_TOKENS, build_models, generation_cases
from hf_vanilla_transformer.inference import prepare_for_cpu_inference


class Timed:
    """Wraps a module's forward (as an instance attribute) and adds up its wall time."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.seconds = module, 0.0
        self.forward = type(module).forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.forward(self.module, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def profile_case(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, beams: int) -> dict[str, float]:
    """One timed `generate()`: total, decoder-step forward and encoder seconds."""
    step, encoder = Timed(model), Timed(model.get_encoder())
    model.forward, model.get_encoder().forward = step, encoder
    try:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                num_beams=beams,
                do_sample=False,
                eos_token_id=None,
                max_new_tokens=NEW_TOKENS,
            )
        total = time.perf_counter() - start
    finally:
        del model.forward, model.get_encoder().forward
    return {"total": total, "forward": step.seconds, "encoder": encoder.seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cprofile", metavar="CASE", help="e.g. greedy/batch1: cProfile's top functions")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = CONFIGS[args.config]
    model = prepare_for_cpu_inference(build_models(size)["ours"].eval())
    print(f"{args.config}, {args.threads} threads, {NEW_TOKENS} new tokens; ms per generate() (median), per step")
    print("| case | total | decoder forward | encoder | generic rest | rest per step |")
    print("|---|---|---|---|---|---|")
    for suffix, ids, mask, beams in generation_cases(size):
        if args.cprofile:
            if suffix != args.cprofile:
                continue
            profile_case(model, ids, mask, beams)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.reps):
                profile_case(model, ids, mask, beams)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            return
        profile_case(model, ids, mask, beams)  # warm-up
        results = [profile_case(model, ids, mask, beams) for _ in range(args.reps)]
        median = {key: statistics.median(r[key] for r in results) * 1e3 for key in results[0]}
        rest = statistics.median((r["total"] - r["forward"] - r["encoder"]) * 1e3 for r in results)
        print(
            f"| {suffix} | {median['total']:.1f} | {median['forward']:.1f} | {median['encoder']:.1f} "
            f"| {rest:.1f} | {rest / NEW_TOKENS:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
