"""What the converters of plain-PyTorch models share (nn_transformer.py, annotated.py): a state dict found in a
checkpoint, vocabularies saved as itos lists, the check of a stored sinusoid table, their common options
(`PytorchOptions`), and the tail (`finish_pytorch`: the shared step of `_common.finish` with the upstream code's
reference logits)."""

from __future__ import annotations

import json
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
    finish_against_reference,
    load_with_key_map,
    word_level_tokenizer,
)

# Where training scripts commonly nest the state dict inside a checkpoint dict.
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model")
# The special tokens whose ids a state dict does not record (`PytorchOptions.<role>_id`).
SPECIAL_ROLES = ("unk", "pad", "bos", "eos")


@dataclass(frozen=True, kw_only=True)
class PytorchOptions(ReferenceOptions):
    """What both converters of plain-PyTorch models take: `source` is `torch.save(model.state_dict())`; a state
    dict does not record the heads or the special tokens' ids; `reference` is the teacher_forced.safetensors of
    tests/conversion/fixtures/make_fixtures.py. Each format gives the ids its upstream code uses as defaults."""

    heads: int  # attention heads
    dropout: float = 0.1  # the model's dropout, for fine-tuning
    # The vocabularies' itos (`vocab.get_itos()`), a JSON list or one token a line: each writes a word-level
    # tokenizer for whitespace-separated pre-tokenized text. None: the folder has no tokenizer on that side.
    src_vocab: Path | None = None
    tgt_vocab: Path | None = None
    unk_id: int
    pad_id: int
    bos_id: int
    eos_id: int


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


def tokenizers_for(
    options: PytorchOptions, rows: tuple[int, int], max_length: int
) -> dict[str, PreTrainedTokenizerFast]:
    """Tokenizers from `src_vocab` / `tgt_vocab` (none without them); each must have its embedding's size. Words
    are whitespace-separated (pre-tokenized input, e.g. spaCy tokens joined by spaces), each sentence wrapped in
    bos ... eos as the upstream data pipelines do."""
    ids = {role: getattr(options, f"{role}_id") for role in SPECIAL_ROLES}
    tokenizers: dict[str, PreTrainedTokenizerFast] = {}
    sides = (("", options.src_vocab, rows[0]), (TARGET_TOKENIZER, options.tgt_vocab, rows[1]))
    for subfolder, path, size in sides:
        if path is None:
            continue
        symbols = read_vocabulary(path)
        if len(symbols) != size:
            raise ValueError(f"{path} has {len(symbols)} tokens but the embedding it belongs to has {size} rows.")
        names = {role: symbols[index] for role, index in ids.items()}
        tokenizers[subfolder] = word_level_tokenizer(
            symbols, **names, add_bos=True, add_eos=True, model_max_length=max_length
        )
    return tokenizers


def converted(
    options: PytorchOptions,
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
    tokenizers = tokenizers_for(options, rows, config.max_position_embeddings)
    return Converted(model.eval(), generation_config, tokenizers, facts=facts)


def finish_pytorch(options: PytorchOptions, converted: Converted, title: str, description: str) -> Finished:
    """Verify against `options.reference` when given, write the folder with its model card, check that it reloads
    exactly (`_common.finish`)."""
    tokenizers = converted.tokenizers
    if TARGET_TOKENIZER in tokenizers:
        converted.notes.append(f"Decode outputs with the target tokenizer in `{TARGET_TOKENIZER}/`.")
    example = None
    if "" in tokenizers:
        example = " ".join(tokenizers[""].convert_ids_to_tokens(list(range(4, min(8, tokenizers[""].vocab_size)))))
    return finish_against_reference(
        options,
        converted,
        source="the upstream code",
        hint="no reference logits given; tests/conversion/fixtures/make_fixtures.py shows how to write them",
        title=title,
        description=description,
        example=example,
        tokenizer_note="pre-tokenized words, space-separated",
    )
