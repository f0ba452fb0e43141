"""The Annotated Transformer (harvardnlp) -> hf_vanilla_transformer (`python -m conversion annotated`).

SOURCE is `torch.save(model.state_dict())` of `make_model(src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout)` from
harvardnlp/annotated-transformer's the_annotated_transformer.py (as its train_worker saves multi30k_model_final.pt):
`src_embed.0.lut` / `tgt_embed.0.lut` (Embeddings, × √d_model), `src_embed.1.pe` / `tgt_embed.1.pe` (interleaved
sin/cos from position 0), `encoder` / `decoder` layers of `self_attn` / `src_attn` (MultiHeadedAttention: `linears`
0-3 = Q, K, V, output), `feed_forward` (`w_1`, `w_2`, ReLU) and pre-LN `sublayer.<i>.norm` (SublayerConnection:
x + dropout(sublayer(norm(x)))), a final `norm` on both stacks, and `generator.proj` (a Linear with a bias; the
Generator's log_softmax does not change the greedy choice). Separate vocabularies; shared or tied embeddings (the
tutorial's `if False:` snippet) are recognised by equal weights. Loaded with `torch.load(weights_only=True)`.

Its LayerNorm is its own: a_2 * (x - mean) / (std + eps) + b_2 with the unbiased (n - 1) std and eps = 1e-6 added
to the std, which nn.LayerNorm cannot reproduce exactly; the converted config says `layer_norm_type="annotated_std"`
(a named deviation of the model). `AnnotatedOptions`: `heads` is required (make_model's default is 8);
`layer_norm_eps` (1e-6) and `dropout` (0.1; MultiHeadedAttention's attention dropout is fixed at 0.1 by make_model)
complete it.
Token ids are the Multi30k example's (<s> 0, </s> 1, <blank> 2 = padding, <unk> 3); the decoder starts with <s>;
decoding is check_outputs' `greedy_decode(model, src, src_mask, 72, 0)`: greedy, 71 new tokens at most, cut at </s>.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from hf_vanilla_transformer import VanillaTransformerConfig

from ._common import Converted, Finished, KeyRule, check_output, safe_torch_load, sha256, token_generation_config
from ._pytorch_sources import (
    PytorchOptions,
    check_position_table,
    converted,
    finish_pytorch,
    layer_count,
    same_tensor,
    state_dict_from,
)

SOURCE_EMBEDDING, TARGET_EMBEDDING = "src_embed.0.lut.weight", "tgt_embed.0.lut.weight"
POSITIONS = ("src_embed.1.pe", "tgt_embed.1.pe")
ENCODER_FFN = "encoder.layers.0.feed_forward.w_1.weight"
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")  # MultiHeadedAttention.linears[0..3]


@dataclass(frozen=True, kw_only=True)
class AnnotatedOptions(PytorchOptions):
    """make_model's state dict: the Multi30k example's special ids, its LayerNorm eps and greedy_decode's limit."""

    bos_id: int = 0  # build_vocabulary's specials: "<s>", "</s>", "<blank>", "<unk>"
    eos_id: int = 1
    pad_id: int = 2
    unk_id: int = 3
    layer_norm_eps: float = 1e-6  # LayerNorm(features, eps=1e-6), added to the std
    max_len: int = 72  # greedy_decode's max_len, the start symbol included


