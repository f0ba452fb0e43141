"""CPU inference with oneDNN-packed linear weights: speed only, the results are those of `nn.Linear` up to float32
rounding (bf16: the rounding of autocast's linear).

`use_packed_linears(model)` (called once, from the model's `post_init`) gives every plain `nn.Linear` of the model an
instance forward that multiplies by a packed copy of its weight when that is allowed and pays (the rules of
`inference_linear_dtype`) and runs `F.linear` otherwise, so that the model's code reads `self.q_proj(hidden_states)`.
For the few rows of a decoding step `F.linear` runs these products up to 2.3x slower on some CPUs
(bench/packed_projection.py); the packed copy costs one more copy of the weights in memory (per dtype used).
A decoding step's small float32 products (at most `SPLIT_LINEAR_MAX_ROWS` rows) are split by output rows over the
threads instead (`split_linear`): for one to four rows `F.linear` runs on one core, bound by that core's share of the
memory bandwidth. `plain_kernels` (or `torch.backends.mkldnn.flags(enabled=False)`) turns both off.
`keep_freed_memory` (called by `translate` and `evaluate`) tunes the process's allocator for decoding. This file
imports only torch: it is copied next to the model code (remote code).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import math
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

# oneDNN-packed copies of linear weights (and biases cast to bf16), by id of the tensor and then by dtype, each
# dropped when its tensor is freed.
# Kept outside the modules: packed tensors are opaque (no storage), so a deep copy or pickle of a model holding one
# would fail.
_PACKED_WEIGHTS: dict[int, dict[torch.dtype, tuple[tuple[int, int], torch.Tensor]]] = {}

# Below this many multiply-adds in float32, oneDNN's fixed cost per call (~13 µs) outweighs what the packed layout
# saves: one row of a 256 × 256 layer takes 16 µs packed against 7 µs through `F.linear`, 16 rows 20 against 18 µs;
# 16 rows of 256 × 1024 (4.2 M) 36 against 68 µs; one row of the 256 × 8000 output projection (2 M) 73 against
# 142 µs (bench/packed_projection.py, AMD EPYC with AVX-512, 2 threads).
PACKED_LINEAR_MIN_MACS = 1_500_000

# Up to this many rows a float32 product below the packing threshold is split over the threads (`split_linear`). With
# the weights read from memory as in a decoding step, `generate()` at batch 1 was 1.45x faster greedy and 1.23x with
# beam 4 (4 rows) in the base configuration, 1.15x and 1.14x in the tiny one (bench/split_linear.py); splitting 16
# rows made tiny greedy batch 16 10% slower (AMD EPYC, 2 threads).
SPLIT_LINEAR_MAX_ROWS = 4


class PackedForward:
    """The instance forward `use_packed_linears` gives one `nn.Linear`: `packed_forward(layer, input)`.

    It holds its layer weakly (a strong reference would be a cycle, keeping a deleted model's weights until the garbage
    collector runs) and follows it through `copy.deepcopy` and pickling."""

    __slots__ = ("layer",)

    def __init__(self, layer: nn.Linear) -> None:
        self.layer = weakref.ref(layer)

    def __call__(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return packed_forward(self.layer(), hidden_states)

    def __deepcopy__(self, memo: dict[int, Any]) -> PackedForward:
        return PackedForward(copy.deepcopy(self.layer(), memo))  # the copy of the layer being copied (in the memo)

    def __reduce__(self) -> tuple[type[PackedForward], tuple[nn.Linear]]:
        return PackedForward, (self.layer(),)


def use_packed_linears(model: nn.Module) -> None:
    """Give every `nn.Linear` of `model` (exactly that class, without an instance forward of its own) the packed
    inference forward. Idempotent; layers added later keep `nn.Linear.forward`."""
    for module in model.modules():
        if type(module) is nn.Linear and "forward" not in module.__dict__:
            module.forward = PackedForward(module)


def packed_forward(layer: nn.Linear, hidden_states: torch.Tensor) -> torch.Tensor:
    """`nn.Linear.forward`, computed by `packed_linear` where `inference_linear_dtype` allows it, by `split_linear`
    for a small float32 product of a few rows where `split_count` allows it. Hooks have already run
    (`nn.Module.__call__`); a layer with hooks, or wrapped by another instance forward (accelerate's offloading),
    takes `F.linear`."""
    # First: under torch.compile / torch.export every check below is a graph break or a guard on a symbolic size
    # (`is_inference()` cannot be traced at all), and compiled code packs weights itself.
    if torch.compiler.is_compiling():
        return nn.functional.linear(hidden_states, layer.weight, layer.bias)
    if (
        hidden_states.dtype == torch.float32
        and hidden_states.numel() * layer.weight.shape[0] < PACKED_LINEAR_MIN_MACS
        and not torch.is_autocast_enabled(hidden_states.device.type)
    ):
        # Speed only: a small float32 product takes `F.linear` whatever the checks below say (see
        # `inference_linear_dtype`); answering first saves them, a tenth of a decoding step's time at batch 1. A
        # decoding step's few rows are split over the threads instead, where `split_count` allows.
        if hidden_states.numel() <= SPLIT_LINEAR_MAX_ROWS * hidden_states.shape[-1]:
            chunks = split_count(layer, hidden_states)
            if chunks > 1:
                return split_linear(hidden_states, layer.weight, layer.bias, chunks)
        return nn.functional.linear(hidden_states, layer.weight, layer.bias)
    if calls_plain_forward(layer):
        dtype = packable_dtype(layer, hidden_states)
        if dtype is not None:
            return packed_linear(layer, hidden_states, dtype)
    return nn.functional.linear(hidden_states, layer.weight, layer.bias)


def packed_linear_dtype(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype in which `packed_forward` may multiply by a packed weight, or None where it must not: on the CPU,
    no gradient wanted, not under torch.compile (which packs weights itself), torch.export or torch.jit.trace (their
    graphs must hold portable ops), oneDNN present and enabled; float32, or bfloat16 (bf16 autocast, or bf16 inputs
    and weights) where oneDNN has bf16 kernels."""
    if not (
        torch.backends.mkldnn.enabled
        and hidden_states.is_cpu
        and weight.is_cpu
        and hidden_states.numel() > 0
        and not (torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad))
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and onednn_linear_dtypes()
    ):
        return None
    if torch.is_autocast_enabled("cpu"):
        # Autocast's linear casts the input, the weight and the bias to its dtype; float32 ones only.
        dtype = torch.get_autocast_dtype("cpu")
        inputs_castable = hidden_states.dtype in (torch.float32, dtype) and weight.dtype in (torch.float32, dtype)
    else:
        dtype = weight.dtype
        inputs_castable = hidden_states.dtype == dtype
    if inputs_castable and dtype in onednn_linear_dtypes():
        return dtype
    return None


