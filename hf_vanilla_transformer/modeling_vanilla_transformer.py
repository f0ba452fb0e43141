"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need" (arXiv:1706.03762): one file, in paper order.

Shapes: B batch, S source length, T target length, L cache + new length, D d_model, H heads, Dh = d_k = d_v = D / H,
F d_ff, V vocabulary. Module names follow Marian/fairseq so that foreign checkpoints map by name.
This file imports only torch and transformers, so that a saved folder loads with `trust_remote_code=True`.
"""

import contextlib
import inspect
import math
import os
import shutil
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import PaperGenerationMixin

PIPELINE_FILE = "pipeline_vanilla_translation.py"
# transformers 5.24 renamed the outputs' `past_key_values` field to `cache`; the old name still works there but logs a
# deprecation warning on every run, so outputs are built and read under the installed version's name.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing (§3.1: "output embeddings are offset by one position"): the decoder input is the target
    shifted right behind the start token; -100 (ignored label) becomes padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2.1 Scaled Dot-Product Attention, eq. (1): softmax(Q Kᵀ / √d_k) V.

    query (B, H, T, Dh); key, value (B, H, L, Dh); additive attention_mask (B, 1, T, L) with large negative values
    at masked positions (§3.2.3: "setting to −∞"). Returns the output (B, T, H, Dh) and the weights (B, H, T, L).
    """
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, T, L)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    # Deviation hook: attention dropout is not in the paper; config.attention_dropout defaults to 0.
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()  # (B, H, T, Dh) -> (B, T, H, Dh)
    return attn_output, attn_weights


# oneDNN-packed copies of linear weights for CPU inference (`inference_linear`), by id of the weight and then by
# dtype, each dropped when its weight is freed. Kept outside the modules: packed tensors are opaque (no storage), so a
# deep copy or pickle of a model holding one would fail.
_PACKED_WEIGHTS: dict[int, dict[torch.dtype, tuple[tuple[int, int], torch.Tensor]]] = {}


