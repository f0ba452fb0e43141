"""int8 inference on the CPU: `quantize_int8(model)` gives every linear layer int8 weights (one scale per output row)
and quantizes its input to 8 bits at run time (dynamic quantization), the scheme of CTranslate2's int8 on the CPU.

The kernels are torch's own (`torch.ao.quantization.quantize_dynamic`: FBGEMM's `quantized::linear_dynamic` on x86,
QNNPACK on ARM), so no other package is needed. torchao's `Int8DynamicActivationInt8WeightConfig` (0.18, the
maintained successor) was measured too: run eagerly on the CPU it is slower than float32 (it re-transposes the weight
and re-sums its columns at every call and leaves their fusion to torch.compile), while FBGEMM's kernels are several
times faster than float32 on a decoding step's few rows (docs/model.md, "int8 inference"). Embeddings, layer norms
and attention's own products stay float32.

For a decoding step's few rows FBGEMM's fixed cost per call (quantizing the input, 20-25 µs whatever the size) exceeds
the product: `Int8Linear` multiplies the same int8 weights by the input rounded to bf16 there (torch's
`_weight_int8pack_mm`), 1.2-1.9x faster per layer for products below `WEIGHT_ONLY_MAX_MACS` multiply-adds and
more exact (bf16 inputs where FBGEMM's are 7-bit integers).

Quantize after loading; the int8 model is for inference only (no gradients, CPU only) and is not saved: quantizing a
base-sized model takes well under a second, so the float32 folder stays the one format to save and share.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, TypeVar

import torch
from torch import nn

from .cpu_inference import PackedLinear

try:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
except ImportError:  # a torch without it: quantize_int8 stops first, with int8_engine's one-line error
    DynamicInt8Linear = nn.Module

ModelT = TypeVar("ModelT", bound=nn.Module)

# Below this many multiply-adds (rows x in x out), the int8 weights times bf16 inputs beat FBGEMM's dynamic int8:
# 256 x 256 layers 1.7-1.9x faster from 1 to 4 rows and 1.3x at 8 (524 K), 1024 x 256 and 512 x 512 1.2-1.5x at 1-2
# rows; at 1 M (512 x 512 at 4 rows, 2048 x 512 at one) they are even or slower (AMD EPYC with AVX512-BF16, 2 threads).
WEIGHT_ONLY_MAX_MACS = 600_000


class Int8Linear(DynamicInt8Linear):
    """torch's dynamically quantized linear (FBGEMM int8 weights and inputs), which for a product of fewer than
    `WEIGHT_ONLY_MAX_MACS` multiply-adds multiplies the same int8 weights (and their per-row scales) by the input
    rounded to bf16 instead (`torch.ops.aten._weight_int8pack_mm`), adding the float32 bias to the float32 result."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // self.in_features
        if 0 < rows * self.in_features * self.out_features < WEIGHT_ONLY_MAX_MACS and weight_only_kernel():
            weight, scales, bias = self.weight_only_parameters()
            flat = hidden_states.reshape(rows, self.in_features).to(torch.bfloat16)  # (..., in) -> (R, in)
            products = torch.ops.aten._weight_int8pack_mm(flat, weight, scales).to(hidden_states.dtype)
            if bias is not None:
                products = products + bias
            return products.view(*hidden_states.shape[:-1], self.out_features)  # (R, out) -> (..., out)
        return super().forward(hidden_states)

    def weight_only_parameters(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The int8 weights (out, in), their per-row scales in bf16 (out,) and the bias, read from the FBGEMM-packed
        ones, again whenever those are replaced (`set_weight_bias`, `load_state_dict`)."""
        packed = self._packed_params._packed_params
        kept: Any = self.__dict__.get("_weight_only")
        if kept is None or kept[0] is not packed:
            weight, bias = self._weight_bias()
            kept = (packed, weight.int_repr(), weight.q_per_channel_scales().to(torch.bfloat16), bias)
            self.__dict__["_weight_only"] = kept
        return kept[1], kept[2], kept[3]


@functools.cache
def weight_only_kernel() -> bool:
    """Whether `Int8Linear`'s few-row path may run: torch has the kernel and this CPU multiplies bf16 fast (oneDNN's
    bf16 check: AVX-512 or newer). Read once."""
    return (
        hasattr(torch.ops.aten, "_weight_int8pack_mm")
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def int8_engine() -> str:
    """The quantized engine torch will run the int8 layers with; raises RuntimeError (one line, with the fix) where
    this torch has no dynamic int8 quantization or no engine for this CPU."""
    quantization = getattr(torch.ao, "quantization", None)
    engines = [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]
    if (
        quantization is None
        or not hasattr(quantization, "quantize_dynamic")
        or DynamicInt8Linear is nn.Module
        or not engines
    ):
        raise RuntimeError(
            f"int8 inference needs torch's dynamic quantization (torch.ao.quantization.quantize_dynamic with the "
            f"x86/fbgemm or qnnpack engine), which torch {torch.__version__} lacks (engines: "
            f"{torch.backends.quantized.supported_engines}); install a CPU build that has it, e.g. "
            f"pip install 'torch>=2.5,<2.14' --index-url https://download.pytorch.org/whl/cpu, or run without `int8`."
        )
    return torch.backends.quantized.engine


def quantize_int8(model: ModelT) -> ModelT:
    """`model` with every `nn.Linear` (attention projections, feed-forward layers, the output projection) replaced in
    place by a dynamically quantized int8 layer (`Int8Linear`); returns the model, in eval mode. The replacement
    layers are not `nn.Linear`, so `prepare_for_cpu_inference` (cpu_inference.py), run after this, leaves them alone;
    a model prepared before is made plain first (its `PackedLinear` layers are quantized like any `nn.Linear`).
    Raises ValueError for a model off the CPU and RuntimeError where torch has no int8 kernels (`int8_engine`).
    The quantized model's `save_pretrained`/`push_to_hub` raise ValueError (`refuse_saving`)."""
    devices = {parameter.device.type for parameter in model.parameters()}
    if devices != {"cpu"}:
        raise ValueError(
            f"int8 quantization runs on the CPU only, but the model is on {sorted(devices)}; load it on the CPU "
            f"(model.to('cpu')) before quantize_int8, or drop `int8`."
        )
    int8_engine()
    # The weights' scales are per output row (per channel), as CTranslate2's; the default qconfig has one per tensor.
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    model.eval()
    for module in model.modules():
        if isinstance(module, PackedLinear):
            module.unprepare()  # quantize_dynamic matches exact classes
    with warnings.catch_warnings():
        # torch >= 2.10 warns at each quantized weight that quantized tensors are deprecated; the kernels are present
        # (int8_engine checked), and a user of `int8` cannot act on it.
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="torch.ao.quantization is deprecated")
        torch.ao.quantization.quantize_dynamic(
            model, {nn.Linear: qconfig}, dtype=torch.qint8, mapping={nn.Linear: Int8Linear}, inplace=True
        )
    refuse_saving(model)
    return model


def refuse_saving(model: nn.Module) -> None:
    """Make this int8 model's `save_pretrained` and `push_to_hub` raise a one-line ValueError before anything is
    written or uploaded. Their int8 layers hold FBGEMM-packed weights that safetensors cannot store (transformers
    would create the folder and write config.json first, then fail with an AttributeError at the weights), so the
    refusal replaces the two methods on this instance only: the class, the float models and the model room's code
    stay as they are."""
    for name in ("save_pretrained", "push_to_hub"):
        method = getattr(model, name, None)
        if callable(method):
            setattr(model, name, functools.wraps(method)(functools.partial(refuse_to_save, name)))


def refuse_to_save(name: str, *args: Any, **kwargs: Any) -> None:
    raise ValueError(
        f"{name} of a model quantized with quantize_int8 (`int8`): int8 layers are for inference only and their "
        f"packed weights cannot be saved; save the float model (load it again without `int8`) and quantize after "
        f"loading."
    )
