"""CPU inference speed as an explicit step: `prepare_for_cpu_inference(model)` (speed only, the results are those of
`nn.Linear` up to float32 rounding; bf16: the rounding of autocast's linear).

The step turns every plain `nn.Dropout` into an `InferenceDropout`, which returns its input in eval mode without
torch's dropout call (a few µs even when it does nothing; 14 calls a decoding step in a 3 + 3-layer model: 2% of a
batch-1 greedy `generate()`, AMD EPYC, 2 threads), and every plain `nn.Linear` into a `PackedLinear` (the same module
object, so the same
`weight`/`bias` Parameters: tying, state_dict keys and `save_pretrained` are unchanged). In CPU inference a
`PackedLinear` multiplies by a oneDNN-packed copy of its weight that it owns, where that is allowed and pays (the
rules of `inference_linear_dtype`), and runs `F.linear` otherwise. For the few rows of a decoding step `F.linear` runs
these products up to 2.3x slower on some CPUs (bench/packed_projection.py); the packed copy costs one more copy of the
weights in memory (per dtype used). A decoding step's small float32 products (at most `SPLIT_LINEAR_MAX_ROWS` rows) are
split by output rows over the threads instead (`split_linear`) on CPUs where that pays (`few_row_split_pays`: AMD's;
there, for one to four rows `F.linear` runs on one core, bound by that core's share of the memory bandwidth).

The model code (model/) knows nothing of this: a loaded model is plain PyTorch until its owner calls the step.
`keep_freed_memory` tunes the process's allocator for decoding; it is for the process owner (the command line calls
it), never for library code.
"""

from __future__ import annotations

import ctypes
import functools
import math
import sys
from typing import Any, TypeVar

import torch
from torch import nn

ModelT = TypeVar("ModelT", bound=nn.Module)

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


def prepare_for_cpu_inference(model: ModelT) -> ModelT:
    """Make `model` (in eval mode) faster in CPU inference; returns the same model, changed in place.

    Every plain `nn.Dropout` (exactly that class) becomes an `InferenceDropout`. Every plain `nn.Linear` (exactly
    that class, in eval mode) becomes a `PackedLinear`, and every `PackedLinear`
    drops the packed copies it holds, so the next products pack the current weights again: the step is idempotent,
    and calling it again is always safe. Layers inside a wrapper that owns a `base_layer` (PEFT's adapter layers,
    which merge into the base weight through `.data`) stay, or become again, plain `nn.Linear`.

    Weight edits: an in-place write that bumps the weight's version counter (`with torch.no_grad(): w.mul_(0.5)`,
    `load_state_dict`, an optimizer's foreach step) or replaces its storage (`w.data = ...`, `model.to(...)`) is seen
    at the next product. A write that bumps nothing, through `w.data` (`w.data.mul_(0.5)`) or by a fused optimizer
    step in eval mode, is not: call `prepare_for_cpu_inference(model)` again after it. Wrapping layers in adapters
    (PEFT's `get_peft_model`) after the step: call it again, so that the wrapped layers are plain before their merge
    (`merge_and_unload` writes through `.data`). Training undoes the step: `model.train()` turns every `PackedLinear`
    back into a plain `nn.Linear` without copies, so only a new call packs again, and every `InferenceDropout` into a
    plain `nn.Dropout`. An int8 model: call
    `quantize_int8` first (its layers are not `nn.Linear`; a `PackedLinear` is not quantized).

    Raises ValueError for a model in training mode (call `model.eval()` first)."""
    if model.training:
        raise ValueError(
            f"prepare_for_cpu_inference(model) is for inference, but model.training is True ({type(model).__name__} "
            f"in training mode); call model.eval() first."
        )
    wrapped = {
        id(inner)
        for wrapper in model.modules()
        if isinstance(getattr(wrapper, "base_layer", None), nn.Module)
        for inner in wrapper.modules()
        if inner is not wrapper
    }
    for module in model.modules():
        if type(module) is PackedLinear:
            if id(module) in wrapped or module.training:
                module.unprepare()
            else:
                module.packed = {}
        elif type(module) is nn.Linear and id(module) not in wrapped and not module.training:
            module.__class__ = PackedLinear
            module.packed = {}
        elif type(module) is nn.Dropout:
            module.__class__ = InferenceDropout
    return model


