"""The bench's library: the models (ours and `MarianMTModel` with the same weights), Multi30k-like batches, the
timed work items, timing (interleaved ABBA reps, medians, paired ratios) and the description of the host.

Both models get the same architecture, sizes and weights (Marian's [sin | cos] sinusoids: ours runs with
`sinusoidal_layout="concat"`, so both compute the same function), the same batches and the same generation settings.
Every measurement alternates the models rep by rep (ABBA order) after warm-up and reports medians and spreads; ratios
are medians of the per-rep ratios, so that load from other processes on the machine hits both models alike. See
bench/README.md for the method.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch import nn
from transformers import GenerationConfig, MarianMTModel

from conversion.marian import vanilla_to_marian
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.inference.cpu_inference import prepare_for_cpu_inference

# Sizes: "tiny" is the Multi30k model (`make train`'s transformer-multi30k preset); "base" is the paper's base
# model (Table 3).
CONFIGS: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn=1024),
    "base": dict(vocab_size=37000, d_model=512, layers=6, heads=8, ffn=2048),
}
MODELS = ("ours", "marian")
BOS, PAD, EOS = 0, 1, 2  # the decoder starts from <pad> in both models (Marian's convention)
# Generation makes exactly this many new tokens: max_new_tokens with no EOS (eos_token_id=None) for the PyTorch models,
# min = max decoding length for CTranslate2. (min_new_tokens would add two logits processors that copy the (rows,
# vocabulary) scores at every step, 8-12% of a batch-16 call, which a translation does not run.)
NEW_TOKENS = 40


@dataclass
class Settings:
    """What `python -m bench.bench`'s command line sets for every section (these defaults: the CPU)."""

    # Where the models run (`--device`); on a GPU every timed call ends with a synchronisation.
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    attention: str = "eager"  # both models' attention kernels (--attn-implementation)
    dtypes: tuple[str, ...] = ("fp32", "bf16")  # fp32 alone where bf16 is slow (--bf16)
    # Training steps eager and compiled (torch.compile, inductor), where compiling works here (--no-compile).
    modes: tuple[str, ...] = ("eager", "compiled")
    # torch.compile's `dynamic` for the train section (--compile-shapes): None = automatic dynamic shapes (what
    # `train --torch-compile` gets), False = one graph per batch shape, with kernels for its fixed sizes.
    compile_dynamic: bool | None = None
    # torch.compile's `mode` for the train section (--compile-mode): "default", or "max-autotune", which times
    # inductor's GEMM templates (C++ with AMX micro-kernels on the CPU) against ATen's for each shape while compiling.
    compile_mode: str = "default"
    # Rows x longest side of a batch, as the Multi30k batches of the MarianMTModel reference run (docs/runs/speed.md);
    # --token-budget 25000 gives the paper's batches (§5.1) on a GPU.
    token_budget: int = 4096


SETTINGS = Settings()


def synchronize() -> None:
    if SETTINGS.device.type == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------------------------------
# Models


def build_ours(size: dict[str, int]) -> VanillaTransformerForConditionalGeneration:
    """Our model with Marian's [sin | cos] sinusoid layout (`sinusoidal_layout="concat"`), so that both models
    compute the same function from the same weights."""
    config = VanillaTransformerConfig.from_paper(
        N=size["layers"],
        d_model=size["d_model"],
        d_ff=size["ffn"],
        h=size["heads"],
        P_drop=0.1,
        vocab_size=size["vocab_size"],
        sinusoidal_layout="concat",
        max_position_embeddings=512,
        bos_token_id=BOS,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=PAD,
    )
    return VanillaTransformerForConditionalGeneration(config)


def build_marian(size: dict[str, int]) -> MarianMTModel:
    """`MarianMTModel` computing what `build_ours` computes (ReLU, embeddings x √d_model, one matrix for both
    embeddings and the output projection, dropout 0.1, no attention/ReLU dropout, the same special ids, no forced
    EOS), with the same weights: our model through the Marian exporter (conversion/marian.py), token ids kept."""
    return vanilla_to_marian(build_ours(size), move_pad_last=False)[0]


def prepare(model: nn.Module) -> nn.Module:
    """The same attention kernels (those of `hf-vanilla-transformer train` unless --attn-implementation) and the
    same plain generation config (no model-specific decoding defaults) for both."""
    model.set_attn_implementation(SETTINGS.attention)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD
    )
    return model


