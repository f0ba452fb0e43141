"""Parallel text for training and evaluation, as `datasets` objects with one `source` and one `target` column.

Four ways in, all giving the same columns:
- `load_multi30k(src_lang, tgt_lang)`: Multi30k task 1 (bundled in `data/multi30k/`, see its README for provenance
  and citation), any two of en / de / fr, either direction; splits `train` (29,000 pairs), `validation` (1,014) and
  `test` (test_2016_flickr, 1,000);
- `load_parallel_files(source_path, target_path)`: two text files (optionally .gz), one sentence per line, line i
  of one the translation of line i of the other;
- `load_dataset_pairs(name_or_path, ...)`: splits of a Hub dataset, a save_to_disk folder or a local
  json/jsonl/csv/parquet file, through `datasets`;
- `from_dataset(dataset, src_lang, tgt_lang)`: an existing `datasets.Dataset` with a `translation` column of
  {lang: text} dicts (the Hub's convention, e.g. wmt14), two text columns, or `source` / `target` columns.

`tokenize_pairs` then tokenizes with a joint tokenizer (tokenization.py) and drops, explicitly and with a count in
the log, pairs with an empty side or with more than `max_length` tokens on a side (`</s>` included).
"""

from __future__ import annotations

import collections
import gzip
import json
import logging
import os
import select
import zlib
from pathlib import Path
from typing import BinaryIO

from datasets import Dataset, DatasetDict
from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

MULTI30K_DIR = Path(__file__).parent / "data" / "multi30k"
MULTI30K_LANGUAGES = ("en", "de", "fr")
# Split name in `datasets` convention -> file stem in data/multi30k/.
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
# Longest side kept for training, in tokens with </s>. Multi30k's longest sentence is far shorter (under 100 tokens
# with the 8k BPE: 54), so the default drops nothing there; it guards memory on other corpora.
DEFAULT_MAX_LENGTH = 256


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines of UTF-8 `data` without their line ends. Only "\\n" (and a "\\r" before it: CRLF files) ends a
    line: other Unicode line separators inside a sentence stay part of it. Bytes that are not UTF-8 raise a
    ValueError naming `name` (a file, or stdin) and the line, rather than reaching the tokenizer as garbage."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{name} is not UTF-8 text: line {line} has the byte 0x{data[error.start]:02x}, which UTF-8 does not "
            "allow there. Convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or fix that line."
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if it ends in .gz), as `decode_lines` splits them. A file that is not
    UTF-8, or a damaged .gz, raises a ValueError naming the file (and the line)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist or is not a file. Check the path (one sentence per line).")
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as handle:
                data = handle.read()
        except (OSError, EOFError, zlib.error) as error:  # BadGzipFile is an OSError; a truncated file an EOFError
            raise ValueError(
                f"{path} is not a readable gzip file ({error}): it is truncated or damaged. Copy or download it "
                "again, or pass the uncompressed file."
            ) from None
    else:
        data = path.read_bytes()
    return decode_lines(data, str(path))


class LineStream:
    """The lines of the UTF-8 stream `handle` (e.g. stdin), decoded one at a time as they arrive, with the line ends,
    UTF-8 rule and error (naming `name` and the line) of `decode_lines`. `ready()` says, without waiting, whether a
    next line (or the end) is there already: what lets `translate` answer a line piped in at once and still batch a
    burst of lines. A handle without a file descriptor (in memory) is always ready."""

    def __init__(self, handle: BinaryIO, name: str) -> None:
        self._handle, self._name = handle, name
        try:
            self._fd: int | None = handle.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both an OSError and a ValueError
            self._fd = None
        self._lines: collections.deque[bytes] = collections.deque()
        self._partial = b""
        self._ended = False
        self._number = 0

    def _read(self) -> None:
        # os.read returns what the pipe holds now (at least a byte): a buffered read would wait to fill its buffer.
        data = os.read(self._fd, 1 << 16) if self._fd is not None else self._handle.read1(1 << 16)
        if not data:
            self._ended = True
            if self._partial:  # a last line without its "\n"
                self._lines.append(self._partial)
            return
        *complete, self._partial = (self._partial + data).split(b"\n")
        self._lines.extend(complete)

    def ready(self) -> bool:
        if self._fd is None:
            return True
        while not self._lines and not self._ended and select.select([self._fd], [], [], 0)[0]:
            self._read()
        return bool(self._lines) or self._ended

    def __iter__(self) -> LineStream:
        return self

    def __next__(self) -> str:
        while not self._lines:
            if self._ended:
                raise StopIteration
            self._read()
        line = self._lines.popleft()
        self._number += 1
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            decode_lines(b"\n" * (self._number - 1) + line, self._name)  # raises its error, with this line's number
            raise
        return text.removesuffix("\r")