class InferenceDropout(nn.Dropout):
    """An `nn.Dropout` in CPU inference (made by `prepare_for_cpu_inference`): in eval mode its input as it is, as
    `nn.Dropout` returns it, without the call into torch's dropout; in training mode `nn.Dropout`'s."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return super().forward(input) if self.training else input

    def train(self, mode: bool = True) -> nn.Dropout:
        """`nn.Module.train`; `train(True)` also turns the module back into a plain `nn.Dropout`."""
        if mode:
            self.__class__ = nn.Dropout
        return nn.Dropout.train(self, mode)  # not super(): the class has changed


class PackedLinear(nn.Linear):
    """An `nn.Linear` in CPU inference (made by `prepare_for_cpu_inference`, never constructed): it computes
    `nn.Linear.forward` by `packed_linear` where `inference_linear_dtype` allows it, by `split_linear` for a small
    float32 product of a few rows where `split_count` allows it, and by `F.linear` otherwise (training, gradients,
    torch.compile / export / jit.trace, off the CPU, hooks, an instance forward).

    `packed` holds its packed weights (and biases cast to bf16) by dtype, each with the version counters and data
    pointers of the weight and the bias when it was made: a copy is remade when any of them changes. Packed oneDNN
    tensors are opaque (no storage), so a deep copy or pickle of the layer leaves them out; the copy packs its own on
    first use."""

    packed: dict[torch.dtype, tuple[tuple[int, ...], torch.Tensor, torch.Tensor | None]]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # First: under torch.compile / torch.export every check below is a graph break or a guard on a symbolic size
        # (`is_inference()` cannot be traced at all), and compiled code packs weights itself.
        if torch.compiler.is_compiling():
            return nn.functional.linear(hidden_states, self.weight, self.bias)
        if (
            hidden_states.dtype == torch.float32
            and hidden_states.numel() * self.out_features < PACKED_LINEAR_MIN_MACS
            and not torch.is_autocast_enabled(hidden_states.device.type)
        ):
            # Speed only: a small float32 product takes `F.linear` whatever the checks below say (see
            # `inference_linear_dtype`); answering first saves them, a tenth of a decoding step's time at batch 1. A
            # decoding step's few rows are split over the threads instead, where `split_count` allows.
            if hidden_states.numel() <= SPLIT_LINEAR_MAX_ROWS * hidden_states.shape[-1]:
                chunks = split_count(self, hidden_states)
                if chunks > 1:
                    return split_linear(hidden_states, self.weight, self.bias, chunks)
            return nn.functional.linear(hidden_states, self.weight, self.bias)
        if calls_plain_forward(self):
            dtype = packable_dtype(self, hidden_states)
            if dtype is not None:
                return packed_linear(self, hidden_states, dtype)
        return nn.functional.linear(hidden_states, self.weight, self.bias)

    def train(self, mode: bool = True) -> nn.Linear:
        """`nn.Module.train`; `train(True)` also undoes the preparation (`unprepare`)."""
        if mode:
            self.unprepare()
        return nn.Linear.train(self, mode)  # not super(): `unprepare` has changed the class

    def unprepare(self) -> None:
        """Back to a plain `nn.Linear` without packed copies; only `prepare_for_cpu_inference` packs again."""
        self.__dict__.pop("packed", None)
        self.__class__ = nn.Linear

    def __getstate__(self) -> dict[str, Any]:
        # Used by pickle and copy.deepcopy: the packed copies cannot be copied or pickled.
        state = super().__getstate__()
        return {**state, "packed": {}}


def packed_linear_dtype(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype in which a `PackedLinear` may multiply by a packed weight, or None where it must not: on the CPU,
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
    """True where `module(x)` only runs `PackedLinear.forward` (which computes `nn.Linear.forward`): in eval mode, no
    hooks of its own or global ones, no per-instance forward (accelerate's offloading sets one)."""
    hooks = torch.nn.modules.module
    return (
        type(module) is PackedLinear
        and not module.training
        and "forward" not in module.__dict__
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
    """The dtype in which a `PackedLinear` multiplies by a packed weight, or None for the plain linear:
    `packed_linear_dtype`, and in float32 only products of at least `PACKED_LINEAR_MIN_MACS` multiply-adds (under
    bf16 autocast the packed product wins at every size: it skips autocast's casts)."""
    dtype = packed_linear_dtype(hidden_states, weight)
    if dtype == torch.float32 and hidden_states.numel() * weight.shape[0] < PACKED_LINEAR_MIN_MACS:
        return None
    return dtype


@functools.cache
def few_row_split_pays() -> bool:
    """Whether `split_linear` speeds up a decoding step's few-row float32 products on this CPU: a fixed rule by CPU
    vendor (read once from /proc/cpuinfo), never a timing. On AMD CPUs a one-row `F.linear` runs on one core, and the
    split made batch-1 `generate()` 1.15-1.45x faster (AMD EPYC, 2 threads, bench/split_linear.py); on Intel CPUs it
    made it 0.50-0.71x as fast (Intel Xeon with AMX, 2 threads, 2026-11-26, docs/runs/decoding.md). False where the
    vendor cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return any(line.startswith("vendor_id") and "AuthenticAMD" in line for line in cpuinfo)
    except OSError:
        return False


def split_count(layer: nn.Linear, hidden_states: torch.Tensor) -> int:
    """Into how many blocks of output rows `split_linear` may split the product: the largest common divisor of the
    number of threads and of output features where the split pays on this CPU (`few_row_split_pays`) and the packed
    path would be allowed in float32 (the same rules: inference on the CPU, no hooks, oneDNN enabled), else 1 (no
    split)."""
    if not few_row_split_pays():  # first: the vendor rule answers most calls on an Intel CPU
        return 1
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


def packed_linear(layer: PackedLinear, hidden_states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`layer(hidden_states)` computed in `dtype` by oneDNN from the layer's packed copy of its weight, made on first
    use and again whenever the weight's version counter or storage changes (`packed_weight`). No checks: see
    `PackedLinear.forward`."""
    packed, bias = packed_weight(layer, dtype)
    if hidden_states.dtype != dtype:
        hidden_states = hidden_states.to(dtype)
    return torch.ops.mkldnn._linear_pointwise(hidden_states, packed, bias, "none", [], "")


def packed_weight(layer: PackedLinear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layer's weight packed for oneDNN in `dtype` and its bias in `dtype` (autocast's cast, once per change
    instead of at every call), kept in `layer.packed` until the weight or the bias changes (its version counter or
    data pointer)."""
    weight, bias = layer.weight, layer.bias
    key = (weight._version, weight.data_ptr())
    if bias is not None:
        key += (bias._version, bias.data_ptr())
    kept = layer.packed.get(dtype)
    if kept is None or kept[0] != key:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None)
        cast_bias = None if bias is None else bias.detach().to(dtype)
        kept = layer.packed[dtype] = (key, packed, cast_bias)
    return kept[1], kept[2]


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory() -> bool:
    """Process-wide, for the process owner only (the command line calls it; library code must not): ask glibc's
    malloc to keep freed memory for reuse (`mallopt`: blocks up to 1 GiB come from the heap rather than from a fresh
    mapping each, and the heap is not trimmed back below 2 GiB of free space). Decoding allocates and frees
    (rows, vocabulary) score tensors at every step; with glibc's defaults many are mapped afresh and their pages
    faulted in again: about 40,000 page faults per `generate()` of the base configuration with int8 layers at beam 4,
    batch 16, which then took 1.25x as long (docs/runs/decoding.md). The process keeps its peak memory from then on, as
    with jemalloc or tcmalloc. Returns False where there is no glibc (nothing is changed)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and other C libraries
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