def for_inference(models: dict[str, Any]) -> dict[str, Any]:
    """`models` with ours (every "ours..." model) in eval mode and prepared for CPU inference
    (`prepare_for_cpu_inference`, as `translate` and `evaluate` run it); Marian, and strings saying why a model is
    missing, as they are."""
    for name, model in models.items():
        if name.startswith("ours") and isinstance(model, nn.Module):
            prepare_for_cpu_inference(model.eval())
    return models


def build_models(size: dict[str, int], seed: int = 0) -> dict[str, nn.Module]:
    """Both models with the same weights: ours initialised from `seed`, exported to Marian."""
    torch.manual_seed(seed)
    ours = build_ours(size)
    marian, _ = vanilla_to_marian(ours, move_pad_last=False)
    return {"ours": prepare(ours).to(SETTINGS.device), "marian": prepare(marian).to(SETTINGS.device)}


# ---------------------------------------------------------------------------------------------------------------
# Data: Multi30k-like lengths, token-budget batches


@dataclass
class Batch:
    """A padded batch: input_ids/attention_mask (B, S), decoder_input_ids/labels (B, T) with -100 at padding."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    decoder_input_ids: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        tensors = (self.input_ids, self.attention_mask, self.decoder_input_ids, self.labels)
        return Batch(*(tensor.to(device) for tensor in tensors))

    @property
    def target_tokens(self) -> int:
        return int((self.labels != -100).sum())

    @property
    def source_tokens(self) -> int:
        return int(self.attention_mask.sum())


def sample_lengths(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Source and target lengths in subword tokens (EOS included) of n Multi30k-like sentence pairs.

    Log-normal fits to Multi30k train with a 10k joint BPE: mean 16.2 source (EN) and 15.4 target (DE) tokens,
    σ(log length) = 0.33, correlation 0.9 between the two sides of a pair; clamped to [3, 80].
    """
    z_source = torch.randn(n, generator=generator)
    z_target = 0.9 * z_source + math.sqrt(1 - 0.9**2) * torch.randn(n, generator=generator)
    sigma = 0.33
    source = torch.exp(math.log(16.2) - sigma**2 / 2 + sigma * z_source).round().clamp(3, 80).long()
    target = torch.exp(math.log(15.4) - sigma**2 / 2 + sigma * z_target).round().clamp(3, 80).long()
    return source, target


def make_batch(source_lengths: list[int], target_lengths: list[int], vocab: int, generator: torch.Generator) -> Batch:
    rows, source_len, target_len = len(source_lengths), max(source_lengths), max(target_lengths)
    source = torch.tensor(source_lengths)
    target = torch.tensor(target_lengths)
    attention_mask = (torch.arange(source_len)[None] < source[:, None]).long()
    input_ids = torch.randint(4, vocab, (rows, source_len), generator=generator).masked_fill(attention_mask == 0, PAD)
    input_ids[torch.arange(rows), source - 1] = EOS
    labels = torch.randint(4, vocab, (rows, target_len), generator=generator)
    labels[torch.arange(rows), target - 1] = EOS
    labels = labels.masked_fill(torch.arange(target_len)[None] >= target[:, None], -100)
    decoder_input_ids = torch.cat([torch.full((rows, 1), PAD), labels[:, :-1]], 1).masked_fill_(
        torch.cat([torch.zeros(rows, 1, dtype=torch.bool), labels[:, :-1] == -100], 1), PAD
    )
    return Batch(input_ids, attention_mask, decoder_input_ids, labels)


def token_budget_batches(vocab: int, seed: int = 0, pairs: int = 29000) -> list[Batch]:
    """An epoch of Multi30k-like pairs, sorted by length and cut into batches of at most SETTINGS.token_budget tokens
    (rows x longest side), as the token batcher of the MarianMTModel reference run (≈ 127 batches of ≈ 3,500 target
    tokens)."""
    generator = torch.Generator().manual_seed(seed)
    source, target = sample_lengths(pairs, generator)
    order = torch.argsort(source * 1000 + target)
    source_list, target_list = source[order].tolist(), target[order].tolist()
    spans, start, budget = [], 0, SETTINGS.token_budget
    while start < pairs:
        end, longest = start, 0
        while end < pairs and (end - start + 1) * max(longest, source_list[end], target_list[end]) <= budget:
            longest = max(longest, source_list[end], target_list[end])
            end += 1
        spans.append((start, end))
        start = end
    return [make_batch(source_list[a:b], target_list[a:b], vocab, generator) for a, b in spans]


