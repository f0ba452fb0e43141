"""Parallel text as `datasets` objects with one `source` and one `target` column, read the same way for training and
for evaluation (both import this module; neither imports the other for it):
- `read_lines(path)` / `iter_lines(path)`: a UTF-8 text file (optionally .gz), one sentence per line; `LineStream`,
  the same lines of a stream (stdin) as they arrive;
- `load_parallel_files(source_path, target_path)`: two line-aligned files streamed into an Arrow file in the
  `datasets` cache (memory-mapped, so a corpus of any size is never held in memory; rebuilt when a file changes);
- `load_multi30k(src_lang, tgt_lang)`: Multi30k task 1 (bundled in `data/multi30k/`, see its README for provenance
  and citation), any two of en / de / fr, either direction; splits `train` (29,000 pairs), `validation` (1,014) and
  `test` (test_2016_flickr, 1,000).

`datasets` (the `train` and `eval` extras) is imported by the functions that make `datasets` objects: reading lines
(`translate`) needs none of it.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import hashlib
import json
import os
import select
import zlib
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

MULTI30K_DIR = Path(__file__).parent / "data" / "multi30k"
MULTI30K_LANGUAGES = ("en", "de", "fr")
# Split name in `datasets` convention -> file stem in data/multi30k/.
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
# Part of the names of the parallel files' cache files: a change to what they hold must change it.
_CACHE_VERSION = "1"
# The byte order mark that Windows editors (Notepad, Excel's "UTF-8 CSV") put at the start of a UTF-8 file: a mark
# of the encoding, not text, so the line readers drop it there (elsewhere it is a zero-width no-break space).
BOM = "\ufeff"


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


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (gzipped if it ends in .gz), one at a time, split as `decode_lines` splits
    them, without a byte order mark at the start of the file (`BOM`). A file that is not UTF-8 (file and line
    number), or a damaged .gz, raises a ValueError naming the file."""
    path = Path(path)
    if not path.exists() or path.is_dir():  # a pipe (bash's `<(...)`, a FIFO) is fine: read once, front to back
        raise FileNotFoundError(f"{path} does not exist or is not a file. Check the path (one sentence per line).")
    number = 0
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            # Binary lines end at b"\n" only, as decode_lines splits; a UTF-8 character never contains that byte.
            for number, raw in enumerate(handle, 1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path} is not UTF-8 text: line {number} has the byte 0x{raw[error.start]:02x}, which UTF-8 "
                        "does not allow there. Convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or fix that line."
                    ) from None
                text = text.removeprefix(BOM) if number == 1 else text
                yield text.removesuffix("\n").removesuffix("\r")
    except (OSError, EOFError, zlib.error) as error:  # BadGzipFile is an OSError; a truncated file an EOFError
        raise ValueError(
            f"{path} is not a readable gzip file ({error}): it is truncated or damaged (after line {number}). Copy "
            "or download it again, or pass the uncompressed file."
        ) from None


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file (gzipped if it ends in .gz) as a list: `iter_lines`, for files that are small
    enough to hold (a test set); training files go through `load_parallel_files`."""
    return list(iter_lines(path))


class LineStream:
    """The lines of the UTF-8 stream `handle` (e.g. stdin), decoded one at a time as they arrive, with the line ends,
    UTF-8 rule and error (naming `name` and the line) of `decode_lines`, without a `BOM` at the start. `ready()`
    says, without waiting, whether a next line (or the end) is there already: what lets `translate` answer a line
    piped in at once and still batch a burst of lines. A handle without a file descriptor (in memory) is always
    ready."""

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
        return (text.removeprefix(BOM) if self._number == 1 else text).removesuffix("\r")


def _parallel_lines(source_path: str, target_path: str) -> Iterator[dict[str, str]]:
    """The pairs of two line-aligned files, checked as they stream: an empty file, or line counts that differ
    (counted to the end of the longer file), raise a ValueError naming the file."""
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    count = 0
    for count, (source, target) in enumerate(zip_longest(sources, targets), 1):
        if source is None or target is None:  # one file ended at line `count`: count the other to its end
            shorter, longer, rest = (
                (source_path, target_path, targets) if source is None else (target_path, source_path, sources)
            )
            if count == 1:
                raise ValueError(f"`{shorter}` is empty. Pass files with at least one sentence pair.")
            raise ValueError(
                f"`{longer}` has {count + sum(1 for _ in rest)} lines but `{shorter}` has {count - 1}: line "
                f"{count} of `{longer}` has no counterpart. Parallel files need one line per sentence pair; check "
                "that the two files belong together (a sentence split or joined across lines shifts every line "
                "after it)."
            )
        yield {"source": source, "target": target}
    if count == 0:
        raise ValueError(f"`{source_path}` is empty. Pass files with at least one sentence pair.")


@contextlib.contextmanager
def quiet_datasets() -> Iterator[None]:
    """No `datasets` progress bars (they would add lines to the CLI's one-line errors); restores the setting."""
    from datasets.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


def load_parallel_files(
    source_path: str | Path, target_path: str | Path, cache_dir: str | Path | None = None
) -> Dataset:
    """A `Dataset` with `source` / `target` columns from two line-aligned files (see `iter_lines`), streamed into an
    Arrow file in the `datasets` cache (`cache_dir`, default: HF_DATASETS_CACHE) and memory-mapped from there. The
    cache is named after the files' paths, sizes and modification times: changing a file builds it again.

    Raises a ValueError naming the file for an empty file, line counts that differ (both counts and the first line
    past the shorter file), bytes that are not UTF-8 (and the line) and a damaged .gz."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    paths = [Path(source_path).resolve(), Path(target_path).resolve()]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist or is not a file. Check the path (one sentence per line).")
    stamp = json.dumps([_CACHE_VERSION, *[(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]])
    fingerprint = "parallel-" + hashlib.sha256(stamp.encode()).hexdigest()[:24]
    try:
        with quiet_datasets():
            return Dataset.from_generator(
                _parallel_lines,
                gen_kwargs={"source_path": str(source_path), "target_path": str(target_path)},
                cache_dir=None if cache_dir is None else str(cache_dir),
                fingerprint=fingerprint,
            )
    except DatasetGenerationError as error:  # `datasets` wraps the generator's own errors: give ours back
        if isinstance(error.__cause__, (ValueError, FileNotFoundError)):
            raise error.__cause__ from None
        raise


def check_language_pair(src_lang: str, tgt_lang: str, languages: tuple[str, ...] = MULTI30K_LANGUAGES) -> None:
    """Raise a ValueError unless `src_lang` and `tgt_lang` are two different codes from `languages`."""
    for name, value in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if value not in languages:
            raise ValueError(
                f"`{name}` must be one of {', '.join(languages)} for Multi30k, got {value!r}. For other languages "
                "pass your own parallel files (`train_src`/`train_tgt`)."
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
    from datasets import DatasetDict

    return DatasetDict(
        {
            split: load_parallel_files(
                MULTI30K_DIR / f"{MULTI30K_SPLITS[split]}.{src_lang}.gz",
                MULTI30K_DIR / f"{MULTI30K_SPLITS[split]}.{tgt_lang}.gz",
            )
            for split in splits
        }
    )


__all__ = [
    "BOM",
    "MULTI30K_DIR",
    "MULTI30K_LANGUAGES",
    "MULTI30K_SPLITS",
    "LineStream",
    "check_language_pair",
    "decode_lines",
    "iter_lines",
    "load_multi30k",
    "load_parallel_files",
    "quiet_datasets",
    "read_lines",
]
