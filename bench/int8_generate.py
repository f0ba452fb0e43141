"""`generate()` in float32 (the packed oneDNN path) against the same model after `quantize_int8`, random weights,
for the tiny and base configurations: greedy batch 16, beam 4 batch 1 and 16, 20 source tokens forced to 20 new ones.

    .venv/bin/python -m bench.int8_generate [--configs tiny base] [--reps 3] [--threads 2]

Prints the median milliseconds of each and the median of the per-rep fp32/int8 ratios (> 1: int8 faster); the reps
alternate fp32 and int8 after one warm-up call of each.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.inference.quantization import quantize_int8

CONFIGS = {"tiny": dict(N=3, d_model=256, d_ff=1024, h=4), "base": dict(N=6, d_model=512, d_ff=2048, h=8)}
CASES = ((1, 16), (4, 1), (4, 16))  # (num_beams, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["tiny", "base"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.configs:
        torch.manual_seed(0)
        config = VanillaTransformerConfig.from_paper(vocab_size=8000, max_position_embeddings=256, **CONFIGS[name])
        fp32 = VanillaTransformerForConditionalGeneration(config).eval()
        models = {"fp32": fp32, "int8": quantize_int8(copy.deepcopy(fp32))}
        for num_beams, batch in CASES:
            ids = torch.randint(4, 8000, (batch, 20), generator=torch.Generator().manual_seed(1))
            kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=num_beams)
            kwargs |= dict(max_new_tokens=20, eos_token_id=None)  # exactly 20 (min_new_tokens adds processors)
            times: dict[str, list[float]] = {key: [] for key in models}
            with torch.no_grad():
                for model in models.values():  # warm-up
                    model.generate(**kwargs)
                for _ in range(args.reps):
                    for key, model in models.items():
                        start = time.perf_counter()
                        model.generate(**kwargs)
                        times[key].append(time.perf_counter() - start)
            fp32_ms, int8_ms = (statistics.median(times[key]) * 1000 for key in models)
            ratio = statistics.median(a / b for a, b in zip(times["fp32"], times["int8"], strict=True))
            print(
                f"{name} beams {num_beams} batch {batch}: fp32 {fp32_ms:.0f} ms, int8 {int8_ms:.0f} ms, "
                f"fp32/int8 {ratio:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
