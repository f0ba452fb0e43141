"""The core every converter shares: a safe checkpoint loader, a declarative key map that refuses leftover, missing
and misshapen weights, the logit checks against the source's outputs with one tolerance policy (`ATOL_FP64`,
`ATOL_FP32`), the options every format's typed options extend (`CommonOptions`), one in-memory type (`Converted`),
one tokenizer builder, one usage snippet builder, and the one step that ends every conversion and export (`finish`):
write the folder beside OUTPUT_DIR, verify it, add its model card (through the `model_card` package), swap it in
atomically, reload it and check it again. It returns what it did (`Finished`); the command line prints that."""

from __future__ import annotations

import copy
import hashlib
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.files import MODEL_LAYOUT, TARGET_TOKENIZER, check_output_folder, replaced_folder
from hf_vanilla_transformer.hub_metadata import check_license, check_repo_id
from model_card import render_converted_card

# One rule of a key map: a regular expression that must match a whole source key, and what the tensor becomes:
# a target key (backreferences like \1 allowed); a tuple of target keys, which splits the tensor into that many equal
# chunks along dim 0 (fused Q/K/V projections); or None, a key dropped on purpose (a buffer without weights).
KeyRule = tuple[str, str | tuple[str, ...] | None]


_ZIP_MAGIC = b"PK\x03\x04"


def _check_archive(path: Path) -> None:
    """Refuse an empty, truncated or damaged checkpoint before torch reads it. A `.pt` of torch >= 1.6 is a zip
    archive with a CRC-32 per member: reading every member verifies them (one pass over the file), so a flipped or
    zeroed byte inside a tensor is caught rather than converted into silently wrong weights. Legacy (pre-zip)
    files have no checksum; their truncation surfaces when torch reads them."""
    with path.open("rb") as file:
        magic = file.read(len(_ZIP_MAGIC))
    if not magic:
        raise ValueError(f"{path} is empty (0 bytes). Re-download or re-copy the checkpoint.")
    if magic != _ZIP_MAGIC:
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        raise ValueError(
            f"{path} is damaged (truncated or not a complete zip archive: {error}). Re-download or re-copy it."
        ) from error
    if damaged is not None:
        raise ValueError(
            f"{path} is damaged: the CRC-32 of its member `{damaged}` does not match its data (a corrupted copy or "
            "download). Re-download or re-copy it."
        )


def safe_torch_load(path: str | os.PathLike, allowed_globals: Iterable[Any] = ()) -> Any:
    """`torch.load(weights_only=True)` with `allowed_globals` (e.g. `argparse.Namespace`) as the only classes
    allowed besides tensors and plain containers. Never a plain pickle load: a checkpoint is untrusted input.
    The archive's checksums are verified first (`_check_archive`). Raises ValueError naming the file when it is
    empty, truncated or damaged, and naming the class the file needs when it holds anything else."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; pass the checkpoint file itself (e.g. {path / 'model.pt'}).")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist. Check the path of the checkpoint file.")
    _check_archive(path)
    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights only load failed" not in str(error).lower():
            raise ValueError(f"{path} is damaged ({error}). Re-download or re-copy it.") from error
        raise ValueError(
            f"{path} holds Python objects that a weights-only load refuses ({error}). Checkpoints are loaded without "
            "running pickled code; re-save it with tensors and plain containers only (e.g. torch.save({'model': "
            "state_dict, 'cfg': plain_dict})), or add the class to the converter's allow-list if it is harmless."
        ) from error
    except (EOFError, RuntimeError) as error:  # a truncated legacy file; torch's zip reader on a broken archive
        raise ValueError(f"{path} is damaged or truncated ({error}). Re-download or re-copy it.") from error


def check_weights(weights: Mapping[str, torch.Tensor], origin: Mapping[str, str] | None = None) -> None:
    """Refuse weights no trained model has, which a damaged source or a converter bug would otherwise carry into a
    folder that loads fine: a NaN or an infinity anywhere, or a weight matrix (a linear or embedding layer's
    `.weight`, 2 or more dimensions) of exact zeros, which would silence its layer. Biases and LayerNorm parameters
    may legitimately be all zero and are not checked for it. Raises ValueError naming the first offending weight
    (and the source tensor it came from, by `origin`: target name -> source key)."""
    for name, tensor in weights.items():
        if not tensor.is_floating_point():
            continue
        what = f"`{name}`" + (f" (from `{origin[name]}`)" if origin and name in origin else "")
        if not torch.isfinite(tensor).all():
            count = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"Weight {what} holds {count} non-finite value(s) (NaN or inf). The source checkpoint is damaged "
                "or diverged in training; convert a checkpoint from before the divergence."
            )
        if name.endswith(".weight") and tensor.dim() >= 2 and tensor.numel() and not tensor.any():
            raise ValueError(
                f"Weight {what} {tuple(tensor.shape)} is all zeros, which no trained layer is. The source "
                "checkpoint is damaged or was saved before its weights were loaded; convert the trained checkpoint."
            )


def apply_key_map(
    source: Mapping[str, torch.Tensor], key_map: Sequence[KeyRule], expected: Mapping[str, torch.Size]
) -> dict[str, torch.Tensor]:
    """Rename (and split) `source` tensors by the first rule of `key_map` whose pattern matches the whole key.

    `expected` maps every key the target model needs to its shape. Raises ValueError on a source key no rule matches
    (a leftover: weights the converter does not understand), on a produced key the target lacks, on a needed key
    nothing produced, on a shape mismatch, and on two source tensors mapped to one key with different values
    (weights the source claims are tied but are not), and on NaN, inf or an all-zero weight matrix
    (`check_weights`, naming the source key). Never drops a weight silently.
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
    check_weights(mapped, origin)
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
    """Max |reference - ours| over the positions where `mask` (B, T) is set (all without one); raises ValueError
    naming `what` when it exceeds `atol`, is not finite, or the shapes differ."""
    if reference.shape != ours.shape:
        raise ValueError(f"{what}: shapes differ, reference {tuple(reference.shape)} vs ours {tuple(ours.shape)}.")
    diff = (reference.double() - ours.double()).abs()
    if mask is not None:
        diff = diff[mask.bool()]
    max_diff = float(diff.max()) if diff.numel() else 0.0
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
    logits = model(**inputs).logits
    diffs["fp32"] = verify_logits(tensors["logits"], logits, atol_fp32, mask=mask, what=f"{source} vs ours, fp32")
    if "log_probs" in tensors:
        what = f"{source} vs ours, fp32 log-probabilities"
        log_probs = logits.log_softmax(-1)
        diffs["log_probs"] = verify_logits(tensors["log_probs"], log_probs, atol_fp32, mask=mask, what=what)
    return diffs


