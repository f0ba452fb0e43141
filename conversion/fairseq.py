"""fairseq `transformer` checkpoints -> hf_vanilla_transformer (`python -m conversion fairseq SOURCE OUTPUT_DIR`).

`convert(FairseqOptions(SOURCE, OUTPUT_DIR, ...))`. SOURCE is a checkpoint file (dictionaries beside it, or in
`dict_dir`) or a folder holding one with its `dict.<lang>.txt` files (directly or in `data-bin/`). Both checkpoint
formats load, old (`args`, an argparse.Namespace) and new (`cfg`, plain containers), through
`torch.load(weights_only=True)` with Namespace as the only allowed class. Supported: separate or joined
dictionaries; share-all, share-decoder-input-output or untied embeddings; fairseq's sinusoids or learned positions;
post- or pre-LN (with fairseq's final LayerNorms); relu, gelu, gelu_accurate and swish; fairseq's legacy weight
names (fused `in_proj_weight`, `layer_norms.N`, `embed_out`). Settings our model cannot represent raise
NotImplementedError naming them.

Token ids stay fairseq's dictionary indices (<s> 0, <pad> 1, </s> 2, <unk> 3, then dict.txt in order, madeupwordNNNN
padding included); the tokenizer is a whitespace-split WordLevel one, because fairseq data is tokenized/BPE'd
before binarization, and it appends </s> as fairseq's `encode_line` does. The decoder starts with </s>, as in
fairseq. The generation config is `fairseq-generate`'s defaults: beam 5, lenpen 1 (score / |Y|^1, |Y| counting
</s>), a sentence stops when 5 hypotheses have finished, at most max_len_b (200) tokens + </s> with </s> forced
there, no </s> as the first token (min_len 1), <pad> never generated.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

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

# fairseq's Dictionary always starts with these four, in this order (bos 0, pad 1, eos 2, unk 3).
SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS, UNK = range(4)
CHECKPOINT_NAMES = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")

# Architectures registered for fairseq's TransformerModel (transformer_legacy.py) and its alignment variant, whose
# weights are the same modules.
ARCHITECTURES = frozenset(
    {
        "transformer",
        "transformer_tiny",
        "transformer_iwslt_de_en",
        "transformer_wmt_en_de",
        "transformer_vaswani_wmt_en_de_big",
        "transformer_vaswani_wmt_en_fr_big",
        "transformer_wmt_en_de_big",
        "transformer_wmt_en_de_big_t2t",
        "transformer_align",
        "transformer_wmt_en_de_big_align",
    }
)
# fairseq activation -> the same function in transformers' ACT2FN (gelu_accurate is the tanh approximation).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new", "swish": "silu"}
# fairseq's defaults (transformer_legacy.base_architecture) for settings that older checkpoints predate.
DEFAULTS: dict[str, Any] = {
    "activation_fn": "relu",
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "relu_dropout": 0.0,
    "dropout": 0.1,
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "share_decoder_input_output_embed": False,
    "share_all_embeddings": False,
    "no_scale_embedding": False,
    "no_decoder_final_norm": False,
    "max_source_positions": 1024,
    "max_target_positions": 1024,
}
# Settings that change the computation in a way our model has no field for; any truthy value is refused.
UNSUPPORTED = {
    "layernorm_embedding": "a LayerNorm on the embeddings (--layernorm-embedding)",
    "adaptive_softmax_cutoff": "an adaptive softmax (--adaptive-softmax-cutoff)",
    "adaptive_input": "adaptive input embeddings (--adaptive-input)",
    "no_token_positional_embeddings": "no positional embeddings (--no-token-positional-embeddings)",
    "cross_self_attention": "cross+self-attention (--cross-self-attention)",
    "no_cross_attention": "a decoder without encoder-decoder attention (--no-cross-attention)",
    "quant_noise_pq": "quantization noise (--quant-noise-pq)",
    "quant_noise_scalar": "scalar quantization noise (--quant-noise-scalar)",
    "encoder_layers_to_keep": "pruned encoder layers (--encoder-layers-to-keep)",
    "decoder_layers_to_keep": "pruned decoder layers (--decoder-layers-to-keep)",
    "base_layers": "BASE layers (--base-layers)",
    "char_inputs": "character inputs (--char-inputs)",
}
# Pairs that must agree because our config has one field for both stacks.
SAME = (
    ("encoder_embed_dim", "decoder_embed_dim"),
    ("decoder_embed_dim", "decoder_input_dim"),
    ("decoder_embed_dim", "decoder_output_dim"),
    ("encoder_normalize_before", "decoder_normalize_before"),
    ("encoder_learned_pos", "decoder_learned_pos"),
)


@dataclass(frozen=True, kw_only=True)
class FairseqOptions(ReferenceOptions):
    """A fairseq conversion: `source` is a checkpoint file or a folder holding one; `reference` is the
    teacher_forced.safetensors of conversion/reference/make_fairseq_reference.py."""

    checkpoint: str | None = None  # the checkpoint's name in a `source` folder; None: the first of CHECKPOINT_NAMES
    dict_dir: Path | None = None  # the folder of dict.<lang>.txt; None: beside the checkpoint, or its data-bin/
    source_lang: str | None = None  # the source dictionary's language; None: the checkpoint's
    target_lang: str | None = None  # the target dictionary's language; None: the checkpoint's
    beam: int = 5  # the folder's default decoding, fairseq-generate's defaults: beam size,
    lenpen: float = 1.0  # length penalty,
    max_len_b: int = 200  # most tokens before </s>


# ---------------------------------------------------------------------------------------------------- checkpoint
def model_settings(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], str]:
    """The model's settings as fairseq's flat argument names, and the format ("args" or "cfg")."""
    if "model" not in state or not isinstance(state["model"], dict):
        raise ValueError(f"{path} has no `model` state dict: it is not a fairseq checkpoint.")
    if state.get("cfg") is not None:
        settings, fmt = state["cfg"].get("model"), "cfg"
    elif state.get("args") is not None:
        settings, fmt = state["args"], "args"
    else:
        raise ValueError(f"{path} has neither `cfg` nor `args`: fairseq stores the model settings in one of them.")
    settings = vars(settings) if isinstance(settings, argparse.Namespace) else dict(settings or {})
    # Newer fairseq nests some groups (cfg.model.encoder.embed_dim); fairseq's own flat names prefix the group.
    for group in ("encoder", "decoder", "quant_noise"):
        if isinstance(settings.get(group), dict):
            settings.update({f"{group}_{key}": value for key, value in settings.pop(group).items()})
    for key, value in DEFAULTS.items():
        settings.setdefault(key, value)
    # Old checkpoints name the decoder's sizes only through the encoder's (base_architecture copies them).
    for field in ("embed_dim", "ffn_embed_dim"):
        settings.setdefault(f"decoder_{field}", settings.get(f"encoder_{field}"))
    settings.setdefault("decoder_input_dim", settings["decoder_embed_dim"])
    settings.setdefault("decoder_output_dim", settings["decoder_embed_dim"])
    return settings, fmt


def task_settings(state: dict[str, Any]) -> dict[str, Any]:
    """The task's settings (source_lang, target_lang, ...): cfg.task, or the one `args` of old checkpoints."""
    if state.get("cfg") is not None:
        task = state["cfg"].get("task") or {}
        return vars(task) if isinstance(task, argparse.Namespace) else dict(task)
    return vars(state["args"])


