"""Whether generation-loop overrides pay: `generate()` of our model (prepared for CPU inference, as the commands run
it) with transformers' own loop and with each candidate override, interleaved rep by rep in one process (bench.bench's
ABBA rounds). A model-side override stays only where it makes `generate()` at least 10% faster.

    .venv/bin/python -m bench.generation_overrides [--configs tiny base] [--threads 1] [--reps 9]

The candidates, once in model/generation_vanilla_transformer.py and removed after this measurement, are kept here to
measure: `memo` (`_get_logits_processor` returning a list that reads each processor's signature once), `signature`
(`forward.__signature__` computed once, as `__init_subclass__` did) and `inputs` (a light
`prepare_inputs_for_generation` for decoding steps with the dynamic cache). Cases: batch 1, greedy and beam 4, random
weights, exactly NEW_TOKENS new tokens (eos_token_id=None). Prints the median milliseconds per call and, per
candidate, the median of per-rep ratios (transformers' loop / with it: 1.10 means 10% faster with it).

Measured 2026-11-26 on an Intel Xeon with AMX, 2 cores shared with other jobs, hence 1 thread (at 2 threads a
tiny greedy call took 1-2 s instead of 0.12 s, threads waiting for a busy core). Tiny, 21 reps, greedy / beam 4:
memo 0.98 / 1.00, signature 1.00 / 1.02, inputs 1.07 / 1.04, all three 1.04 / 1.02. Base, 9 reps (each candidate
removed from all three): 0.99-1.04, all three 1.04 / 0.99. None reaches 1.10: all three were removed.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.generation import GenerationMixin, LogitsProcessorList

from bench.bench import CONFIGS, build_ours, environment, generation, generation_cases, interleaved, paired_ratio
from bench.bench import prepare as same_settings
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration, prepare_for_cpu_inference

CANDIDATES = ("memo", "signature", "inputs")
# Model inputs that send `light_prepare_inputs` to transformers' general path (they need slicing, mask building or
# dropping after the first step); a decoding step of this model brings none of them.
GENERAL_PATH_INPUTS = frozenset(
    {
        "decoder_attention_mask",
        "decoder_position_ids",
        "position_ids",
        "token_type_ids",
        "mm_token_type_ids",
        "moe_mm_token_type_ids",
        "past_key_values",
        "inputs_embeds",
        "labels",
        "mm_encoder_outputs",
        "pixel_values",
        "pixel_mask",
    }
)


class SignatureMemoLogitsProcessorList(LogitsProcessorList):
    """`LogitsProcessorList` reading each processor's `__call__` signature once instead of at every step."""

    def __init__(self, processors: Any = ()) -> None:
        super().__init__(processors)
        self._parameters: dict[Any, list[str]] = {}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        for processor in self:
            call = processor.__call__
            key = getattr(call, "__func__", call)  # a bound method is a new object at every access
            names = self._parameters.get(key)
            if names is None:
                names = self._parameters[key] = list(inspect.signature(call).parameters)
            scores = processor(input_ids, scores, **kwargs) if len(names) > 2 else processor(input_ids, scores)
        return scores


def memo_logits_processor(self: GenerationMixin, *args: Any, **kwargs: Any) -> LogitsProcessorList:
    return SignatureMemoLogitsProcessorList(GenerationMixin._get_logits_processor(self, *args, **kwargs))


def light_prepare_inputs(
    self: GenerationMixin,
    input_ids: torch.LongTensor,
    next_sequence_length: int | None = None,
    cache: Cache | None = None,
    attention_mask: torch.LongTensor | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A decoding step's inputs as transformers builds them for this model (last token, cache, source mask, other
    kwargs as they are), without its general machinery; every other case takes transformers' path."""
    if (
        next_sequence_length == 1
        and type(cache) is EncoderDecoderCache
        and not cache.is_compileable
        and not kwargs.get("is_first_iteration")
        and GENERAL_PATH_INPUTS.isdisjoint(kwargs)
    ):
        model_inputs: dict[str, Any] = {"decoder_input_ids": input_ids[:, -1:].clone(), "cache": cache}
        if attention_mask is not None:
            model_inputs["attention_mask"] = attention_mask
        kwargs.pop("is_first_iteration", None)
        return {**kwargs, **model_inputs}
    kwargs |= dict(next_sequence_length=next_sequence_length, cache=cache, attention_mask=attention_mask)
    return GenerationMixin.prepare_inputs_for_generation(self, input_ids, **kwargs)


@contextlib.contextmanager
def with_candidates(names: tuple[str, ...]) -> Iterator[None]:
    """Within the block, the model class runs the named candidates instead of transformers' own code."""
    cls = VanillaTransformerForConditionalGeneration
    if "memo" in names:
        cls._get_logits_processor = memo_logits_processor
    if "inputs" in names:
        cls.prepare_inputs_for_generation = light_prepare_inputs
    if "signature" in names:
        cls.forward.__signature__ = inspect.signature(cls.forward)
    try:
        yield
    finally:
        if "memo" in names:
            del cls._get_logits_processor
        if "inputs" in names:
            del cls.prepare_inputs_for_generation
        if "signature" in names:
            del cls.forward.__signature__


def timed_with(run: Callable[[], torch.Tensor], names: tuple[str, ...]) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        with with_candidates(names):
            return run()

    return call


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["tiny", "base"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(environment(args.threads)))
    variants: dict[str, tuple[str, ...]] = {"transformers": ()}
    variants |= {name: (name,) for name in CANDIDATES}
    variants["all three"] = CANDIDATES
    others = list(variants)[1:]
    header = [f"{name} (ms)" for name in variants] + [f"transformers / {name}" for name in others]
    print(f"| config | case | {' | '.join(header)} | same tokens |")
    print("|---" * (len(header) + 3) + "|")
    for config in args.configs:
        torch.manual_seed(0)
        model = prepare_for_cpu_inference(same_settings(build_ours(CONFIGS[config])).eval())
        for suffix, ids, mask, beams in generation_cases(CONFIGS[config]):
            if not suffix.endswith("/batch1"):
                continue
            run = generation(model, ids, mask, beams, "fp32")
            fns = {name: timed_with(run, names) for name, names in variants.items()}
            times, values, _ = interleaved(fns, args.reps, args.warmup)
            cells = [f"{1e3 * statistics.median(times[name]):.1f}" for name in variants]
            cells += [f"{paired_ratio(times['transformers'], times[name])['median']:.3f}" for name in others]
            reference = values["transformers"][0]
            same = all(torch.equal(value, reference) for series in values.values() for value in series)
            print(f"| {config} | {suffix} | {' | '.join(cells)} | {same} |", flush=True)


if __name__ == "__main__":
    main()
