"""What the converters of plain-PyTorch models share (nn_transformer.py, annotated.py): a state dict found in a
checkpoint, vocabularies saved as itos lists, word-level tokenizers, the check of a stored sinusoid table, the check
against the upstream code's logits, and the command-line tail (verify, write the folder, reload it)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GenerationConfig, PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.modeling_vanilla_transformer import sinusoid_table

from ._common import (
    KeyRule,
    check_written,
    load_with_key_map,
    model_card,
    reference_logits,
    write_folder,
)

# Where training scripts commonly nest the state dict inside a checkpoint dict.
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")
TARGET_TOKENIZER = "target_tokenizer"


@dataclass
class Converted:
    """A checkpoint converted in memory."""

    model: VanillaTransformerForConditionalGeneration  # in eval mode
    generation_config: GenerationConfig  # the upstream code's own decoding
    tokenizers: dict[str, PreTrainedTokenizerFast] = field(default_factory=dict)  # by subfolder, "" = source
    facts: dict[str, str] = field(default_factory=dict)  # about the source, for the model card


def state_dict_from(checkpoint: Any, path: Path) -> dict[str, torch.Tensor]:
    """The tensors of `torch.save(model.state_dict())`, or of a dict holding it under a usual key."""

    def is_state_dict(value: Any) -> bool:
        return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())

    if is_state_dict(checkpoint):
        return dict(checkpoint)
    if isinstance(checkpoint, dict):
        for key in STATE_DICT_KEYS:
            if is_state_dict(checkpoint.get(key)):
                return dict(checkpoint[key])
    raise ValueError(
        f"{path} holds no state dict: expected the tensors of `torch.save(model.state_dict(), path)`, or a dict with "
        f"them under one of {', '.join(STATE_DICT_KEYS)}. Save the model's state_dict(), not the module."
    )


def layer_count(weights: dict[str, torch.Tensor], prefix: str) -> int:
    """Number of layers `prefix.<i>.` present (indices must run 0..n-1; a gap means a damaged checkpoint)."""
    indices = {int(key[len(prefix) :].split(".", 1)[0]) for key in weights if key.startswith(prefix)}
    if not indices or indices != set(range(len(indices))):
        raise ValueError(f"Layers `{prefix}<i>` are missing or not numbered 0..n-1 (found {sorted(indices)}).")
    return len(indices)


def same_tensor(weights: dict[str, torch.Tensor], first: str, second: str) -> bool:
    """Whether two weights are one (tied): same shape and same values."""
    a, b = weights.get(first), weights.get(second)
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def check_position_table(table: torch.Tensor, name: str, atol: float = 1e-3) -> None:
    """A stored (max_len, d_model) table must be §3.5's interleaved sinusoids from position 0, which our model
    recomputes. Upstream computes it in float32 (angle error ~ position x 6e-8); atol covers that, not a different
    layout or base (differences of order 1)."""
    expected = sinusoid_table(table.shape[0], table.shape[1], "interleaved")
    diff = float((table.double() - expected.double()).abs().max())
    if not diff <= atol:
        raise NotImplementedError(
            f"`{name}` is not the interleaved sin/cos table of §3.5 starting at position 0 (max |Δ| = {diff:.2e} "
            "from it); hf_vanilla_transformer would compute different positions."
        )


def read_vocabulary(path: Path) -> list[str]:
    """Tokens by id: a JSON list of strings (`json.dump(vocab.get_itos(), f)`), or one token a line (tokens with
    whitespace need the JSON form)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        symbols = json.loads(text)
        if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
            raise ValueError(f"{path}: expected a JSON list of token strings (the vocabulary's itos).")
    else:
        symbols = text.splitlines()
    seen: dict[str, int] = {}
    for index, symbol in enumerate(symbols):
        if symbol in seen:
            raise ValueError(f"{path}: token {symbol!r} appears twice (ids {seen[symbol]} and {index}).")
        seen[symbol] = index
    return symbols


