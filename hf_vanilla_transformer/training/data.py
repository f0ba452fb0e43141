"""Parallel text for training, as `datasets` objects with one `source` and one `target` column.

Four ways in, all giving the same columns:
- `load_multi30k(src_lang, tgt_lang)` and `load_parallel_files(source_path, target_path)`: the bundled Multi30k and
  two line-aligned text files, from parallel_text.py (which evaluation reads test sets with too; imported here so
  that this module offers every way in);
- `load_dataset_pairs(name_or_path, ...)`: splits of a Hub dataset, a save_to_disk folder or a local
  json/jsonl/csv/parquet file, through `datasets`;
- `from_dataset(dataset, src_lang, tgt_lang)`: an existing `datasets.Dataset` with a `translation` column of
  {lang: text} dicts (the Hub's convention, e.g. wmt14), two text columns, or `source` / `target` columns.

`prepare_pairs` (and `tokenize_pairs`, its dataset alone) then tokenizes with a joint tokenizer (tokenization.py)
through `datasets.map` into a cached Arrow file, reused by a later call with the same data and tokenizer, and cleans
the corpus as fairseq / Moses `clean-corpus-n` users expect, with a count for each reason: pairs with an empty side,
with more than `max_length` tokens on a side (`</s>` included), and (optional) with a token-length ratio above
`max_length_ratio`. The lengths are kept as numpy arrays, so batching (training.TokenBudgetBatchSampler) and checks
never read the token columns into Python. `tokenizer_sample` picks the sentences a BPE is trained on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset, DatasetDict, Translation, Value, load_dataset, load_from_disk
from datasets.exceptions import DatasetGenerationError, DatasetsError
from datasets.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
from transformers import PreTrainedTokenizerBase

from ..parallel_text import (
    BOM,
    MULTI30K_DIR,
    MULTI30K_LANGUAGES,
    MULTI30K_SPLITS,
    LineStream,
    check_language_pair,
    decode_lines,
    iter_lines,
    load_multi30k,
    load_parallel_files,
    quiet_datasets,
    read_lines,
)
from .mapped_pages import PageReleaser, corpus_files, release_mapped_pages
from .options import DEFAULT_MAX_LENGTH, DEFAULT_TOKENIZER_SAMPLE

logger = logging.getLogger(__name__)

# Part of the names of the tokenized cache files: a change to what they hold must change it, so old caches are not
# reused.
_CACHE_VERSION = "1"
_BATCH = 10_000  # rows per batch when streaming a column


def _translation_columns(
    dataset: Dataset, src_lang: str | None, tgt_lang: str | None, name: str, row_name: Callable[[int], str]
) -> tuple[Dataset, tuple[str, str]]:
    """`dataset`'s `translation` column of {lang: text} dicts as one plain column per language, and the names of
    the source and target ones; a one-line ValueError (see `from_dataset`) where the column holds no such dicts or
    lacks a language."""
    feature = dataset.features["translation"]
    if not isinstance(feature, (Translation, dict)):
        # A row whose dict lacks a language can make `datasets` read the column as Json: name that row.
        for index, value in enumerate(dataset["translation"]):
            if not isinstance(value, dict):
                continue
            lang = next((lang for lang in (src_lang, tgt_lang) if lang not in value), None)
            if lang is not None:
                raise ValueError(
                    f"{name}: {row_name(index)} has no {lang!r} key in its `translation` dict (its keys: "
                    f"{', '.join(map(str, value)) or 'none'}). Add the {lang!r} text to that row, or remove the row."
                )
        raise ValueError(
            f"{name}: the `translation` column holds {feature}, not {{language: text}} dicts. Pass "
            "`src_column`/`tgt_column` naming two text columns instead."
        )
    languages = feature.languages if isinstance(feature, Translation) else list(feature)
    for option, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang not in languages:
            raise ValueError(
                f"{name}: the `translation` column has no language {lang!r} (its languages: "
                f"{', '.join(sorted(languages))}). Pass `{option}` with one of those."
            )
    # The dicts are an Arrow struct: flattening gives one plain column per language without a Python pass.
    return dataset.select_columns(["translation"]).flatten(), (f"translation.{src_lang}", f"translation.{tgt_lang}")


def from_dataset(
    dataset: Dataset,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_column: str | None = None,
    tgt_column: str | None = None,
    name: str = "the dataset",
    row_name: Callable[[int], str] = "row {}".format,
) -> Dataset:
    """`source` / `target` columns from an existing `Dataset`: a `translation` column of {lang: text} dicts (the
    Hub's convention, picked by `src_lang` / `tgt_lang`), two plain text columns (`src_column` / `tgt_column`,
    defaulting to the language codes), or `source` / `target` columns already (no languages given). Missing
    values (an empty csv cell, a language absent from one row's dict) become empty texts, which `tokenize_pairs`
    drops and counts. Problems raise a one-line ValueError naming `name` (the dataset and split), what it holds and
    the fix; a `translation` dict without a language is named by its row (`row_name`: 0-based index -> its name)."""
    if not isinstance(dataset, Dataset):
        raise ValueError(
            f"`dataset` must be a datasets.Dataset, got {type(dataset).__name__}. Pick a split, e.g. dataset['train']."
        )
    columns = dataset.column_names
    if src_lang is None and tgt_lang is None and src_column is None and tgt_column is None:
        if {"source", "target"} <= set(columns):
            return dataset.select_columns(["source", "target"])
        raise ValueError(
            f"{name}: the languages are needed to pick the source and target from its columns {columns}. Pass "
            "src_lang and tgt_lang (or src_column and tgt_column)."
        )
    if src_column is None and tgt_column is None and "translation" in columns:
        dataset, pair = _translation_columns(dataset, src_lang, tgt_lang, name, row_name)
        where = "the `translation` column's language"
    else:
        pair = (src_column or src_lang, tgt_column or tgt_lang)
        where = "column"
        for option, column in zip(("src_column", "tgt_column"), pair, strict=True):
            if column not in columns:
                raise ValueError(
                    f"{name} has no column {column!r} (its columns: {', '.join(columns)}). Pass `{option}` naming the "
                    "column that holds the "
                    + ("source" if option == "src_column" else "target")
                    + " sentences (the columns default to `src_lang`/`tgt_lang`)."
                )
        if pair[0] == pair[1]:
            raise ValueError(f"{name}: source and target are both column {pair[0]!r}. Pass two different columns.")
    for column in pair:
        feature = dataset.features[column]
        if not (isinstance(feature, Value) and feature.dtype in ("string", "large_string")):
            shown = column.removeprefix("translation.")
            raise ValueError(
                f"{name}: {where} {shown!r} holds {feature}, not text. Pass the columns that hold the sentences."
            )
    dataset = dataset.select_columns(list(pair)).rename_columns({pair[0]: "source", pair[1]: "target"})
    if any(dataset.data.column(column).null_count for column in ("source", "target")):
        dataset = dataset.map(
            lambda batch: {column: [text or "" for text in batch[column]] for column in ("source", "target")},
            batched=True,
        )
    return dataset


# A local data file's extension -> the `datasets` builder that reads it (a single file is the split "train").
DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def _flat(error: BaseException) -> str:
    """An error's message on one line: a generation error's cause (what the reader said), whitespace collapsed."""
    if isinstance(error, DatasetGenerationError) and error.__cause__ is not None:
        error = error.__cause__
    return " ".join(str(error).split())[:400] or type(error).__name__


def _first_bad_line(path: Path) -> str | None:
    """Where a json/jsonl/csv file that `datasets` could not read goes wrong, for the error message: the UTF-8 error
    (`decode_lines` raises it naming the line), else for JSON the first line that is not a JSON value (JSON lines)
    when the file is not one JSON document either. Read only once loading has failed."""
    lines = decode_lines(path.read_bytes(), str(path))
    if DATA_FILE_BUILDERS[path.suffix] != "json":
        return None
    try:
        json.loads("\n".join(lines))
        return None  # one JSON document: the problem is its shape, which the library's message names
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(lines, 1):
        try:
            if line.strip():
                json.loads(line)
        except json.JSONDecodeError as error:
            return f"line {number}, column {error.colno} is not valid JSON ({error.msg})"
    return None


def _load_raw_dataset(name_or_path: str | Path, config: str | None) -> DatasetDict:
    """The splits of `name_or_path`: a save_to_disk folder, a local data file or folder of them, or a Hub name."""
    path = Path(name_or_path)
    local = path.exists() or path.suffix in DATA_FILE_BUILDERS or str(name_or_path).startswith((".", "/", "~"))
    if local and config is not None:
        raise ValueError(
            f"`dataset_config={config}` picks a configuration of a Hub dataset, but {name_or_path} is a local "
            "path. Drop `dataset_config`."
        )
    if local and not path.exists():
        raise ValueError(
            f"`dataset` {name_or_path} does not exist. Check the path (a json/jsonl/csv/parquet file or a folder)."
        )
    if path.is_file() and path.suffix not in DATA_FILE_BUILDERS:
        raise ValueError(
            f"`dataset` {name_or_path} has the unknown file type {path.suffix or '(no extension)'!r}. Pass a "
            f"{'/'.join(suffix[1:] for suffix in DATA_FILE_BUILDERS)} file, a save_to_disk folder, or plain text "
            "files with `train_src`/`train_tgt`."
        )
    saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
    try:
        if saved:
            loaded = load_from_disk(str(path))
        elif path.is_file():
            loaded = load_dataset(DATA_FILE_BUILDERS[path.suffix], data_files={"train": str(path)})
        else:  # a folder of data files (train.jsonl, validation.jsonl, ...) or a Hub name
            loaded = load_dataset(str(name_or_path), config)
    except (DatasetsError, OSError, ValueError) as error:  # ArrowInvalid is a ValueError; offline an OSError
        where = _first_bad_line(path) if path.is_file() and path.suffix != ".parquet" else None
        if where is not None:
            raise ValueError(
                f"`dataset` {name_or_path}: {where}. Fix that line (a .jsonl file holds one JSON object per line)."
            ) from None
        what = "read" if local else "loaded from the Hub"
        fix = (
            f"Check that it is a valid {path.suffix[1:] or 'data'} file (json: one object per line for jsonl)."
            if local
            else "Check the name and `dataset_config`, and that the Hub is reachable (or pass a local file)."
        )
        raise ValueError(f"`dataset` {name_or_path} could not be {what}: {_flat(error)}. {fix}") from None
    return loaded if isinstance(loaded, DatasetDict) else DatasetDict({"train": loaded})


def load_dataset_pairs(
    name_or_path: str | Path,
    src_lang: str,
    tgt_lang: str,
    splits: dict[str, str],
    optional: tuple[str, ...] = (),
    config: str | None = None,
    src_column: str | None = None,
    tgt_column: str | None = None,
    progress: bool = True,
) -> dict[str, Dataset]:
    """`source` / `target` splits of a dataset, through `datasets.load_dataset` (the Hub name `name_or_path` with
    `config`, or a local folder of data files), `load_from_disk` (a save_to_disk folder), or a local
    json/jsonl/csv/parquet file (one split: `train`). `splits` maps each role (train, valid, test) to the split
    name that gives it; the roles in `optional` may be absent (then absent from the result). The columns are
    picked by `from_dataset`. Problems raise a one-line ValueError naming the dataset, what it has and the fix.
    `progress`: show `datasets`' progress bars (on stderr) while it reads and converts files."""
    shown = not are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        return _dataset_pairs(name_or_path, src_lang, tgt_lang, splits, optional, config, src_column, tgt_column)
    finally:
        if shown and not progress:
            enable_progress_bars()


def _dataset_pairs(
    name_or_path: str | Path,
    src_lang: str,
    tgt_lang: str,
    splits: dict[str, str],
    optional: tuple[str, ...],
    config: str | None,
    src_column: str | None,
    tgt_column: str | None,
) -> dict[str, Dataset]:
    """`load_dataset_pairs` without its progress-bar switch."""
    loaded = _load_raw_dataset(name_or_path, config)
    pairs = {}
    for role, split in splits.items():
        if split not in loaded:
            if role in optional:
                continue
            raise ValueError(
                f"`dataset` {name_or_path} has no split {split!r} (its splits: {', '.join(loaded)}). Pass "
                f"`{role}_split` with one of those."
            )
        pairs[role] = from_dataset(
            loaded[split],
            src_lang,
            tgt_lang,
            src_column,
            tgt_column,
            name=f"`dataset` {name_or_path} (split {split})",
            row_name=_jsonl_line_name(Path(name_or_path)) if str(name_or_path).endswith(".jsonl") else "row {}".format,
        )
    return pairs


def _jsonl_line_name(path: Path) -> Callable[[int], str]:
    """How `from_dataset` names a row of the jsonl file `path`: its 1-based line (the file read only then)."""

    def line(index: int) -> str:
        lines = decode_lines(path.read_bytes(), str(path))
        numbers = [number for number, text in enumerate(lines, 1) if text.strip()]  # `datasets` skips blank lines
        return f"line {numbers[index]}" if index < len(numbers) else f"row {index}"

    return line


@dataclass(frozen=True)
class Cleaning:
    """What `prepare_pairs` dropped, by reason; each pair is counted once, under the first reason that applies (an
    empty side, then `max_length`, then `max_length_ratio`)."""

    pairs: int
    empty: int
    too_long: int
    ratio: int
    max_length: int | None
    max_length_ratio: float | None

    @property
    def kept(self) -> int:
        return self.pairs - self.empty - self.too_long - self.ratio

    def summary(self) -> str:
        """One line with every count, for the log."""
        long = f"over `max_length={self.max_length}` tokens" if self.max_length is not None else "too long (no limit)"
        ratio = (
            f"over `max_length_ratio={self.max_length_ratio:g}`"
            if self.max_length_ratio is not None
            else "over a length ratio (`max_length_ratio` off)"
        )
        return (
            f"Cleaning: kept {self.kept:,} of {self.pairs:,} pairs; dropped {self.empty:,} with an empty side, "
            f"{self.too_long:,} {long}, {self.ratio:,} {ratio}"
        )


@dataclass(frozen=True)
class TokenizedPairs:
    """`prepare_pairs`' result: the kept pairs (`dataset`: source, target, input_ids, attention_mask, labels,
    source_length, target_length), their token counts (`</s>` included) as numpy arrays, what cleaning dropped, and
    the tokenized cache file (None for a dataset in memory) with whether it was reused."""

    dataset: Dataset
    source_lengths: np.ndarray
    target_lengths: np.ndarray
    cleaning: Cleaning
    cache_file: Path | None
    reused: bool


def _tokenizer_hash(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of everything that decides the token ids: a fast tokenizer's whole pipeline (normalizer,
    pre-tokenizer, model, post-processor), else the vocabulary and special tokens."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    state = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    state += json.dumps([type(tokenizer).__name__, tokenizer.all_special_tokens, tokenizer.split_special_tokens])
    return hashlib.sha256(state.encode()).hexdigest()[:24]


def _encode(batch: dict[str, list[str]], tokenizer: PreTrainedTokenizerBase, files: list[str]) -> dict[str, list]:
    encoded = dict(tokenizer(batch["source"], text_target=batch["target"]))
    release_mapped_pages(files)  # the text read so far is done with (mapped_pages.py)
    return {
        **encoded,
        "source_length": [len(ids) for ids in encoded["input_ids"]],
        "target_length": [len(ids) for ids in encoded["labels"]],
        "blank": [
            not (source.strip() and target.strip())
            for source, target in zip(batch["source"], batch["target"], strict=True)
        ],
    }


def _tokenized_cache(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, num_proc: int | None
) -> tuple[Path | None, bool, dict[str, Any]]:
    """The tokenized cache file of `dataset` and `tokenizer` (None for a dataset in memory), whether it (each of
    its `num_proc` shards) is there already, and the `datasets.map` arguments that write or reuse it."""
    if not dataset.cache_files:
        return None, False, {}
    fingerprint = hashlib.sha256(
        f"{_CACHE_VERSION} {dataset._fingerprint} {_tokenizer_hash(tokenizer)}".encode()
    ).hexdigest()[:24]
    cache_file = Path(dataset.cache_files[0]["filename"]).parent / f"tokenized-{fingerprint}.arrow"
    shards = (
        [cache_file]
        if not num_proc or num_proc == 1
        else [
            cache_file.with_name(f"{cache_file.stem}_{rank:05d}_of_{num_proc:05d}.arrow") for rank in range(num_proc)
        ]
    )
    reused = all(shard.is_file() for shard in shards)
    if reused:
        logger.info(f"Reusing tokenized cache {cache_file}")
    return (
        cache_file,
        reused,
        {"cache_file_name": str(cache_file), "new_fingerprint": fingerprint, "load_from_cache_file": True},
    )


def prepare_pairs(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    max_length_ratio: float | None = None,
    num_proc: int | None = None,
) -> TokenizedPairs:
    """Tokenize `dataset` (`source` / `target` columns) through `datasets.map` and clean it (see `Cleaning`).

    The tokenized columns (`input_ids`, `attention_mask` and `labels`, both sides ending in `</s>`, and each side's
    length) go to an Arrow file beside `dataset`'s own cache files, named after `dataset`'s fingerprint and the
    tokenizer's: a second call with the same data and tokenizer reuses it instead of tokenizing again (`reused`).
    A dataset held in memory is tokenized in memory. `num_proc` processes tokenize in parallel.

    Cleaning drops pairs with an empty (blank) side, unless `max_length` is None those with more than `max_length`
    tokens on either side, and unless `max_length_ratio` is None those whose longer side has more than
    `max_length_ratio` times the tokens of the shorter (`</s>` not counted; Moses' clean-corpus-n / fairseq's
    length-ratio filter, usually 1.5 to 9). Never truncates: a cut target would teach the model to stop
    mid-sentence. Raises a ValueError when no pair is left."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"`max_length` must be an integer >= 2 (a token and </s>) or None, got {max_length!r}.")
    if max_length_ratio is not None and (isinstance(max_length_ratio, bool) or not max_length_ratio >= 1):
        raise ValueError(
            f"`max_length_ratio` must be a number >= 1 (e.g. 1.5 to 9) or None, got {max_length_ratio!r}."
        )
    for column in ("source", "target"):
        if column not in dataset.column_names:
            raise ValueError(
                f"The dataset needs a `{column}` column, got columns {dataset.column_names}. Use from_dataset()."
            )
    dataset = dataset.select_columns(["source", "target"])
    cache_file, reused, options = _tokenized_cache(dataset, tokenizer, num_proc)
    with quiet_datasets():
        tokenized = dataset.map(
            _encode,
            batched=True,
            fn_kwargs={"tokenizer": tokenizer, "files": corpus_files(dataset)},
            num_proc=num_proc,
            **options,
        )
    source_lengths, target_lengths, blank = _numpy_columns(tokenized, ["source_length", "target_length", "blank"])
    longer = np.maximum(source_lengths, target_lengths)
    too_long = ~blank & (longer > max_length) if max_length is not None else np.zeros_like(blank)
    if max_length_ratio is not None:  # on the text's tokens: both sides end in one </s>
        shorter = np.minimum(source_lengths, target_lengths) - 1
        ratio = ~blank & ~too_long & (longer - 1 > max_length_ratio * np.maximum(shorter, 1))
    else:
        ratio = np.zeros_like(blank)
    keep = ~(blank | too_long | ratio)
    cleaning = Cleaning(
        len(tokenized), int(blank.sum()), int(too_long.sum()), int(ratio.sum()), max_length, max_length_ratio
    )
    if not cleaning.kept:
        raise ValueError(
            f"No sentence pair is left after dropping empty pairs and pairs longer than {max_length} tokens"
            + (f" or with a length ratio over {max_length_ratio:g}" if max_length_ratio is not None else "")
            + ". Check the data, or raise `max_length`."
        )
    if cleaning.kept < cleaning.pairs:
        tokenized = tokenized.select(np.flatnonzero(keep))
    return TokenizedPairs(
        tokenized.remove_columns("blank"),
        source_lengths[keep],
        target_lengths[keep],
        cleaning,
        cache_file,
        reused,
    )


def tokenize_pairs(
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    max_length_ratio: float | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """`prepare_pairs`' dataset alone, its cleaning counts logged (a warning) when it dropped pairs."""
    prepared = prepare_pairs(dataset, tokenizer, max_length, max_length_ratio, num_proc)
    if prepared.cleaning.kept < prepared.cleaning.pairs:
        logger.warning(prepared.cleaning.summary())
    return prepared.dataset


def pair_lengths(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's source and target token counts, from the `source_length` / `target_length` columns that
    `prepare_pairs` writes, else from the offsets of the `input_ids` / `labels` lists (Arrow, not Python lists)."""
    if {"source_length", "target_length"} <= set(dataset.column_names):
        return tuple(_numpy_columns(dataset, ["source_length", "target_length"]))
    table = dataset.select_columns(["input_ids", "labels"]).with_format("arrow")[:]
    return tuple(pc.list_value_length(table.column(name)).to_numpy() for name in ("input_ids", "labels"))


def _numpy_columns(dataset: Dataset, names: list[str]) -> list[np.ndarray]:
    """Scalar columns of `dataset` (its selected rows) as numpy arrays, read through Arrow without Python objects."""
    table = dataset.select_columns(names).with_format("arrow")[:]
    columns = [table.column(name).to_numpy() for name in names]
    release_mapped_pages(corpus_files(dataset))  # read across every record batch of the file (mapped_pages.py)
    return columns


def tokenizer_sample(dataset: Dataset, size: int, seed: int = 0) -> Iterator[str]:
    """The sentences a BPE is trained on: every source then every target sentence of `dataset` where they number
    `size` or fewer, else those of `size // 2` pairs drawn at random (`seed`: the same sample each time), streamed
    from the Arrow file rather than held in memory. A BPE learns its merges from word counts, which such a sample
    estimates well; training on all of a large corpus would take long and hold its whole vocabulary."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"`size` (`tokenizer_sample`) must be an integer >= 2 (a pair's two sides), got {size!r}.")
    pairs = dataset.select_columns(["source", "target"])
    if 2 * len(pairs) > size:
        rng = np.random.default_rng(seed)
        pairs = pairs.select(np.sort(rng.choice(len(pairs), size // 2, replace=False)))
    releaser = PageReleaser(dataset)  # each sampled sentence is read once (mapped_pages.py)
    for column in ("source", "target"):  # the order of training on all of it before samples existed
        for batch in pairs.select_columns([column]).iter(batch_size=_BATCH):
            yield from batch[column]
            releaser.read(len(batch[column]))


__all__ = [
    "BOM",
    "DATA_FILE_BUILDERS",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_TOKENIZER_SAMPLE",
    "MULTI30K_DIR",
    "MULTI30K_LANGUAGES",
    "MULTI30K_SPLITS",
    "Cleaning",
    "LineStream",
    "TokenizedPairs",
    "check_language_pair",
    "decode_lines",
    "from_dataset",
    "iter_lines",
    "load_dataset_pairs",
    "load_multi30k",
    "load_parallel_files",
    "pair_lengths",
    "prepare_pairs",
    "read_lines",
    "tokenize_pairs",
    "tokenizer_sample",
]
