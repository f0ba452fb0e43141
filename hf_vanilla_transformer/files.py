"""Model folders and the paths the commands write: what a model folder holds; writing a model folder whole (the new
folder is built beside the old one and swapped in with one atomic rename, so a reader, or a kill at any moment, sees
the whole old folder or the whole new one, never a mix of the two); and the checks of the paths an option names
(`writable_folder`, `writable_file`, `existing_file`), made before any long work."""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OptionError

# The model folder inside a run folder of `train`: the Hub repository's files and nothing else.
MODEL_DIR = "model"
# The results of the run that wrote a model folder (`train`): scores, languages, the model card's inputs.
RESULTS_FILE = "results.json"
# Every tokenizer file a model folder may hold: what tokenizers' save_pretrained writes (fast and slow, BPE and
# SentencePiece) and what the converters copy as they are (Marian's source.spm / target.spm / target_vocab.json).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "source.spm",
    "target.spm",
    "target_vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
)
# The subfolder with the target side's tokenizer, where source and target vocabularies differ (the converters).
TARGET_TOKENIZER = "target_tokenizer"

# The card, the configs and the safetensors weights (one file, or shards and their index): what a model folder and its
# Hub repository hold besides tokenizer and code files.
MODEL_FILES = (
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*-of-*.safetensors",
    "model.safetensors.index.json",
)

# Top-level entries that belong to a model folder: what save_pretrained, the tokenizers, the converters and the model
# card write. A new folder replaces all of them, so a stale one (an old target_tokenizer/ or weight shard) vanishes.
# Every other entry of the old folder (a user's own files; `train`'s results.json, attention/ and learning_curve.png,
# which it writes again after averaging; the checkpoints/ and curve/ of a run folder of an older version, where the
# model sat at the run folder's top level) is carried over into the new one. Code files (*.py) are not listed:
# save_pretrained rewrites the model's own, and a file of the user's is never deleted.
MODEL_ENTRIES = (
    *MODEL_FILES,
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    *TOKENIZER_FILES,
    TARGET_TOKENIZER,
)

_RENAME_EXCHANGE = 2  # linux/fs.h; renameat2(2) swaps the two paths atomically, both must exist
_AT_FDCWD = -100


def is_model_entry(name: str) -> bool:
    """Whether a top-level entry `name` of a model folder is one of the model's files (`MODEL_ENTRIES`)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in MODEL_ENTRIES)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two existing paths in one step with Linux's renameat2(RENAME_EXCHANGE). False where the platform, the C
    library or the filesystem cannot (then the caller falls back to two renames)."""
    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28, musl >= 1.2.2
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):  # e.g. NFS, FUSE, a seccomp filter
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def _link_tree(source: Path, target: Path) -> None:
    """Recreate `source` at `target` with hard links (no data copied; the files stay the same inodes, so a lock held
    on one stays held), copying where the filesystem has no hard links."""
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
    elif source.is_dir():
        target.mkdir()
        for child in source.iterdir():
            _link_tree(child, target / child.name)
    else:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _recover(output_dir: Path) -> None:
    """Undo what a writer killed mid-way left: an `output_dir` missing between the two renames of the fallback gets
    its old folder back, and the sibling folders of writers that are no longer running are removed."""
    siblings = sorted(output_dir.parent.glob(f".{output_dir.name}.*-*"))
    for sibling in siblings:
        kind, _, pid = sibling.name[len(output_dir.name) + 2 :].rpartition("-")
        if kind not in ("partial", "old") or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        if kind == "old" and not output_dir.exists():
            sibling.rename(output_dir)
        else:
            shutil.rmtree(sibling, ignore_errors=True)