def word_level_tokenizer(symbols: list[str], ids: dict[str, int], model_max_length: int) -> PreTrainedTokenizerFast:
    """Whitespace-split words to the vocabulary's ids (pre-tokenized input, e.g. spaCy tokens joined by spaces),
    unknown words to unk, each sentence wrapped in bos ... eos as the upstream data pipelines do. Right padding."""
    names = {role: symbols[index] for role, index in ids.items()}
    backend = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token=names["unk"]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{names['bos']} $A {names['eos']}",
        special_tokens=[(names["bos"], ids["bos"]), (names["eos"], ids["eos"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=names["bos"],
        eos_token=names["eos"],
        pad_token=names["pad"],
        unk_token=names["unk"],
        padding_side="right",
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids, which generate() would refuse
    )


def tokenizers_for(
    args: argparse.Namespace, rows: tuple[int, int], ids: dict[str, int], max_length: int
) -> dict[str, PreTrainedTokenizerFast]:
    """Tokenizers from --src-vocab / --tgt-vocab (none without them); each must have its embedding's size."""
    tokenizers: dict[str, PreTrainedTokenizerFast] = {}
    for subfolder, path, size in (("", args.src_vocab, rows[0]), (TARGET_TOKENIZER, args.tgt_vocab, rows[1])):
        if path is None:
            continue
        symbols = read_vocabulary(path)
        if len(symbols) != size:
            raise ValueError(f"{path} has {len(symbols)} tokens but the embedding it belongs to has {size} rows.")
        tokenizers[subfolder] = word_level_tokenizer(symbols, ids, max_length)
    return tokenizers


def converted(
    args: argparse.Namespace,
    weights: dict[str, torch.Tensor],
    config: VanillaTransformerConfig,
    key_map: list[KeyRule],
    generation_config: GenerationConfig,
    facts: dict[str, str],
) -> Converted:
    """Our model with `weights` loaded through `key_map` (leftover or missing keys refused), and the tokenizers."""
    model = VanillaTransformerForConditionalGeneration(config)
    load_with_key_map(model, weights, key_map)
    rows = (config.vocab_size, config.decoder_vocab_size)
    ids = {"unk": args.unk_id, "pad": args.pad_id, "bos": args.bos_id, "eos": args.eos_id}
    tokenizers = tokenizers_for(args, rows, ids, config.max_position_embeddings)
    return Converted(model.eval(), generation_config, tokenizers, facts)


def add_common_arguments(parser: argparse.ArgumentParser, what: str, ids: dict[str, int]) -> None:
    """SOURCE, OUTPUT_DIR and the options both converters take."""
    parser.add_argument("source", type=Path, help=f"The checkpoint: torch.save(model.state_dict()) of {what}.")
    parser.add_argument("output", type=Path, help="The folder to write the converted model to.")
    parser.add_argument(
        "--heads", type=int, required=True, help="Attention heads (a state dict does not record them)."
    )
    parser.add_argument("--dropout", type=float, default=0.1, help="The model's dropout (for fine-tuning; 0.1).")
    for side in ("src", "tgt"):
        parser.add_argument(
            f"--{side}-vocab",
            type=Path,
            help=f"The {side} vocabulary's itos (`vocab.get_itos()`), a JSON list or one token a line: writes a "
            "word-level tokenizer for whitespace-separated pre-tokenized text.",
        )
    for role, default in ids.items():
        parser.add_argument(f"--{role}-id", type=int, default=default, help=f"Id of <{role}> (default {default}).")
    parser.add_argument(
        "--reference",
        type=Path,
        help="teacher_forced.safetensors from tests/conversion/fixtures/make_fixtures.py: refuse the result unless "
        "its logits match the upstream code's within --atol (float64) and --atol-fp32.",
    )
    parser.add_argument("--atol", type=float, default=1e-5, help="Largest float64 logit difference (1e-5).")
    parser.add_argument("--atol-fp32", type=float, default=1e-5, help="Largest fp32 logit difference (1e-5).")


def finish(
    args: argparse.Namespace,
    converted: Converted,
    title: str,
    source: str,
    usage: Callable[[Path, dict[str, PreTrainedTokenizerFast]], str],
    notes: list[str],
) -> VanillaTransformerForConditionalGeneration:
    """Verify against --reference when given, write the folder with its model card, check that it reloads exactly."""
    model, facts = converted.model, converted.facts
    if args.reference is not None:
        diffs = reference_logits(model, args.reference, args.atol, args.atol_fp32)
        measured = ", ".join(f"{diff:.1e} ({kind})" for kind, diff in diffs.items())
        facts["Verification"] = f"max abs difference to the upstream code: {measured} (`{args.reference.name}`)"
    else:
        print("Not verified against the upstream code: pass --reference.")
        facts["Verification"] = "none against the upstream code (no --reference given)"
    config = model.config
    facts["Architecture"] = (
        f"{config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
        f"{config.encoder_attention_heads} heads, FFN {config.encoder_ffn_dim}, {config.activation_function}, "
        f"{'pre' if config.normalize_before else 'post'}-LN + final LayerNorms, vocabularies "
        f"{config.vocab_size}/{config.decoder_vocab_size}"
    )
    if TARGET_TOKENIZER in converted.tokenizers:
        notes.append(f"Decode outputs with the target tokenizer in `{TARGET_TOKENIZER}/`.")
    card = model_card(title, source, facts, usage(args.output, converted.tokenizers), notes)
    write_folder(args.output, model, converted.generation_config, card, converted.tokenizers)
    check_written(model, args.output)
    print(f"Wrote {args.output}")
    return model


def usage_example(output: Path, tokenizers: dict[str, PreTrainedTokenizerFast]) -> str:
    """The model card's code example."""
    lines = [
        "import hf_vanilla_transformer  # registers the architecture with the Auto classes",
        "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
        "",
        f'model = AutoModelForSeq2SeqLM.from_pretrained("{output}")',
    ]
    if "" in tokenizers:
        words = tokenizers[""].convert_ids_to_tokens(list(range(4, min(8, tokenizers[""].vocab_size))))
        target = f'"{output}", subfolder="{TARGET_TOKENIZER}"' if TARGET_TOKENIZER in tokenizers else f'"{output}"'
        lines += [
            f'tokenizer = AutoTokenizer.from_pretrained("{output}")  # pre-tokenized words, space-separated',
            f"target_tokenizer = AutoTokenizer.from_pretrained({target})",
            f'batch = tokenizer(["{" ".join(words)}"], return_tensors="pt", padding=True)',
            "print(target_tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        ]
    else:
        lines += ["input_ids = ...  # the source token ids of the original vocabulary", "model.generate(input_ids)"]
    return "\n".join(lines)