def check_supported(settings: dict[str, Any]) -> None:
    """Refuse (NotImplementedError) every setting our model cannot reproduce, naming it."""
    arch = settings.get("arch") or settings.get("_name")
    if arch not in ARCHITECTURES:
        raise NotImplementedError(
            f"fairseq architecture {arch!r} is not supported; only fairseq's `transformer` family converts "
            f"({', '.join(sorted(ARCHITECTURES))})."
        )
    for name, what in UNSUPPORTED.items():
        if settings.get(name):
            raise NotImplementedError(
                f"The checkpoint uses {what}: {name}={settings[name]!r}. hf_vanilla_transformer has no equivalent, "
                "so the converted model would compute something else; refusing."
            )
    for first, second in SAME:
        if settings.get(first) != settings.get(second):
            raise NotImplementedError(
                f"{first}={settings.get(first)!r} but {second}={settings.get(second)!r}: hf_vanilla_transformer has "
                "one setting for both (d_model, normalize_before, position_embedding_type), so they must agree."
            )
    if settings["activation_fn"] not in ACTIVATIONS:
        raise NotImplementedError(
            f"activation_fn={settings['activation_fn']!r} is not supported; supported: {', '.join(ACTIVATIONS)}."
        )
    if settings["encoder_learned_pos"] and settings["max_source_positions"] != settings["max_target_positions"]:
        raise NotImplementedError(
            f"Learned positions with max_source_positions={settings['max_source_positions']} != "
            f"max_target_positions={settings['max_target_positions']}: our model has one table size for both."
        )
    if not settings["encoder_learned_pos"] and settings["encoder_embed_dim"] % 2:
        raise NotImplementedError(
            f"encoder_embed_dim={settings['encoder_embed_dim']} is odd: fairseq zero-pads its sinusoids there, which "
            "hf_vanilla_transformer's sinusoidal positions do not."
        )


