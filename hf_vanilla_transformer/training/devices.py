"""What `train` decides from the device it runs on, each by a fixed rule (never a timing taken at start-up) that it
states in one line of its log: the device itself, TF32 for fp32 matrix products, CUDA graphs; and the training
loop's measured rate at the end. bf16 (trainer.resolve_bf16) and torch.compile (compiling.py) have their own."""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .compiling import graphs_win, update_flops
from .static_shapes import GRAPH_LENGTH_BUCKETS

logger = logging.getLogger(__name__)

# TF32 tensor cores came with compute capability 8.0 (Ampere); V100 (7.0) and T4 (7.5) multiply fp32 as fp32.
TF32_CAPABILITY = (8, 0)
# The logs whose rates the loop's rate leaves out: the first updates compile, record graphs and warm the allocator.
RATE_SKIPPED_LOGS = 2


def describe_device(device: torch.device) -> str:
    """The device as `train`'s log names it: "cuda:0 (NVIDIA H200, compute capability 9.0, 1 of 1 GPUs)" or "cpu
    (N threads)"."""
    if device.type != "cuda":
        return f"{device.type} ({torch.get_num_threads()} threads)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    name = torch.cuda.get_device_name(index)
    return f"cuda:{index} ({name}, compute capability {major}.{minor}, {torch.cuda.device_count()} GPU(s) visible)"


def resolve_tf32(device: torch.device, given: bool | None) -> tuple[bool | None, str]:
    """TF32 for fp32 matrix products (the Trainer's `tf32`), and the line that says why. The rule: on, on GPUs of
    compute capability 8.0 or more (TF32 tensor cores: ~8x fp32's matrix rate, a 10-bit mantissa in the products,
    sums in fp32; what PyTorch's own default was until 1.12), so an fp32 run (`bf16=no`, or the fp32 parts of a
    bf16-autocast run) is not left at a fraction of the GPU; elsewhere left alone. `given`: the user's `tf32`
    Trainer argument, which wins. Returns the value for the Trainer (None: leave transformers' default)."""
    if given is not None:
        return given, f"{'on' if given else 'off'} (the `tf32` Trainer argument)"
    if device.type != "cuda":
        return None, f"not applicable (a {device.type.upper()})"
    capability = torch.cuda.get_device_capability(device)
    if capability >= TF32_CAPABILITY:
        return True, (
            f"on for fp32 matrix products (compute capability {capability[0]}.{capability[1]} >= 8.0 has TF32 tensor "
            "cores; `--tf32 False` turns it off)"
        )
    return None, f"off (compute capability {capability[0]}.{capability[1]} < 8.0 has no TF32 tensor cores)"


def model_parameters(config: VanillaTransformerConfig) -> int:
    """The parameters of a model of `config`, counted on the meta device (no memory, no initialisation)."""
    with torch.device("meta"):
        return VanillaTransformerForConditionalGeneration(config).num_parameters()


def resolve_cuda_graphs(
    choice: str, compiled: bool, device: torch.device, config: VanillaTransformerConfig, max_tokens: int
) -> tuple[dict[str, Any], str]:
    """The Trainer arguments for CUDA graphs (compiling.graphs_win's rule: `torch_compile_mode="reduce-overhead"`
    and `length_buckets`), none without them, and the line that says why."""
    flops = update_flops(model_parameters(config), max_tokens) if compiled and device.type == "cuda" else 0.0
    graphs, line = graphs_win(choice, compiled, device, flops)
    if not graphs:
        return {}, line
    arguments = {"torch_compile_mode": "reduce-overhead", "length_buckets": GRAPH_LENGTH_BUCKETS}
    return arguments, f"{line}; torch.compile mode reduce-overhead, at most {GRAPH_LENGTH_BUCKETS} batch shapes"


class LoopRateCallback(TrainerCallback):
    """At the end of training, one line with the training loop's rate: updates/s and target tokens/s, the median
    over the intervals between training logs after the first `RATE_SKIPPED_LOGS` (compiling, graph recording and
    the allocator's warm-up are not the loop's steady rate). The model step's own rate at the same shape is
    `python -m bench.bench --sections train` (bench/gpu_check.sh divides the one by the other)."""

    def __init__(self) -> None:
        self.points: list[tuple[float, int, float]] = []  # (time, update, target tok/s since the previous log)

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.points = []

    def on_log(self, args, state: TrainerState, control: TrainerControl, logs=None, **kwargs: Any) -> None:
        if logs and "tgt_tokens_per_second" in logs:
            self.points.append((time.perf_counter(), state.global_step, float(logs["tgt_tokens_per_second"])))

    def rates(self) -> tuple[float, float] | None:
        """(updates/s, target tokens/s), or None with too few logs."""
        points = self.points[RATE_SKIPPED_LOGS:]
        if len(points) < 2:
            return None
        steps = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(points) if b[0] > a[0]]
        return statistics.median(steps), statistics.median(point[2] for point in points[1:])

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        rates = self.rates()
        if rates is None:
            logger.info(f"Loop: too few training logs to measure its rate ({len(self.points)}; see --logging-steps)")
            return
        logger.info(
            f"Loop: {rates[0]:.1f} updates/s, {rates[1]:,.0f} target tok/s (medians between training logs, after "
            f"the first {RATE_SKIPPED_LOGS}; {state.global_step} updates)"
        )


__all__ = [
    "RATE_SKIPPED_LOGS",
    "TF32_CAPABILITY",
    "LoopRateCallback",
    "describe_device",
    "model_parameters",
    "resolve_cuda_graphs",
    "resolve_tf32",
]
