"""nn.Transformer (PyTorch's translation tutorial) -> hf_vanilla_transformer (`python -m conversion nn-transformer`).

SOURCE is `torch.save(model.state_dict())` of the `Seq2SeqTransformer` of the tutorial "Language Translation with
nn.Transformer and torchtext" (pytorch/tutorials, beginner_source/translation_transformer.py): `src_tok_emb` and
`tgt_tok_emb` (TokenEmbedding: an nn.Embedding times √emb_size), `positional_encoding` (a (maxlen, 1, emb_size)
buffer of interleaved sin/cos from position 0, §3.5 as written), `transformer` (torch.nn.Transformer: fused Q/K/V
`in_proj_weight`/`in_proj_bias`, `norm1..3`, `linear1/2`, and the final `encoder.norm` / `decoder.norm` that
nn.Transformer adds even after post-LN layers) and `generator` (an nn.Linear with a bias). Separate vocabularies;
shared or tied embeddings are recognised by equal weights. Loaded with `torch.load(weights_only=True)`.

What a state dict does not record comes from `NnTransformerOptions`, with nn.Transformer's defaults: `heads`
(required), `norm_first` (False: post-LN), `activation` relu|gelu (relu), `layer_norm_eps` (1e-5), `dropout` (0.1,
which nn.Transformer applies to the attention weights, after the FFN activation and to each sub-layer output, and the
tutorial after the positions). nn.Transformer(bias=False) and other modules (kdim/vdim projections, a custom encoder
or decoder) have no counterpart here and are refused. Token ids are the tutorial's (<unk> 0, <pad> 1, <bos> 2,
<eos> 3 unless told otherwise); the decoder starts with <bos>; decoding is `translate`'s greedy search with
max_len = source length + 5 (the start symbol included), except that our length limit ends with a forced <eos>.
"""

from __future__ import annotations

from dataclasses import dataclass

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

ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # nn.Transformer's string activations -> ACT2FN (exact erf GELU)
SOURCE_EMBEDDING, TARGET_EMBEDDING = "src_tok_emb.embedding.weight", "tgt_tok_emb.embedding.weight"
POSITIONS = "positional_encoding.pos_embedding"
MAXLEN = 5000  # the tutorial's PositionalEncoding default, when the buffer is absent


@dataclass(frozen=True, kw_only=True)
class NnTransformerOptions(PytorchOptions):
    """The tutorial's Seq2SeqTransformer: its special ids, and the nn.Transformer arguments it was built with."""

    unk_id: int = 0  # the tutorial's special_symbols: <unk>, <pad>, <bos>, <eos>
    pad_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    norm_first: bool = False  # nn.Transformer(norm_first=True): pre-LN
    activation: str = "relu"  # nn.Transformer's activation: relu or gelu
    layer_norm_eps: float = 1e-5  # nn.Transformer's layer_norm_eps
    max_len_offset: int = 5  # translate's max_len = source length + this


def key_map(config: VanillaTransformerConfig) -> list[KeyRule]:
    """Tutorial name -> ours. nn.Transformer's layer names: self_attn / multihead_attn (fused in_proj + out_proj),
    linear1/2, norm1 (self-attention), norm2 (encoder: FFN; decoder: cross-attention), norm3 (decoder FFN)."""
    layer = r"transformer\.(encoder|decoder)\.layers\.(\d+)\."
    decoder = r"transformer\.decoder\.layers\.(\d+)\."
    if config.share_encoder_decoder_embeddings:
        source_embedding = target_embedding = "model.shared.weight"
    else:
        source_embedding, target_embedding = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    return [
        (POSITIONS, None),  # checked against our sinusoids before mapping (`check_position_table`)
        (SOURCE_EMBEDDING.replace(".", r"\."), source_embedding),
        (TARGET_EMBEDDING.replace(".", r"\."), target_embedding),
        (r"generator\.weight", target_embedding if config.tie_word_embeddings else "lm_head.weight"),
        (r"generator\.bias", "lm_head.bias"),
        # nn.MultiheadAttention's in_proj: the Q, K and V projections stacked along dim 0, split in three.
        (layer + r"self_attn\.in_proj_(weight|bias)", qkv(r"model.\1.layers.\2.self_attn.{}_proj.\3")),
        (decoder + r"multihead_attn\.in_proj_(weight|bias)", qkv(r"model.decoder.layers.\1.encoder_attn.{}_proj.\2")),
        (layer + r"self_attn\.out_proj\.(weight|bias)", r"model.\1.layers.\2.self_attn.out_proj.\3"),
        (decoder + r"multihead_attn\.out_proj\.(weight|bias)", r"model.decoder.layers.\1.encoder_attn.out_proj.\2"),
        (layer + r"linear1\.(weight|bias)", r"model.\1.layers.\2.fc1.\3"),
        (layer + r"linear2\.(weight|bias)", r"model.\1.layers.\2.fc2.\3"),
        (layer + r"norm1\.(weight|bias)", r"model.\1.layers.\2.self_attn_layer_norm.\3"),
        (r"transformer\.encoder\.layers\.(\d+)\.norm2\.(weight|bias)", r"model.encoder.layers.\1.final_layer_norm.\2"),
        (decoder + r"norm2\.(weight|bias)", r"model.decoder.layers.\1.encoder_attn_layer_norm.\2"),
        (decoder + r"norm3\.(weight|bias)", r"model.decoder.layers.\1.final_layer_norm.\2"),
        (r"transformer\.(encoder|decoder)\.norm\.(weight|bias)", r"model.\1.layer_norm.\2"),
    ]


def qkv(target: str) -> tuple[str, str, str]:
    """The three target keys of a fused projection, `{}` in `target` standing for q, k and v."""
    return target.format("q"), target.format("k"), target.format("v")


