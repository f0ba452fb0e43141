"""OpenNMT-py 3.x `transformer` checkpoints -> hf_vanilla_transformer (`python -m conversion opennmt SOURCE OUTPUT`).

SOURCE is a checkpoint (`model_step_N.pt`, or one released by `onmt_release_model`) or a folder holding one. It
loads through `torch.load(weights_only=True)` with argparse.Namespace (OpenNMT-py's `opt`) as the only allowed class;
the vocabularies come from the checkpoint (`vocab`: plain token lists). OpenNMT-py's transformer is pre-LN with a
final LayerNorm after each stack, scales embeddings by sqrt(d_model) and adds sinusoids from position 0:
`SinusoidalInterleaved` is §3.5 as written, `SinusoidalConcat` is [sin | cos] with frequencies 10000^(-k/(d/2 - 1)),
our "fairseq" layout without its offset. The sinusoid tables stored in the checkpoint are checked against ours and
then dropped (ours are recomputed). Supported: separate or shared vocabularies; share_embeddings and/or
share_decoder_embeddings; relu or gelu; any norm_eps. OpenNMT-py 3.x has no Q/K/V/output biases unless
add_qkvbias, and no FFN biases unless add_ffnbias: our projections always have a bias, and a zero bias is exactly a
missing one (x W^T + 0 = x W^T), so missing biases become zeros, and only then. The generator (always with a bias)
becomes `lm_head` with `lm_head_bias=True`. Settings our model cannot represent raise NotImplementedError naming
them: relative positions, rotary, ALiBi, no position encoding, RMSNorm, gated FFNs (silu, gated-gelu), average
attention, copy attention, grouped K/V heads, parallel residuals, mixtures of experts, sliding windows, source
features, LoRA or quantized layers, language models and non-transformer encoders or decoders.

Token ids are OpenNMT-py's vocabulary indices (<unk> 0, <blank> 1, <s> 2, </s> 3 by default, then the vocabulary in
order, `averyunlikelytokenN` padding included). The tokenizer splits on whitespace and appends nothing, as
OpenNMT-py does to a source; the decoder starts with the checkpoint's decoder_start_token (<s>). The generation
config is onmt_translate's defaults: beam 5, no length penalty, at most max_length 250 tokens.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.modeling_vanilla_transformer import sinusoid_table

from ._common import (
    TARGET_TOKENIZER,
    Converted,
    Finished,
    KeyRule,
    ReferenceOptions,
    check_output,
    finish_against_reference,
    load_with_key_map,
    safe_torch_load,
    sha256,
    token_generation_config,
    word_level_tokenizer,
)

PAD, BOS, EOS, UNK = "<blank>", "<s>", "</s>", "<unk>"  # OpenNMT-py's DefaultTokens
CHECKPOINT_NAMES = ("model.pt",)
PE_MAX_LEN = 5000  # OpenNMT-py's PositionalEncoding table; longer inputs raise SequenceTooLongError there
# OpenNMT-py position_encoding_type -> our sinusoidal_layout (position_offset 0 for both).
LAYOUTS = {"SinusoidalInterleaved": "interleaved", "SinusoidalConcat": "fairseq"}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu"}  # F.relu, F.gelu (exact erf form)
# OpenNMT-py 3.5's defaults (onmt.opts.model_opts) for options that older checkpoints predate.
DEFAULTS: dict[str, Any] = {
    "model_task": "seq2seq",
    "model_type": "text",
    "position_encoding": False,
    "position_encoding_type": "SinusoidalInterleaved",
    "max_relative_positions": 0,
    "relative_positions_buckets": 0,
    "layer_norm": "standard",
    "norm_eps": 1e-6,
    "pos_ffn_activation_fn": "relu",
    "self_attn_type": "scaled-dot-flash",
    "num_kv": 0,
    "multiquery": False,
    "parallel_residual": False,
    "num_experts": 0,
    "sliding_window": 0,
    "copy_attn": False,
    "n_src_feats": 0,
    "share_embeddings": False,
    "share_decoder_embeddings": False,
    "layers": -1,
    "hidden_size": -1,
    "word_vec_size": -1,
    "dropout": [0.3],
    "attention_dropout": [0.1],
    "lora_layers": [],
    "lora_embedding": False,
    "quant_layers": [],
}
# Options that change the computation in a way our model has no field for: (option, what it is, is it in use).
UNSUPPORTED = (
    ("max_relative_positions", "relative position representations (> 0), rotary (-1) or ALiBi (-2)", bool),
    ("relative_positions_buckets", "T5-style relative position buckets", bool),
    ("layer_norm", "RMSNorm", lambda value: value != "standard"),
    ("self_attn_type", "average attention (AAN) in the decoder", lambda value: value == "average"),
    ("copy_attn", "copy attention (a CopyGenerator)", bool),
    ("parallel_residual", "parallel residual blocks (GPT-J style)", bool),
    ("multiquery", "multi-query attention", bool),
    ("num_experts", "a mixture of experts in the FFNs", bool),
    ("sliding_window", "a sliding-window decoder self-attention mask", bool),
    ("n_src_feats", "source word features", bool),
    ("lora_layers", "LoRA adapters", bool),
    ("lora_embedding", "LoRA embeddings", bool),
    ("quant_layers", "quantized layers", bool),
)
# Options named in the model card.
OPTIONS_SHOWN = (
    "position_encoding_type",
    "share_embeddings",
    "share_decoder_embeddings",
    "add_qkvbias",
    "add_ffnbias",
    "pos_ffn_activation_fn",
    "norm_eps",
)
# OpenNMT-py's attention projections -> ours.
PROJECTIONS = {
    "linear_query": "q_proj",
    "linear_keys": "k_proj",
    "linear_values": "v_proj",
    "final_linear": "out_proj",
}


@dataclass(frozen=True, kw_only=True)
class OpenNMTOptions(ReferenceOptions):
    """An OpenNMT-py conversion: `source` is a checkpoint file or a folder holding one; `reference` is the
    teacher_forced.safetensors of conversion/reference/make_opennmt_reference.py."""

    checkpoint: str | None = None  # the checkpoint's name in a `source` folder; None: model.pt, or its only *.pt
    beam: int = 5  # the folder's default decoding, onmt_translate's defaults: beam size,
    max_length: int = 250  # most generated tokens


# ---------------------------------------------------------------------------------------------------- checkpoint
def model_settings(state: dict[str, Any], path: Path) -> dict[str, Any]:
    """OpenNMT-py's model options (`opt`) as a dict, with 3.5's defaults for missing ones and the derived sizes
    that `ArgumentParser.update_model_opts` sets (layers, hidden_size, word_vec_size apply to both sides)."""
    if not isinstance(state.get("model"), dict) or "opt" not in state or "vocab" not in state:
        raise ValueError(
            f"{path} lacks OpenNMT-py's `model`, `opt` or `vocab`: it is not an OpenNMT-py 3.x checkpoint (2.x "
            "ones store torchtext fields; convert them with OpenNMT-py's tools/convertv2_v3.py first)."
        )
    opt = state["opt"]
    settings = vars(opt).copy() if isinstance(opt, argparse.Namespace) else dict(opt)
    for key, value in DEFAULTS.items():
        settings.setdefault(key, value)
    for side in ("enc", "dec"):
        if settings["layers"] > 0:
            settings[f"{side}_layers"] = settings["layers"]
        if settings["hidden_size"] > 0:
            settings[f"{side}_hid_size"] = settings["hidden_size"]
    if settings["word_vec_size"] > 0:
        settings["src_word_vec_size"] = settings["tgt_word_vec_size"] = settings["word_vec_size"]
    # OpenNMT-py's loader turns add_ffnbias on when the FFNs have biases; a checkpoint that predates add_qkvbias
    # (2.x converted) has attention biases exactly when its weights do.
    weights = state["model"]
    settings["add_ffnbias"] = bool(settings.get("add_ffnbias")) or any(k.endswith("w_1.bias") for k in weights)
    if "add_qkvbias" not in settings:
        settings["add_qkvbias"] = any(key.endswith("linear_keys.bias") for key in weights)
    for name in ("dropout", "attention_dropout"):
        if isinstance(settings[name], (list, tuple)):
            settings[name] = settings[name][0]  # per-step schedules: the first value, as from_opt takes
    return settings


def check_supported(settings: dict[str, Any], vocab: dict[str, Any]) -> None:
    """Refuse (NotImplementedError) every option our model cannot reproduce, naming it."""
    for name, expected in (
        ("model_task", "seq2seq"),
        ("encoder_type", "transformer"),
        ("decoder_type", "transformer"),
    ):
        if settings.get(name) != expected:
            raise NotImplementedError(
                f"{name}={settings.get(name)!r}: only OpenNMT-py's seq2seq transformer converts ({name}={expected!r})."
            )
    if not settings["position_encoding"]:
        raise NotImplementedError(
            "position_encoding=False: the model has no sinusoidal positions (and OpenNMT-py then does not scale "
            "embeddings by sqrt(d_model)); hf_vanilla_transformer always adds positions."
        )
    if settings["position_encoding_type"] not in LAYOUTS:
        raise NotImplementedError(
            f"position_encoding_type={settings['position_encoding_type']!r} is not supported; supported: "
            f"{', '.join(LAYOUTS)}."
        )
    for name, what, in_use in UNSUPPORTED:
        if in_use(settings[name]):
            raise NotImplementedError(
                f"The checkpoint uses {what}: {name}={settings[name]!r}. hf_vanilla_transformer has no equivalent, so "
                "the converted model would compute something else; refusing."
            )
    if settings["num_kv"] not in (0, settings["heads"]):
        raise NotImplementedError(
            f"num_kv={settings['num_kv']} with heads={settings['heads']}: grouped key/value heads are not supported."
        )
    if settings["pos_ffn_activation_fn"] not in ACTIVATIONS:
        raise NotImplementedError(
            f"pos_ffn_activation_fn={settings['pos_ffn_activation_fn']!r} is not supported (silu and gated-gelu are "
            f"gated FFNs with a third matrix w_3); supported: {', '.join(ACTIVATIONS)}."
        )
    sizes = {name: settings.get(name) for name in ("enc_hid_size", "dec_hid_size", "src_word_vec_size")}
    sizes["tgt_word_vec_size"] = settings.get("tgt_word_vec_size")
    if len(set(sizes.values())) != 1:
        raise NotImplementedError(
            f"{', '.join(f'{k}={v}' for k, v in sizes.items())}: hf_vanilla_transformer has one d_model for both "
            "stacks and their embeddings, so they must agree."
        )
    if "src_feats" in vocab:
        raise NotImplementedError("The vocabulary has source features (src_feats): not supported.")


def read_vocab(vocab: dict[str, Any], side: str) -> list[str]:
    """The token list of one side; ids are list positions (pyonmttok.build_vocab_from_tokens)."""
    tokens = vocab.get(side)
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise ValueError(f"The checkpoint's vocab[{side!r}] is not a list of tokens (OpenNMT-py 3.x's format).")
    seen: set[str] = set()
    for index, token in enumerate(tokens):
        if token in seen:
            raise ValueError(f"vocab[{side!r}] lists {token!r} twice (again at id {index}); a token needs one id.")
        seen.add(token)
    for special in (PAD, EOS, UNK):
        if special not in seen:
            raise ValueError(f"vocab[{side!r}] lacks OpenNMT-py's special token {special!r}.")
    return tokens


def check_position_tables(weights: dict[str, torch.Tensor], settings: dict[str, Any], d_model: int) -> None:
    """The sinusoid buffers OpenNMT-py saves (`*.embeddings.make_embedding.pe.pe`, (max_len, 1, d)) must be the
    table our layout computes. OpenNMT-py builds them in float32 (angles rounded before sin/cos: ~3e-4 apart from
    ours at position 5000); another layout or frequency differs by O(1)."""
    layout = LAYOUTS[settings["position_encoding_type"]]
    for stack in ("encoder", "decoder"):
        key = f"{stack}.embeddings.make_embedding.pe.pe"
        if key not in weights:
            continue
        table = weights[key].float().reshape(weights[key].shape[0], -1)
        ours = sinusoid_table(table.shape[0], d_model, layout)
        if table.shape != ours.shape or not torch.allclose(table, ours, rtol=0.0, atol=1e-3):
            raise ValueError(
                f"`{key}` is not the {settings['position_encoding_type']} table that position_encoding_type names "
                f"(shape {tuple(table.shape)}, max |Δ| to ours "
                f"{(table - ours).abs().max().item() if table.shape == ours.shape else float('nan'):.3g}). The "
                "checkpoint's settings and its weights disagree."
            )


def with_zero_biases(weights: dict[str, torch.Tensor], settings: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Weights plus a zero bias for each bias-free projection (add_qkvbias / add_ffnbias False): exact, since our
    nn.Linear with a zero bias computes x W^T, which is OpenNMT-py's bias-free projection. With the flag set, a
    missing bias stays missing and the key map reports it; without it, a bias present is refused."""
    weights = dict(weights)
    groups = (("add_qkvbias", "|".join(PROJECTIONS)), ("add_ffnbias", "w_1|w_2"))
    for flag, names in groups:
        pattern = re.compile(rf"(.+\.(?:{names}))\.weight")
        for key in list(weights):
            match = pattern.fullmatch(key)
            if match is None or settings[flag]:
                continue
            bias = f"{match.group(1)}.bias"
            if bias in weights:
                raise ValueError(
                    f"{flag}=False but the checkpoint has `{bias}`: the checkpoint's settings and weights disagree."
                )
            weights[bias] = torch.zeros(weights[key].shape[0], dtype=weights[key].dtype)
    return weights