def bench_batches(vocab: int, count: int = 4) -> list[Batch]:
    """`count` batches at evenly spaced quantiles of the epoch's length order (short to long sentences)."""
    epoch = token_budget_batches(vocab)
    return [epoch[int((i + 0.5) / count * len(epoch))] for i in range(count)]


def generation_sources(vocab: int, rows: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """`rows` unsorted Multi30k-like source sentences, right-padded: input_ids and attention_mask (rows, S)."""
    generator = torch.Generator().manual_seed(seed)
    source, target = sample_lengths(rows, generator)
    batch = make_batch(source.tolist(), target.tolist(), vocab, generator)
    return batch.input_ids, batch.attention_mask


def generation_cases(size: dict[str, int]) -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """(name suffix, input_ids, attention_mask, beams) for batch 1 and 16 of the same sources, greedy and beam 4."""
    input_ids, attention_mask = generation_sources(size["vocab_size"], 16)
    cases = []
    for rows in (1, 16):
        ids = input_ids[:rows, : int(attention_mask[:rows].sum(-1).max())]
        mask = attention_mask[:rows, : ids.shape[1]]
        for beams in (1, 4):
            cases.append((f"{'greedy' if beams == 1 else 'beam4'}/batch{rows}", ids, mask, beams))
    return cases


# ---------------------------------------------------------------------------------------------------------------
# Work items


def autocast(dtype: str) -> torch.autocast:
    return torch.autocast(SETTINGS.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def generation(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, beams: int, dtype: str
) -> Callable[[], torch.Tensor]:
    input_ids, attention_mask = input_ids.to(SETTINGS.device), attention_mask.to(SETTINGS.device)

    def run() -> torch.Tensor:
        model.eval()
        with torch.no_grad(), autocast(dtype):
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                num_beams=beams,
                do_sample=False,
                eos_token_id=None,
                max_new_tokens=NEW_TOKENS,
                use_cache=True,
            )
        return output.cpu()  # waits for the device

    return run


# ---------------------------------------------------------------------------------------------------------------
# Timing


def summary(values: list[float]) -> dict[str, float]:
    """Median, min, max and interquartile range."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "q1": quartiles[0],
        "q3": quartiles[2],
        "n": len(ordered),
    }


def interleaved(
    fns: dict[str, Callable[[], Any]], reps: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, list[Any]], dict[str, list[float]]]:
    """Run every function `warmup` times, then `reps` times in alternating (ABBA) order. Returns, per function,
    the wall-clock seconds per call, the values the timed calls returned and the process CPU seconds per call
    (user + system, all threads: a check on wall times when other processes share the cores)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    values: dict[str, list[Any]] = {name: [] for name in fns}
    for rep in range(reps):
        order = list(fns) if rep % 2 == 0 else list(reversed(list(fns)))
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            values[name].append(fns[name]())
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return times, values, cpu


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Per-rep ratios numerator[i] / denominator[i] (the same rep ran both back to back), summarised."""
    return summary([a / b for a, b in zip(numerator, denominator, strict=True)])


def fmt(stats: dict[str, float], scale: float = 1.0, digits: int = 0) -> str:
    median, q1, q3 = (stats[k] * scale for k in ("median", "q1", "q3"))
    return f"{median:,.{digits}f} [{q1:,.{digits}f}-{q3:,.{digits}f}]"


# ---------------------------------------------------------------------------------------------------------------
# The host


# The CPU flags that decide which matrix kernels run (fp32 SIMD width, int8 dot products, bf16 and AMX units).
MATRIX_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def host() -> dict[str, Any]:
    """The machine and software a measurement ran on: the CPU's model name and which of MATRIX_FLAGS it has (from
    /proc/cpuinfo where there is one), the versions, the time and the load average at the start."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            cpu = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            present = next(line.split(":", 1)[1].split() for line in cpuinfo if line.startswith("flags"))
        flags = [flag for flag in MATRIX_FLAGS if flag in present]
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu_flags": " ".join(flags),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
    }


def environment(threads: int) -> dict[str, Any]:
    """`host()` with what the bench's measurements also depend on: CTranslate2, the device, threads, attention."""
    try:
        import ctranslate2

        ct2_version = ctranslate2.__version__
    except ImportError:
        ct2_version = "not installed"
    return {
        **host(),
        "ctranslate2": ct2_version,
        "device": torch.cuda.get_device_name() if SETTINGS.device.type == "cuda" else "cpu",
        "threads": threads,
        "attn_implementation": SETTINGS.attention,
    }