def packed_linear_dtype(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype in which `inference_linear` may multiply by a packed weight, or None where it must not: on the CPU,
    no gradient wanted, not under torch.compile (which packs weights itself), torch.export or torch.jit.trace (their
    graphs must hold portable ops), oneDNN present and enabled; float32, or bfloat16 (bf16 autocast, or bf16 inputs
    and weights) where oneDNN has bf16 kernels."""
    if not (
        not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and hidden_states.device.type == weight.device.type == "cpu"
        and hidden_states.numel() > 0
        and not (torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad))
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return None
    if torch.is_autocast_enabled("cpu"):
        # Autocast's linear casts the input, the weight and the bias to its dtype; float32 ones only.
        dtype = torch.get_autocast_dtype("cpu")
        inputs_castable = {hidden_states.dtype, weight.dtype} <= {torch.float32, dtype}
    else:
        dtype = weight.dtype
        inputs_castable = hidden_states.dtype == dtype
    if not inputs_castable:
        return None
    if dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return dtype
    return None


def calls_plain_forward(module: nn.Module) -> bool:
    """True where `module(x)` would only run `nn.Linear.forward`: exactly an `nn.Linear` (not a PEFT, quantized or
    other subclass), no hooks of its own or global ones, no per-instance forward (accelerate's offloading sets one)."""
    hooks = torch.nn.modules.module
    return (
        type(module) is nn.Linear
        and "forward" not in module.__dict__
        and not (module._forward_hooks or module._forward_pre_hooks)
        and not (module._backward_hooks or module._backward_pre_hooks)
        and not (hooks._global_forward_hooks or hooks._global_forward_pre_hooks)
        and not (hooks._global_backward_hooks or hooks._global_backward_pre_hooks)
    )


# Below this many multiply-adds in float32, oneDNN's fixed cost per call (~13 µs) outweighs what the packed layout
# saves: one row of a 256 × 256 layer takes 16 µs packed against 7 µs through `F.linear`, 16 rows 20 against 18 µs;
# 16 rows of 256 × 1024 (4.2 M) 36 against 68 µs; one row of the 256 × 8000 output projection (2 M) 73 against
# 142 µs (bench/packed_projection.py, AMD EPYC with AVX-512, 2 threads).
PACKED_LINEAR_MIN_MACS = 1_500_000


def inference_linear(module: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """`module(hidden_states)`; for CPU inference in bfloat16 (autocast or bf16 weights), or in float32 for products
    of at least `PACKED_LINEAR_MIN_MACS` multiply-adds, `packed_linear`.

    For the few rows of a decoding step `F.linear` runs these products up to 2.3x slower on some CPUs
    (bench/packed_projection.py). It costs one more copy of the weights in memory (per dtype used). The result
    equals `module(hidden_states)` up to float32 rounding (bf16: the rounding of autocast's linear); `plain_kernels`
    (or `torch.backends.mkldnn.flags(enabled=False)`) turns it off."""
    weight = module.weight if calls_plain_forward(module) else None
    # A weight made under torch.inference_mode has no version counter to watch; a tensor subclass has its own ops.
    if weight is None or type(weight) not in (nn.Parameter, torch.Tensor) or weight.is_inference():
        return module(hidden_states)
    dtype = inference_linear_dtype(hidden_states, weight)
    return module(hidden_states) if dtype is None else packed_linear(module, hidden_states, dtype)


def inference_linear_dtype(hidden_states: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The dtype in which `inference_linear` multiplies by a packed weight, or None for the plain linear:
    `packed_linear_dtype`, and in float32 only products of at least `PACKED_LINEAR_MIN_MACS` multiply-adds (under
    bf16 autocast the packed product wins at every size: it skips autocast's casts)."""
    dtype = packed_linear_dtype(hidden_states, weight)
    if dtype == torch.float32 and hidden_states.numel() * weight.shape[0] < PACKED_LINEAR_MIN_MACS:
        return None
    return dtype


def packed_linear(module: nn.Linear, hidden_states: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`module(hidden_states)` computed in `dtype` by oneDNN from a packed copy of the weight, made on first use and
    again after every change to the weight (its version counter or storage changes). No checks: see
    `inference_linear`."""
    weight = module.weight
    key = (weight._version, weight.data_ptr())
    by_dtype = _PACKED_WEIGHTS.get(id(weight))
    if by_dtype is None:
        by_dtype = _PACKED_WEIGHTS[id(weight)] = {}
        weakref.finalize(weight, _PACKED_WEIGHTS.pop, id(weight), None)
    kept = by_dtype.get(dtype)
    if kept is None or kept[0] != key:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None)
        kept = by_dtype[dtype] = (key, packed)
    bias = None if module.bias is None else module.bias.to(dtype)
    return torch.ops.mkldnn._linear_pointwise(hidden_states.to(dtype), kept[1], bias, "none", [], "")


@contextlib.contextmanager
def plain_kernels() -> Iterator[None]:
    """Within the block, every layer runs its own `nn.Linear` forward: `inference_linear`'s packed path is off
    (oneDNN is switched off; the warning about Intel-GPU TF32 that torch prints at each switch is silenced)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TF32 acceleration on top of oneDNN")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


class VanillaTransformerAttention(nn.Module):
    """§3.2.2 Multi-Head Attention: Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The h projections of size d_model × d_k are stored side by side in one d_model × d_model matrix per role
    (`q_proj`, `k_proj`, `v_proj`); `out_proj` is W^O. Biases follow every reference implementation (the paper is
    silent). The backend comes from transformers' attention interface; eager is eq. (1) above.
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_dim = config.d_model
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.dropout = config.attention_dropout
        self.is_causal = is_causal  # read by the sdpa/flash backends
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states (B, T, D) give the queries; keys and values come from key_value_states (B, S, D) for
        encoder-decoder attention (§3.2.3), else from hidden_states. Returns (B, T, D) and the weights."""
        is_cross_attention = key_value_states is not None
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, self.num_heads, self.head_dim)  # explicit H: -1 is ambiguous for B = 0
        query_states = inference_linear(self.q_proj, hidden_states)
        query_states = query_states.view(hidden_shape).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)

        cache: Cache | None = None
        is_updated = False
        if isinstance(past_key_values, EncoderDecoderCache):
            is_updated = bool(past_key_values.is_updated.get(self.layer_idx))
            if is_cross_attention:
                cache = past_key_values.cross_attention_cache
            else:
                cache = past_key_values.self_attention_cache
        elif past_key_values is not None:
            cache = past_key_values

        if is_cross_attention and cache is not None and is_updated:
            # The encoder output does not change while decoding: its K/V were projected at the first step.
            key_states = cache.layers[self.layer_idx].keys
            value_states = cache.layers[self.layer_idx].values
        else:
            current_states = key_value_states if is_cross_attention else hidden_states
            kv_shape = (*current_states.shape[:-1], self.num_heads, self.head_dim)
            key_states = inference_linear(self.k_proj, current_states)
            value_states = inference_linear(self.v_proj, current_states)
            key_states = key_states.view(kv_shape).transpose(1, 2)  # (B, L, D) -> (B, H, L, Dh)
            value_states = value_states.view(kv_shape).transpose(1, 2)  # (B, L, D) -> (B, H, L, Dh)
            if cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
                if is_cross_attention and isinstance(past_key_values, EncoderDecoderCache):
                    past_key_values.is_updated[self.layer_idx] = True

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, self.embed_dim).contiguous()  # (B, T, H, Dh) -> (B, T, D)
        return inference_linear(self.out_proj, attn_output), attn_weights


def sinusoid_table(num_positions: int, dim: int, layout: str = "interleaved", offset: int = 0) -> torch.Tensor:
    """§3.5 PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Returns rows for positions offset, ..., offset + num_positions - 1: (num_positions, dim).
    layout="interleaved" is the paper. Deviation: "concat" = Marian's [sin | cos] with the same frequencies (a fixed
    permutation of the feature axis); "fairseq" = [sin | cos] with frequencies 10000^(-k / (dim/2 - 1)), computed in
    float32 as fairseq does so that converted models match it bit for bit.
    """
    half = dim // 2
    if layout == "fairseq":
        freqs = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
        angles = torch.arange(offset, offset + num_positions, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    # float64 so that positions in the thousands keep full float32 accuracy.
    inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # 10000^(-2i/d_model): (dim/2,)
    angles = torch.arange(offset, offset + num_positions, dtype=torch.float64).unsqueeze(1) * inv_freq
    if layout == "concat":
        table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    else:
        table = torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).flatten(1)  # (P, dim/2, 2) -> (P, dim)
    return table.float()


class VanillaTransformerSinusoidalPositionalEmbedding(nn.Module):
    """§3.5 Positional Encoding: a fixed table, a non-persistent buffer (not saved; refilled by `_init_weights`
    after `from_pretrained`). Positions past the table are computed on demand ("extrapolate to sequence lengths
    longer than the ones encountered during training")."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        self.dim = config.d_model
        self.layout = config.sinusoidal_layout
        self.offset = config.position_offset
        self.register_buffer("table", self.create_table(config.max_position_embeddings), persistent=False)

    def create_table(self, num_positions: int) -> torch.Tensor:
        return sinusoid_table(num_positions, self.dim, self.layout, self.offset)

    def forward(self, position_ids: torch.Tensor, num_positions: int | None = None) -> torch.Tensor:
        """position_ids (T,) from 0 -> (T, D). `num_positions` (above every id, known to the stacks) spares reading
        the ids back from the device, a synchronisation and a torch.compile graph break."""
        if num_positions is None:
            num_positions = int(position_ids.max()) + 1 if position_ids.numel() else 0
        table = self.table
        if num_positions > table.shape[0]:
            table = self.create_table(num_positions).to(device=table.device, dtype=table.dtype)
        return table[position_ids]


class VanillaTransformerLearnedPositionalEmbedding(nn.Embedding):
    """Deviation: learned positions (Table 3 row E; fairseq `--*-learned-pos`, BART) instead of §3.5's sinusoids.
    Row `position_offset + pos` holds position pos."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config.max_position_embeddings + config.position_offset, config.d_model)
        self.offset = config.position_offset
        self.max_positions = config.max_position_embeddings

    def forward(self, position_ids: torch.Tensor, num_positions: int | None = None) -> torch.Tensor:
        """position_ids (T,) from 0 -> (T, D); `num_positions` as for the sinusoids."""
        if num_positions is None:
            num_positions = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if num_positions > self.max_positions:
            raise ValueError(
                f"Input of {num_positions} positions exceeds `max_position_embeddings` "
                f"({self.max_positions}) of this model's learned position table. Truncate the input "
                "(tokenizer truncation=True, max_length=...); learned positions cannot be extended."
            )
        return super().forward(position_ids + self.offset)


def build_positional_embedding(config: VanillaTransformerConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return VanillaTransformerLearnedPositionalEmbedding(config)
    return VanillaTransformerSinusoidalPositionalEmbedding(config)


class VanillaTransformerStdLayerNorm(nn.Module):
    """Deviation (`layer_norm_type="annotated_std"`): the Annotated Transformer's LayerNorm,
    weight * (x - mean) / (std + eps) + bias with the unbiased standard deviation, where the paper's LayerNorm
    (Ba et al., 2016; `nn.LayerNorm`) is (x - mean) / sqrt(var + eps) with the biased variance."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mean = hidden_states.mean(-1, keepdim=True)
        std = hidden_states.std(-1, keepdim=True)  # unbiased (n - 1), as torch.Tensor.std
        return self.weight * (hidden_states - mean) / (std + self.eps) + self.bias


def build_layer_norm(config: VanillaTransformerConfig) -> nn.Module:
    if config.layer_norm_type == "annotated_std":
        return VanillaTransformerStdLayerNorm(config.d_model, config.layer_norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """§3.1 Encoder layer, Figure 1 (left): self-attention then the position-wise FFN (§3.3, eq. (2)), each as
    LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4).
    Deviation: `normalize_before` gives x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = build_layer_norm(config)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(config.d_model, config.encoder_ffn_dim)  # W1, b1
        self.fc2 = nn.Linear(config.encoder_ffn_dim, config.d_model)  # W2, b2
        self.final_layer_norm = build_layer_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """hidden_states (B, S, D); attention_mask as built by `create_bidirectional_mask`. Returns (B, S, D)."""
        # Self Attention
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if not self.normalize_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        # Fully Connected, eq. (2): max(0, x W1 + b1) W2 + b2
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.activation_fn(inference_linear(self.fc1, hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        hidden_states = inference_linear(self.fc2, hidden_states)
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if not self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class VanillaTransformerDecoderLayer(GradientCheckpointingLayer):
    """§3.1 Decoder layer, Figure 1 (right): masked self-attention, encoder-decoder attention (§3.2.3), FFN, each
    as LayerNorm(x + Dropout(Sublayer(x))). Deviation: `normalize_before` (pre-LN)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = build_layer_norm(config)
        self.encoder_attn = VanillaTransformerAttention(config, heads, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = build_layer_norm(config)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(config.d_model, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, config.d_model)
        self.final_layer_norm = build_layer_norm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """hidden_states (B, T, D); encoder_hidden_states (B, S, D). Returns (B, T, D)."""
        # Masked Self Attention (§3.2.3: position i attends to positions ≤ i)
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states, _ = self.self_attn(
            hidden_states, past_key_values=past_key_values, attention_mask=attention_mask, **kwargs
        )
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if not self.normalize_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        # Encoder-Decoder Attention: queries from the decoder, keys and values from the encoder output
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.encoder_attn_layer_norm(hidden_states)
        hidden_states, _ = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            past_key_values=past_key_values,
            attention_mask=encoder_attention_mask,
            **kwargs,
        )
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if not self.normalize_before:
            hidden_states = self.encoder_attn_layer_norm(hidden_states)

        # Fully Connected, eq. (2)
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.activation_fn(inference_linear(self.fc1, hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        hidden_states = inference_linear(self.fc2, hidden_states)
        hidden_states = residual + nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        if not self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """Weight initialisation, attention backends and remote-code saving shared by every model class."""

    config: VanillaTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, VanillaTransformerSinusoidalPositionalEmbedding):
            # from_pretrained creates non-persistent buffers empty; the table must be computed again.
            init.copy_(module.table, module.create_table(module.table.shape[0]))
        elif isinstance(module, VanillaTransformerStdLayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        # `_tied_weights_keys` is built per instance from the config (see __init__s), so it already says exactly
        # which weights are shared; transformers would otherwise drop all of them when tie_word_embeddings=False,
        # including the encoder/decoder embedding sharing.
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(self._tied_weights_keys or {})

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """`PreTrainedModel.from_pretrained`, strict: a damaged, truncated or mismatched weights file raises an error
        naming the file, the key and the problem instead of loading random or cast weights. `strict=False` keeps
        transformers' lenient behaviour (missing weights initialised, unexpected ones dropped)."""
        want_info = kwargs.pop("output_loading_info", False)
        # Asking for the loading info means handling missing/unexpected keys oneself: lenient unless told otherwise.
        strict = kwargs.pop("strict", not want_info)
        if strict and pretrained_model_name_or_path is not None and os.path.isdir(pretrained_model_name_or_path):
            check_weight_files(str(pretrained_model_name_or_path))
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except RuntimeError as error:
            if not strict or "ignore_mismatched_sizes" not in str(error):
                raise
            # transformers only logs which shapes differ; load again leniently to name them in the error below.
            kwargs["ignore_mismatched_sizes"] = True
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        problems = {kind: info.get(kind) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        problems = {kind: sorted(map(str, keys)) for kind, keys in problems.items() if keys}
        if strict and problems:
            details = "; ".join(f"{kind.replace('_', ' ')}: {', '.join(keys[:8])}" for kind, keys in problems.items())
            raise ValueError(
                f"The weights in {pretrained_model_name_or_path} do not fit {cls.__name__} ({details}). Check that "
                "config.json belongs to these weights, or pass strict=False to initialise/drop them knowingly."
            )
        return (model, info) if want_info else model

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """`PreTrainedModel.save_pretrained`, plus the translation pipeline file next to the code files, so that
        `pipeline("translation", model=dir, trust_remote_code=True)` works where this package is not installed."""
        super().save_pretrained(save_directory, *args, **kwargs)
        pipeline_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), PIPELINE_FILE)
        if os.path.isfile(pipeline_file) and "auto_map" in self.config.to_dict():
            shutil.copy(pipeline_file, os.path.join(save_directory, PIPELINE_FILE))


def check_weight_files(directory: str) -> None:
    """Open every safetensors file of a local folder before transformers does, so that a truncated or corrupted file,
    or a non-float weight (which would be cast silently), is reported with its file and key."""
    from safetensors import SafetensorError, safe_open

    for name in sorted(os.listdir(directory)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(directory, name)
        try:
            with safe_open(path, "pt") as weights:
                for key in weights.keys():
                    dtype = weights.get_slice(key).get_dtype()
                    if dtype not in ("F64", "F32", "F16", "BF16"):
                        raise ValueError(
                            f"{path}: tensor `{key}` has dtype {dtype}; model weights must be floating point. "
                            "The file is not a checkpoint of this model, or it was damaged."
                        )
        except SafetensorError as error:
            raise ValueError(
                f"{path} is not a readable safetensors file ({error}). It is truncated or corrupted: download or "
                "save it again."
            ) from error


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """§3.1 Encoder: a stack of N `VanillaTransformerEncoderLayer`s over scaled embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0  # §3.4
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = build_positional_embedding(config)
        self.layers = nn.ModuleList([VanillaTransformerEncoderLayer(config) for _ in range(config.encoder_layers)])
        # Deviation: a final LayerNorm after the stack (pre-LN models and nn.Transformer).
        self.layer_norm = build_layer_norm(config) if config.add_final_layer_norm else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        """input_ids (B, S); attention_mask (B, S), 1 = token, 0 = padding; or inputs_embeds (B, S, D), unscaled
        embeddings (scaled by √d_model here, as looked-up ones). Returns last_hidden_state (B, S, D)."""
        inputs_embeds = embed(self, input_ids, inputs_embeds, "input_ids")
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        # §5.4: dropout on the sums of the embeddings and the positional encodings.
        positions = self.embed_positions(position_ids, inputs_embeds.shape[1])
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        check_mask(attention_mask, inputs_embeds, "attention_mask")
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for encoder_layer in self.layers:
            hidden_states = encoder_layer(hidden_states, attention_mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """§3.1 Decoder: a stack of N `VanillaTransformerDecoderLayer`s, auto-regressive through the causal mask."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.decoder_vocab_size, config.d_model, config.pad_token_id)
        self.embed_positions = build_positional_embedding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.layer_norm = build_layer_norm(config) if config.add_final_layer_norm else None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids (B, T) (only the new tokens when a cache is given); attention_mask (B, L);
        encoder_hidden_states (B, S, D); encoder_attention_mask (B, S). Returns last_hidden_state (B, T, D)."""
        past_key_values = cache_argument(past_key_values, kwargs)
        inputs_embeds = embed(self, input_ids, inputs_embeds, "decoder_input_ids")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states`: run the encoder first (or pass input_ids).")
        if encoder_hidden_states.shape[0] != inputs_embeds.shape[0]:
            raise ValueError(
                f"Batch sizes differ: {encoder_hidden_states.shape[0]} source rows but {inputs_embeds.shape[0]} "
                "target rows. Pass as many decoder_input_ids rows as input_ids rows."
            )
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        seq_length = inputs_embeds.shape[1]
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        position_ids = torch.arange(seq_length, device=inputs_embeds.device) + past_length
        # The position tables need the number of positions as a Python int. A static cache counts its length in a
        # tensor (so that torch.compile sees one graph for every step); compiled, that count cannot be read back (a
        # data-dependent branch), and the cache's capacity, which bounds every position it can hold, stands in.
        if isinstance(past_length, torch.Tensor) and torch.compiler.is_compiling():
            num_positions = max(past_key_values.get_max_length(), seq_length)
        else:
            num_positions = int(past_length) + seq_length
        self_attention_cache = (
            past_key_values.self_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else None
        )
        # No decoder padding mask means every position counts: the helpers build the causal mask from the cache
        # length alone. A single new position then masks nothing (no later positions exist, §3.2.3) unless the cache
        # is static (compileable), whose unwritten slots must be hidden: skip the mask, as decoding does every step.
        # The cache goes in by position: transformers 5.24 renamed the argument `past_key_values` -> `cache`.
        if seq_length == 1 and attention_mask is None and not getattr(self_attention_cache, "is_compileable", False):
            causal_mask = None
        else:
            causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, self_attention_cache)
        encoder_attention_mask = self.cross_attention_mask(
            encoder_attention_mask, inputs_embeds, encoder_hidden_states, past_key_values
        )
        positions = self.embed_positions(position_ids, num_positions)
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, **{CACHE_FIELD: past_key_values}
        )

    def cross_attention_mask(
        self,
        encoder_attention_mask: torch.Tensor | None,
        inputs_embeds: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        past_key_values: Cache | None,
    ) -> torch.Tensor | None:
        """The encoder-decoder attention mask (no attention to source padding), built once per generation: every
        decoding step brings the same source mask, so the mask of the first step is kept with the cache and reused
        while the source mask, the number of new positions, the dtype and the attention backend stay the same."""
        if past_key_values is None or torch.compiler.is_compiling():
            return create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=encoder_attention_mask,
                encoder_hidden_states=encoder_hidden_states,
            )
        source_mask = encoder_attention_mask
        key = (
            None if source_mask is None or source_mask.is_inference() else source_mask._version,  # edited in place?
            tuple(encoder_hidden_states.shape[:2]),
            inputs_embeds.shape[1],
            inputs_embeds.dtype,
            self.config._attn_implementation,
        )
        kept = getattr(past_key_values, "vanilla_transformer_cross_attention_mask", None)
        if kept is None or kept[0] is not source_mask or kept[1] != key:
            mask = create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=source_mask,
                encoder_hidden_states=encoder_hidden_states,
            )
            kept = past_key_values.vanilla_transformer_cross_attention_mask = (source_mask, key, mask)
        return kept[2]


def cache_argument(past_key_values: Cache | None, kwargs: dict[str, Any]) -> Cache | None:
    """The decoder cache, under either name: `generate()` passes it as `past_key_values` up to transformers 5.23 and
    as `cache` from 5.24 on (where `past_key_values` is deprecated)."""
    cache = kwargs.pop("cache", None)
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the decoder cache once, as `cache` or as `past_key_values`, not both.")
    return past_key_values if past_key_values is not None else cache


def embed(
    stack: VanillaTransformerEncoder | VanillaTransformerDecoder,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    name: str,
) -> torch.Tensor:
    """§3.4 Embeddings: look up (or take) the embeddings and multiply them by √d_model. Returns (B, T, D)."""
    if (input_ids is None) == (inputs_embeds is None):
        got = "both" if input_ids is not None else "neither"
        raise ValueError(f"Pass exactly one of `{name}` or its `*inputs_embeds` (got {got}).")
    if input_ids is not None:
        if input_ids.dim() != 2:
            raise ValueError(f"`{name}` must have shape (batch, length), got {tuple(input_ids.shape)}.")
        if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
            raise ValueError(f"`{name}` must hold integer token ids, got dtype {input_ids.dtype}.")
        vocab = stack.embed_tokens.num_embeddings
        # One pass and one read-back; skipped while torch.compile traces (a data-dependent graph break).
        checked = input_ids.numel() and not torch.compiler.is_compiling()
        low, high = (int(v) for v in torch.aminmax(input_ids)) if checked else (0, 0)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(
                f"`{name}` holds token id {bad}, outside the vocabulary [0, {vocab}). Use the tokenizer saved "
                "with this model (labels of -100 belong in `labels`, not in the inputs)."
            )
        inputs_embeds = stack.embed_tokens(input_ids)
    if inputs_embeds.shape[0] == 0:
        raise ValueError(
            f"`{name}` is an empty batch (shape {tuple(inputs_embeds.shape[:2])}); pass at least one row."
        )
    if inputs_embeds.shape[1] == 0:
        raise ValueError(
            f"`{name}` has no positions (shape {tuple(inputs_embeds.shape[:2])}); every row needs at least one token, "
            "e.g. </s> for an empty sentence."
        )
    return inputs_embeds * stack.embed_scale


def check_mask(attention_mask: torch.Tensor | None, inputs_embeds: torch.Tensor, name: str) -> None:
    """A mask whose shape disagrees with the inputs fails deep inside the attention; say so here instead."""
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != inputs_embeds.shape[:2]:
        raise ValueError(
            f"`{name}` has shape {tuple(attention_mask.shape)} but the inputs have shape "
            f"{tuple(inputs_embeds.shape[:2])}. Pass the mask the tokenizer returned with these input_ids."
        )


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """§3 The encoder-decoder without the output projection; `shared` is the §3.4 embedding matrix."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            self._tied_weights_keys = {
                "encoder.embed_tokens.weight": "shared.weight",
                "decoder.embed_tokens.weight": "shared.weight",
            }
        else:
            self.shared = None
            self._tied_weights_keys = None
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        """Encode input_ids (B, S) (or reuse encoder_outputs), decode decoder_input_ids (B, T).
        Returns last_hidden_state (B, T, D) and the caches/attentions asked for."""
        past_key_values = cache_argument(past_key_values, kwargs)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_FIELD: getattr(decoder_outputs, CACHE_FIELD)},
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, PaperGenerationMixin):
    """§3.4 The encoder-decoder plus the pre-softmax linear transformation (`lm_head`), which by default is the
    shared embedding matrix itself (three-way tying)."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=config.lm_head_bias)
        tied: dict[str, str] = {}
        if config.share_encoder_decoder_embeddings:
            tied = {
                "model.encoder.embed_tokens.weight": "model.shared.weight",
                "model.decoder.embed_tokens.weight": "model.shared.weight",
            }
        if config.tie_word_embeddings:
            source = "model.shared.weight" if config.share_encoder_decoder_embeddings else None
            tied["lm_head.weight"] = source or "model.decoder.embed_tokens.weight"
        self._tied_weights_keys = tied or None
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        label_smoothing: float = 0.0,
        skip_logits: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        """As `VanillaTransformerModel.forward`, plus logits (B, T, V). labels (B, T): target ids, -100 ignored;
        without decoder_input_ids they are shifted right into the decoder input (no further shift in the loss).
        The loss is token-level cross-entropy (mean, or sum / num_items_in_batch under gradient accumulation) with
        label smoothing ε_ls = `label_smoothing` (§5.4; `VanillaSeq2SeqTrainer` passes the Trainer's
        `label_smoothing_factor`). `skip_logits=True` (the name transformers' Trainer uses for fused losses) computes
        the projection and the loss together in row chunks (`linear_label_smoothed_cross_entropy`), never holding
        the (B, T, V) logits, and returns `logits=None`: the training path."""
        past_key_values = cache_argument(past_key_values, kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"`label_smoothing` must be in [0, 1), got {label_smoothing}. The paper uses 0.1 (§5.4); pass 0.0 "
                "for plain cross-entropy."
            )
        if skip_logits and labels is None:
            raise ValueError("`skip_logits=True` needs `labels`: without a loss to compute there is no output.")
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_attention_mask=decoder_attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        loss = logits = None
        if labels is not None and labels.shape != hidden_states.shape[:2]:
            raise ValueError(
                f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(hidden_states.shape[:2])}. "
                "Pass labels with one id per decoder position."
            )
        if not skip_logits:
            logits = inference_linear(self.lm_head, hidden_states)
        if labels is not None:
            labels = labels.to(hidden_states.device)
            if not skip_logits:
                loss = nn.functional.cross_entropy(
                    logits.float().flatten(0, 1),  # (B, T, V) -> (B*T, V)
                    labels.flatten(),
                    ignore_index=-100,
                    reduction="sum",
                    label_smoothing=label_smoothing,
                )
            else:
                loss = linear_label_smoothed_cross_entropy(
                    hidden_states.flatten(0, 1),  # (B, T, D) -> (B*T, D)
                    self.lm_head.weight,
                    self.lm_head.bias,
                    labels.flatten(),
                    label_smoothing,
                )
            # Token-level mean: over this batch's targets, or over the accumulated batch's (gradient accumulation).
            loss = loss / (labels.ne(-100).sum() if num_items_in_batch is None else num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def _reorder_cache(self, past_key_values: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search's per-step cache reordering (transformers calls it when the model defines it). Only the
        self-attention cache moves: beams are reordered within their own source sentence, whose rows of the
        encoder-decoder attention cache (K/V of one encoder output, repeated per beam) are equal, so gathering them
        again every step (transformers' default) would copy them unchanged."""
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.self_attention_cache.reorder_cache(beam_idx)
        else:
            past_key_values.reorder_cache(beam_idx)
        return past_key_values

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Used by `DataCollatorForSeq2Seq` so that the Trainer's label smoothing sees decoder inputs."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


# transformers reads the forward's signature at every generation step of a model that can be saved as remote code (to
# see whether it still takes `cache_position`); worked out through the decorators, that is a tenth of a millisecond
# and more per step on a CPU. Computed once here, the same signature is read back at once.
VanillaTransformerForConditionalGeneration.forward.__signature__ = inspect.signature(
    VanillaTransformerForConditionalGeneration.forward
)


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """The summed §5.4 loss of `hidden @ weight.T + bias` and its gradients, computed together in row chunks.

    The loss is scalar, so its gradients are known in the forward pass: per chunk, the logits (n, V) in the compute
    dtype, then in fp32 the log-normaliser, the loss and d loss / d logits = softmax - q (q: 1 - ε on the label plus
    ε / V everywhere, zero for ignored rows), then the two gradient GEMMs. The same three GEMMs as the unfused head;
    the fp32 (B*T, V) logits, log-probabilities and their gradients are never materialised.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        label_smoothing: float,
        compute_dtype: torch.dtype,
        chunk_size: int,
    ) -> torch.Tensor:
        vocab = weight.shape[0]
        needs_grad = any(ctx.needs_input_grad[:3])
        weight_c = weight.to(compute_dtype)
        bias_c = None if bias is None else bias.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden_states.device)
        grad_hidden = torch.empty_like(hidden_states) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if ctx.needs_input_grad[2] else None
        for start in range(0, hidden_states.shape[0], chunk_size):
            hidden_c = hidden_states[start : start + chunk_size].to(compute_dtype)  # (n, D)
            labels_c = labels[start : start + chunk_size]
            keep = labels_c.ne(-100)
            targets = labels_c.clamp(min=0).unsqueeze(1)  # (n, 1)
            logits = nn.functional.linear(hidden_c, weight_c, bias_c).float()  # (n, V)
            log_normaliser = torch.logsumexp(logits, dim=-1)  # (n,)
            # -log p(label) and the mean over the vocabulary of -log p(v), per row.
            nll = log_normaliser - logits.gather(1, targets).squeeze(1)
            smooth = log_normaliser - logits.mean(dim=-1)
            total += torch.where(keep, (1.0 - label_smoothing) * nll + label_smoothing * smooth, 0.0).sum()
            if not needs_grad:
                continue
            grad_logits = logits.sub_(log_normaliser.unsqueeze(1)).exp_().sub_(label_smoothing / vocab)  # (n, V)
            grad_logits.scatter_add_(1, targets, torch.full_like(targets, label_smoothing - 1.0, dtype=torch.float32))
            grad_logits.mul_(keep.unsqueeze(1))
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
            grad_logits = grad_logits.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = grad_logits @ weight_c  # (n, V) @ (V, D) -> (n, D)
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ hidden_c).float()  # (V, n) @ (n, D) -> (V, D)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden_states.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = [
            None if grad is None else (grad * grad_output).to(dtype)
            for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True)
        ]
        return (*grads, None, None, None, None)


def linear_label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """§5.4 label-smoothed cross-entropy of the §3.4 pre-softmax projection, summed over the rows whose label is
    not -100: for each row, (1 - ε) (-log p(label)) + ε mean_v (-log p(v)), as `nn.functional.cross_entropy(
    hidden_states @ weight.T + bias, labels, label_smoothing=ε, reduction="sum")`. hidden_states (N, D), weight (V, D),
    bias (V,) or None, labels (N,). Under autocast the GEMMs run in the autocast dtype, as `nn.Linear` would; the
    softmax and the loss in fp32. `chunk_size` rows at a time, so memory is (chunk_size, V), not (N, V)."""
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive number of rows, got {chunk_size}.")
    device_type = hidden_states.device.type
    compute_dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden_states.dtype
    )
    with torch.autocast(device_type, enabled=False):  # the dtypes are chosen above; the fp32 parts must stay fp32
        return _LinearLabelSmoothedCrossEntropy.apply(
            hidden_states, weight, bias, labels, label_smoothing, compute_dtype, chunk_size
        )


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
