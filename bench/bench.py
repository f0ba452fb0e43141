"""Our model against Hugging Face's `MarianMTModel` on the same work, in one process, interleaved.

    .venv/bin/python -m bench.bench --config tiny [--json bench/results_tiny.json]

Both models get the same architecture, sizes and weights (Marian's [sin | cos] sinusoids: ours runs with
`sinusoidal_layout="concat"`, so both compute the same function; the script checks that their logits agree), the
same batches, the same loss function and the same generation settings. Every measurement alternates the models
rep by rep (ABBA order) after warm-up and reports medians and spreads; ratios are medians of the per-rep ratios,
so that load from other processes on the machine hits both models alike. CTranslate2, on the same weights, runs
in a process of its own (`--ct2-worker`): beside PyTorch it slows PyTorch's small matrix products. See
bench/README.md for the method.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import GenerationConfig, MarianMTModel

from conversion.marian import vanilla_to_marian
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.inference.cpu_inference import keep_freed_memory, prepare_for_cpu_inference
from hf_vanilla_transformer.training.compiling import compile_counts, compile_failure
from hf_vanilla_transformer.training.cpu_training import prepare_for_cpu_training
from hf_vanilla_transformer.training.trainer import resolve_bf16

# Sizes: "tiny" is the Multi30k model (`make train`'s transformer-multi30k preset); "base" is the paper's base
# model (Table 3).
CONFIGS: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn=1024),
    "base": dict(vocab_size=37000, d_model=512, layers=6, heads=8, ffn=2048),
}
MODELS = ("ours", "marian")
# Training steps eager and compiled (torch.compile, inductor), where compiling works here (--no-compile; set in main).
MODES: tuple[str, ...] = ("eager", "compiled")
# torch.compile's `dynamic` for the train section (--compile-shapes; set in main): None = automatic dynamic shapes
# (what `train --torch-compile` gets), False = one graph per batch shape, with kernels for its fixed sizes.
COMPILE_DYNAMIC: bool | None = None
# torch.compile's `mode` for the train section (--compile-mode; set in main): "default", or "max-autotune", which times
# inductor's GEMM templates (C++ with AMX micro-kernels on the CPU) against ATen's for each shape while compiling.
COMPILE_MODE = "default"
DTYPES: tuple[str, ...] = ("fp32", "bf16")  # fp32 alone where bf16 is slow (--bf16; set in main)
BOS, PAD, EOS = 0, 1, 2  # the decoder starts from <pad> in both models (Marian's convention)
# Rows x longest side of a batch, as the Multi30k batches of the MarianMTModel reference run (docs/results.md);
# --token-budget 25000 gives the paper's batches (§5.1) on a GPU. Set in main.
TOKEN_BUDGET = 4096
# Dense bf16 tensor-core peaks in FLOP/s, by the device name torch reports, for the MFU of training steps on a GPU
# (NVIDIA's data sheets: H100 and H200 SXM 989 TFLOP/s); --peak-tflops gives it for other devices.
PEAK_FLOPS = {"H100 80GB HBM3": 989.4e12, "H200": 989.4e12}
# Generation makes exactly this many new tokens: max_new_tokens with no EOS (eos_token_id=None) for the PyTorch models,
# min = max decoding length for CTranslate2. (min_new_tokens would add two logits processors that copy the (rows,
# vocabulary) scores at every step, 8-12% of a batch-16 call, which a translation does not run.)
NEW_TOKENS = 40
LABEL_SMOOTHING = 0.1  # §5.4
# Where the models run (`--device`); on a GPU every timed call ends with a synchronisation.
DEVICE = torch.device("cpu")
ATTENTION = "eager"  # both models' attention kernels (--attn-implementation; set in main)


def synchronize() -> None:
    if DEVICE.type == "cuda":
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
    model.set_attn_implementation(ATTENTION)
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
    return {"ours": prepare(ours).to(DEVICE), "marian": prepare(marian).to(DEVICE)}


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
    """An epoch of Multi30k-like pairs, sorted by length and cut into batches of at most TOKEN_BUDGET tokens
    (rows x longest side), as the token batcher of the MarianMTModel reference run (≈ 127 batches of ≈ 3,500 target
    tokens)."""
    generator = torch.Generator().manual_seed(seed)
    source, target = sample_lengths(pairs, generator)
    order = torch.argsort(source * 1000 + target)
    source_list, target_list = source[order].tolist(), target[order].tolist()
    spans, start = [], 0
    while start < pairs:
        end, longest = start, 0
        while end < pairs and (end - start + 1) * max(longest, source_list[end], target_list[end]) <= TOKEN_BUDGET:
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


# ---------------------------------------------------------------------------------------------------------------
# Work items


def training_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Label-smoothed (ε_ls = 0.1, §5.4) token-level cross-entropy, each model's fastest way: ours fuses the
    projection with the loss (`skip_logits`, what VanillaSeq2SeqTrainer uses); Marian's logits go through
    `cross_entropy(label_smoothing=...)`, PyTorch's fused kernel (faster than the Trainer's LabelSmoother)."""
    inputs = dict(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=batch.decoder_input_ids
    )
    # `torch.compile` wraps the model (`_orig_mod`); the Trainer unwraps it the same way before choosing the loss.
    if isinstance(getattr(model, "_orig_mod", model), VanillaTransformerForConditionalGeneration):
        return model(**inputs, labels=batch.labels, label_smoothing=LABEL_SMOOTHING, skip_logits=True).loss
    logits = model(**inputs).logits
    return nn.functional.cross_entropy(
        logits.float().flatten(0, 1), batch.labels.flatten(), ignore_index=-100, label_smoothing=LABEL_SMOOTHING
    )


def autocast(dtype: str) -> torch.autocast:
    return torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