def has_final_layer_norm(settings: dict[str, Any], weights: dict[str, torch.Tensor]) -> bool:
    """fairseq adds a LayerNorm after each pre-LN stack, except in checkpoints older than the stacks' version buffers
    2 (encoder) and 3 (decoder), and in a decoder with --no-decoder-final-norm."""

    def version(stack: str) -> float:
        return float(weights.get(f"{stack}.version", torch.tensor([1.0]))[0])

    encoder = settings["encoder_normalize_before"] and version("encoder") >= 2
    decoder = settings["decoder_normalize_before"] and not settings["no_decoder_final_norm"] and version("decoder") > 2
    if encoder != decoder:
        raise NotImplementedError(
            f"The encoder {'has' if encoder else 'lacks'} a final LayerNorm but the decoder "
            f"{'has' if decoder else 'lacks'} one (no_decoder_final_norm={settings['no_decoder_final_norm']}, "
            f"stack versions {version('encoder'):g}/{version('decoder'):g}); our model has one setting for both."
        )
    return encoder


def key_map(config: VanillaTransformerConfig) -> list[KeyRule]:
    """fairseq name -> ours. Module names are the same below the stacks; only the prefix, the embeddings and the
    output projection differ. Tied fairseq tensors map to the one tensor our model keeps (checked equal)."""
    layer = r"(encoder|decoder)\.layers\.(\d+)\."
    attention = layer + r"(self_attn|encoder_attn)\."
    if config.share_encoder_decoder_embeddings:
        source_embedding = target_embedding = "model.shared.weight"
    else:
        source_embedding, target_embedding = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    output_projection = target_embedding if config.tie_word_embeddings else "lm_head.weight"
    return [
        # Buffers without weights: stack format versions (read before mapping) and the sinusoid table's dtype marker
        # (old checkpoints saved the table itself, which our model recomputes).
        (r"(encoder|decoder)\.version", None),
        (r"(encoder|decoder)\.embed_positions\.(_float_tensor|weights)", None),
        # fairseq 0.12's copies of each encoder layer's weights for its BetterTransformer path: fairseq refills them
        # from q/k/v_proj, out_proj, fc1 and fc2 whenever it loads a checkpoint, so they carry nothing of their own.
        (r"encoder\.layers\.\d+\.(in_proj|out_proj|fc1|fc2)_(weight|bias)", None),
        (r"(encoder|decoder)\.embed_positions\.weight", r"model.\1.embed_positions.weight"),
        (r"encoder\.embed_tokens\.weight", source_embedding),
        (r"decoder\.embed_tokens\.weight", target_embedding),
        (r"decoder\.(output_projection\.weight|embed_out)", output_projection),
        # fairseq < 0.7: one fused Q/K/V projection and numbered LayerNorms.
        (attention + r"in_proj_(weight|bias)", tuple(rf"model.\1.layers.\2.\3.{p}_proj.\4" for p in "qkv")),
        (r"encoder\.layers\.(\d+)\.layer_norms\.0\.(weight|bias)", r"model.encoder.layers.\1.self_attn_layer_norm.\2"),
        (r"encoder\.layers\.(\d+)\.layer_norms\.1\.(weight|bias)", r"model.encoder.layers.\1.final_layer_norm.\2"),
        (r"decoder\.layers\.(\d+)\.layer_norms\.0\.(weight|bias)", r"model.decoder.layers.\1.self_attn_layer_norm.\2"),
        (
            r"decoder\.layers\.(\d+)\.layer_norms\.1\.(weight|bias)",
            r"model.decoder.layers.\1.encoder_attn_layer_norm.\2",
        ),
        (r"decoder\.layers\.(\d+)\.layer_norms\.2\.(weight|bias)", r"model.decoder.layers.\1.final_layer_norm.\2"),
        (attention + r"(q_proj|k_proj|v_proj|out_proj)\.(weight|bias)", r"model.\1.layers.\2.\3.\4.\5"),
        (
            layer + r"(self_attn_layer_norm|encoder_attn_layer_norm|final_layer_norm|fc1|fc2)\.(weight|bias)",
            r"model.\1.layers.\2.\3.\4",
        ),
        (r"(encoder|decoder)\.layer_norm\.(weight|bias)", r"model.\1.layer_norm.\2"),
    ]


