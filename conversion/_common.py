"""The core every converter shares (design.md §6): a safe checkpoint loader, a declarative key map that refuses
leftover, missing and misshapen weights, a logit check that reports the max-abs difference, and the writer of a
Hub-ready folder (safetensors weights, config, generation config, tokenizer, model card)."""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from hf_vanilla_transformer.cpu_inference import plain_kernels
from hf_vanilla_transformer.files import replaced_folder

# One rule of a key map: a regular expression that must match a whole source key, and what the tensor becomes:
# a target key (backreferences like \1 allowed); a tuple of target keys, which splits the tensor into that many equal
# chunks along dim 0 (fused Q/K/V projections); or None, a key dropped on purpose (a buffer without weights).
KeyRule = tuple[str, str | tuple[str, ...] | None]


def safe_torch_load(path: str | os.PathLike, allowed_globals: Iterable[Any] = ()) -> Any:
    """`torch.load(weights_only=True)` with `allowed_globals` (e.g. `argparse.Namespace`) as the only classes
    allowed besides tensors and plain containers. Never a plain pickle load: a checkpoint is untrusted input.
    Raises ValueError naming the class the file needs when it holds anything else."""
    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path} holds Python objects that a weights-only load refuses ({error}). Checkpoints are loaded without "
            "running pickled code; re-save it with tensors and plain containers only (e.g. torch.save({'model': "
            "state_dict, 'cfg': plain_dict})), or add the class to the converter's allow-list if it is harmless."
        ) from error