def key_map(config: VanillaTransformerConfig) -> list[KeyRule]:
    """OpenNMT-py name -> ours. Tied OpenNMT-py tensors (saved once per dict) map to the one tensor our model
    keeps, checked equal."""
    if config.share_encoder_decoder_embeddings:
        source_embedding = target_embedding = "model.shared.weight"
    else:
        source_embedding, target_embedding = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    output_projection = target_embedding if config.tie_word_embeddings else "lm_head.weight"
    encoder, decoder = r"encoder\.transformer\.(\d+)\.", r"decoder\.transformer_layers\.(\d+)\."
    rules: list[KeyRule] = [
        # The sinusoid tables: checked against ours (check_position_tables), recomputed by our model.
        (r"(encoder|decoder)\.embeddings\.make_embedding\.pe\.pe", None),
        (r"encoder\.embeddings\.make_embedding\.emb_luts\.0\.weight", source_embedding),
        (r"decoder\.embeddings\.make_embedding\.emb_luts\.0\.weight", target_embedding),
        # The generator (its own state dict in the checkpoint; "0." in checkpoints converted from 2.x).
        (r"generator\.(0\.)?weight", output_projection),
        (r"generator\.(0\.)?bias", "lm_head.bias"),
        (r"(encoder|decoder)\.layer_norm\.(weight|bias)", r"model.\1.layer_norm.\2"),
        (encoder + r"layer_norm\.(weight|bias)", r"model.encoder.layers.\1.self_attn_layer_norm.\2"),
        (decoder + r"layer_norm_1\.(weight|bias)", r"model.decoder.layers.\1.self_attn_layer_norm.\2"),
        (decoder + r"layer_norm_2\.(weight|bias)", r"model.decoder.layers.\1.encoder_attn_layer_norm.\2"),
    ]
    for stack, ours in ((encoder, "encoder"), (decoder, "decoder")):
        rules += [
            (stack + r"feed_forward\.layer_norm\.(weight|bias)", rf"model.{ours}.layers.\1.final_layer_norm.\2"),
            (stack + r"feed_forward\.w_1\.(weight|bias)", rf"model.{ours}.layers.\1.fc1.\2"),
            (stack + r"feed_forward\.w_2\.(weight|bias)", rf"model.{ours}.layers.\1.fc2.\2"),
        ]
    for stack, ours, theirs, mine in (
        (encoder, "encoder", "self_attn", "self_attn"),
        (decoder, "decoder", "self_attn", "self_attn"),
        (decoder, "decoder", "context_attn", "encoder_attn"),
    ):
        for their_projection, our_projection in PROJECTIONS.items():
            rules.append(
                (
                    stack + rf"{theirs}\.{their_projection}\.(weight|bias)",
                    rf"model.{ours}.layers.\1.{mine}.{our_projection}.\2",
                )
            )
    return rules


