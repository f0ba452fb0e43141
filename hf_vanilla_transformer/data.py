"""Parallel text for training and evaluation, as `datasets` objects with one `source` and one `target` column.

Three ways in, all giving the same columns:
- `load_multi30k(src_lang, tgt_lang)`: Multi30k task 1 (bundled in `data/multi30k/`, see its README for provenance
  and citation), any two of en / de / fr, either direction; splits `train` (29,000 pairs), `validation` (1,014) and
  `test` (test_2016_flickr, 1,000);
- `load_parallel_files(source_path, target_path)`: two text files (optionally .gz), one sentence per line, line i
  of one the translation of line i of the other;
- `from_dataset(dataset, src_lang, tgt_lang)`: an existing `datasets.Dataset` with a `translation` column of
  {lang: text} dicts (the Hub's convention, e.g. wmt14), one column per language, or `source` / `target` columns.

`tokenize_pairs` then tokenizes with a joint tokenizer (tokenization.py) and drops, explicitly and with a count in
the log, pairs with an empty side or with more than `max_length` tokens on a side (`</s>` included).
"""

from __future__ import annotations

import gzip
import logging
import zlib
from collections.abc import Iterator
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


def stream_lines(handle: BinaryIO, name: str) -> Iterator[str]:
    """The lines of the UTF-8 stream `handle` (e.g. stdin), decoded one at a time as they arrive, with the line
    ends, UTF-8 rule and error (naming `name` and the line) of `decode_lines`."""
    for number, line in enumerate(handle, start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            decode_lines(b"\n" * (number - 1) + line, name)  # raises decode_lines' error, with this line's number
            raise
        yield text.removesuffix("\n").removesuffix("\r")


def load_parallel_files(source_path: str | Path, target_path: str | Path) -> Dataset:
    """A `Dataset` with `source` / `target` columns from two line-aligned files (see `read_lines`)."""
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise ValueError(
            f"`{source_path}` has {len(sources)} lines but `{target_path}` has {len(targets)}; parallel files must "
            "have one line per sentence pair. Check that the two files belong together."
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


def from_dataset(dataset: Dataset, src_lang: str | None = None, tgt_lang: str | None = None) -> Dataset:
    """`source` / `target` columns from an existing `Dataset`: a `translation` column of {lang: text} dicts or one
    column per language (both need `src_lang` / `tgt_lang`), or `source` / `target` columns already."""
    if not isinstance(dataset, Dataset):
        raise ValueError(
            f"`dataset` must be a datasets.Dataset, got {type(dataset).__name__}. Pick a split, e.g. dataset['train']."
        )
    columns = dataset.column_names
    if src_lang is None and tgt_lang is None and {"source", "target"} <= set(columns):
        return dataset.select_columns(["source", "target"])
    if src_lang is None or tgt_lang is None:
        raise ValueError(
            f"`src_lang` and `tgt_lang` are needed to pick the languages from columns {columns}, got "
            f"src_lang={src_lang!r}, tgt_lang={tgt_lang!r}."
        )
    if "translation" in columns:
        pair = dataset[0]["translation"]
        for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if lang not in pair:
                raise ValueError(
                    f"`{name}` must be one of the languages {sorted(pair)} in `translation`, got {lang!r}."
                )
        return dataset.map(
            lambda batch: {
                "source": [pair[src_lang] for pair in batch["translation"]],
                "target": [pair[tgt_lang] for pair in batch["translation"]],
            },
            batched=True,
            remove_columns=columns,
        )
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if lang not in columns:
            raise ValueError(
                f"`{name}` must name a column of the dataset (or a language in its `translation` column), got "
                f"{lang!r}; the columns are {columns}."
            )
    return dataset.select_columns([src_lang, tgt_lang]).rename_columns({src_lang: "source", tgt_lang: "target"})


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
    "DEFAULT_MAX_LENGTH",
    "MULTI30K_LANGUAGES",
    "MULTI30K_SPLITS",
    "check_language_pair",
    "decode_lines",
    "from_dataset",
    "load_multi30k",
    "load_parallel_files",
    "read_lines",
    "stream_lines",
    "tokenize_pairs",
]