def vanilla_config(
    settings: dict[str, Any], source_vocab: int, target_vocab: int, final_layer_norm: bool
) -> VanillaTransformerConfig:
    """Our config for a checked fairseq model (`check_supported`)."""
    share_all = bool(settings["share_all_embeddings"])
    if share_all and source_vocab != target_vocab:
        raise ValueError(
            f"share_all_embeddings=True needs one dictionary, but the source has {source_vocab} entries and the "
            f"target {target_vocab}. Point `dict_dir` at the dictionaries the model was trained with."
        )
    learned = bool(settings["encoder_learned_pos"])
    return VanillaTransformerConfig(
        vocab_size=source_vocab,
        decoder_vocab_size=target_vocab,
        d_model=settings["encoder_embed_dim"],
        encoder_layers=settings["encoder_layers"],
        decoder_layers=settings["decoder_layers"],
        encoder_attention_heads=settings["encoder_attention_heads"],
        decoder_attention_heads=settings["decoder_attention_heads"],
        encoder_ffn_dim=settings["encoder_ffn_embed_dim"],
        decoder_ffn_dim=settings["decoder_ffn_embed_dim"],
        activation_function=ACTIVATIONS[settings["activation_fn"]],
        dropout=float(settings["dropout"]),
        attention_dropout=float(settings["attention_dropout"]),
        # fairseq's older name for activation dropout is relu_dropout; it uses whichever is set.
        activation_dropout=float(settings["activation_dropout"] or settings["relu_dropout"] or 0.0),
        scale_embedding=not settings["no_scale_embedding"],
        share_encoder_decoder_embeddings=share_all,
        tie_word_embeddings=share_all or bool(settings["share_decoder_input_output_embed"]),
        max_position_embeddings=max(settings["max_source_positions"], settings["max_target_positions"]),
        position_embedding_type="learned" if learned else "sinusoidal",
        sinusoidal_layout="fairseq",
        position_offset=PAD + 1,  # fairseq's make_positions: the first token is at padding_idx + 1
        normalize_before=bool(settings["encoder_normalize_before"]),
        add_final_layer_norm=final_layer_norm,
        layer_norm_eps=1e-5,  # fairseq's LayerNorm is torch's with its default eps
        bos_token_id=BOS,
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,  # fairseq's prev_output_tokens start with </s>
    )


# ---------------------------------------------------------------------------------------------------- dictionaries
def read_dictionary(path: Path) -> list[str]:
    """Symbols of a fairseq dict.txt by index: the four specials, then one `<token> <count> [#fairseq:overwrite]`
    line per entry, parsed as fairseq's `Dictionary.add_from_file` does."""
    symbols = list(SPECIAL_SYMBOLS)
    seen = set(symbols)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.rstrip().rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == "#fairseq:overwrite"
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise ValueError(f"{path}:{number}: expected '<token> <count> [#fairseq:overwrite]', got {line!r}.")
        word = fields[0]
        if word in seen:
            if not overwrite:
                raise ValueError(f"{path}:{number}: duplicate entry {word!r} (fairseq refuses it too).")
            raise NotImplementedError(
                f"{path}:{number}: {word!r} is overwritten (#fairseq:overwrite), which gives it two ids; a tokenizer "
                "vocabulary maps a string to one id."
            )
        symbols.append(word)
        seen.add(word)
    return symbols


