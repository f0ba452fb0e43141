"""Compiled training (`train --torch-compile`): transformers' own switch (`TrainingArguments.torch_compile`, which
has accelerate wrap the model in `torch.compile`, inductor by default), made to work here on the first try.

- Bounded recompiles: token-budget batches (§5.1) have a new (rows, length) shape at almost every step. torch's
  automatic dynamic shapes compile the first batch's shape, and at the first other shape recompile once with the
  batch and length dimensions symbolic; that graph then serves every later batch. On a GPU, inductor also guards on
  whether each length is a multiple of 8 (aligned matrix kernels), so up to a few more graphs follow, one per new
  outcome of that test (docs/runs/gpu.md, "Compiled training on the H100"). `CompileReportCallback` logs each new
  graph and the compile time, so a run whose recompiles do not stop says so in its log.
- CUDA graphs (`torch_compile="graphs"`, or "auto" by `graphs_win`'s rule): `mode="reduce-overhead"` replays each
  update's forward and backward as CUDA graphs, with the batches padded to a few fixed shapes (static_shapes.py) so
  that the graphs are reused; for models whose step is bound by kernel launches rather than arithmetic.
- A device where compiling cannot work (no C++ compiler for inductor on a CPU, no Triton on a GPU, an unsupported
  torch) is found before training by compiling a one-line function; `resolve_torch_compile` then says so in one
  line and training goes on eagerly.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState

logger = logging.getLogger(__name__)

TORCH_COMPILE_CHOICES = ("auto", "yes", "graphs", "no")
# `graphs_win`'s bound: an update of fewer floating-point operations than this is bound by kernel launches on a GPU.
# 1e12 is about 3 ms of bf16 matrix work on an H100 (~300-400 TFLOP/s reached), while the Multi30k model's eager
# update (6 x 7.6M parameters x 4096 tokens = 1.9e11) took 49 ms on an H200 (20.5 updates/s): launches and Python.
# The paper's base model at its 25k-token batches (6 x 63M x 25,000 = 9.4e12) is above it: its arithmetic dominates,
# and the bucket padding (static_shapes.LengthBuckets.padding) would cost more than the launches it saves.
LAUNCH_BOUND_FLOPS = 1e12


def compile_failure(device: torch.device) -> str | None:
    """Why `torch.compile` (inductor) cannot compile on `device`, or None where it can: compiles and runs a
    one-line function there (a few seconds the first time, cached after)."""
    try:
        doubled = torch.compile(lambda x: x * 2 + 1, backend="inductor", fullgraph=True)(torch.ones(4, device=device))
    except Exception as error:  # inductor's errors have no common base: any failure means eager training
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return f"{type(error).__name__}: {lines[0] if lines else 'no message'}"
    finally:
        torch._dynamo.reset()  # the probe's graph must not count as one of the training graphs
    if not torch.equal(doubled.cpu(), torch.full((4,), 3.0)):
        return "a compiled test function computed a wrong result"
    return None


def compile_wins(device: torch.device) -> str | None:
    """The `torch_compile="auto"` rule: the reason to compile on `device`, or None to train eagerly. A fixed rule,
    never a timing taken at start-up. Evidence (docs/runs/training-speed.md, "Compiled training"): on 2 cores of an
    Intel Xeon with AMX, compiled training ran at 0.68x (fp32) and 0.90x (bf16) of eager, `MarianMTModel` at 0.77x and
    0.78x; on one H100 (base configuration, the paper's 25k-token batches, bf16), at 1.50x, `MarianMTModel` at 1.29x:
    inductor's Triton kernels fuse the pointwise work that eager launches one kernel at a time."""
    if device.type == "cuda":
        return "a GPU (Triton kernels fuse layer norm, dropout, softmax and the residual adds)"
    return None


def resolve_torch_compile(choice: str, device: torch.device) -> tuple[bool, str]:
    """Whether to compile the training step for `torch_compile` "auto", "yes", "graphs" or "no" on `device`, and
    the line that says what was decided and why (`train` prints it as "Compile: ...")."""
    if choice not in TORCH_COMPILE_CHOICES:
        raise ValueError(f"`torch_compile` is {choice!r}; pass 'auto', 'yes', 'graphs' or 'no'.")
    if choice == "no":
        return False, "eager (`torch_compile=no`)"
    reason = compile_wins(device)
    if choice == "auto" and reason is None:
        return False, f"eager (`torch_compile=auto` compiles on a GPU only; this is a {device.type.upper()})"
    failure = compile_failure(device)
    if failure is not None:
        return False, f"eager: torch.compile cannot work here ({failure}); training goes on without it"
    why = f"`torch_compile=auto`: {reason}" if choice == "auto" else f"`torch_compile={choice}`"
    return True, f"torch.compile, inductor ({why})"


def update_flops(parameters: int, max_tokens: int) -> float:
    """The arithmetic of one training update, roughly: 6 floating-point operations per parameter and target token
    (forward 2, backward 4), with `max_tokens` target tokens."""
    return 6.0 * parameters * max_tokens


def graphs_win(choice: str, compiled: bool, device: torch.device, flops: float) -> tuple[bool, str]:
    """Whether the compiled step runs as CUDA graphs over fixed batch shapes, and the line that says why (`train`
    prints it as "CUDA graphs: ..."). The `torch_compile="auto"` rule, fixed, no timing: on a GPU, when an update
    is under `LAUNCH_BOUND_FLOPS` (`update_flops`); "graphs" asks for them on any GPU."""
    if not compiled or device.type != "cuda":
        where = "not compiled" if not compiled else f"this is a {device.type.upper()}"
        return False, f"no ({where}; CUDA graphs need a compiled step on a GPU)"
    if choice == "graphs":
        return True, "yes (`torch_compile=graphs`)"
    if choice == "auto" and flops < LAUNCH_BOUND_FLOPS:
        return (
            True,
            f"yes (`torch_compile=auto`: an update is {flops:.1e} FLOPs < {LAUNCH_BOUND_FLOPS:.0e}, launch-bound)",
        )
    if choice == "auto":
        return (
            False,
            f"no (`torch_compile=auto`: an update is {flops:.1e} FLOPs >= {LAUNCH_BOUND_FLOPS:.0e}; dynamic shapes)",
        )
    return False, "no (`torch_compile=yes`: dynamic shapes; `graphs` asks for them)"


def compile_counts() -> tuple[int, float]:
    """Graphs compiled in this process so far, and the seconds spent compiling them (forward and backward)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    graphs = int(counters["stats"]["unique_graphs"])
    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", []))
    return graphs, seconds


class CompileReportCallback(TrainerCallback):
    """Logs the graphs torch.compile builds for training: those of the first update (the compile), then each
    recompile (a later new graph: a shape or input the graphs in hand could not take), with the seconds spent
    compiling so far; and a summary when training ends."""

    def __init__(self) -> None:
        self.start_graphs, self.start_seconds = compile_counts()
        self.first_graphs: int | None = None  # graphs of the first update, once it has run
        self.graphs = self.start_graphs

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.start_graphs, self.start_seconds = compile_counts()
        self.first_graphs, self.graphs = None, self.start_graphs

    def recompiles(self) -> int:
        return 0 if self.first_graphs is None else self.graphs - self.start_graphs - self.first_graphs

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        graphs, seconds = compile_counts()
        if self.first_graphs is None:
            self.first_graphs, self.graphs = graphs - self.start_graphs, graphs
            what = f"compiled the training step ({self.first_graphs} graph(s))"
        elif graphs != self.graphs:
            self.graphs = graphs
            what = f"recompiled at update {state.global_step} ({self.recompiles()} recompile(s) so far)"
        else:
            return
        logger.info(f"torch.compile: {what}; {seconds - self.start_seconds:.0f} s compiling in all")

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.graphs, seconds = compile_counts()
        logger.info(
            f"torch.compile: {self.graphs - self.start_graphs} graph(s), {self.recompiles()} recompile(s), "
            f"{seconds - self.start_seconds:.0f} s compiling in {state.global_step} updates"
        )


__all__ = [
    "LAUNCH_BOUND_FLOPS",
    "TORCH_COMPILE_CHOICES",
    "CompileReportCallback",
    "compile_counts",
    "compile_failure",
    "compile_wins",
    "graphs_win",
    "resolve_torch_compile",
    "update_flops",
]
