"""The Transformer of Vaswani et al. (2017), "Attention Is All You Need" (arXiv:1706.03762), in paper order: eq. (1)
attention, §3.2.2 multi-head attention, §3.3 feed-forward, §3.4 embeddings, §3.5 positions, the layers, encoder and
decoder (§3.1), the model and its §3.4 output projection with the §5.4 loss.

Shapes: B batch, S source length, T target length, L cache + new length, D d_model, H heads, Dh = d_k = d_v = D / H,
F d_ff, V vocabulary. Module names follow Marian/fairseq so that foreign checkpoints map by name.
Beside it, each copied with it into a saved folder (remote code: they import only torch, transformers, huggingface_hub
and safetensors):
input_checks.py (clear errors for wrong inputs), label_smoothed_loss.py (the fused training loss) and
generation_vanilla_transformer.py (§6.1 decoding). The model is plain PyTorch (§5.4 dropout is `nn.Dropout`): CPU
inference and training speed are explicit steps of the package (`hf_vanilla_transformer.prepare_for_cpu_inference`,
training/cpu_training.py), never taken at load.
"""

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
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
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_vanilla_transformer import VanillaTransformerConfig
from .generation_vanilla_transformer import PaperGenerationMixin, cross_attention_mask
from .input_checks import (
    check_embeddings,
    check_encoder_states,
    check_labels,
    check_loss_options,
    check_mask,
    check_token_ids,
    check_weight_files,
)
from .label_smoothed_loss import linear_label_smoothed_cross_entropy

logger = logging.get_logger(__name__)

# transformers 5.24 renamed the outputs' `past_key_values` field to `cache`; the old name still works there but logs a
# deprecation warning on every run, so outputs are built and read under the installed version's name.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


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
        query_states = self.q_proj(hidden_states)
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
            key_states = self.k_proj(current_states)
            value_states = self.v_proj(current_states)
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
        return self.out_proj(attn_output), attn_weights


class VanillaTransformerLayer(GradientCheckpointingLayer):
    """What the encoder and decoder layers share: the §3.3 position-wise feed-forward network, eq. (2)
    FFN(x) = max(0, x W1 + b1) W2 + b2 (`fc1`, `fc2`, set by each layer), as the last sub-layer."""

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """LayerNorm(x + Dropout(FFN(x))) (§3.1, §5.4), or x + Dropout(FFN(LayerNorm(x))) with `normalize_before`.
        hidden_states (B, T, D) -> (B, T, D)."""
        residual = hidden_states
        if self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = self.activation_dropout(hidden_states)
        hidden_states = self.fc2(hidden_states)
        hidden_states = residual + self.dropout(hidden_states)
        if not self.normalize_before:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states


def embed(
    stack: "VanillaTransformerEncoder | VanillaTransformerDecoder",
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    name: str,
    check_ids: bool,
) -> torch.Tensor:
    """§3.4 Embeddings: look up (or take) the embeddings and multiply them by √d_model. Returns (B, T, D).
    `check_ids`: check that the ids lie inside the vocabulary (input_checks.check_token_ids)."""
    check_token_ids(input_ids, inputs_embeds, stack.embed_tokens.num_embeddings, name, check_ids)
    if input_ids is not None:
        inputs_embeds = stack.embed_tokens(input_ids)
    check_embeddings(inputs_embeds, name)
    return inputs_embeds * stack.embed_scale