def train_steps(model: nn.Module, batches: list[Batch], dtype: str) -> Callable[[], float]:
    """One training step (forward, loss, backward, AdamW) per batch; returns the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    batches = [batch.to(DEVICE) for batch in batches]

    def run() -> float:
        model.train()
        prepare_for_cpu_training(model)  # as VanillaSeq2SeqTrainer's training step (Marian has no nn.Dropout)
        loss = torch.zeros(())
        for batch in batches:
            with autocast(dtype):
                loss = training_loss(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.item()  # waits for the device

    return run


def encoder_forward(model: nn.Module, batches: list[Batch], dtype: str) -> Callable[[], None]:
    batches = [batch.to(DEVICE) for batch in batches]

    def run() -> None:
        model.eval()
        with torch.no_grad(), autocast(dtype):
            for batch in batches:
                model.get_encoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        synchronize()

    return run


def generation(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, beams: int, dtype: str
) -> Callable[[], torch.Tensor]:
    input_ids, attention_mask = input_ids.to(DEVICE), attention_mask.to(DEVICE)

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
# FLOPs and the GEMM ceiling


def train_flops(size: dict[str, int], rows: int, source_len: int, target_len: int) -> float:
    """Matrix-multiply FLOPs of one training step over the padded batch (see bench/README.md for the formula):
    6 x the forward multiply-accumulates (forward 1x, backward 2x, 2 FLOPs per MAC)."""
    d, f, v, n = size["d_model"], size["ffn"], size["vocab_size"], size["layers"]
    src, tgt = rows * source_len, rows * target_len
    encoder = n * (src * (4 * d * d + 2 * d * f) + 2 * rows * source_len * source_len * d)
    decoder = n * (
        tgt * (6 * d * d + 2 * d * f)  # self-attention Q, K, V, O; cross-attention Q, O; FFN
        + src * 2 * d * d  # cross-attention K, V of the encoder output
        + 2 * rows * target_len * target_len * d  # self-attention Q Kᵀ and P V
        + 2 * rows * target_len * source_len * d  # cross-attention Q Kᵀ and P V
    )
    output = tgt * d * v
    return 6.0 * (encoder + decoder + output)


def batch_flops(size: dict[str, int], batch: Batch) -> float:
    """`train_flops` of the batch's sentences without their padding: the sum over rows of their own lengths (the
    count behind MFU, as in the MarianMTModel H100 reference's "pads excluded")."""
    sources, targets = batch.attention_mask.sum(1).tolist(), (batch.labels != -100).sum(1).tolist()
    return sum(train_flops(size, 1, s, t) for s, t in zip(sources, targets, strict=True))


def gemm_shapes(size: dict[str, int]) -> list[tuple[int, int, int]]:
    """(M, K, N) of the forward GEMMs of a training step on a full token budget: projections, FFN, output layer."""
    d, f, v, rows = size["d_model"], size["ffn"], size["vocab_size"], TOKEN_BUDGET
    return [(rows, d, d), (rows, d, f), (rows, f, d), (rows, d, v)]