def vanilla_config(
    settings: dict[str, Any], source: list[str], target: list[str], decoder_start: str
) -> VanillaTransformerConfig:
    """Our config for a checked OpenNMT-py model (`check_supported`)."""
    if source.index(PAD) != target.index(PAD):
        raise NotImplementedError(
            f"<blank> has id {source.index(PAD)} in the source vocabulary but {target.index(PAD)} in the target "
            "one; hf_vanilla_transformer has one pad_token_id."
        )
    if settings["share_embeddings"] and source != target:
        raise ValueError("share_embeddings=True needs one vocabulary, but vocab['src'] and vocab['tgt'] differ.")
    if decoder_start not in target:
        raise ValueError(f"The decoder_start_token {decoder_start!r} is not in the target vocabulary.")
    return VanillaTransformerConfig(
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        d_model=settings["enc_hid_size"],
        encoder_layers=settings["enc_layers"],
        decoder_layers=settings["dec_layers"],
        encoder_attention_heads=settings["heads"],
        decoder_attention_heads=settings["heads"],
        encoder_ffn_dim=settings["transformer_ff"],
        decoder_ffn_dim=settings["transformer_ff"],
        activation_function=ACTIVATIONS[settings["pos_ffn_activation_fn"]],
        dropout=float(settings["dropout"]),
        attention_dropout=float(settings["attention_dropout"]),
        activation_dropout=float(settings["dropout"]),  # OpenNMT-py's dropout_1 after the FFN activation
        scale_embedding=True,  # PositionalEncoding multiplies by sqrt(dim) before adding the table
        share_encoder_decoder_embeddings=bool(settings["share_embeddings"]),
        tie_word_embeddings=bool(settings["share_decoder_embeddings"]),
        lm_head_bias=True,  # the generator is an nn.Linear with its bias
        max_position_embeddings=PE_MAX_LEN,
        position_embedding_type="sinusoidal",
        sinusoidal_layout=LAYOUTS[settings["position_encoding_type"]],
        position_offset=0,
        normalize_before=True,  # OpenNMT-py's layers are pre-norm ...
        add_final_layer_norm=True,  # ... with a LayerNorm after each stack
        layer_norm_eps=float(settings["norm_eps"]),
        bos_token_id=target.index(BOS) if BOS in target else None,
        pad_token_id=target.index(PAD),
        eos_token_id=target.index(EOS),
        decoder_start_token_id=target.index(decoder_start),
    )