def training_step(module: nn.Module) -> bool:
    """Whether this forward is a training step: training mode, building gradients (not `generate`, which runs
    without them)."""
    return module.training and torch.is_grad_enabled()


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

    def forward(self, position_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        """position_ids (T,) from 0 -> (T, D). `num_positions` (above every id, known to the stacks) spares reading
        the ids back from the device, a synchronisation and a torch.compile graph break."""
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

    def forward(self, position_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        """position_ids (T,) from 0 -> (T, D); `num_positions` as for the sinusoids."""
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


class VanillaTransformerEncoderLayer(VanillaTransformerLayer):
    """§3.1 Encoder layer, Figure 1 (left): self-attention then the position-wise FFN (§3.3, eq. (2)), each as
    LayerNorm(x + Dropout(Sublayer(x))) (§3.1, §5.4).
    Deviation: `normalize_before` gives x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = nn.Dropout(config.dropout)  # §5.4, on each sub-layer's output
        self.activation_dropout = nn.Dropout(config.activation_dropout)  # Deviation hook (paper: none)
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
        hidden_states = residual + self.dropout(hidden_states)
        if not self.normalize_before:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        return self.feed_forward(hidden_states)  # §3.3, eq. (2)


class VanillaTransformerDecoderLayer(VanillaTransformerLayer):
    """§3.1 Decoder layer, Figure 1 (right): masked self-attention, encoder-decoder attention (§3.2.3), FFN, each
    as LayerNorm(x + Dropout(Sublayer(x))). Deviation: `normalize_before` (pre-LN)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = nn.Dropout(config.dropout)  # §5.4, on each sub-layer's output
        self.activation_dropout = nn.Dropout(config.activation_dropout)  # Deviation hook (paper: none)
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
        hidden_states = residual + self.dropout(hidden_states)
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
        hidden_states = residual + self.dropout(hidden_states)
        if not self.normalize_before:
            hidden_states = self.encoder_attn_layer_norm(hidden_states)

        return self.feed_forward(hidden_states)  # §3.3, eq. (2)


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
        untied = _untied_from_tied(model, pretrained_model_name_or_path)
        if untied and "lm_head.weight" in info.get("missing_keys", ()):
            with torch.no_grad():  # §3.4: the output projection was the embedding matrix; it starts as a copy of it
                model.lm_head.weight.copy_(model.model.decoder.embed_tokens.weight)
            info["missing_keys"] = {key for key in info["missing_keys"] if key != "lm_head.weight"}
        problems = {kind: info.get(kind) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        problems = {kind: sorted(map(str, keys)) for kind, keys in problems.items() if keys}
        if strict and problems:
            details = "; ".join(f"{kind.replace('_', ' ')}: {', '.join(keys[:8])}" for kind, keys in problems.items())
            raise ValueError(
                f"The weights in {pretrained_model_name_or_path} do not fit {cls.__name__} ({details}). Check that "
                "config.json belongs to these weights, or pass strict=False to initialise/drop them knowingly."
            )
        return (model, info) if want_info else model


def _untied_from_tied(model: PreTrainedModel, folder: str | os.PathLike) -> bool:
    """Whether `model` is loaded untied (`tie_word_embeddings=False`) from a local folder saved tied, whose weights
    hold no output projection of their own (it was the embedding matrix)."""
    if model.config.tie_word_embeddings or not os.path.isdir(folder):
        return False
    try:
        saved = json.loads(Path(folder, "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(saved, dict) and saved.get("tie_word_embeddings", True) is True


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """§3.1 Encoder: a stack of N `VanillaTransformerEncoderLayer`s over scaled embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig) -> None:
        super().__init__(config)
        self.dropout = nn.Dropout(config.dropout)  # §5.4, on embeddings + positions
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
        check_ids: bool = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        """input_ids (B, S); attention_mask (B, S), 1 = token, 0 = padding; or inputs_embeds (B, S, D), unscaled
        embeddings (scaled by √d_model here, as looked-up ones). Returns last_hidden_state (B, S, D).
        `check_ids=False` skips the check that the ids lie inside the vocabulary, for ids checked on the host."""
        inputs_embeds = embed(self, input_ids, inputs_embeds, "input_ids", check_ids)
        position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device)
        # §5.4: dropout on the sums of the embeddings and the positional encodings.
        positions = self.embed_positions(position_ids, inputs_embeds.shape[1])
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)
        hidden_states = self.dropout(hidden_states)
        check_mask(attention_mask, inputs_embeds, "attention_mask")
        attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            # A training step keeps a given mask unread (see cross_attention_mask).
            allow_is_bidirectional_skip=not training_step(self) or attention_mask is None,
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
        self.dropout = nn.Dropout(config.dropout)  # §5.4, on embeddings + positions
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
        check_ids: bool = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids (B, T) (only the new tokens when a cache is given); attention_mask (B, L);
        encoder_hidden_states (B, S, D); encoder_attention_mask (B, S); `check_ids` as for the encoder. Returns
        last_hidden_state (B, T, D)."""
        past_key_values = cache_argument(past_key_values, kwargs)
        inputs_embeds = embed(self, input_ids, inputs_embeds, "decoder_input_ids", check_ids)
        check_encoder_states(encoder_hidden_states, inputs_embeds)
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
        encoder_attention_mask = cross_attention_mask(
            self.config,
            encoder_attention_mask,
            inputs_embeds,
            encoder_hidden_states,
            past_key_values,
            training_step(self),
        )
        positions = self.embed_positions(position_ids, num_positions)
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)
        hidden_states = self.dropout(hidden_states)
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


def cache_argument(past_key_values: Cache | None, kwargs: dict[str, Any]) -> Cache | None:
    """The decoder cache, under either name: `generate()` passes it as `past_key_values` up to transformers 5.23 and
    as `cache` from 5.24 on (where `past_key_values` is deprecated). A wrapper that fills the cache before the decoder
    runs (PEFT's prefix tuning: its prompt's keys and values) passes it as `past_key_values` beside `generate()`'s own
    `cache`: at the first step, where `generate()`'s is still empty, the prompt starts the cache; at later steps
    (the wrapper looks for the cache under its old name only, finds none and adds the prompt again) `generate()`'s
    holds the prompt and the tokens so far, and is the cache."""
    cache = kwargs.pop("cache", None)
    if cache is None or past_key_values is None:
        return past_key_values if past_key_values is not None else cache
    return cache if cache.get_seq_length() > 0 else past_key_values


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
        check_ids: bool = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        """Encode input_ids (B, S) (or reuse encoder_outputs), decode decoder_input_ids (B, T).
        Returns last_hidden_state (B, T, D) and the caches/attentions asked for. `check_ids=False`: the ids were
        checked on the host (VanillaSeq2SeqTrainer's collator), so the stacks do not read their range back."""
        past_key_values = cache_argument(past_key_values, kwargs)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                check_ids=check_ids,
                **kwargs,
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
            check_ids=check_ids,
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


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing (§3.1: "output embeddings are offset by one position"): the decoder input is the target
    shifted right behind the start token; -100 (ignored label) becomes padding."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def token_level_loss(
    lm_head: nn.Linear,
    hidden_states: torch.Tensor,
    logits: torch.Tensor | None,
    labels: torch.Tensor,
    label_smoothing: float,
    num_items_in_batch: torch.Tensor | int | None,
) -> torch.Tensor:
    """Token-level cross-entropy with label smoothing ε_ls (§5.4) of hidden_states (B, T, D) against labels (B, T),
    -100 ignored: from the logits (B, T, V), or, when they are None, fused with the projection `lm_head` in row
    chunks (`linear_label_smoothed_cross_entropy`). The mean over this batch's targets, or the sum over
    `num_items_in_batch` (the accumulated batch's targets under gradient accumulation)."""
    labels = labels.to(hidden_states.device)
    if logits is not None:
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
            lm_head.weight,
            lm_head.bias,
            labels.flatten(),
            label_smoothing,
        )
    return loss / (labels.ne(-100).sum() if num_items_in_batch is None else num_items_in_batch)


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
        self._warned_tied_adapter = False
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
        check_ids: bool = True,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        """As `VanillaTransformerModel.forward`, plus logits (B, T, V). labels (B, T): target ids, -100 ignored;
        without decoder_input_ids they are shifted right into the decoder input (no further shift in the loss).
        The loss is token-level cross-entropy (mean, or sum / num_items_in_batch under gradient accumulation) with
        label smoothing ε_ls = `label_smoothing` (§5.4; `VanillaSeq2SeqTrainer` passes the Trainer's
        `label_smoothing_factor`). `skip_logits=True` (the name transformers' Trainer uses for fused losses) computes
        the projection and the loss together in row chunks (`linear_label_smoothed_cross_entropy`), never holding
        the (B, T, V) logits, and returns `logits=None`: the training path. `check_ids=False` skips the check that
        the ids lie inside the vocabulary, which reads their range back from the device (a synchronisation on a GPU):
        for ids checked on the host, as `VanillaSeq2SeqTrainer`'s collator does."""
        past_key_values = cache_argument(past_key_values, kwargs)
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        check_loss_options(label_smoothing, skip_logits, labels)
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
            check_ids=check_ids,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        check_labels(labels, hidden_states)
        self._warn_of_a_tied_adapter()
        logits = None if skip_logits else self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = token_level_loss(self.lm_head, hidden_states, logits, labels, label_smoothing, num_items_in_batch)
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

    def _warn_of_a_tied_adapter(self) -> None:
        """Once per model: an adapter on `lm_head` (PEFT's LoRA: a layer with a `base_layer`) whose weight is the
        input embedding matrix (§3.4 tying) moves the embeddings too when it is merged, so the merged model computes
        something else than the adapted one."""
        if self._warned_tied_adapter or getattr(self.lm_head, "base_layer", None) is None:
            return
        if self.lm_head.weight is not self.model.decoder.embed_tokens.weight:
            return
        self._warned_tied_adapter = True
        logger.warning(
            "lm_head carries an adapter, but its weight is the input embedding matrix (tie_word_embeddings=True, "
            "§3.4): merging the adapter changes the embeddings too, and the merged model no longer computes what "
            "the adapted one does. To adapt the output projection alone, untie it first: load the model with "
            "from_pretrained(folder, tie_word_embeddings=False), where lm_head starts as a copy of the embeddings; "
            "or leave lm_head out of the adapter's target modules."
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


__all__ = [
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