def gemm_suite(size: dict[str, int], dtype: str) -> Callable[[], dict[str, float]]:
    """torch.matmul on the step's GEMM shapes; returns FLOP/s per shape (one timed call each after one warm call)."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    operands = {
        f"{m}x{k}x{n}": (
            torch.randn(m, k, dtype=torch_dtype, device=DEVICE),
            torch.randn(k, n, dtype=torch_dtype, device=DEVICE),
        )
        for m, k, n in gemm_shapes(size)
    }

    def run() -> dict[str, float]:
        rates = {}
        for name, (a, b) in operands.items():
            torch.matmul(a, b)
            synchronize()
            start = time.perf_counter()
            torch.matmul(a, b)
            synchronize()
            rates[name] = 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - start)
        return rates

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
# Sections


def check_same_function(size: dict[str, int], batch: Batch) -> float:
    """Max |logits ours - logits Marian| in eval mode on one batch (the two must compute the same function)."""
    models = build_models(size)
    batch = batch.to(DEVICE)
    with torch.no_grad():
        logits = [
            models[name]
            .eval()(
                input_ids=batch.input_ids[:8],
                attention_mask=batch.attention_mask[:8],
                decoder_input_ids=batch.decoder_input_ids[:8],
            )
            .logits
            for name in MODELS
        ]
    return float((logits[0] - logits[1]).abs().max())


def section_train(
    size: dict[str, int], batches: list[Batch], reps: int, warmup: int, peak_flops: float | None = None
) -> dict[str, Any]:
    """Training steps of both models in fp32 and bf16 autocast, eager and (where inductor works, `COMPILE`) under
    `torch.compile` (what `train --torch-compile` and the Trainer's `torch_compile=True` do), interleaved with the
    GEMM suites. A compiled model's first call over the batches (the compile and its recompile: the batches have
    four shapes) is timed apart, then the warm-up and timed reps run as for eager models. With `peak_flops` (a GPU's
    dense bf16 peak), each row also has its MFU: FLOPs without padding per second over that peak."""
    fns: dict[str, Callable[[], Any]] = {}
    first_call: dict[str, float] = {}
    graphs: dict[str, int] = {}
    for dtype in DTYPES:
        for mode in MODES:
            models = build_models(size)
            for name in MODELS:
                model = models[name]
                if mode == "compiled":
                    model = torch.compile(model, dynamic=COMPILE_DYNAMIC, mode=COMPILE_MODE)
                key = f"{name}/{dtype}" if mode == "eager" else f"{name}_compiled/{dtype}"
                fns[key] = train_steps(model, batches, dtype)
                if mode == "compiled":
                    before, start = compile_counts()[0], time.perf_counter()
                    fns[key]()
                    first_call[key] = time.perf_counter() - start
                    graphs[key] = compile_counts()[0] - before
                    print(f"  {key}: first call (compiling) {first_call[key]:.0f} s, {graphs[key]} graphs", flush=True)
        fns[f"gemm/{dtype}"] = gemm_suite(size, dtype)
    times, values, cpu = interleaved(fns, reps, warmup)
    rates = {
        dtype: {shape: [rep[shape] for rep in values[f"gemm/{dtype}"]] for shape in values[f"gemm/{dtype}"][0]}
        for dtype in DTYPES
    }
    tokens = sum(b.target_tokens for b in batches)
    flops = sum(train_flops(size, b.input_ids.shape[0], b.input_ids.shape[1], b.labels.shape[1]) for b in batches)
    unpadded_flops = sum(batch_flops(size, b) for b in batches)
    result: dict[str, Any] = {
        "target_tokens": tokens,
        "flops": flops,
        "flops_without_padding": unpadded_flops,
        "peak_flops_per_s": peak_flops,
        "token_budget": TOKEN_BUDGET,
        "batches": len(batches),
        "modes": MODES,
        "compile_shapes": "dynamic" if COMPILE_DYNAMIC is None else "static",
        "compile_mode": COMPILE_MODE,
    }
    names = [*MODELS, *(f"{name}_compiled" for name in MODELS if "compiled" in MODES)]
    for dtype in DTYPES:
        ceiling_per_shape = {shape: summary(values) for shape, values in rates[dtype].items()}
        ceiling = max(s["median"] for s in ceiling_per_shape.values())
        result[dtype] = {"gemm_flops_per_s": ceiling_per_shape, "gemm_ceiling": ceiling}
        for name in names:
            seconds = times[f"{name}/{dtype}"]
            result[dtype][name] = {
                "seconds": summary(seconds),
                "cpu_seconds": summary(cpu[f"{name}/{dtype}"]),
                "target_tokens_per_s": summary([tokens / s for s in seconds]),
                "achieved_flops_per_s": flops / statistics.median(seconds),
                "fraction_of_gemm_ceiling": flops / statistics.median(seconds) / ceiling,
            }
            if peak_flops:
                result[dtype][name]["mfu"] = unpadded_flops / statistics.median(seconds) / peak_flops
            if f"{name}/{dtype}" in first_call:
                result[dtype][name]["first_call_seconds"] = first_call[f"{name}/{dtype}"]
                result[dtype][name]["graphs"] = graphs[f"{name}/{dtype}"]

        def ratio(numerator: str, denominator: str, dtype: str = dtype) -> dict[str, float]:
            return paired_ratio(times[f"{denominator}/{dtype}"], times[f"{numerator}/{dtype}"])  # speed ratio

        result[dtype]["ratio_ours_over_marian"] = ratio("ours", "marian")
        if "compiled" in MODES:
            for name in MODELS:
                result[dtype][f"ratio_{name}_compiled_over_{name}"] = ratio(f"{name}_compiled", name)
            result[dtype]["ratio_ours_compiled_over_marian_compiled"] = ratio("ours_compiled", "marian_compiled")
            result[dtype]["ratio_ours_compiled_over_marian"] = ratio("ours_compiled", "marian")
    if DTYPES == ("fp32", "bf16"):
        for name in MODELS:
            result[f"{name}_bf16_over_fp32"] = paired_ratio(times[f"{name}/fp32"], times[f"{name}/bf16"])
    return result


def section_encoder(size: dict[str, int], batches: list[Batch], reps: int, warmup: int) -> dict[str, Any]:
    fns = {}
    for dtype in DTYPES:
        models = for_inference(build_models(size))
        for name in MODELS:
            fns[f"{name}/{dtype}"] = encoder_forward(models[name], batches, dtype)
    times, _, cpu = interleaved(fns, reps, warmup)
    tokens = sum(b.source_tokens for b in batches)
    result: dict[str, Any] = {"source_tokens": tokens}
    for dtype in DTYPES:
        result[dtype] = {
            name: {
                "source_tokens_per_s": summary([tokens / s for s in times[f"{name}/{dtype}"]]),
                "cpu_seconds": summary(cpu[f"{name}/{dtype}"]),
            }
            for name in MODELS
        }
        result[dtype]["ratio_ours_over_marian"] = paired_ratio(times[f"marian/{dtype}"], times[f"ours/{dtype}"])
    return result


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


def ct2_generation(translator: Any, source_tokens: list[list[str]], beams: int) -> Callable[[], Any]:
    def run() -> Any:
        return translator.translate_batch(
            source_tokens, beam_size=beams, min_decoding_length=NEW_TOKENS, max_decoding_length=NEW_TOKENS
        )

    return run


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
            tokens = [
                [f"w{i}" if i > EOS else "</s>" for i in row[row_mask.bool()].tolist()]
                for row, row_mask in zip(ids, mask, strict=True)
            ]
            fns = {name: ct2_generation(translator, tokens, beams) for name, translator in translators.items()}
            result[f"fp32/{suffix}"] = interleaved(fns, reps, warmup)[0]
    return result


def section_generate(config: str, reps: int, warmup: int) -> dict[str, Any]:
    """Greedy and beam-4 with the cache, batch 1 and 16, exactly NEW_TOKENS new tokens; on the CPU, CTranslate2 on
    the same weights as well (fp32 rows), in a subprocess (`ct2_worker`) after ours and Marian."""
    size = CONFIGS[config]
    models = for_inference(build_models(size))
    result: dict[str, Any] = {}
    for dtype in DTYPES:
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
    if DEVICE.type == "cpu":
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


# ---------------------------------------------------------------------------------------------------------------
# The decoding table (issue 25 item 4): tiny and base, greedy and beam 4, batch 1 and 16, fp32 / bf16 / int8


DECODE_DTYPES = ("fp32", "bf16", "int8")
# CTranslate2's compute type for each of our dtypes.
CT2_COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}
# CTranslate2's two CPU backends, chosen by CT2_USE_MKL when it loads: Intel's MKL (its default on Intel CPUs) or
# oneDNN and its own kernels (its default elsewhere). The decoding table runs both, each in its own process, and
# compares every row with the faster one: CTranslate2 "with its best settings for the host". MKL is x86 only.
CT2_SETTINGS = {"mkl_off": "0", "mkl_on": "1"}
INT8_MISSING = "n/a (quantize_int8 missing)"


def int8_models(models: dict[str, nn.Module]) -> dict[str, nn.Module | str]:
    """int8 linear layers on both sides: ours through `hf_vanilla_transformer.inference.quantization.quantize_int8`
    (the project's int8 path; INT8_MISSING where it is not there), Marian through PyTorch's dynamic quantization
    (`torch.ao.quantization.quantize_dynamic`, int8 weights and per-batch int8 activations: what a MarianMTModel
    user has in PyTorch itself)."""
    import warnings

    try:
        from hf_vanilla_transformer.inference.quantization import quantize_int8
    except ImportError:
        ours: nn.Module | str = INT8_MISSING
    else:
        ours = quantize_int8(models["ours"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        marian = torch.ao.quantization.quantize_dynamic(models["marian"], {nn.Linear}, dtype=torch.qint8)
    return {"ours": ours, "marian": marian}


def decode_models(size: dict[str, int], dtype: str) -> dict[str, nn.Module | str]:
    """The models timed for one dtype: ours and Marian (fp32 weights; under bf16 both run in bf16 autocast), plus,
    for bf16, ours with bf16 weights (`model.to(torch.bfloat16)`, no autocast)."""
    models: dict[str, nn.Module | str] = dict(build_models(size))
    if dtype == "bf16":
        bf16_weights = build_models(size)["ours"].to(torch.bfloat16)
        models["ours_bf16_weights"] = bf16_weights
    elif dtype == "int8":
        models = int8_models(models)
    return models


def ct2_decode_worker(configs: list[str], reps: int, warmup: int) -> dict[str, Any]:
    """In a fresh process: CTranslate2 on every case of the decoding table, its compute types interleaved; seconds
    per call, or a string saying why a compute type is missing on this CPU."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types("cpu")
    result: dict[str, Any] = {}
    for config in configs:
        size = CONFIGS[config]
        wanted = tuple(CT2_COMPUTE_TYPES[dtype] for dtype in DECODE_DTYPES)
        with tempfile.TemporaryDirectory() as folder:
            types = tuple(t for t in wanted if t in supported)
            translators = ctranslate2_translators(build_models(size)["ours"], Path(folder), types)
            for suffix, ids, mask, beams in generation_cases(size):
                tokens = [
                    [f"w{i}" if i > EOS else "</s>" for i in row[row_mask.bool()].tolist()]
                    for row, row_mask in zip(ids, mask, strict=True)
                ]
                fns = {name: ct2_generation(translator, tokens, beams) for name, translator in translators.items()}
                times = interleaved(fns, reps, warmup)[0]
                for dtype, compute_type in CT2_COMPUTE_TYPES.items():
                    result[f"{config}/{dtype}/{suffix}"] = times.get(
                        f"ct2_{compute_type}",
                        f"n/a (CTranslate2 has no {compute_type} on this CPU: {sorted(supported)})",
                    )
    return result


def section_decode(configs: list[str], reps: int, warmup: int) -> dict[str, Any]:
    """The decoding table: for each configuration, dtype and generation case (`generation_cases`), ours and Marian
    (and ours with bf16 weights) interleaved rep by rep, ratios the medians of per-rep ratios; then CTranslate2 on
    the same weights in its own process (`ct2_decode_worker`), ratios of medians. Exactly NEW_TOKENS new tokens."""
    result: dict[str, Any] = {}
    dtypes = [dtype for dtype in DECODE_DTYPES if dtype != "bf16" or "bf16" in DTYPES]
    for config in configs:
        size = CONFIGS[config]
        for dtype in dtypes:
            models = for_inference(decode_models(size, dtype))
            for suffix, ids, mask, beams in generation_cases(size):
                key = f"{config}/{dtype}/{suffix}"
                # bf16 weights need no autocast; the fp32-weight models run under it for bf16.
                fns = {
                    name: generation(model, ids, mask, beams, "fp32" if name == "ours_bf16_weights" else dtype)
                    for name, model in models.items()
                    if not isinstance(model, str)
                }
                times, _, _ = interleaved(fns, reps, warmup)
                row: dict[str, Any] = {name: model for name, model in models.items() if isinstance(model, str)}
                for name, seconds in times.items():
                    row[name] = {"seconds": summary(seconds)}
                for name in ("ours", "ours_bf16_weights"):
                    if name in times:
                        row[f"ratio_{name}_over_marian"] = paired_ratio(times["marian"], times[name])
                result[key] = row
                print(
                    f"  {key:28s} " + "  ".join(f"{n} {1e3 * statistics.median(t):.0f} ms" for n, t in times.items())
                )
    if DEVICE.type == "cpu":
        command = [sys.executable, "-m", "bench.bench", "--threads", str(torch.get_num_threads())]
        command += ["--reps", str(reps), "--warmup", str(warmup), "--decode-configs", *configs, "--ct2-decode-worker"]
        settings = CT2_SETTINGS if platform.machine().lower() in ("x86_64", "amd64") else {"mkl_off": "0"}
        for setting, use_mkl in settings.items():
            environment = {**os.environ, "CT2_USE_MKL": use_mkl}
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=environment).stdout
            for key, times in json.loads(output.strip().splitlines()[-1]).items():
                if key in result:
                    add_ct2_times(result[key], f"ct2_{setting}", times)
        for row in result.values():
            add_best_ct2_ratios(row)
    return result


