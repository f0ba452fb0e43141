"""CPU training speed as an explicit step of the training step: `prepare_for_cpu_training(model)` (speed only, the
same dropout in distribution; the model code in model/ is plain `nn.Dropout`).

On a CPU, torch's dropout draws one float32 uniform per element with its serial generator and took 11% of a training
update of the Multi30k model in bf16 (docs/runs/training-speed.md, "Dropout on the CPU"). `dropout` here decides
each element's keep with a 32-bit slice of a 64-bit draw compared with p * 2^32: about 3x faster, and as exact (p to
within 2^-33, where a float32 uniform resolves 2^-24). On a GPU (torch's fused kernel) and while compiling (inductor
draws its own numbers), torch's dropout runs unchanged.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

ModelT = TypeVar("ModelT", bound=nn.Module)
INT32_MIN = -(2**31)
INT64_MIN = -(2**63)


def dropout(hidden_states: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Zero each element of `hidden_states` with probability `p` and scale the rest by 1 / (1 - p) while
    `training` (§5.4); the identity otherwise."""
    if not training or p == 0.0:
        return hidden_states
    # Of the 2^32 values of a uniform int32, the `dropped` lowest are dropped: probability dropped / 2^32. A p within
    # 2^-33 of 1 (or above) leaves no int32 value kept; torch's dropout takes it.
    dropped = round(p * 2**32)
    if hidden_states.device.type != "cpu" or dropped >= 2**32 or torch.compiler.is_compiling():
        return nn.functional.dropout(hidden_states, p=p, training=True)
    numel = hidden_states.numel()
    # random_(INT64_MIN, None) draws all 64 bits (an explicit upper bound would draw a modulo of a range).
    draws = torch.empty((numel + 1) // 2, dtype=torch.int64).random_(INT64_MIN, None)
    bits = draws.view(torch.int32)[:numel].view(hidden_states.shape)  # (numel + 1) // 2 int64 -> hidden_states' shape
    keep = bits >= INT32_MIN + dropped
    return hidden_states.mul(keep).mul_(1.0 / (1.0 - p))


class CpuDropout(nn.Dropout):
    """`nn.Dropout` whose mask is drawn by `dropout` (faster on a CPU; torch's elsewhere). An in-place dropout
    (`inplace=True`) stays torch's."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.inplace:
            return super().forward(input)
        return dropout(input, self.p, self.training)


def prepare_for_cpu_training(model: ModelT) -> ModelT:
    """Make `model` faster to train on a CPU: every plain `nn.Dropout` (exactly that class) becomes a `CpuDropout`,
    the same module object (no parameters, state_dict unchanged). Returns the same model, changed in place;
    idempotent, so the training step takes it before every update and modules added since are covered too."""
    for module in model.modules():
        if type(module) is nn.Dropout:
            module.__class__ = CpuDropout
    return model


__all__ = ["CpuDropout", "dropout", "prepare_for_cpu_training"]