def vanilla_config(weights: dict[str, torch.Tensor], options: NnTransformerOptions) -> VanillaTransformerConfig:
    """Our config: sizes from the weights' shapes, the rest from the options (module docstring)."""
    required = (SOURCE_EMBEDDING, TARGET_EMBEDDING, "generator.weight", "transformer.encoder.layers.0.linear1.weight")
    for key in required:
        if key not in weights:
            raise ValueError(
                f"`{key}` is missing: this is not a state dict of the tutorial's Seq2SeqTransformer "
                "(src_tok_emb, tgt_tok_emb, positional_encoding, transformer = nn.Transformer, generator)."
            )
    if "transformer.encoder.layers.0.linear1.bias" not in weights or "transformer.encoder.norm.bias" not in weights:
        raise NotImplementedError(
            "The nn.Transformer was built with bias=False (its Linear and LayerNorm modules have no biases); "
            "hf_vanilla_transformer's always have them."
        )
    if options.activation not in ACTIVATIONS:
        raise NotImplementedError(
            f"`activation={options.activation}` is not supported: nn.Transformer's string activations are "
            f"{' and '.join(f'`activation={name}`' for name in ACTIVATIONS)}."
        )
    max_len = MAXLEN
    if POSITIONS in weights:
        table = weights[POSITIONS]
        if table.dim() != 3 or table.shape[1] != 1:
            raise ValueError(f"`{POSITIONS}` has shape {tuple(table.shape)}; the tutorial's is (maxlen, 1, emb_size).")
        check_position_table(table[:, 0], POSITIONS)
        max_len = table.shape[0]
    source_rows, d_model = weights[SOURCE_EMBEDDING].shape
    encoder_layers = layer_count(weights, "transformer.encoder.layers.")
    decoder_layers = layer_count(weights, "transformer.decoder.layers.")
    shared = same_tensor(weights, SOURCE_EMBEDDING, TARGET_EMBEDDING)
    return VanillaTransformerConfig(
        vocab_size=source_rows,
        decoder_vocab_size=weights[TARGET_EMBEDDING].shape[0],
        d_model=d_model,
        encoder_layers=encoder_layers,
        decoder_layers=decoder_layers,
        encoder_attention_heads=options.heads,
        decoder_attention_heads=options.heads,
        encoder_ffn_dim=weights["transformer.encoder.layers.0.linear1.weight"].shape[0],
        decoder_ffn_dim=weights["transformer.decoder.layers.0.linear1.weight"].shape[0],
        activation_function=ACTIVATIONS[options.activation],
        dropout=options.dropout,
        attention_dropout=options.dropout,  # nn.MultiheadAttention(dropout=dropout)
        activation_dropout=options.dropout,  # linear2(dropout(activation(linear1(x))))
        scale_embedding=True,  # TokenEmbedding: embedding(tokens) * sqrt(emb_size)
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=same_tensor(weights, TARGET_EMBEDDING, "generator.weight"),
        lm_head_bias=True,
        max_position_embeddings=max_len,
        position_embedding_type="sinusoidal",
        sinusoidal_layout="interleaved",
        position_offset=0,
        normalize_before=options.norm_first,
        add_final_layer_norm=True,  # nn.Transformer's encoder.norm / decoder.norm, with either norm_first
        layer_norm_eps=options.layer_norm_eps,
        bos_token_id=options.bos_id,
        pad_token_id=options.pad_id,
        eos_token_id=options.eos_id,
        decoder_start_token_id=options.bos_id,  # greedy_decode(..., start_symbol=BOS_IDX)
    )


def generation_config(config: VanillaTransformerConfig, max_len_offset: int) -> GenerationConfig:
    """`translate`'s decoding: greedy from <bos>, stopping at <eos>, at most source length + offset - 1 new tokens
    (greedy_decode runs max_len - 1 steps); the source length counts <bos> and <eos>, as text_transform adds them."""
    return token_generation_config(
        config,
        num_beams=1,
        do_sample=False,
        max_new_tokens_offset=max_len_offset - 1,
    )


def load_nn_transformer(options: NnTransformerOptions) -> Converted:
    """Convert in memory (nothing is written)."""
    weights = state_dict_from(safe_torch_load(options.source), options.source)
    config = vanilla_config(weights, options)
    facts = {
        "Source": f"nn.Transformer tutorial state dict `{options.source.name}`, sha256 `{sha256(options.source)}`",
        "Settings given": f"heads {options.heads}, norm_first={options.norm_first}, activation "
        f"{options.activation}, layer_norm_eps {options.layer_norm_eps:g}",
    }
    generation = generation_config(config, options.max_len_offset)
    return converted(options, weights, config, key_map(config), generation, facts)


def convert(options: NnTransformerOptions) -> Finished:
    """Convert, verify against `options.reference` when given, write the folder and check that it reloads exactly."""
    check_output(options)
    result = load_nn_transformer(options)
    result.notes += [
        "Inputs are the tutorial's token ids; its tokenizer is spaCy, so the tokenizer here (from the given source "
        "vocabulary) takes pre-tokenized, space-separated words and adds <bos> ... <eos> as the tutorial's "
        "text_transform.",
        "Greedy decoding as the tutorial's translate(); at its length limit the tutorial emits one more word where "
        "this model ends with <eos>.",
    ]
    return finish_pytorch(
        options,
        result,
        "nn.Transformer tutorial model in hf_vanilla_transformer",
        "Converted with `python -m conversion nn-transformer` from a state dict of the `Seq2SeqTransformer` of "
        "PyTorch's tutorial *Language Translation with nn.Transformer and torchtext*.",
    )


__all__ = ["NnTransformerOptions", "convert", "generation_config", "key_map", "load_nn_transformer", "vanilla_config"]