def add_ct2_times(row: dict[str, Any], column: str, times: list[float] | str) -> None:
    """CTranslate2's seconds per call (or why there are none) under `column` of a decoding-table row, and ours over
    them as ratios of medians (> 1: ours faster)."""
    if isinstance(times, str):
        row[column] = times
        return
    row[column] = {"seconds": summary(times)}
    for name in ("ours", "ours_bf16_weights"):
        if isinstance(row.get(name), dict):
            row[f"ratio_{name}_over_{column}"] = statistics.median(times) / row[name]["seconds"]["median"]


def add_best_ct2_ratios(row: dict[str, Any]) -> None:
    """Ours against CTranslate2's faster setting in this row (the smaller of the per-setting ratios), where there
    is one."""
    for name in ("ours", "ours_bf16_weights"):
        ratios = [row[key] for key in (f"ratio_{name}_over_ct2_{setting}" for setting in CT2_SETTINGS) if key in row]
        if ratios:
            row[f"ratio_{name}_over_ct2_best"] = min(ratios)


def print_decode_table(results: dict[str, Any]) -> None:
    """One table: ms per generate() call (median [IQR]) and speed ratios (> 1: ours faster); then the targets."""
    env = results["environment"]
    print(
        f"\nDecoding, {NEW_TOKENS} new tokens per row, {env['threads']} threads, {env['cpu']} "
        f"({env['cpu_count']} logical cores; {env.get('cpu_flags', '')}), {env['date']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, ctranslate2 {env.get('ctranslate2', '-')}; "
        f"PyTorch side's malloc: {env.get('malloc', 'default')}; "
        f"load {env['load_average_at_start']} -> {results.get('load_average_at_end')}"
    )
    print(
        "ours/Marian: median of per-rep ratios (interleaved); ours/CT2: ratio of medians (CTranslate2 in its own "
        "process, CT2_USE_MKL=0 / 1, best = against the faster); Marian int8 = torch dynamic quantization; bf16 = "
        "autocast (ours/Marian), bfloat16 (CT2)"
    )
    print(
        "| config | case | dtype | ours ms | Marian ms | ours/Marian | CT2 ms (MKL off / on) | ours/CT2 (off / on) "
        "| ours/CT2 best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def cell(value: Any, scale: float = 1e3, digits: int = 1) -> str:  # "n/a" alone: the reason is in the JSON
        return (
            value.split(" (")[0] if isinstance(value, str) else fmt(value["seconds"], scale, digits) if value else "-"
        )

    def ratio(value: float | None) -> str:
        return f"{value:.2f}" if value else "-"

    for key, row in results["decode"].items():
        config, dtype, case = key.split("/", 2)
        variants = [("ours", dtype)] + ([("ours_bf16_weights", "bf16 weights")] if "ours_bf16_weights" in row else [])
        for name, label in variants:
            marian_ratio = row.get(f"ratio_{name}_over_marian")
            ct2 = " / ".join(cell(row.get(f"ct2_{setting}")) for setting in CT2_SETTINGS)
            ct2_ratios = " / ".join(ratio(row.get(f"ratio_{name}_over_ct2_{setting}")) for setting in CT2_SETTINGS)
            print(
                f"| {config} | {case} | {label} | {cell(row.get(name))} | {cell(row.get('marian'))} | "
                f"{fmt(marian_ratio, digits=2) if marian_ratio else '-'} | {ct2} | {ct2_ratios} | "
                f"{ratio(row.get(f'ratio_{name}_over_ct2_best'))} |"
            )
    print(
        "\nTargets (medians of per-rep ratios against Marian, ratios of medians against CTranslate2's faster setting):"
    )
    print("| target | rows | met |")
    print("|---|---|---|")
    for target in results["decode_targets"]:
        rows = ", ".join(f"{label} {value:.2f}" for label, value in target["rows"])
        met = f"{target['met']} of {len(target['rows'])}"
        print(f"| {target['target']} | {rows or '-'} | {met} |")


@dataclass(frozen=True)
class DecodeTarget:
    """A decoding target: our `variants` ("ours", "ours_bf16_weights") in `dtypes` and `cases` (None: every case),
    each at least `threshold` times as fast as `against` ("marian", or "ct2_best": CTranslate2's faster setting)."""

    description: str
    variants: tuple[str, ...]
    dtypes: tuple[str, ...]
    cases: tuple[str, ...] | None
    against: str
    threshold: float


BATCH16 = ("greedy/batch16", "beam4/batch16")
BATCH1 = ("greedy/batch1", "beam4/batch1")
DECODE_TARGETS = (
    DecodeTarget(
        "ours >= 1.5x Marian in every row", ("ours", "ours_bf16_weights"), DECODE_DTYPES, None, "marian", 1.5
    ),
    DecodeTarget("int8 >= 1.0x CTranslate2 int8 at batch 16", ("ours",), ("int8",), BATCH16, "ct2_best", 1.0),
    DecodeTarget("int8 >= 0.8x CTranslate2 int8 at batch 1", ("ours",), ("int8",), BATCH1, "ct2_best", 0.8),
    DecodeTarget("fp32 >= 1.0x CTranslate2 float32 (its faster setting)", ("ours",), ("fp32",), None, "ct2_best", 1.0),
    DecodeTarget("bf16 autocast >= 1.3x Marian under the same autocast", ("ours",), ("bf16",), None, "marian", 1.3),
    DecodeTarget("bf16 weights >= 1.3x Marian under autocast", ("ours_bf16_weights",), ("bf16",), None, "marian", 1.3),
)


def decode_targets(decode: dict[str, Any], cpu_flags: str = "") -> list[dict[str, Any]]:
    """Each of DECODE_TARGETS with the rows it covers ("config case dtype", ratio) and how many reach it. Rows
    without the ratio (a dtype not measured, CTranslate2 without that compute type) are left out. The bf16 targets
    say whether this CPU has bf16 matrix units (AMX), the CPUs they are set for."""
    targets = []
    for target in DECODE_TARGETS:
        rows = []
        for key, row in decode.items():
            config, dtype, case = key.split("/", 2)
            if dtype not in target.dtypes or (target.cases is not None and case not in target.cases):
                continue
            for name in target.variants:
                value = row.get(f"ratio_{name}_over_{target.against}")
                if isinstance(value, dict):  # ours/Marian: the summary of per-rep ratios
                    value = value["median"]
                if value is not None:
                    rows.append((f"{config} {case} {'bf16 weights' if name == 'ours_bf16_weights' else dtype}", value))
        description = target.description
        if target.dtypes == ("bf16",):
            description += " (this CPU has AMX)" if "amx_bf16" in cpu_flags else " (this CPU has no AMX)"
        met = sum(value >= target.threshold for _, value in rows)
        targets.append({"target": description, "threshold": target.threshold, "rows": rows, "met": met})
    return targets


def memory_worker(config: str, name: str, dtype: str) -> dict[str, float]:
    """In a fresh process: peak resident memory of training steps of one model (see bench/README.md)."""
    size = CONFIGS[config]
    batches = bench_batches(size["vocab_size"])
    torch.manual_seed(0)
    model = prepare(build_ours(size) if name.startswith("ours") else build_marian(size))
    step = train_steps(torch.compile(model) if name.endswith("_compiled") else model, batches, dtype)
    step()  # warm-up: optimizer state, allocator pools, lazily built tables, compiling
    rss_before = _status_kb("VmRSS")
    reset = _reset_peak_rss()
    step()
    peak = _status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_rss_mb": peak / 1024,
        "rss_before_steps_mb": rss_before / 1024,
        "step_peak_increase_mb": (peak - rss_before) / 1024,
        "peak_was_reset": reset,
    }


