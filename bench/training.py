"""The training sections of `python -m bench.bench`: training steps (eager and compiled, fp32 and bf16 autocast)
against the GEMM ceiling, the encoder's forward, and the bf16 loss curve; the FLOPs behind a step's MFU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bench.common import (
    EOS,
    MODELS,
    PAD,
    SETTINGS,
    Batch,
    autocast,
    build_models,
    for_inference,
    interleaved,
    paired_ratio,
    summary,
    synchronize,
)
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.compiling import compile_counts
from hf_vanilla_transformer.training.cpu_training import prepare_for_cpu_training

LABEL_SMOOTHING = 0.1  # §5.4


def training_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Label-smoothed (ε_ls = 0.1, §5.4) token-level cross-entropy, each model's fastest way: ours fuses the
    projection with the loss (`skip_logits`, what VanillaSeq2SeqTrainer uses); Marian's logits go through
    `cross_entropy(label_smoothing=...)`, PyTorch's fused kernel (faster than the Trainer's LabelSmoother)."""
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    inputs["decoder_input_ids"] = batch.decoder_input_ids
    # `torch.compile` wraps the model (`_orig_mod`); the Trainer unwraps it the same way before choosing the loss.
    if isinstance(getattr(model, "_orig_mod", model), VanillaTransformerForConditionalGeneration):
        return model(**inputs, labels=batch.labels, label_smoothing=LABEL_SMOOTHING, skip_logits=True).loss
    logits = model(**inputs).logits
    return nn.functional.cross_entropy(
        logits.float().flatten(0, 1), batch.labels.flatten(), ignore_index=-100, label_smoothing=LABEL_SMOOTHING
    )


def train_steps(model: nn.Module, batches: list[Batch], dtype: str) -> Callable[[], float]:
    """One training step (forward, loss, backward, AdamW) per batch; returns the last loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    batches = [batch.to(SETTINGS.device) for batch in batches]

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
    batches = [batch.to(SETTINGS.device) for batch in batches]

    def run() -> None:
        model.eval()
        with torch.no_grad(), autocast(dtype):
            for batch in batches:
                model.get_encoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        synchronize()

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
    d, f, v, rows = size["d_model"], size["ffn"], size["vocab_size"], SETTINGS.token_budget
    return [(rows, d, d), (rows, d, f), (rows, f, d), (rows, d, v)]


def gemm_suite(size: dict[str, int], dtype: str) -> Callable[[], dict[str, float]]:
    """torch.matmul on the step's GEMM shapes; returns FLOP/s per shape (one timed call each after one warm call)."""
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    operands = {
        f"{m}x{k}x{n}": (
            torch.randn(m, k, dtype=torch_dtype, device=SETTINGS.device),
            torch.randn(k, n, dtype=torch_dtype, device=SETTINGS.device),
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
# Sections


def check_same_function(size: dict[str, int], batch: Batch) -> float:
    """Max |logits ours - logits Marian| in eval mode on one batch (the two must compute the same function)."""
    models = build_models(size)
    batch = batch.to(SETTINGS.device)
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
    for dtype in SETTINGS.dtypes:
        for mode in SETTINGS.modes:
            models = build_models(size)
            for name in MODELS:
                model = models[name]
                if mode == "compiled":
                    model = torch.compile(model, dynamic=SETTINGS.compile_dynamic, mode=SETTINGS.compile_mode)
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
        for dtype in SETTINGS.dtypes
    }
    tokens = sum(b.target_tokens for b in batches)
    flops = sum(train_flops(size, b.input_ids.shape[0], b.input_ids.shape[1], b.labels.shape[1]) for b in batches)
    unpadded_flops = sum(batch_flops(size, b) for b in batches)
    result: dict[str, Any] = {
        "target_tokens": tokens,
        "flops": flops,
        "flops_without_padding": unpadded_flops,
        "peak_flops_per_s": peak_flops,
        "token_budget": SETTINGS.token_budget,
        "batches": len(batches),
        "modes": SETTINGS.modes,
        "compile_shapes": "dynamic" if SETTINGS.compile_dynamic is None else "static",
        "compile_mode": SETTINGS.compile_mode,
    }
    names = [*MODELS, *(f"{name}_compiled" for name in MODELS if "compiled" in SETTINGS.modes)]
    for dtype in SETTINGS.dtypes:
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
        if "compiled" in SETTINGS.modes:
            for name in MODELS:
                result[dtype][f"ratio_{name}_compiled_over_{name}"] = ratio(f"{name}_compiled", name)
            result[dtype]["ratio_ours_compiled_over_marian_compiled"] = ratio("ours_compiled", "marian_compiled")
            result[dtype]["ratio_ours_compiled_over_marian"] = ratio("ours_compiled", "marian")
    if SETTINGS.dtypes == ("fp32", "bf16"):
        for name in MODELS:
            result[f"{name}_bf16_over_fp32"] = paired_ratio(times[f"{name}/fp32"], times[f"{name}/bf16"])
    return result


def section_encoder(size: dict[str, int], batches: list[Batch], reps: int, warmup: int) -> dict[str, Any]:
    fns = {}
    for dtype in SETTINGS.dtypes:
        models = for_inference(build_models(size))
        for name in MODELS:
            fns[f"{name}/{dtype}"] = encoder_forward(models[name], batches, dtype)
    times, _, cpu = interleaved(fns, reps, warmup)
    tokens = sum(b.source_tokens for b in batches)
    result: dict[str, Any] = {"source_tokens": tokens}
    for dtype in SETTINGS.dtypes:
        result[dtype] = {
            name: {
                "source_tokens_per_s": summary([tokens / s for s in times[f"{name}/{dtype}"]]),
                "cpu_seconds": summary(cpu[f"{name}/{dtype}"]),
            }
            for name in MODELS
        }
        result[dtype]["ratio_ours_over_marian"] = paired_ratio(times[f"marian/{dtype}"], times[f"ours/{dtype}"])
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
        batches.append(Batch(source, torch.ones_like(source), decoder_input_ids, labels).to(SETTINGS.device))
    curves = {}
    for dtype in SETTINGS.dtypes:
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