def build_tokenizer(symbols: list[str], model_max_length: int) -> PreTrainedTokenizerFast:
    """fairseq's ids: whitespace-split (as fairseq's tokenize_line), </s> appended (as encode_line)."""
    return word_level_tokenizer(
        symbols, unk="<unk>", pad="<pad>", eos="</s>", bos="<s>", add_eos=True, model_max_length=model_max_length
    )


def locate(source: Path, checkpoint: str | None, dict_dir: Path | None) -> tuple[Path, Path]:
    """The checkpoint file and the folder of its dictionaries."""
    if source.is_file():
        path = source
    elif source.is_dir():
        names = [checkpoint] if checkpoint else CHECKPOINT_NAMES
        found = [source / name for name in names if (source / name).is_file()]
        if not found:
            present = ", ".join(sorted(p.name for p in source.glob("*.pt"))) or "none"
            raise FileNotFoundError(
                f"No {' or '.join(names)} in {source} (*.pt files there: {present}). Pass `checkpoint`, the file's "
                "name."
            )
        path = found[0]
    else:
        raise FileNotFoundError(f"{source} does not exist. Pass a fairseq checkpoint file or its folder.")
    if dict_dir is None:
        candidates = [path.parent, path.parent / "data-bin"]
        dict_dir = next((d for d in candidates if any(d.glob("dict.*.txt"))), None)
        if dict_dir is None:
            raise FileNotFoundError(
                f"No dict.<lang>.txt beside {path} or in its data-bin/. Pass `dict_dir` (fairseq-preprocess's "
                "destdir)."
            )
    return path, dict_dir


def dictionary_paths(
    dict_dir: Path, task: dict[str, Any], source_lang: str | None, target_lang: str | None
) -> tuple[Path, Path]:
    """dict.<source_lang>.txt and dict.<target_lang>.txt in `dict_dir`; languages default to the checkpoint's."""
    source_lang = source_lang or task.get("source_lang")
    target_lang = target_lang or task.get("target_lang")
    if not source_lang or not target_lang:
        raise ValueError(
            "The checkpoint does not name its languages (source_lang/target_lang). Pass `source_lang` and "
            f"`target_lang` to choose among {', '.join(sorted(p.name for p in dict_dir.glob('dict.*.txt')))}."
        )
    paths = dict_dir / f"dict.{source_lang}.txt", dict_dir / f"dict.{target_lang}.txt"
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found. Pass `dict_dir`, or `source_lang` and `target_lang`.")
    return paths


# ---------------------------------------------------------------------------------------------------- conversion
def load_fairseq(
    checkpoint: Path,
    dict_dir: Path,
    source_lang: str | None = None,
    target_lang: str | None = None,
    *,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_b: int = 200,
) -> Converted:
    """Convert a fairseq checkpoint and its dictionaries in memory (nothing is written), with fairseq-generate's
    decoding (`beam`, `lenpen`, `max_len_b`: `generation_config`)."""
    state = safe_torch_load(checkpoint, [argparse.Namespace])
    settings, fmt = model_settings(state, checkpoint)
    check_supported(settings)
    weights = state["model"]
    source_path, target_path = dictionary_paths(dict_dir, task_settings(state), source_lang, target_lang)
    source_symbols, target_symbols = read_dictionary(source_path), read_dictionary(target_path)
    for path, symbols, key in (
        (source_path, source_symbols, "encoder.embed_tokens.weight"),
        (target_path, target_symbols, "decoder.embed_tokens.weight"),
    ):
        rows = weights[key].shape[0] if key in weights else None
        if rows != len(symbols):
            raise ValueError(
                f"{path} defines {len(symbols)} symbols but `{key}` has {rows} rows. Use the dictionaries the model "
                "was trained with (fairseq-preprocess's destdir), or a task that adds no symbols."
            )
    config = vanilla_config(
        settings, len(source_symbols), len(target_symbols), has_final_layer_norm(settings, weights)
    )
    model = VanillaTransformerForConditionalGeneration(config)
    load_with_key_map(model, weights, key_map(config))
    tokenizers = {"": build_tokenizer(source_symbols, settings["max_source_positions"])}
    if target_symbols != source_symbols:
        tokenizers[TARGET_TOKENIZER] = build_tokenizer(target_symbols, settings["max_target_positions"])
    generation = generation_config(config, settings["max_target_positions"], beam, lenpen, max_len_b)
    facts = {
        "Source": f"fairseq checkpoint `{checkpoint.name}` ({fmt} format), sha256 `{sha256(checkpoint)}`",
        "Dictionaries": f"`{source_path.name}` ({len(source_symbols)}), `{target_path.name}` ({len(target_symbols)})",
        "fairseq arch": str(settings.get("arch") or settings.get("_name")),
        "Decoding defaults": f"fairseq-generate's: beam {generation.num_beams}, length penalty "
        f"{generation.length_penalty}, at most {generation.max_new_tokens} tokens (</s> included)",
    }
    notes = [
        "Token ids are the fairseq dictionary indices; inputs are whitespace-separated tokens (BPE'd as for fairseq).",
        "Pad on the right (the tokenizer does): positions count from the first token, as fairseq's do.",
    ]
    if TARGET_TOKENIZER in tokenizers:
        notes.append(f"Source and target dictionaries differ: decode outputs with `{TARGET_TOKENIZER}/`.")
    return Converted(model.eval(), generation, tokenizers, settings, facts, notes)


