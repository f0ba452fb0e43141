"""The generate section of `python -m bench.bench` (greedy and beam 4, batch 1 and 16, ours against Marian and, in a
process of its own, CTranslate2) and what the decoding table shares with it: our weights in CTranslate2."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench.common import (
    BOS,
    CONFIGS,
    EOS,
    MODELS,
    NEW_TOKENS,
    PAD,
    SETTINGS,
    build_models,
    fmt,
    for_inference,
    generation,
    generation_cases,
    interleaved,
    paired_ratio,
    summary,
)


def ctranslate2_translators(
    model: nn.Module, folder: Path, compute_types: tuple[str, ...] = ("float32", "int8")
) -> dict[str, Any]:
    """Our weights through the Marian exporter (conversion/marian.py) into CTranslate2, one translator per compute
    type, on the CPU with this process's thread count. A word-level vocabulary ("w4", ...) stands in for a
    tokenizer."""
    import ctranslate2
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from conversion.marian import ToMarianOptions, export

    vocab = {"<s>": BOS, "<pad>": PAD, "</s>": EOS, "<unk>": 3} | {
        f"w{i}": i for i in range(4, model.config.vocab_size)
    }
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    model.save_pretrained(folder / "ours")
    tokenizer.save_pretrained(folder / "ours")
    export(ToMarianOptions(folder / "ours", folder / "marian"))
    ctranslate2.converters.TransformersConverter(str(folder / "marian")).convert(str(folder / "ct2"))
    threads = torch.get_num_threads()
    return {
        f"ct2_{compute_type}": ctranslate2.Translator(
            str(folder / "ct2"), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        for compute_type in compute_types
    }


def ct2_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[str]]:
    """The rows of a padded batch as CTranslate2's source tokens: the word-level vocabulary of
    `ctranslate2_translators`, padding dropped."""
    return [
        [f"w{i}" if i > EOS else "</s>" for i in row[row_mask.bool()].tolist()]
        for row, row_mask in zip(input_ids, attention_mask, strict=True)
    ]


def ct2_generation(translator: Any, source_tokens: list[list[str]], beams: int) -> Callable[[], Any]:
    def run() -> Any:
        return translator.translate_batch(
            source_tokens, beam_size=beams, min_decoding_length=NEW_TOKENS, max_decoding_length=NEW_TOKENS
        )

    return run


def ct2_worker(config: str, reps: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """In a fresh process: CTranslate2 (float32 and int8, interleaved) on every generation case; seconds per call.

    Not beside the PyTorch models: once CTranslate2 has run in a process, PyTorch's two-thread small matrix
    products there are 1.7x slower (its own OpenMP runtime; bench/README.md), which slowed ours and Marian alike
    and squeezed their ratio."""
    size = CONFIGS[config]
    result: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        translators = ctranslate2_translators(build_models(size)["ours"], Path(folder))
        for suffix, ids, mask, beams in generation_cases(size):
            tokens = ct2_tokens(ids, mask)
            fns = {name: ct2_generation(translator, tokens, beams) for name, translator in translators.items()}
            result[f"fp32/{suffix}"] = interleaved(fns, reps, warmup)[0]
    return result


def section_generate(config: str, reps: int, warmup: int) -> dict[str, Any]:
    """Greedy and beam-4 with the cache, batch 1 and 16, exactly NEW_TOKENS new tokens; on the CPU, CTranslate2 on
    the same weights as well (fp32 rows), in a subprocess (`ct2_worker`) after ours and Marian."""
    size = CONFIGS[config]
    models = for_inference(build_models(size))
    result: dict[str, Any] = {}
    for dtype in SETTINGS.dtypes:
        for suffix, ids, mask, beams in generation_cases(size):
            fns = {name: generation(models[name], ids, mask, beams, dtype) for name in MODELS}
            times, outputs, cpu = interleaved(fns, reps, warmup)
            key = f"{dtype}/{suffix}"
            rows = ids.shape[0]
            result[key] = {
                name: {
                    "seconds": summary(times[name]),
                    "cpu_seconds": summary(cpu[name]),
                    "new_tokens_per_s": summary([rows * NEW_TOKENS / s for s in times[name]]),
                }
                for name in fns
            }
            result[key]["ratio_ours_over_marian"] = paired_ratio(times["marian"], times["ours"])
            result[key]["same_tokens"] = bool(torch.equal(outputs["ours"][-1], outputs["marian"][-1]))
            print(f"  {key:24s} ours/marian {fmt(result[key]['ratio_ours_over_marian'], digits=3)}", flush=True)
    if SETTINGS.device.type == "cpu":
        command = [sys.executable, "-m", "bench.bench", "--config", config, "--threads", str(torch.get_num_threads())]
        command += ["--reps", str(reps), "--warmup", str(warmup), "--ct2-worker"]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        for key, times in json.loads(output.strip().splitlines()[-1]).items():
            ours = result[key]["ours"]["seconds"]["median"]
            for name, seconds in times.items():
                result[key][name] = {"seconds": summary(seconds)}
                # Not paired rep by rep (another process): the ratio of the two medians.
                result[key][f"ratio_ours_over_{name}"] = statistics.median(seconds) / ours
                print(f"  {key:24s} ours/{name} {result[key][f'ratio_ours_over_{name}']:.3f}", flush=True)
    return result