@functools.cache
def onednn_linear_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes oneDNN's packed linear runs in with this torch build and CPU (none without oneDNN); read once."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return ()
    return (torch.float32, torch.bfloat16) if torch.ops.mkldnn._is_mkldnn_bf16_supported() else (torch.float32,)


def calls_plain_forward(module: nn.Module) -> bool:
    """True where `module(x)` would only run `nn.Linear.forward` (or the packed forward, which computes the same):
    exactly an `nn.Linear` (not a PEFT, quantized or other subclass), no hooks of its own or global ones, no other
    per-instance forward (accelerate's offloading sets one)."""
    hooks = torch.nn.modules.module
    forward = module.__dict__.get("forward")
    return (
        type(module) is nn.Linear
        and (forward is None or type(forward) is PackedForward)
        and not (module._forward_hooks or module._forward_pre_hooks)
        and not (module._backward_hooks or module._backward_pre_hooks)
        and not (hooks._global_forward_hooks or hooks._global_forward_pre_hooks)
        and not (hooks._global_backward_hooks or hooks._global_backward_pre_hooks)
    )


def packable_dtype(layer: nn.Linear, hidden_states: torch.Tensor) -> torch.dtype | None:
    """`inference_linear_dtype` for a plain layer's weight; None for a weight made under torch.inference_mode (no
    version counter to watch) or a tensor subclass (it has its own ops)."""
    weight = layer.weight
    if type(weight) not in (nn.Parameter, torch.Tensor) or weight.is_inference():
        return None
    return inference_linear_dtype(hidden_states, weight)