def generation_config(
    config: VanillaTransformerConfig,
    max_target_positions: int,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_b: int = 200,
) -> GenerationConfig:
    """fairseq-generate's decoding (module docstring) in transformers' terms. Like fairseq, output stops one token
    short of the decoder's position limit (max_target_positions) when max_len_b would go past it."""
    max_len = min(max_len_b, max_target_positions - 1)
    return token_generation_config(
        config,
        num_beams=beam,
        length_penalty=lenpen,
        early_stopping=True,  # fairseq finishes a sentence once `beam` hypotheses have ended
        max_new_tokens=max_len + 1,  # max_len tokens, then </s>
        forced_eos_token_id=config.eos_token_id,
        min_new_tokens=1,  # min_len 1: </s> is not allowed as the first token
        suppress_tokens=[config.pad_token_id],
    )


class FairseqEOSAtMaxLength(LogitsProcessor):
    """fairseq's end of a hypothesis at the length limit: as the `max_new_tokens`-th token only </s> stays possible,
    with its own log-probability. transformers' `forced_eos_token_id` gives </s> log-probability 0 there instead,
    which re-ranks beam hypotheses that reach the limit (greedy output is the same). Use it with
    `forced_eos_token_id=None`; one instance per `generate` call (it remembers the decoder prompt's length)."""

    def __init__(self, max_new_tokens: int, eos_token_id: int) -> None:
        self.max_new_tokens = max_new_tokens
        self.eos_token_id = eos_token_id
        self.prompt_length: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B * k, prompt + generated); scores (B * k, V)."""
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        if input_ids.shape[1] - self.prompt_length < self.max_new_tokens - 1:
            return scores
        limited = torch.full_like(scores, -math.inf)
        limited[:, self.eos_token_id] = scores[:, self.eos_token_id]
        return limited


def convert(options: FairseqOptions) -> Finished:
    """Convert, verify against `options.reference` when given, write the folder and check that it reloads exactly."""
    check_output(options)
    checkpoint, dict_dir = locate(options.source, options.checkpoint, options.dict_dir)
    converted = load_fairseq(
        checkpoint,
        dict_dir,
        options.source_lang,
        options.target_lang,
        beam=options.beam,
        lenpen=options.lenpen,
        max_len_b=options.max_len_b,
    )
    example = " ".join(converted.tokenizers[""].convert_ids_to_tokens(list(range(len(SPECIAL_SYMBOLS), 8))))
    return finish_against_reference(
        options,
        converted,
        source="fairseq",
        hint="no reference logits given; conversion/reference/make_fairseq_reference.py writes them",
        title="fairseq transformer in hf_vanilla_transformer",
        description="Converted with `python -m conversion fairseq` from a fairseq `transformer` checkpoint.",
        example=example,
        tokenizer_note="source side: pre-tokenized / BPE'd text, as for fairseq",
    )


__all__ = [
    "FairseqEOSAtMaxLength",
    "FairseqOptions",
    "convert",
    "generation_config",
    "key_map",
    "load_fairseq",
    "read_dictionary",
]
