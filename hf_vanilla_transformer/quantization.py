"""int8 inference on the CPU: `quantize_int8(model)` gives every linear layer int8 weights (one scale per output row)
and quantizes its input to 8 bits at run time (dynamic quantization), the scheme of CTranslate2's int8 on the CPU.

The kernels are torch's own (`torch.ao.quantization.quantize_dynamic`: FBGEMM's `quantized::linear_dynamic` on x86,
QNNPACK on ARM), so no other package is needed. torchao's `Int8DynamicActivationInt8WeightConfig` (0.18, the
maintained successor) was measured too: run eagerly on the CPU it is slower than float32 (it re-transposes the weight
and re-sums its columns at every call and leaves their fusion to torch.compile), while FBGEMM's kernels are several
times faster than float32 on a decoding step's few rows (docs/model.md, "int8 inference"). Embeddings, layer norms
and attention's own products stay float32.

Quantize after loading; the int8 model is for inference only (no gradients, CPU only) and is not saved: quantizing a
base-sized model takes well under a second, so the float32 folder stays the one format to save and share.
"""

from __future__ import annotations

import warnings
from typing import TypeVar

import torch
from torch import nn

ModelT = TypeVar("ModelT", bound=nn.Module)


def int8_engine() -> str:
    """The quantized engine torch will run the int8 layers with; raises RuntimeError (one line, with the fix) where
    this torch has no dynamic int8 quantization or no engine for this CPU."""
    quantization = getattr(torch.ao, "quantization", None)
    engines = [engine for engine in torch.backends.quantized.supported_engines if engine != "none"]
    if quantization is None or not hasattr(quantization, "quantize_dynamic") or not engines:
        raise RuntimeError(
            f"int8 inference needs torch's dynamic quantization (torch.ao.quantization.quantize_dynamic with the "
            f"x86/fbgemm or qnnpack engine), which torch {torch.__version__} lacks (engines: "
            f"{torch.backends.quantized.supported_engines}); install a CPU build that has it, e.g. "
            f"pip install 'torch>=2.5,<2.14' --index-url https://download.pytorch.org/whl/cpu, or run without --int8."
        )
    return torch.backends.quantized.engine


def quantize_int8(model: ModelT) -> ModelT:
    """`model` with every `nn.Linear` (attention projections, feed-forward layers, the output projection) replaced in
    place by a dynamically quantized int8 layer; returns the model, in eval mode. The replacement layers are not
    `nn.Linear`, so the packed float32 path of cpu_inference.py (an instance forward on each `nn.Linear`) leaves them
    alone. Raises ValueError for a model off the CPU and RuntimeError where torch has no int8 kernels (`int8_engine`).
    """
    devices = {parameter.device.type for parameter in model.parameters()}
    if devices != {"cpu"}:
        raise ValueError(
            f"int8 quantization runs on the CPU only, but the model is on {sorted(devices)}; load it on the CPU "
            f"(model.to('cpu')) before quantize_int8, or drop --int8."
        )
    int8_engine()
    # The weights' scales are per output row (per channel), as CTranslate2's; the default qconfig has one per tensor.
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    model.eval()
    with warnings.catch_warnings():
        # torch >= 2.10 warns at each quantized weight that quantized tensors are deprecated; the kernels are present
        # (int8_engine checked), and a user of --int8 cannot act on it.
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel")
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="torch.ao.quantization is deprecated")
        torch.ao.quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    return model