def build_tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    """OpenNMT-py's ids: whitespace-split (OpenNMT-py splits the transformed line on spaces), nothing appended
    (OpenNMT-py adds neither <s> nor </s> to a source)."""
    bos = BOS if BOS in tokens else None
    return word_level_tokenizer(tokens, unk=UNK, pad=PAD, eos=EOS, bos=bos, model_max_length=PE_MAX_LEN)


def locate(source: Path, checkpoint: str | None = None) -> Path:
    """The checkpoint file: `source` itself, or in a `source` folder `checkpoint`, model.pt or its only *.pt."""
    if source.is_file():
        return source
    if not source.is_dir():
        raise FileNotFoundError(f"{source} does not exist. Pass an OpenNMT-py checkpoint (.pt) or its folder.")
    if checkpoint:
        path = source / checkpoint
        if not path.is_file():
            raise FileNotFoundError(f"No {checkpoint} in {source}. Pass as `checkpoint` the name of a file there.")
        return path
    found = [source / name for name in CHECKPOINT_NAMES if (source / name).is_file()] or sorted(source.glob("*.pt"))
    if len(found) != 1:
        present = ", ".join(path.name for path in found) or "none"
        raise FileNotFoundError(
            f"Found {len(found)} candidate checkpoints in {source} ({present}). Pass `checkpoint`, the file's name."
        )
    return found[0]