def apply_key_map(
    source: Mapping[str, torch.Tensor], key_map: Sequence[KeyRule], expected: Mapping[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Rename (and split) `source` tensors by the first rule of `key_map` whose pattern matches the whole key.

    `expected` maps every key the target model needs to its shape. Raises ValueError on a source key no rule matches
    (a leftover: weights the converter does not understand), on a produced key the target lacks, on a needed key
    nothing produced, on a shape mismatch, and on two source tensors mapped to one key with different values
    (weights the source claims are tied but are not). Never drops a weight silently.
    """
    rules = [(re.compile(pattern), target) for pattern, target in key_map]
    mapped: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    leftovers = []
    for key, tensor in source.items():
        match, target = next(((m, t) for p, t in rules if (m := p.fullmatch(key))), (None, None))
        if match is None:
            leftovers.append(key)
            continue
        if target is None:
            continue
        targets = (target,) if isinstance(target, str) else target
        if tensor.shape[0] % len(targets):
            raise ValueError(
                f"`{key}` has shape {tuple(tensor.shape)}, which does not split into {len(targets)} equal parts "
                f"({', '.join(match.expand(t) for t in targets)}). The checkpoint is damaged or not of this format."
            )
        for name, piece in zip((match.expand(t) for t in targets), tensor.chunk(len(targets)), strict=True):
            if name in mapped and not torch.equal(mapped[name], piece):
                raise ValueError(
                    f"`{origin[name]}` and `{key}` both map to `{name}` (tied weights) but hold different values. "
                    "The checkpoint's sharing settings do not match its weights."
                )
            mapped[name], origin[name] = piece, key
    if leftovers:
        raise ValueError(
            f"{len(leftovers)} checkpoint tensor(s) match no rule of the key map: "
            f"{', '.join(sorted(leftovers)[:10])}. They belong to a feature this converter does not support; "
            "refusing rather than dropping them."
        )
    unexpected = sorted(set(mapped) - set(expected))
    if unexpected:
        raise ValueError(
            f"The checkpoint has weights the converted model has no place for: "
            f"{', '.join(f'{name} (from {origin[name]})' for name in unexpected[:10])}. The checkpoint's settings "
            "and its weights disagree (e.g. learned positions or a final LayerNorm without the setting)."
        )
    missing = sorted(set(expected) - set(mapped))
    if missing:
        raise ValueError(
            f"The checkpoint lacks weights the converted model needs: {', '.join(missing[:10])}. It is truncated, "
            "or its settings promise modules its weights do not have."
        )
    for name, tensor in mapped.items():
        if tensor.shape != expected[name]:
            raise ValueError(
                f"`{origin[name]}` has shape {tuple(tensor.shape)} but `{name}` needs {tuple(expected[name])}. "
                "The checkpoint's settings (dimensions, vocabulary sizes) do not match its weights."
            )
    return mapped


def load_with_key_map(model: PreTrainedModel, source: Mapping[str, torch.Tensor], key_map: Sequence[KeyRule]) -> None:
    """Fill `model` from `source` through `key_map`, every weight accounted for (`apply_key_map`), then a strict
    `load_state_dict`. Tied aliases (`model._tied_weights_keys`, alias -> source) are not expected from the key map:
    they receive their source tensor."""
    tied = dict(getattr(model, "_tied_weights_keys", None) or {})
    expected = {name: tensor.shape for name, tensor in model.state_dict().items() if name not in tied}
    state_dict = apply_key_map(source, key_map, expected)
    for alias, origin in tied.items():
        state_dict[alias] = state_dict[origin]
    model.load_state_dict(state_dict, strict=True)


def verify_logits(
    reference: torch.Tensor,
    ours: torch.Tensor,
    atol: float,
    *,
    mask: torch.Tensor | None = None,
    what: str = "logits",
) -> float:
    """Print and return max |reference - ours| over the positions where `mask` (B, T) is set (all without one);
    raise ValueError when it exceeds `atol`, is not finite, or the shapes differ."""
    if reference.shape != ours.shape:
        raise ValueError(f"{what}: shapes differ, reference {tuple(reference.shape)} vs ours {tuple(ours.shape)}.")
    diff = (reference.double() - ours.double()).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    max_diff = float(diff.max()) if diff.numel() else 0.0
    print(f"{what}: max |Δ| = {max_diff:.3e} over {diff.numel()} values (atol {atol:g})")
    if not max_diff <= atol:  # also catches NaN
        raise ValueError(
            f"{what}: max |Δ| = {max_diff:.3e} exceeds atol {atol:g}. The conversion is wrong (or atol is too tight "
            "for this dtype); the folder must not be used as an exact copy of the source model."
        )
    return max_diff


@torch.no_grad()
def reference_logits(
    model: PreTrainedModel, reference: str | os.PathLike, atol: float, atol_fp32: float, source: str = "upstream"
) -> dict[str, float]:
    """Our logits against the source implementation's, stored by its reference script (conversion/reference/,
    tests/conversion/fixtures/make_fixtures.py) as a safetensors file: float64 logits (`logits_fp64`, when stored)
    within `atol`, which tests the conversion itself; fp32 `logits` and, when stored, `log_probs` (what a
    log_softmax generator decodes with) within `atol_fp32`. Two fp32 implementations differ by their rounding
    alone. Padded target positions are not compared. Returns the max-abs differences by kind."""
    tensors = load_file(str(reference))
    inputs = {name: tensors[name] for name in ("input_ids", "attention_mask", "decoder_input_ids")}
    inputs["decoder_attention_mask"] = mask = tensors["decoder_attention_mask"]
    diffs = {}
    if "logits_fp64" in tensors:
        logits = copy.deepcopy(model).double()(**inputs).logits
        diffs["fp64"] = verify_logits(tensors["logits_fp64"], logits, atol, mask=mask, what=f"{source} vs ours, fp64")
    # The check measures the conversion, not a kernel choice: on a large trained model the packed CPU inference
    # path's rounding alone could approach the default atol_fp32.
    with plain_kernels():
        logits = model(**inputs).logits
    diffs["fp32"] = verify_logits(tensors["logits"], logits, atol_fp32, mask=mask, what=f"{source} vs ours, fp32")
    if "log_probs" in tensors:
        what = f"{source} vs ours, fp32 log-probabilities"
        log_probs = logits.log_softmax(-1)
        diffs["log_probs"] = verify_logits(tensors["log_probs"], log_probs, atol_fp32, mask=mask, what=what)
    return diffs


@torch.no_grad()
def check_written(model: PreTrainedModel, output: str | os.PathLike) -> None:
    """The written folder must reproduce the in-memory model exactly (tied weights saved once, buffers and tables
    recomputed on load)."""
    reloaded = type(model).from_pretrained(output).eval()
    config = model.config
    sample = {
        "input_ids": torch.arange(7)[None] % config.vocab_size,
        "decoder_input_ids": torch.tensor([[config.decoder_start_token_id, 0, 1, 2, 3]]) % config.decoder_vocab_size,
    }
    verify_logits(model(**sample).logits, reloaded(**sample).logits, 0.0, what=f"{output} vs converted model")


def sha256(path: str | os.PathLike) -> str:
    """Hex digest of a file, naming the exact source checkpoint in the model card."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def model_card(title: str, source: str, facts: Mapping[str, str], usage: str, notes: Sequence[str] = ()) -> str:
    """A short model card (Hub README.md): what the model is, where it comes from, how to use it."""
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: translation",
        "tags: [vanilla-transformer, converted]",
        "---",
        "",
        f"# {title}",
        "",
        source,
        "",
        "| | |",
        "|---|---|",
        *(f"| {name} | {value} |" for name, value in facts.items()),
        "",
        "## Usage",
        "",
        "```python",
        usage.strip(),
        "```",
    ]
    if notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def write_folder(
    output_dir: str | os.PathLike,
    model: PreTrainedModel,
    generation_config: GenerationConfig,
    card: str,
    tokenizers: Mapping[str, PreTrainedTokenizerFast] | None = None,
) -> Path:
    """Write a Hub-ready folder: safetensors weights, config.json, generation_config.json, README.md, and each
    tokenizer in `tokenizers` under its relative subfolder ("" = the folder itself). Returns the folder."""
    model.generation_config = generation_config
    with replaced_folder(output_dir) as folder:  # written beside OUTPUT_DIR, then moved in: no half-written files
        model.save_pretrained(folder)  # safetensors; transformers 5 writes no pickle
        for subfolder, tokenizer in (tokenizers or {}).items():
            tokenizer.save_pretrained(folder / subfolder)
        (folder / "README.md").write_text(card, encoding="utf-8")
    return Path(output_dir)


__all__ = [
    "KeyRule",
    "apply_key_map",
    "check_written",
    "load_with_key_map",
    "model_card",
    "reference_logits",
    "safe_torch_load",
    "sha256",
    "verify_logits",
    "write_folder",
]