def sample_inputs(config: PretrainedConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three right-padded source rows and decoder inputs behind the start token, avoiding <pad> elsewhere: the
    inputs on which a model is compared with a live source model or with its own reloaded folder."""
    generator = torch.Generator().manual_seed(seed)
    pad = config.pad_token_id

    def tokens(vocab_size: int, shape: tuple[int, int]) -> torch.Tensor:
        ids = torch.randint(0, vocab_size - 1, shape, generator=generator)
        return ids + (ids >= pad).long()  # skip <pad>

    input_ids = tokens(config.vocab_size, (3, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    decoder_input_ids = tokens(config.decoder_vocab_size, (3, 7))
    decoder_input_ids[:, 0] = config.decoder_start_token_id
    return {
        "input_ids": input_ids.masked_fill(attention_mask == 0, pad),
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
    }


@torch.no_grad()
def check_written(model: PreTrainedModel, output: str | os.PathLike) -> None:
    """The written folder must reproduce the in-memory model exactly (tied weights saved once, buffers and tables
    recomputed on load)."""
    reloaded = type(model).from_pretrained(output, dtype=torch.float32).eval()
    inputs = sample_inputs(model.config)
    expected, found = model(**inputs).logits, reloaded(**inputs).logits
    verify_logits(expected, found, 0.0, what=f"{output} vs converted model")


def sha256(path: str | os.PathLike) -> str:
    """Hex digest of a file, naming the exact source checkpoint in the model card."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------- tolerance policy
# The largest max-abs logit difference to the source's outputs that a conversion may show before it is refused, the
# same for every format (`SourceOptions.atol`, `CommonOptions.atol_fp32`).
#
# float64, 1e-5: run in float64, a right conversion leaves only the source's own float32 steps: ~1e-15 against
# MarianMTModel (all float64), 2.6e-7 to 4.4e-7 against the stored fp64 logits of fairseq (its softmax stays
# float32), OpenNMT-py, nn.Transformer and the Annotated Transformer. A wrong one (a misplaced or transposed weight,
# another LayerNorm or position layout) moves logits by O(0.1 to 10): 5.6 for nn.LayerNorm in place of the Annotated
# one. 1e-5 sits twenty times above the first, four orders below the second.
#
# float32, 1e-4: two float32 implementations sum in different orders, which alone moves a logit by a few float32 ulps
# of its size times the depth: measured 1.4e-6 to 4.3e-6 (fp32 logits and log-probabilities of the tiny OpenNMT-py,
# nn.Transformer, Annotated and Marian fixtures), 1.9e-5 on the fairseq sym2math model (|logit| up to 28), and ~6e-5
# on a random base-size model exported to Marian, whose residual-stream permutation reorders every sum. 1e-4 admits
# all of these and is still three orders below a conversion error. Tests that measure a tighter bound pass it.
ATOL_FP64 = 1e-5
ATOL_FP32 = 1e-4


# ------------------------------------------------------------------------------------------------- the options
@dataclass(frozen=True)
class CommonOptions:
    """What every conversion takes; each format's options extend it with the settings its source needs. Errors
    about an option name its field in backquotes (`output_dir`), which the command line words as its flag."""

    source: Path  # the checkpoint file or model folder to convert
    output_dir: Path  # the folder to write: new or empty, or a model folder of this package's (`check_output`)
    _: KW_ONLY
    atol_fp32: float = ATOL_FP32  # largest accepted float32 logit / log-probability difference to the source
    base_model: str | None = None  # the source's Hub repository id, recorded as the card's base_model
    license: str | None = None  # the Hub license id of the converted weights; None: the source card's, if any
    license_name: str | None = None  # with `license=other`: the terms' kebab-case name

    def __post_init__(self) -> None:
        # A caller's "model.pt" is as good as Path("model.pt"), as on the command line.
        for option in fields(self):
            value = getattr(self, option.name)
            if isinstance(value, str) and "Path" in str(option.type):
                object.__setattr__(self, option.name, Path(value))
        # The values the card writes, as the Hub takes them: refused now, not after the conversion's work.
        if self.base_model is not None:
            check_repo_id(self.base_model)
        if self.license is not None or self.license_name is not None:
            check_license(self.license, self.license_name)


def check_output(options: CommonOptions) -> None:
    """Refuse (OptionError, naming `output_dir`) an OUTPUT_DIR that the conversion may not write, before it reads
    anything: one that is, holds or lies inside an input (`source`, or any other path among the options: a
    reference, a vocabulary, a dictionary folder), the current folder, or a folder holding files that are not a
    model folder's of this package (files.check_output_folder). Every format's `convert` calls it first, `finish`
    again before writing."""
    inputs = [(item.name, getattr(options, item.name)) for item in fields(options) if item.name != "output_dir"]
    paths = [(name, value) for name, value in inputs if isinstance(value, Path)]
    check_output_folder(options.output_dir, "output_dir", MODEL_LAYOUT, paths)


@dataclass(frozen=True, kw_only=True)
class SourceOptions(CommonOptions):
    """A conversion verified against its source in float64 as well (every format but the float32 ONNX export)."""

    atol: float = ATOL_FP64  # largest accepted float64 logit difference to the source


@dataclass(frozen=True, kw_only=True)
class ReferenceOptions(SourceOptions):
    """A conversion verified against the teacher-forced logits that its source's reference script stored."""

    reference: Path | None = None  # teacher_forced.safetensors; None: the conversion is written unverified


# -------------------------------------------------------------------------------------- the converted result
@dataclass
class Converted:
    """A checkpoint converted in memory (nothing written yet): what `finish` writes, verifies and reloads."""

    model: PreTrainedModel  # in eval mode: ours, or a MarianMTModel for `to-marian`
    generation_config: GenerationConfig  # the source's own decoding
    tokenizers: dict[str, PreTrainedTokenizerFast] = field(default_factory=dict)  # by subfolder, "" = the folder
    settings: dict[str, Any] = field(default_factory=dict)  # the source's settings as read
    facts: dict[str, str] = field(default_factory=dict)  # about the source, for the model card's table
    notes: list[str] = field(default_factory=list)  # for the model card's notes
    languages: list[str] = field(default_factory=list)  # source and target, for the card's metadata, when known
    source_metadata: dict[str, Any] = field(default_factory=dict)  # the source's own card (source_card_metadata)


# A source-specific comparison of the converted model (and of the folder written so far, which the ONNX export's
# graphs are run from) with the expected outputs: the max-abs differences by kind ("fp64", "fp32", "log_probs"),
# raising ValueError above its bounds.
Compare = Callable[[PreTrainedModel, Path], dict[str, float]]


@dataclass(frozen=True)
class SourceCheck:
    """Source-specific verification: who computed the expected outputs and how ours are compared with them."""

    source: str  # e.g. "fairseq", "MarianMTModel"
    compare: Compare | None  # None: nothing to compare with
    evidence: str = ""  # where the expected outputs come from, named in the card
    hint: str = ""  # how to get them, named in the card when there are none


def reference_check(reference: Path | None, source: str, hint: str, atol: float, atol_fp32: float) -> SourceCheck:
    """The check against teacher-forced logits that the source's reference script stored (`reference_logits`,
    within `atol` / `atol_fp32`); without a file, a check that reports the conversion as unverified, with `hint` on
    how to get one."""
    if reference is None:
        return SourceCheck(source, None, hint=hint)

    def compare(model: PreTrainedModel, folder: Path) -> dict[str, float]:
        return reference_logits(model, reference, atol, atol_fp32, source)

    return SourceCheck(source, compare, evidence=f"`{reference.name}`")


@dataclass(frozen=True)
class CardText:
    """What a converter says in its folder's model card besides the facts, notes and tables `finish` fills in."""

    title: str  # after the folder's name
    description: str
    usage: str  # Python code
    decoding_note: str = ""  # below the decoding table: what a runtime keeps of the generation config
    library_name: str = "transformers"  # the Hub's library of the folder's files
    tags: tuple[str, ...] = ()  # besides translation, vanilla-transformer and converted


@dataclass(frozen=True)
class Finished:
    """What `finish` wrote and measured. `str()` is the command line's report."""

    output_dir: Path
    model: PreTrainedModel  # the model the folder holds (for the ONNX export: the one its graphs compute)
    verification: str  # as the card states it: the measured differences and their evidence, or why none
    differences: dict[str, float]  # max-abs differences to the source by kind; empty when not verified
    copied: tuple[str, ...] = ()  # files copied from the source as they are

    def __str__(self) -> str:
        copied = f" (files copied: {', '.join(self.copied)})" if self.copied else ""
        return f"Verification: {self.verification}\nWrote {self.output_dir}{copied}"


def word_level_tokenizer(
    symbols: Sequence[str],
    *,
    unk: str,
    pad: str,
    eos: str,
    bos: str | None = None,
    add_bos: bool = False,
    add_eos: bool = False,
    model_max_length: int,
) -> PreTrainedTokenizerFast:
    """A tokenizer that keeps the source's ids: whitespace-split words (the sources' data is tokenized, or BPE'd,
    before it reaches the model) to their index in `symbols`, unknown words to `unk`, each sentence wrapped in
    `bos` ... `eos` as far as `add_bos` / `add_eos` ask, as the source's data pipeline does. Right padding: our
    positions count from the first token, as the sources' do."""
    ids = {symbol: index for index, symbol in enumerate(symbols)}
    backend = Tokenizer(models.WordLevel(ids, unk_token=unk))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    added = [token for token, wanted in ((bos, add_bos), (eos, add_eos)) if wanted and token is not None]
    if added:
        template = " ".join([bos] * (bos in added) + ["$A"] + [eos] * (eos in added))
        backend.post_processor = processors.TemplateProcessing(
            single=template, special_tokens=[(token, ids[token]) for token in added]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        unk_token=unk,
        padding_side="right",
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids, which generate() would refuse
    )


def usage_snippet(
    output: Path,
    example: str | None,
    *,
    tokenizer_note: str = "",
    target_tokenizer: bool = False,
    model_class: str = "AutoModelForSeq2SeqLM",
    after: Sequence[str] = (),
) -> str:
    """The model card's code example: load the folder, tokenize `example` (None: the folder has no tokenizer, so
    token ids are passed), generate, decode with the target tokenizer's subfolder when `target_tokenizer`."""
    lines = []
    if model_class == "AutoModelForSeq2SeqLM":
        lines.append("import hf_vanilla_transformer  # registers the architecture with the Auto classes")
    lines += [f"from transformers import AutoTokenizer, {model_class}", ""]
    lines.append(f'model = {model_class}.from_pretrained("{output}")')
    if example is None:
        lines += ["input_ids = ...  # the source token ids of the original vocabulary", "model.generate(input_ids)"]
        return "\n".join([*lines, *after])
    note = f"  # {tokenizer_note}" if tokenizer_note else ""
    lines.append(f'tokenizer = AutoTokenizer.from_pretrained("{output}"){note}')
    decoder = "tokenizer"
    if target_tokenizer:
        lines.append(f'target_tokenizer = AutoTokenizer.from_pretrained("{output}", subfolder="{TARGET_TOKENIZER}")')
        decoder = "target_tokenizer"
    lines += [
        f'batch = tokenizer(["{example}"], return_tensors="pt", padding=True)',
        f"print({decoder}.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        *after,
    ]
    return "\n".join(lines)


def token_generation_config(config: PretrainedConfig, **decoding: Any) -> GenerationConfig:
    """A generation config with the source's `decoding` settings and the model's special token ids."""
    return GenerationConfig(
        **decoding,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )


def finish(
    converted: Converted,
    options: CommonOptions,
    check: SourceCheck,
    card: CardText,
    *,
    card_config: PretrainedConfig | None = None,
    write_model: Callable[[Path], None] | None = None,
    extra_files: Callable[[Path], list[str]] | None = None,
) -> Finished:
    """The one step every format ends with. OUTPUT_DIR is checked again (`check_output`: files may have appeared
    since), and weights with NaN, inf or an all-zero matrix are refused (`check_weights`). The folder is written
    beside `options.output_dir`: the model (`save_pretrained`: safetensors, config, generation config; or
    `write_model(folder)`, the ONNX graphs), the tokenizers, the files `extra_files(folder)` writes; then
    `converted.model` is verified against the source's outputs (`check`, which may read the folder), and the model
    card states the measured differences, `card`'s text and, from `options`, `base_model` and `license`. Only then
    is the folder swapped in whole (`replaced_folder`, with a manifest listing what was written): a failed check
    leaves OUTPUT_DIR as it was. Saved weights are reloaded and must reproduce the model exactly (`check_written`).
    The card's architecture table is `card_config` (default: the model's own config, when it is ours)."""
    model, output_dir = converted.model, options.output_dir
    check_output(options)
    check_weights(model.state_dict())
    model.generation_config = converted.generation_config
    copied: list[str] = []
    with replaced_folder(output_dir) as folder:  # written beside OUTPUT_DIR, then swapped in whole: never a mix
        if write_model is None:
            model.save_pretrained(folder)  # safetensors; transformers 5 writes no pickle
        else:
            write_model(folder)
        for subfolder, tokenizer in converted.tokenizers.items():
            tokenizer.save_pretrained(folder / subfolder)
        if extra_files is not None:
            copied = extra_files(folder)
        differences = {} if check.compare is None else check.compare(model, folder)
        converted.facts["Verification"] = verification = _verification(check, differences)
        card_config = card_config or model.config
        render_converted_card(
            f"{output_dir.name}: {card.title}",
            card.description,
            converted.facts,
            card.usage,
            converted.notes,
            config=card_config.to_dict() if isinstance(card_config, VanillaTransformerConfig) else None,
            generation=converted.generation_config.to_diff_dict(),
            decoding_note=card.decoding_note,
            library_name=card.library_name,
            tags=card.tags,
            source=check.source,
            license=options.license,
            license_name=options.license_name,
            base_model=options.base_model,
            source_metadata=converted.source_metadata,
            languages=converted.languages,
        ).save(folder / "README.md")
    if write_model is None:
        check_written(model, output_dir)
    return Finished(output_dir, model, verification, differences, tuple(copied))


def _verification(check: SourceCheck, differences: Mapping[str, float]) -> str:
    """The card's (and the report's) verification line: the measured differences and their evidence, or why none."""
    if check.compare is None:
        return f"none against {check.source} ({check.hint})"
    measured = ", ".join(f"{diff:.1e} ({kind})" for kind, diff in differences.items())
    return f"max abs logit difference to {check.source}: {measured}, on {check.evidence}"


def finish_against_reference(
    options: ReferenceOptions,
    converted: Converted,
    *,
    source: str,
    hint: str,
    title: str,
    description: str,
    example: str | None,
    tokenizer_note: str,
) -> Finished:
    """`finish` for a converter verified against the teacher-forced logits its source stored (`options.reference`;
    None: unverified, `hint` says how to get them) within `options.atol` / `atol_fp32`; the card's usage example
    tokenizes `example` (`usage_snippet`)."""
    usage = usage_snippet(
        options.output_dir,
        example,
        tokenizer_note=tokenizer_note,
        target_tokenizer=TARGET_TOKENIZER in converted.tokenizers,
    )
    check = reference_check(options.reference, source, hint, options.atol, options.atol_fp32)
    return finish(converted, options, check, CardText(title, description, usage))


__all__ = [
    "ATOL_FP32",
    "ATOL_FP64",
    "TARGET_TOKENIZER",
    "CardText",
    "CommonOptions",
    "Compare",
    "Converted",
    "Finished",
    "KeyRule",
    "ReferenceOptions",
    "SourceCheck",
    "SourceOptions",
    "apply_key_map",
    "check_output",
    "check_weights",
    "check_written",
    "finish",
    "finish_against_reference",
    "load_with_key_map",
    "reference_check",
    "reference_logits",
    "safe_torch_load",
    "sample_inputs",
    "sha256",
    "token_generation_config",
    "usage_snippet",
    "verify_logits",
    "word_level_tokenizer",
]