# ---------------------------------------------------------------------------------------------------- conversion
def load_opennmt(checkpoint: Path, *, beam: int = 5, max_length: int = 250) -> Converted:
    """Convert an OpenNMT-py checkpoint in memory (nothing is written), with onmt_translate's decoding (`beam`,
    `max_length`: `generation_config`)."""
    state = safe_torch_load(checkpoint, [argparse.Namespace])
    settings = model_settings(state, checkpoint)
    vocab = state["vocab"]
    check_supported(settings, vocab)
    source, target = read_vocab(vocab, "src"), read_vocab(vocab, "tgt")
    decoder_start = vocab.get("decoder_start_token", BOS)
    config = vanilla_config(settings, source, target, decoder_start)
    generator = state.get("generator") or {}
    weights = {**state["model"], **{f"generator.{key}": value for key, value in generator.items()}}
    for key, tokens, side in (
        ("encoder.embeddings.make_embedding.emb_luts.0.weight", source, "src"),
        ("decoder.embeddings.make_embedding.emb_luts.0.weight", target, "tgt"),
    ):
        rows = weights[key].shape[0] if key in weights else None
        if rows != len(tokens):
            raise ValueError(f"vocab[{side!r}] has {len(tokens)} tokens but `{key}` has {rows} rows.")
    check_position_tables(weights, settings, config.d_model)
    model = VanillaTransformerForConditionalGeneration(config)
    load_with_key_map(model, with_zero_biases(weights, settings), key_map(config))
    tokenizers = {"": build_tokenizer(source)}
    if target != source:
        tokenizers[TARGET_TOKENIZER] = build_tokenizer(target)
    facts = {
        "Source": f"OpenNMT-py checkpoint `{checkpoint.name}`, sha256 `{sha256(checkpoint)}`",
        "Vocabularies": f"{len(source)} source, {len(target)} target tokens"
        + (" (one shared vocabulary)" if target == source else ""),
        "OpenNMT-py options": ", ".join(f"{name}={settings[name]}" for name in OPTIONS_SHOWN),
    }
    generation = generation_config(config, beam, max_length)
    facts["Decoding defaults"] = (
        f"onmt_translate's: beam {generation.num_beams}, no length penalty, at most {generation.max_new_tokens} tokens"
    )
    notes = [
        "Token ids are OpenNMT-py's vocabulary indices; inputs are space-separated tokens after the checkpoint's "
        f"transforms ({', '.join(settings.get('transforms') or []) or 'none recorded'}), which are not included.",
        "onmt_translate also stops at 1.25 x the (padded) source length + 5 tokens (-max_length_ratio); "
        "max_new_tokens here is its fixed -max_length only.",
    ]
    if not settings["add_qkvbias"] or not settings["add_ffnbias"]:
        notes.append("Projections without a bias in OpenNMT-py have a zero bias here (the same function).")
    if TARGET_TOKENIZER in tokenizers:
        notes.append(f"Source and target vocabularies differ: decode outputs with `{TARGET_TOKENIZER}/`.")
    return Converted(model.eval(), generation, tokenizers, settings, facts, notes)