def _status_kb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to /proc/self/clear_refs resets the peak resident set size (VmHWM) to the current one."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def section_gpu_memory(size: dict[str, int], batches: list[Batch]) -> dict[str, Any]:
    """On a GPU: the allocator's peak during one training step (after a warm-up step), per model and dtype."""
    result: dict[str, Any] = {}
    for dtype in DTYPES:
        for name, model in build_models(size).items():
            step = train_steps(model, batches, dtype)
            step()
            torch.cuda.reset_peak_memory_stats()
            step()
            result[f"{name}/{dtype}"] = {"peak_rss_mb": summary([torch.cuda.max_memory_allocated() / 2**20])}
            del model, step
            torch.cuda.empty_cache()
        result[f"ratio_ours_over_marian/{dtype}"] = (
            result[f"ours/{dtype}"]["peak_rss_mb"]["median"] / result[f"marian/{dtype}"]["peak_rss_mb"]["median"]
        )
    return result


def section_memory(config: str, rounds: int) -> dict[str, Any]:
    """Each (model, dtype) in its own fresh subprocess, `rounds` times, alternating the order. glibc is told to
    give every freed block of 64 KiB or more back to the system at once, so that the resident peak follows the
    live tensors rather than what the allocator happened to keep cached."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    runs: dict[str, list[dict[str, float]]] = {}
    for round_ in range(rounds):
        names = [*MODELS, *(f"{name}_compiled" for name in MODELS if "compiled" in MODES)]
        jobs = [(name, dtype) for dtype in DTYPES for name in names]
        for name, dtype in jobs if round_ % 2 == 0 else reversed(jobs):
            command = [sys.executable, "-m", "bench.bench", "--config", config, "--attn-implementation", ATTENTION]
            command += ["--memory-worker", name, dtype]
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
            runs.setdefault(f"{name}/{dtype}", []).append(json.loads(output.strip().splitlines()[-1]))
    result: dict[str, Any] = {}
    for key, values in runs.items():
        result[key] = {field: summary([v[field] for v in values]) for field in values[0] if field != "peak_was_reset"}
        result[key]["peak_was_reset"] = all(v["peak_was_reset"] for v in values)
    for dtype in DTYPES:
        for suffix in ("", "_compiled") if "compiled" in MODES else ("",):
            result[f"ratio_ours{suffix}_over_marian{suffix}/{dtype}"] = (
                result[f"ours{suffix}/{dtype}"]["peak_rss_mb"]["median"]
                / result[f"marian{suffix}/{dtype}"]["peak_rss_mb"]["median"]
            )
    return result


def section_loss_curve(size: dict[str, int], steps: int) -> dict[str, Any]:
    """Our model trained for `steps` steps in fp32 and in bf16 autocast from the same seed (same weights, same
    batches, same dropout draws) on a learnable task: the target is the source reversed (64 distinct tokens)."""
    generator = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(steps):
        rows, length = 64, 16
        source = torch.randint(4, 68, (rows, length), generator=generator)
        source[:, -1] = EOS
        labels = torch.cat([source[:, :-1].flip(1), source[:, -1:]], 1)
        decoder_input_ids = torch.cat([torch.full((rows, 1), PAD), labels[:, :-1]], 1)
        batches.append(Batch(source, torch.ones_like(source), decoder_input_ids, labels).to(DEVICE))
    curves = {}
    for dtype in DTYPES:
        model = build_models(size, seed=3)["ours"].train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
        torch.manual_seed(4)
        curve = []
        for batch in batches:
            with autocast(dtype):
                loss = training_loss(model, batch)
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            curve.append(loss.item())
        curves[dtype] = curve
    relative = [abs(b - a) / a for a, b in zip(curves["fp32"], curves["bf16"], strict=True)]
    tail = max(1, steps // 4)
    return {
        "fp32": curves["fp32"],
        "bf16": curves["bf16"],
        "max_relative_difference": max(relative),
        "mean_relative_difference_last_quarter": statistics.mean(relative[-tail:]),
    }


# ---------------------------------------------------------------------------------------------------------------
# Report


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
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu",
        "threads": threads,
        "attn_implementation": ATTENTION,
    }


def print_report(results: dict[str, Any]) -> None:
    env = results["environment"]
    print(
        f"\n{env['date']}  torch {env['torch']}  transformers {env['transformers']}  {env['cpu']}  "
        f"{env['threads']} threads  {env.get('device', 'cpu')}  {env.get('attn_implementation', 'sdpa')} attention  "
        f"load {env['load_average_at_start']} -> {results.get('load_average_at_end')}"
    )
    print("medians [interquartile range]; ratios are medians of per-rep ratios (> 1: ours faster or smaller)")
    print("| measure | ours | Marian | ours/Marian |\n|---|---|---|---|")
    if "train" in results:
        train = results["train"]
        for dtype in DTYPES:
            row = train[dtype]
            print(
                f"| train step {dtype}, target tok/s | {fmt(row['ours']['target_tokens_per_s'])} | "
                f"{fmt(row['marian']['target_tokens_per_s'])} | {fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
        for dtype in DTYPES:
            row = train[dtype]
            print(
                f"| train {dtype}: GEMM ceiling {row['gemm_ceiling'] / 1e9:.0f} GFLOP/s, achieved | "
                f"{row['ours']['achieved_flops_per_s'] / 1e9:.0f} GFLOP/s = "
                f"{100 * row['ours']['fraction_of_gemm_ceiling']:.0f}% | "
                f"{row['marian']['achieved_flops_per_s'] / 1e9:.0f} GFLOP/s = "
                f"{100 * row['marian']['fraction_of_gemm_ceiling']:.0f}% | |"
            )
        for dtype in DTYPES:
            row = train[dtype]
            if "ours_compiled" not in row:
                continue
            print(
                f"| train step {dtype} compiled, target tok/s | {fmt(row['ours_compiled']['target_tokens_per_s'])} | "
                f"{fmt(row['marian_compiled']['target_tokens_per_s'])} | "
                f"{fmt(row['ratio_ours_compiled_over_marian_compiled'], digits=3)} |"
            )
            print(
                f"| train {dtype}: compiled / eager speed-up | "
                f"{fmt(row['ratio_ours_compiled_over_ours'], digits=3)} | "
                f"{fmt(row['ratio_marian_compiled_over_marian'], digits=3)} | |"
            )
            print(
                f"| train {dtype}: ours compiled / Marian eager | | | "
                f"{fmt(row['ratio_ours_compiled_over_marian'], digits=3)} |"
            )
            print(
                f"| train {dtype} compiled: first call (compiling), s | "
                f"{row['ours_compiled']['first_call_seconds']:.0f} ({row['ours_compiled']['graphs']} graphs) | "
                f"{row['marian_compiled']['first_call_seconds']:.0f} ({row['marian_compiled']['graphs']} graphs) | |"
            )
        if train.get("peak_flops_per_s"):
            for dtype in DTYPES:
                row, peak = train[dtype], train["peak_flops_per_s"] / 1e12
                cells = [
                    f"{100 * row[name]['mfu']:.1f}%" if name in row else ""
                    for name in ("ours", "marian", "ours_compiled", "marian_compiled")
                ]
                print(f"| train {dtype}: MFU (of {peak:.0f} TFLOP/s), eager | {cells[0]} | {cells[1]} | |")
                if cells[2]:
                    print(f"| train {dtype}: MFU (of {peak:.0f} TFLOP/s), compiled | {cells[2]} | {cells[3]} | |")
        if "ours_bf16_over_fp32" in train:
            print(
                f"| train bf16 / fp32 speed-up | {fmt(train['ours_bf16_over_fp32'], digits=2)} | "
                f"{fmt(train['marian_bf16_over_fp32'], digits=2)} | |"
            )
    if "encoder" in results:
        for dtype in DTYPES:
            row = results["encoder"][dtype]
            print(
                f"| encoder forward {dtype}, source tok/s | {fmt(row['ours']['source_tokens_per_s'])} | "
                f"{fmt(row['marian']['source_tokens_per_s'])} | {fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
    if "generate" in results:
        for key, row in results["generate"].items():
            print(
                f"| generate {key}, ms | {fmt(row['ours']['seconds'], 1e3, 1)} | "
                f"{fmt(row['marian']['seconds'], 1e3, 1)} | "
                f"{fmt(row['ratio_ours_over_marian'], digits=3)} |"
            )
        for key, row in results["generate"].items():
            for name in ("ct2_float32", "ct2_int8"):
                if name in row:
                    print(
                        f"| generate {key} against CTranslate2 {name[4:]}, ms | {fmt(row['ours']['seconds'], 1e3, 1)} "
                        f"| {fmt(row[name]['seconds'], 1e3, 1)} (CTranslate2, own process) | "
                        f"{row[f'ratio_ours_over_{name}']:.3f} (ratio of medians) |"
                    )
    if "memory" in results:
        memory = results["memory"]
        memory_kind = "RSS" if env.get("device", "cpu") == "cpu" else "GPU memory"
        for dtype in DTYPES:
            print(
                f"| peak {memory_kind} of training steps {dtype}, MB | "
                f"{fmt(memory[f'ours/{dtype}']['peak_rss_mb'])} | "
                f"{fmt(memory[f'marian/{dtype}']['peak_rss_mb'])} | "
                f"{1 / memory[f'ratio_ours_over_marian/{dtype}']:.3f} |"
            )
            if f"ours_compiled/{dtype}" in memory:
                print(
                    f"| peak {memory_kind} of training steps {dtype} compiled, MB | "
                    f"{fmt(memory[f'ours_compiled/{dtype}']['peak_rss_mb'])} | "
                    f"{fmt(memory[f'marian_compiled/{dtype}']['peak_rss_mb'])} | "
                    f"{1 / memory[f'ratio_ours_compiled_over_marian_compiled/{dtype}']:.3f} |"
                )
    if "loss_curve" in results:
        curve = results["loss_curve"]
        print(
            f"\nbf16 autocast vs fp32 loss ({len(curve['fp32'])} steps, same seed): max relative difference "
            f"{curve['max_relative_difference']:.4f}, mean over the last quarter "
            f"{curve['mean_relative_difference_last_quarter']:.4f}; final loss fp32 {curve['fp32'][-1]:.4f}, "
            f"bf16 {curve['bf16'][-1]:.4f}"
        )
    if "same_function_max_abs_logit_difference" in results:
        difference = results["same_function_max_abs_logit_difference"]
        print(f"max |logits ours - logits Marian| (eval, same weights): {difference:.2e}")


SECTIONS = ("train", "encoder", "generate", "memory", "loss_curve", "decode")


def main(argv: list[str] | None = None) -> None:
    global DEVICE, ATTENTION, DTYPES, MODES, COMPILE_DYNAMIC, COMPILE_MODE, TOKEN_BUDGET
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--reps", type=int, default=7, help="timed reps per measurement (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-rounds", type=int, default=3)
    parser.add_argument("--loss-steps", type=int, default=100)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: a lent GPU")
    parser.add_argument(
        "--attn-implementation",
        choices=("sdpa", "eager"),
        help="both models' attention kernels; default as in `hf-vanilla-transformer train`: eager on the CPU, sdpa "
        "on a GPU",
    )
    parser.add_argument(
        "--bf16",
        choices=("auto", "yes", "no", "only"),
        default="auto",
        help="measure bf16 autocast beside fp32: auto = where this device multiplies bf16 at least 2x as fast as "
        "fp32 (CPUs with AVX512-BF16/AMX, GPUs; an AVX2-only CPU emulates bf16 ~100x slower than fp32); only = bf16 "
        "autocast alone (no fp32 rows)",
    )
    parser.add_argument(
        "--token-budget",
        type=int,
        default=TOKEN_BUDGET,
        help="training batches: at most this many tokens (rows x longest side) on each side; 25000 is the paper's",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the device's dense bf16 peak, for the MFU of training steps (default: known for H100/H200 GPUs)",
    )
    parser.add_argument(
        "--decode-configs",
        nargs="+",
        choices=sorted(CONFIGS),
        default=["tiny", "base"],
        help="the configurations of the decode section's table",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check of the decode table: tiny only, 1 timed rep after 1 warm-up (overrides --reps/--warmup)",
    )
    parser.add_argument(
        "--malloc",
        choices=("keep", "default"),
        default="keep",
        help="keep: glibc's malloc keeps freed memory (cpu_inference.keep_freed_memory, as `translate` and `evaluate` "
        "set it) for ours and Marian alike; default: glibc's defaults. CTranslate2 runs in its own process as it is",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="train and memory sections: eager only (by default also under torch.compile, where inductor works)",
    )
    parser.add_argument(
        "--compile-shapes",
        choices=("dynamic", "static"),
        default="dynamic",
        help="train section: dynamic = torch's automatic dynamic shapes (what `train --torch-compile` gets); static "
        "= one graph per batch shape (torch.compile(dynamic=False)), to see whether kernels for fixed sizes win",
    )
    parser.add_argument(
        "--compile-mode",
        choices=("default", "max-autotune"),
        default="default",
        help="train section: torch.compile's mode; max-autotune also times inductor's GEMM templates for each shape",
    )
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--memory-worker", nargs=2, metavar=("MODEL", "DTYPE"), help=argparse.SUPPRESS)
    parser.add_argument("--ct2-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-decode-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.token_budget < 100:
        parser.error(f"--token-budget is {args.token_budget}; pass at least 100 tokens (25000 is the paper's)")
    if args.quick:
        args.decode_configs, args.reps, args.warmup = ["tiny"], 1, 1
    DEVICE = torch.device(args.device)
    ATTENTION = args.attn_implementation or ("sdpa" if DEVICE.type == "cuda" else "eager")
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        print(json.dumps(memory_worker(args.config, *args.memory_worker)))
        return
    if args.ct2_worker:
        print(json.dumps(ct2_worker(args.config, args.reps, args.warmup)))
        return
    if args.ct2_decode_worker:
        print(json.dumps(ct2_decode_worker(args.decode_configs, args.reps, args.warmup)))
        return
    malloc = "keep" if args.malloc == "keep" and keep_freed_memory() else "default"
    bf16, precision = resolve_bf16("yes" if args.bf16 == "only" else args.bf16, DEVICE)
    DTYPES = ("bf16",) if args.bf16 == "only" else ("fp32", "bf16") if bf16 else ("fp32",)
    print(f"dtypes {', '.join(DTYPES)}: {precision}", flush=True)
    # bf16 against fp32: nothing to compare without both
    sections = [s for s in args.sections if len(DTYPES) == 2 or s != "loss_curve"]
    TOKEN_BUDGET = args.token_budget
    peak_flops = args.peak_tflops * 1e12 if args.peak_tflops else None
    if DEVICE.type == "cuda" and peak_flops is None:
        peak_flops = next((peak for name, peak in PEAK_FLOPS.items() if name in torch.cuda.get_device_name()), None)
    failure = None if args.no_compile else compile_failure(DEVICE)
    MODES = ("eager",) if args.no_compile or failure else ("eager", "compiled")
    COMPILE_DYNAMIC = None if args.compile_shapes == "dynamic" else False
    COMPILE_MODE = args.compile_mode
    # Every model and dtype compiles under transformers' one forward wrapper (a graph per shape with static shapes,
    # one or more per model and dtype with dynamic ones): past dynamo's default limit of 8 graphs per function the
    # rest would run eagerly and pass for compiled rows.
    torch._dynamo.config.recompile_limit = 64
    if failure:
        print(f"eager only: torch.compile cannot work here ({failure})", flush=True)

    size = CONFIGS[args.config]
    batches = bench_batches(size["vocab_size"])
    results: dict[str, Any] = {"environment": environment(args.threads), "config": args.config, "size": size}
    results["environment"]["malloc"] = malloc
    results["precision"] = precision
    results["same_function_max_abs_logit_difference"] = check_same_function(size, batches[1])
    shapes = [(*b.input_ids.shape, b.labels.shape[1]) for b in batches]
    print(f"config {args.config} {size}; training batches (rows, S, T): {shapes}", flush=True)
    for section in sections:
        start = time.perf_counter()
        print(f"[{section}]", flush=True)
        if section == "train":
            results[section] = section_train(size, batches, args.reps, args.warmup, peak_flops)
        elif section == "encoder":
            results[section] = section_encoder(size, batches, args.reps, args.warmup)
        elif section == "generate":
            results[section] = section_generate(args.config, args.reps, args.warmup)
        elif section == "memory" and DEVICE.type == "cuda":
            results[section] = section_gpu_memory(size, batches)
        elif section == "memory":
            results[section] = section_memory(args.config, args.memory_rounds)
        elif section == "loss_curve":
            results[section] = section_loss_curve(size, args.loss_steps)
        elif section == "decode":
            results[section] = section_decode(args.decode_configs, args.reps, args.warmup)
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
    results["load_average_at_end"] = os.getloadavg()
    if set(results) & {"train", "encoder", "generate", "memory", "loss_curve"}:
        print_report(results)
    if "decode" in results:
        results["decode_targets"] = decode_targets(results["decode"], results["environment"].get("cpu_flags", ""))
        print_decode_table(results)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