def key_map(config: VanillaTransformerConfig) -> list[KeyRule]:
    """Annotated name -> ours. SublayerConnection i of an encoder layer: 0 self-attention, 1 FFN; of a decoder
    layer: 0 self-attention, 1 source attention, 2 FFN."""
    layer = r"(encoder|decoder)\.layers\.(\d+)\."
    decoder = r"decoder\.layers\.(\d+)\."
    cross = r"model.decoder.layers.\1.encoder_attn."
    if config.share_encoder_decoder_embeddings:
        source_embedding = target_embedding = "model.shared.weight"
    else:
        source_embedding, target_embedding = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    rules: list[KeyRule] = [
        (r"(src|tgt)_embed\.1\.pe", None),  # checked against our sinusoids before mapping (`check_position_table`)
        (r"src_embed\.0\.lut\.weight", source_embedding),
        (r"tgt_embed\.0\.lut\.weight", target_embedding),
        (r"generator\.proj\.weight", target_embedding if config.tie_word_embeddings else "lm_head.weight"),
        (r"generator\.proj\.bias", "lm_head.bias"),
    ]
    for index, name in enumerate(ATTENTION_PROJECTIONS):
        rules += [
            (layer + rf"self_attn\.linears\.{index}\.(weight|bias)", rf"model.\1.layers.\2.self_attn.{name}.\3"),
            (decoder + rf"src_attn\.linears\.{index}\.(weight|bias)", cross + rf"{name}.\2"),
        ]
    for stack, names in (
        ("encoder", ("self_attn_layer_norm", "final_layer_norm")),
        ("decoder", ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")),
    ):
        for index, name in enumerate(names):
            prefix = rf"{stack}\.layers\.(\d+)\.sublayer\.{index}\.norm\."
            rules += [
                (prefix + "a_2", rf"model.{stack}.layers.\1.{name}.weight"),
                (prefix + "b_2", rf"model.{stack}.layers.\1.{name}.bias"),
            ]
    return [
        *rules,
        (layer + r"feed_forward\.w_1\.(weight|bias)", r"model.\1.layers.\2.fc1.\3"),
        (layer + r"feed_forward\.w_2\.(weight|bias)", r"model.\1.layers.\2.fc2.\3"),
        (r"(encoder|decoder)\.norm\.a_2", r"model.\1.layer_norm.weight"),
        (r"(encoder|decoder)\.norm\.b_2", r"model.\1.layer_norm.bias"),
    ]


def config_fields(weights: dict[str, torch.Tensor], options: AnnotatedOptions) -> dict[str, Any]:
    """Our config's fields: sizes from the weights' shapes, the rest from the options."""
    required = (SOURCE_EMBEDDING, TARGET_EMBEDDING, "generator.proj.weight", ENCODER_FFN)
    for key in required:
        if key not in weights:
            raise ValueError(
                f"`{key}` is missing: this is not a state dict of the Annotated Transformer's make_model "
                "(src_embed, tgt_embed, encoder, decoder, generator)."
            )
    tables = {name: weights[name] for name in POSITIONS if name in weights}
    for name, table in tables.items():
        if table.dim() != 3 or table.shape[0] != 1:
            raise ValueError(f"`{name}` has shape {tuple(table.shape)}; the Annotated one is (1, max_len, d_model).")
        check_position_table(table[0], name)
    encoder_layers = layer_count(weights, "encoder.layers.")
    decoder_layers = layer_count(weights, "decoder.layers.")
    return dict(
        vocab_size=weights[SOURCE_EMBEDDING].shape[0],
        decoder_vocab_size=weights[TARGET_EMBEDDING].shape[0],
        d_model=weights[SOURCE_EMBEDDING].shape[1],
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=options.heads,
        decoder_attention_heads=options.heads,
        encoder_ffn_dim=weights[ENCODER_FFN].shape[0],
        decoder_ffn_dim=weights["decoder.layers.0.feed_forward.w_1.weight"].shape[0],
        activation_function="relu",  # PositionwiseFeedForward: w_2(dropout(w_1(x).relu()))
        dropout=options.dropout,
        attention_dropout=0.1,  # make_model's MultiHeadedAttention(h, d_model) keeps its default dropout=0.1
        activation_dropout=options.dropout,
        scale_embedding=True,  # Embeddings: lut(x) * sqrt(d_model)
        share_encoder_decoder_embeddings=same_tensor(weights, SOURCE_EMBEDDING, TARGET_EMBEDDING),
        tie_word_embeddings=same_tensor(weights, TARGET_EMBEDDING, "generator.proj.weight"),
        lm_head_bias=True,
        max_position_embeddings=max((table.shape[1] for table in tables.values()), default=5000),
        position_embedding_type="sinusoidal",
        sinusoidal_layout="interleaved",
        position_offset=0,
        normalize_before=True,  # SublayerConnection: "the norm is first as opposed to last"
        add_final_layer_norm=True,  # Encoder.norm, Decoder.norm
        layer_norm_type="annotated_std",  # a_2 * (x - mean) / (std + eps) + b_2, unbiased std
        layer_norm_eps=options.layer_norm_eps,  # added to the std, not to the variance
        bos_token_id=options.bos_id,
        pad_token_id=options.pad_id,
        eos_token_id=options.eos_id,
        decoder_start_token_id=options.bos_id,  # greedy_decode(..., start_symbol=0)
    )


def vanilla_config(weights: dict[str, torch.Tensor], options: AnnotatedOptions) -> VanillaTransformerConfig:
    """Our config for the weights and options (`config_fields`)."""
    return VanillaTransformerConfig(**config_fields(weights, options))


def generation_config(config: VanillaTransformerConfig, max_len: int) -> GenerationConfig:
    """check_outputs' `greedy_decode(model, src, src_mask, max_len, 0)`: max_len - 1 greedy steps from <s>; the text
    is cut at the first </s>, where our generation stops."""
    return token_generation_config(
        config,
        num_beams=1,
        do_sample=False,
        max_new_tokens=max_len - 1,
    )


def load_weights(options: AnnotatedOptions) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, loaded without running pickled code."""
    return state_dict_from(safe_torch_load(options.source), options.source)


def load_annotated(options: AnnotatedOptions) -> Converted:
    """Convert in memory (nothing is written)."""
    weights = load_weights(options)
    config = vanilla_config(weights, options)
    facts = {
        "Source": f"Annotated Transformer state dict `{options.source.name}`, sha256 `{sha256(options.source)}`",
        "Settings given": f"heads {options.heads}, LayerNorm eps {options.layer_norm_eps:g} (added to the unbiased "
        "std)",
    }
    generation = generation_config(config, options.max_len)
    return converted(options, weights, config, key_map(config), generation, facts)


def convert(options: AnnotatedOptions) -> Finished:
    """Convert, verify against `options.reference` when given, write the folder and check that it reloads exactly."""
    check_output(options)
    result = load_annotated(options)
    result.notes += [
        "Inputs are the Annotated Transformer's token ids; its tokenizer is spaCy, so the tokenizer here (from the "
        "given source vocabulary) takes pre-tokenized, space-separated words and adds <s> ... </s> as its "
        "collate_batch.",
        "`model.generate` returns token ids; the Generator's log_softmax is `logits.log_softmax(-1)`.",
    ]
    return finish_pytorch(
        options,
        result,
        "Annotated Transformer in hf_vanilla_transformer",
        "Converted with `python -m conversion annotated` from a state dict of harvardnlp's *The Annotated "
        "Transformer* (`make_model`).",
    )


__all__ = ["AnnotatedOptions", "config_fields", "convert", "key_map", "load_annotated", "vanilla_config"]