def generation_config(config: VanillaTransformerConfig, beam: int = 5, max_length: int = 250) -> GenerationConfig:
    """onmt_translate's decoding defaults in transformers' terms: beam 5, length_penalty none (hypotheses ranked by
    their summed log-probabilities: transformers' length_penalty 0), at most max_length tokens, </s> allowed first
    (min_length 0). Greedy output is the same; beam output can differ where the model is unsure, because
    OpenNMT-py's finished hypotheses keep their beam slot while transformers' free it. Without a length penalty no
    hypothesis can outscore a finished one once all running ones score lower, which early_stopping=False waits for,
    as OpenNMT-py stops once its best candidate has finished."""
    return token_generation_config(
        config,
        num_beams=beam,
        length_penalty=0.0,
        early_stopping=False,
        max_new_tokens=max_length,
    )


def convert(options: OpenNMTOptions) -> Finished:
    """Convert, verify against `options.reference` when given, write the folder and check that it reloads exactly."""
    check_output(options)
    checkpoint = locate(options.source, options.checkpoint)
    converted = load_opennmt(checkpoint, beam=options.beam, max_length=options.max_length)
    tokenizer = converted.tokenizers[""]
    words = [token for token in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))) if "<" not in token]
    return finish_against_reference(
        options,
        converted,
        source="OpenNMT-py",
        hint="no reference logits given; conversion/reference/make_opennmt_reference.py writes them",
        title="OpenNMT-py transformer in hf_vanilla_transformer",
        description="Converted with `python -m conversion opennmt` from an OpenNMT-py (MIT) transformer checkpoint.",
        example=" ".join(words[:6]),
        tokenizer_note="source side: text as OpenNMT-py's transforms left it",
    )


__all__ = [
    "OpenNMTOptions",
    "convert",
    "generation_config",
    "key_map",
    "load_opennmt",
    "read_vocab",
]