def load_parallel_files(source_path: str | Path, target_path: str | Path) -> Dataset:
    """A `Dataset` with `source` / `target` columns from two line-aligned files (see `read_lines`)."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"`{source_path}` has {len(sources)} lines but `{target_path}` has {len(targets)}: line "
            f"{min(len(sources), len(targets)) + 1} of `{source_path if len(sources) > len(targets) else target_path}`"
            " is the first without a partner; parallel files must have one line per sentence pair. Check that the "
            "two files belong together."
        )
    if not sources:
        raise ValueError(f"`{source_path}` is empty. Pass files with at least one sentence pair.")
    return Dataset.from_dict({"source": sources, "target": targets})


def check_language_pair(src_lang: str, tgt_lang: str, languages: tuple[str, ...] = MULTI30K_LANGUAGES) -> None:
    """Raise a ValueError unless `src_lang` and `tgt_lang` are two different codes from `languages`."""
    for name, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if value not in languages:
            raise ValueError(
                f"`{name}` must be one of {', '.join(languages)} for Multi30k, got {value!r}. For other languages "
                "pass your own parallel files (--train-src/--train-tgt on the command line)."
            )
    if src_lang == tgt_lang:
        raise ValueError(f"`src_lang` and `tgt_lang` must differ, got {src_lang!r} for both.")


def load_multi30k(
    src_lang: str = "en", tgt_lang: str = "de", splits: tuple[str, ...] = tuple(MULTI30K_SPLITS)
) -> DatasetDict:
    """Multi30k task 1 from the bundled files: a `DatasetDict` of the requested `splits` (train / validation /
    test), each with `source` (in `src_lang`) and `target` (in `tgt_lang`) columns."""
    check_language_pair(src_lang, tgt_lang)
    unknown = [split for split in splits if split not in MULTI30K_SPLITS]
    if unknown:
        raise ValueError(f"`splits` must be drawn from {', '.join(MULTI30K_SPLITS)}, got {unknown}.")
    return DatasetDict(
        {
            split: load_parallel_files(
                MULTI30K_DIR / f"{MULTI30K_SPLITS[split]}.{src_lang}.gz",
                MULTI30K_DIR / f"{MULTI30K_SPLITS[split]}.{tgt_lang}.gz",
            )
            for split in splits
        }
    )


def from_dataset(
    dataset: Dataset,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    src_column: str | None = None,
    tgt_column: str | None = None,
    name: str = "the dataset",
) -> Dataset:
    """`source` / `target` columns from an existing `Dataset`: a `translation` column of {lang: text} dicts (the
    Hub's convention, picked by `src_lang` / `tgt_lang`), two plain text columns (`src_column` / `tgt_column`,
    defaulting to the language codes), or `source` / `target` columns already (no languages given). Missing
    values (an empty csv cell, a language absent from one row's dict) become empty texts, which `tokenize_pairs`
    drops and counts. Problems raise a one-line ValueError naming `name` (the dataset and split), what it holds and
    the fix."""
    from datasets import Translation, Value

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
        feature = dataset.features["translation"]
        if not isinstance(feature, (Translation, dict)):
            raise ValueError(
                f"{name}: the `translation` column holds {feature}, not {{language: text}} dicts. Pass "
                "--src-column/--tgt-column naming two text columns instead."
            )
        languages = feature.languages if isinstance(feature, Translation) else list(feature)
        for option, lang in (("--src-lang", src_lang), ("--tgt-lang", tgt_lang)):
            if lang not in languages:
                raise ValueError(
                    f"{name}: the `translation` column has no language {lang!r} (its languages: "
                    f"{', '.join(sorted(languages))}). Pass {option} with one of those."
                )
        # The dicts are an Arrow struct: flattening gives one plain column per language without a Python pass.
        dataset = dataset.select_columns(["translation"]).flatten()
        pair = (f"translation.{src_lang}", f"translation.{tgt_lang}")
        where = "the `translation` column's language"
    else:
        pair = (src_column or src_lang, tgt_column or tgt_lang)
        where = "column"
        for option, column in zip(("--src-column", "--tgt-column"), pair, strict=True):
            if column not in columns:
                raise ValueError(
                    f"{name} has no column {column!r} (its columns: {', '.join(columns)}). Pass {option} naming the "
                    "column that holds the "
                    + ("source" if option == "--src-column" else "target")
                    + " sentences (the columns default to --src-lang/--tgt-lang)."
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
    from datasets.exceptions import DatasetGenerationError

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
    from datasets import load_dataset, load_from_disk
    from datasets.exceptions import DatasetsError

    path = Path(name_or_path)
    local = path.exists() or path.suffix in DATA_FILE_BUILDERS or str(name_or_path).startswith((".", "/", "~"))
    if local and config is not None:
        raise ValueError(
            f"`--dataset-config {config}` picks a configuration of a Hub dataset, but {name_or_path} is a local "
            "path. Drop --dataset-config."
        )
    if local and not path.exists():
        raise ValueError(
            f"`--dataset` {name_or_path} does not exist. Check the path (a json/jsonl/csv/parquet file or a folder)."
        )
    if path.is_file() and path.suffix not in DATA_FILE_BUILDERS:
        raise ValueError(
            f"`--dataset` {name_or_path} has the unknown file type {path.suffix or '(no extension)'!r}. Pass a "
            f"{'/'.join(suffix[1:] for suffix in DATA_FILE_BUILDERS)} file, a save_to_disk folder, or plain text "
            "files with --train-src/--train-tgt."
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
                f"`--dataset` {name_or_path}: {where}. Fix that line (a .jsonl file holds one JSON object per line)."
            ) from None
        what = "read" if local else "loaded from the Hub"
        fix = (
            f"Check that it is a valid {path.suffix[1:] or 'data'} file (json: one object per line for jsonl)."
            if local
            else "Check the name and --dataset-config, and that the Hub is reachable (or pass a local file)."
        )
        raise ValueError(f"`--dataset` {name_or_path} could not be {what}: {_flat(error)}. {fix}") from None
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
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

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
                f"`--dataset` {name_or_path} has no split {split!r} (its splits: {', '.join(loaded)}). Pass "
                f"--{role}-split with one of those."
            )
        pairs[role] = from_dataset(
            loaded[split],
            src_lang,
            tgt_lang,
            src_column,
            tgt_column,
            name=f"`--dataset` {name_or_path} (split {split})",
        )
    return pairs


def tokenize_pairs(
    dataset: Dataset, tokenizer: PreTrainedTokenizerBase, max_length: int | None = DEFAULT_MAX_LENGTH
) -> Dataset:
    """Add `input_ids`, `attention_mask` and `labels` (both sides end in `</s>`) and drop pairs with an empty side
    or, unless `max_length` is None, with more than `max_length` tokens on either side. Never truncates: a cut
    target would teach the model to stop mid-sentence."""
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
        raise ValueError(f"`max_length` must be an integer >= 2 (a token and </s>) or None, got {max_length!r}.")
    for column in ("source", "target"):
        if column not in dataset.column_names:
            raise ValueError(
                f"The dataset needs a `{column}` column, got columns {dataset.column_names}. Use from_dataset()."
            )

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        return dict(tokenizer(batch["source"], text_target=batch["target"]))

    def keep(batch: dict[str, list]) -> list[bool]:
        kept = []
        for source, target, source_ids, labels in zip(
            batch["source"], batch["target"], batch["input_ids"], batch["labels"], strict=True
        ):
            too_long = max_length is not None and max(len(source_ids), len(labels)) > max_length
            kept.append(bool(source.strip()) and bool(target.strip()) and not too_long)
        return kept

    encoded = dataset.map(encode, batched=True)
    filtered = encoded.filter(keep, batched=True)
    dropped = len(encoded) - len(filtered)
    if dropped:
        logger.warning(
            f"Dropped {dropped} of {len(encoded)} pairs with an empty side or more than {max_length} tokens on a side."
        )
    if not len(filtered):
        raise ValueError(
            f"No sentence pair is left after dropping empty pairs and pairs longer than {max_length} tokens. "
            "Check the data, or raise `max_length`."
        )
    return filtered


__all__ = [
    "DATA_FILE_BUILDERS",
    "DEFAULT_MAX_LENGTH",
    "MULTI30K_LANGUAGES",
    "MULTI30K_SPLITS",
    "LineStream",
    "check_language_pair",
    "decode_lines",
    "from_dataset",
    "load_dataset_pairs",
    "load_multi30k",
    "load_parallel_files",
    "read_lines",
    "tokenize_pairs",
]