@contextmanager
def replaced_folder(output_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty sibling folder of `output_dir` to write the complete new model folder into; on success it
    becomes `output_dir` in one atomic step. On an error the sibling is removed and `output_dir` is untouched.

    An existing `output_dir`'s entries that are not the model's (`MODEL_ENTRIES`: weights, config, tokenizer files,
    target_tokenizer/, card), such as a training run's checkpoints/ and curve/, are carried into the new folder as
    hard links, unless the new folder wrote an entry of that name; stale model files are left behind with the old
    folder. The two folders are then swapped with renameat2(RENAME_EXCHANGE), one system call: at every moment
    `output_dir` is the whole old folder or the whole new one, and the old one (now at the sibling's path) is
    removed. Where that call is unavailable (not Linux, an old C library, a filesystem without it, e.g. NFS), two
    renames: the old folder to `.NAME.old-PID`, the new one to `output_dir`. A kill between the two leaves no
    `output_dir` but the whole old folder beside it, which the next write to `output_dir` (or any call of this
    function for it) renames back; still never a mix. Files are not fsynced: the promise covers killed processes,
    not power loss."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    _recover(output_dir)
    partial = output_dir.parent / f".{output_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        yield partial
        if not output_dir.exists():
            partial.rename(output_dir)
            return
        written = {entry.name for entry in partial.iterdir()}
        for entry in sorted(output_dir.iterdir()):
            if entry.name not in written and not is_model_entry(entry.name):
                _link_tree(entry, partial / entry.name)
        if not _exchange(partial, output_dir):
            old = output_dir.parent / f".{output_dir.name}.old-{os.getpid()}"
            output_dir.rename(old)
            partial.rename(output_dir)
            shutil.rmtree(old)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # the new folder on an error, the old one after the swap


def writable_folder(path: str | os.PathLike, option: str) -> Path:
    """Create `path` if needed and check that files can be written in it; `option` (a field) names it in the error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"  # one per process: torchrun's processes all check the folder
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise OptionError(
            f"`{option}` {path} is not a writable folder ({error.strerror or error}). Choose a folder you can "
            "write to."
        ) from None
    return path


def writable_file(path: str | os.PathLike, option: str, kind: str, example: str) -> Path:
    """`path` as a Path after checking that it is no folder and that its folder (created if needed) is writable;
    `option` (a field) names it in the error, `kind` says what it holds ("JSON"), `example` is a file name to
    suggest."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(
            f"`{option}` {path} is a folder; it names the {kind} file to write. Pass a file name, e.g. "
            f"{path / example}."
        )
    writable_folder(path.parent, option)
    return path


def existing_file(path: str | os.PathLike | None, option: str, *, regular: bool = False) -> Path | None:
    """`path` as a Path (None stays None) after checking that it exists and is no folder; `option` (a field) names it
    in the error. A pipe or device (a FIFO, bash's `<(...)` as /dev/fd/N, /dev/stdin) passes: it serves where the file
    is read once, front to back. `regular=True` refuses one, for files read more than once or cached by size and
    modification time."""
    if path is None:
        return None
    file = Path(path)
    if not file.exists() or file.is_dir():
        raise OptionError(f"`{option}` {path} does not exist or is not a file. Check the path.")
    if regular and not file.is_file():
        raise OptionError(
            f"`{option}` {path} is a pipe or device, not a regular file, and this file is read more than once "
            "(cached by size and time, read by every process). Write it to a file first, e.g. `cmd > data.txt`."
        )
    return file


def no_space_message(error: BaseException, path: str | os.PathLike, option: str) -> str | None:
    """The one-line message for a write that failed because the disk is full, or None for any other error. The
    failure comes as an OSError ENOSPC from Python, as "os error 28" inside a safetensors error, and from torch's zip
    writer (torch.save: Trainer checkpoints) as a RuntimeError "[enforce fail at inline_container.cc...]" without
    the errno: that writer fails so only when a write comes back short, which on a local disk means it is full.
    `path` is the command's output (named unless the OSError names its file), `option` the option that chose it."""
    cause: BaseException | None = error
    while cause is not None:  # the library may have wrapped the failed write
        text = str(cause)
        if (
            (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT))
            or "os error 28" in text
            or (isinstance(cause, RuntimeError) and "inline_container.cc" in text)
        ):
            where = getattr(cause, "filename", None) or path
            return f"no space left on device while writing {where}: free space or choose another {option}."
        cause = cause.__cause__ or cause.__context__
    return None


__all__ = [
    "MODEL_DIR",
    "MODEL_ENTRIES",
    "MODEL_FILES",
    "RESULTS_FILE",
    "TARGET_TOKENIZER",
    "TOKENIZER_FILES",
    "existing_file",
    "is_model_entry",
    "no_space_message",
    "replaced_folder",
    "writable_file",
    "writable_folder",
]
