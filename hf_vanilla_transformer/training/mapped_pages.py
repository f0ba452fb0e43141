"""Resident memory of a corpus read through its memory map.

`datasets` memory-maps its Arrow files: reading a corpus (hashing it, sampling it for the BPE, tokenizing it,
drawing batches from it) maps each page read into the process, and Linux maps up to 64 KB around each page faulted
in ("fault-around"), so a process that reads a 2.9M-pair corpus holds about as much of it in its resident set (RSS)
as it has read. The kernel can drop those pages again (they are page cache, not the process's own memory), but they
count in RSS, which is what containers and job schedulers limit.

`release_mapped_pages` hands the pages of the given files' mappings back (`madvise(MADV_DONTNEED)`): the data
stays in the page cache, and the next read of a page maps it again from there, without disk I/O. Only mappings of the
named files are touched (found in /proc/self/maps), so no other memory of the process can be affected; on other
systems it does nothing. `PageReleaser` calls it every so many rows of a long read, `ReleaseCorpusPagesCallback`
every so many training updates.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback

MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_libc: Any = None


def _madvise(start: int, length: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return _libc.madvise(start, length, MADV_DONTNEED) == 0


def corpus_files(dataset: Any) -> list[str]:
    """The Arrow files a `datasets.Dataset` reads through memory maps (none for a dataset held in memory)."""
    return [item["filename"] for item in getattr(dataset, "cache_files", None) or []]


def release_mapped_pages(files: Iterable[str | os.PathLike]) -> int:
    """Drop this process's resident pages of its memory mappings of `files`; the bytes released (0 off Linux)."""
    if sys.platform != "linux":
        return 0
    wanted = {os.path.realpath(path) for path in files}
    if not wanted:
        return 0
    released = 0
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            # address perms offset dev inode path; the path is absent for anonymous memory
            fields = line.rstrip("\n").split(maxsplit=5)
            if len(fields) == 6 and fields[5] in wanted:
                start, end = (int(address, 16) for address in fields[0].split("-"))
                if _madvise(start, end - start):
                    released += end - start
    return released


class PageReleaser:
    """Counts rows read from `dataset` (`read(n)`) and releases its mapped pages every `every` rows."""

    def __init__(self, dataset: Any, every: int = 100_000) -> None:
        self.files = corpus_files(dataset)
        self.every = every
        self._since = 0

    def read(self, rows: int) -> None:
        self._since += rows
        if self.files and self._since >= self.every:
            release_mapped_pages(self.files)
            self._since = 0


class ReleaseCorpusPagesCallback(TrainerCallback):
    """Releases the training corpus's mapped pages every `every` updates: batches are drawn at random from all of
    the corpus, so without it the resident set would grow by a few pages per sentence trained on."""

    def __init__(self, dataset: Any, every: int = 10) -> None:
        self.files = corpus_files(dataset)
        self.every = every

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.files and state.global_step % self.every == 0:
            release_mapped_pages(self.files)


__all__ = ["PageReleaser", "ReleaseCorpusPagesCallback", "corpus_files", "release_mapped_pages"]