def inference_linear_dtype(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype in which `packed_forward` multiplies by a packed weight, or None for the plain linear:
    `packed_linear_dtype`, and in float32 only products of at least `PACKED_LINEAR_MIN_MACS` multiply-adds (under
    bf16 autocast the packed product wins at every size: it skips autocast's casts)."""
    dtype = packed_linear_dtype(hidden_states, weight)
    if dtype == torch.float32 and hidden_states.numel() * weight.shape[0] < PACKED_LINEAR_MIN_MACS:
        return None
    return dtype


def split_count(layer: nn.Linear, hidden_states: torch.Tensor) -> int:
    """Into how many blocks of output rows `split_linear` may split the product: the largest common divisor of the
    number of threads and of output features where the packed path would be allowed in float32 (the same rules:
    inference on the CPU, no hooks, oneDNN enabled), else 1 (no split)."""
    weight = layer.weight
    chunks = math.gcd(torch.get_num_threads(), weight.shape[0])
    if (
        chunks > 1
        and type(weight) in (nn.Parameter, torch.Tensor)
        and weight.is_contiguous()
        and calls_plain_forward(layer)
        and packed_linear_dtype(hidden_states, weight) == torch.float32
    ):
        return chunks
    return 1


def split_linear(
    hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, chunks: int
) -> torch.Tensor:
    """`F.linear(hidden_states, weight, bias)` as one batched product over `chunks` blocks of output rows, which
    torch runs in parallel (one block per thread); the same sums, up to float32 rounding. No checks: see
    `split_count`."""
    out_features, in_features = weight.shape
    rows = hidden_states.reshape(-1, in_features).t().expand(chunks, -1, -1)  # (..., in) -> (chunks, in, R)
    blocks = weight.view(chunks, out_features // chunks, in_features)  # (out, in) -> (chunks, out / chunks, in)
    if bias is None:
        products = torch.bmm(blocks, rows)
    else:
        products = torch.baddbmm(bias.view(chunks, -1, 1), blocks, rows)  # (out,) -> (chunks, out / chunks, 1)
    # (chunks, out / chunks, R) -> (R, chunks, out / chunks) -> (..., out)
    return products.permute(2, 0, 1).reshape(*hidden_states.shape[:-1], out_features)


def packed_linear(module: nn.Linear, hidden_states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`module(hidden_states)` computed in `dtype` by oneDNN from a packed copy of the weight, made on first use and
    again after every change to the weight (its version counter or storage changes, or an optimizer stepped it).
    No checks: see `packed_forward`."""
    packed = kept_copy(module.weight, dtype, pack_weight)
    bias = module.bias
    if bias is not None and bias.dtype != dtype:
        bias = kept_copy(bias, dtype, cast_bias)  # autocast's cast, once per change instead of at every call
    if hidden_states.dtype != dtype:
        hidden_states = hidden_states.to(dtype)
    return torch.ops.mkldnn._linear_pointwise(hidden_states, packed, bias, "none", [], "")


def pack_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None)


def cast_bias(bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return bias.detach().to(dtype)


def kept_copy(
    tensor: torch.Tensor, dtype: torch.dtype, make: Callable[[torch.Tensor, torch.dtype], torch.Tensor]
) -> torch.Tensor:
    """`make(tensor, dtype)`, kept in `_PACKED_WEIGHTS` until the tensor changes (its version counter or storage;
    an optimizer step: `forget_stepped_weights`) or is freed."""
    key = (tensor._version, tensor.data_ptr())
    by_dtype = _PACKED_WEIGHTS.get(id(tensor))
    if by_dtype is None:
        by_dtype = _PACKED_WEIGHTS[id(tensor)] = {}
        weakref.finalize(tensor, _PACKED_WEIGHTS.pop, id(tensor), None)
        _watch_optimizer_steps()
    kept = by_dtype.get(dtype)
    if kept is None or kept[0] != key:
        kept = by_dtype[dtype] = (key, make(tensor, dtype))
    return kept[1]


_OPTIMIZER_HOOK: list[torch.utils.hooks.RemovableHandle] = []


def _watch_optimizer_steps() -> None:
    """Registers (once) `forget_stepped_weights` as a post-step hook of every optimizer."""
    if not _OPTIMIZER_HOOK:
        _OPTIMIZER_HOOK.append(register_optimizer_step_post_hook(forget_stepped_weights))


def forget_stepped_weights(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """After any optimizer's step, drops the packed copies of the weights it updated. Fused optimizers (transformers'
    default `adamw_torch_fused`) write the weights without bumping their version counters, so the version alone
    would keep a stale copy, and evaluation between training steps would multiply by the weights of an earlier step.
    (An in-place write through `weight.data` bumps no counter either: call `weight.copy_` under `torch.no_grad()`.)"""
    if _PACKED_WEIGHTS:
        for group in optimizer.param_groups:
            for param in group["params"]:
                by_dtype = _PACKED_WEIGHTS.get(id(param))
                if by_dtype:
                    by_dtype.clear()


@contextlib.contextmanager
def plain_kernels() -> Iterator[None]:
    """Within the block, every layer runs its own `nn.Linear` forward: the packed and split paths are off (oneDNN is
    switched off; the warning about Intel-GPU TF32 that torch prints at each switch is silenced)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Process-wide: ask glibc's malloc to keep freed memory for reuse (`mallopt`: blocks up to 1 GiB come from the
    heap rather than from a fresh mapping each, and the heap is not trimmed back below 2 GiB of free space).
    Decoding allocates and frees (rows, vocabulary) score tensors at every step; with glibc's defaults many are
    mapped afresh and their pages faulted in again: about 40,000 page faults per `generate()` of the base
    configuration with int8 layers at beam 4, batch 16, which then took 1.25x as long (docs/results.md). The process
    keeps its peak memory from then on, as with jemalloc or tcmalloc. Returns False where there is no glibc
    (nothing is changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other C libraries
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
