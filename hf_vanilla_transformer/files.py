"""Model folders and the paths the commands write: what a model folder holds; the one rule of every output (the
commands write only into a new or empty folder, or one of their own, and replace only what they wrote:
`check_output_folder`, `writable_file`, with a manifest in each folder they write); writing a model folder whole
(the new folder is built beside the old one and swapped in with one atomic rename, so a reader, or a kill at any
moment, sees the whole old folder or the whole new one, never a mix of the two); and the checks of the paths an
option names (`writable_folder`, `writable_file`, `existing_file`), made before any long work."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fnmatch
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from .errors import OptionError

# The model folder inside a run folder of `train`: the Hub repository's files and nothing else.
MODEL_DIR = "model"
# The results of the run that wrote a model folder (`train`): scores, languages, the model card's inputs.
RESULTS_FILE = "results.json"
# What marks a finished learning-curve snapshot of `train --curve-every` (RUN/curve/step-N; written by trainer.py,
# read by learning_curve.py).
SNAPSHOT_FILE = "snapshot.json"
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
    return _matches(name, MODEL_ENTRIES)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


# ------------------------------------------------------------------------------------------------ the output rule
# Every command that writes a folder (train's run folder and its model folder, average, the converters, attention)
# leaves this manifest in it: the folder's kind and the entries the command writes there. A folder is a command's
# own when its manifest names the command's kind, and only the entries listed there are ever removed or replaced.
# Any other entry is someone else's: a folder holding one is refused before any work, and one that appears while a
# command writes is kept. The Hub upload leaves the manifest out (hub.hub_files takes the model's files by name).
MANIFEST = ".hf_vanilla_transformer.json"
# This package's model type (VanillaTransformerConfig.model_type; not imported, the model's modules import this one).
_MODEL_TYPE = "vanilla_transformer"
# What a writer leaves for a moment in any folder it writes (`writable_folder`'s probe, a manifest being written, a
# model card being written: model_card.save_card): a kill may leave one behind.
_TEMPORARY = (".write-test-*", f"{MANIFEST}.*", ".README.md.partial-*")


def _always(folder: Path) -> bool:
    return True


def _never(folder: Path) -> bool:
    return False


@dataclass(frozen=True)
class Layout:
    """A kind of folder the commands write, and how one is recognized as the package's own (`foreign_entries`).

    A folder whose manifest names this `kind` is its own: its entries are those the manifest lists, and those
    matching `temporary` (what its writers leave for a moment). A folder without a manifest (one an earlier version
    wrote, or one whose writer keeps none: the Trainer's checkpoints/) is this kind's when `recognize(folder)` holds;
    then its entries matching `earlier` are its own. `inside` names subfolders checked with their own layout."""

    kind: str
    earlier: tuple[str, ...] = ()
    recognize: Callable[[Path], bool] = _never
    temporary: tuple[str, ...] = _TEMPORARY
    inside: Mapping[str, Layout] = field(default_factory=dict)


def _earlier_model_folder(folder: Path) -> bool:
    """A model folder of a version before manifests: this package's config.json beside its weights (safetensors, or
    the ONNX graphs of `to-onnx`). A Marian folder is not recognized: a downloaded OPUS-MT model looks the same as a
    `to-marian` export."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.onnx"))
    return isinstance(config, dict) and config.get("model_type") == _MODEL_TYPE and weights


# The attention plots (inference/attention_maps.py, PLOTS): a folder of them alone is `attention`'s.
ATTENTION_LAYOUT = Layout("attention", earlier=("*_attention.png",), recognize=_always)
# A model folder (train's RUN/model, average, the converters): besides the model's own entries, earlier versions
# wrote the code files (*.py), the ONNX graphs, and `train`'s results, attention plots and learning curve
# (RESULTS_FILE, attention_maps.ATTENTION_DIR, learning_curve.CURVE_PNG) into it.
MODEL_LAYOUT = Layout(
    "model",
    earlier=(*MODEL_ENTRIES, "*.py", "*.onnx", "*.onnx.data", RESULTS_FILE, "attention", "learning_curve.png"),
    recognize=_earlier_model_folder,
    inside={"attention": ATTENTION_LAYOUT},
)


@dataclass(frozen=True)
class Manifest:
    """What a folder's manifest says: the folder's kind and the entries the package wrote there."""

    kind: str
    entries: frozenset[str]


def read_manifest(folder: Path) -> Manifest | None:
    """`folder`'s manifest; None where it has none, or none this package wrote (not a JSON object with a kind and a
    list of entries): a damaged manifest makes nothing the package's."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    if not isinstance(data.get("entries"), list):
        return None
    return Manifest(data["kind"], frozenset(name for name in data["entries"] if isinstance(name, str)))


def write_manifest(folder: Path, kind: str, entries: Iterable[str]) -> None:
    """Write `folder`'s manifest whole (a kill leaves the old one or the new one): its `kind` and `entries`."""
    names = sorted(set(entries) - {MANIFEST})
    text = json.dumps({"written_by": "hf_vanilla_transformer", "kind": kind, "entries": names}, indent=2) + "\n"
    partial = folder / f"{MANIFEST}.{os.getpid()}"
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, folder / MANIFEST)


def claim_folder(folder: Path, layout: Layout, entries: Iterable[str]) -> None:
    """Make `folder` (checked with `check_output_folder`) `layout`'s own: its manifest lists `entries` (what the
    command writes there), the entries an earlier manifest of the kind listed, and, in a folder of an earlier version
    (no manifest), its entries that the kind's writers made then (`Layout.earlier`)."""
    manifest = read_manifest(folder)
    names = set(entries)
    if manifest is not None and manifest.kind == layout.kind:
        names |= manifest.entries
    elif manifest is None and layout.recognize(folder):
        names |= {entry.name for entry in folder.iterdir() if _matches(entry.name, layout.earlier)}
    write_manifest(folder, layout.kind, names)


def _own(folder: Path, layout: Layout) -> Callable[[str], bool]:
    """Whether an entry of `folder` (by name) is `layout`'s own (see `Layout`)."""
    manifest = read_manifest(folder)
    if manifest is not None:
        return lambda name: manifest.kind == layout.kind and name in manifest.entries
    if layout.recognize(folder):
        return lambda name: _matches(name, layout.earlier)
    return lambda name: False


def foreign_entries(folder: Path, layout: Layout) -> list[str]:
    """The entries under `folder` that are not `layout`'s own, as relative POSIX paths (folders with a trailing
    "/"), sorted; symbolic links are entries, never followed. Empty for a missing or empty folder."""
    if not folder.is_dir():
        return []
    own = _own(folder, layout)
    foreign = []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if name == MANIFEST or _matches(name, layout.temporary):
            continue
        directory = entry.is_dir() and not entry.is_symlink()
        if not own(name):
            foreign.append(f"{name}/" if directory else name)
        elif directory and name in layout.inside:
            foreign += [f"{name}/{inner}" for inner in foreign_entries(entry, layout.inside[name])]
    return foreign


# An input of a command, for the checks that an output is none of them: (its field, its path; None: not given).
Inputs = Iterable[tuple[str, str | os.PathLike | None]]


def refuse_inputs(path: Path, option: str, inputs: Inputs, fix: str) -> None:
    """Refuse (OptionError) an output `path` that is one of `inputs`, lies inside one, or holds one (symbolic links
    followed, hard links compared by inode); `fix` ends the message."""
    target = path.resolve()
    for name, value in inputs:
        if value is None or not Path(value).exists():
            continue
        source = Path(value).resolve()
        if target == source or (target.exists() and os.path.samefile(target, source)):
            relation = "is"
        elif source in target.parents:
            relation = "lies inside"
        elif target in source.parents:
            relation = "holds"
        else:
            continue
        raise OptionError(f"`{option}` {path} {relation} `{name}` {value}, which this command reads. {fix}")


def check_output_folder(
    path: str | os.PathLike, option: str, layout: Layout, inputs: Inputs = (), *, replaced: bool = True
) -> Path:
    """The real path of the output folder `path` (symbolic links followed), after refusing, before any work and
    changing nothing (OptionError, one line naming `option`, the folder and the fix), a folder that this command
    (of `layout`'s kind) may not write: a file; one that is, holds or lies inside one of its `inputs`; a folder of
    another kind of this package's (a run folder for a model folder); one that holds entries not its own
    (`foreign_entries`, the first three named); and, for a folder `replaced` whole (`replaced_folder`), the current
    folder or one that holds it, which the swap would delete from under the shell."""
    path = Path(path)
    target = path.resolve()
    if target.exists() and not target.is_dir():
        raise OptionError(f"`{option}` {path} is a file, not a folder. Pass a folder name.")
    refuse_inputs(path, option, inputs, "Write to a new folder outside it.")
    manifest = read_manifest(target)
    if manifest is not None and manifest.kind != layout.kind:
        raise OptionError(
            f"`{option}` {path} is a {manifest.kind} folder of this package, not a {layout.kind} folder; it is left "
            "as it is. Choose a new or empty folder."
        )
    foreign = foreign_entries(target, layout)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise OptionError(
            f"`{option}` {path} holds files this package did not write ({shown}); it writes only into a new or empty "
            "folder or one of its own, and never replaces other files. Choose a new or empty folder, or move those "
            "files away."
        )
    cwd = Path.cwd().resolve()
    if replaced and (target == cwd or target in cwd.parents):
        raise OptionError(
            f"`{option}` {path} is the current folder or holds it; the new folder is written beside it and swapped "
            f"in whole, which would leave this shell in a deleted folder. Pass a new folder, e.g. {path / 'model'}."
        )
    return target


def remove_own(folder: Path, layout: Layout) -> None:
    """Remove the entries of `folder` that are `layout`'s own (`Layout`), then the folder itself where nothing else
    is left in it: what a command replaces, and no more."""
    if not folder.is_dir() or folder.is_symlink():
        return
    own = _own(folder, layout)
    for entry in sorted(folder.iterdir()):
        if entry.name == MANIFEST or own(entry.name) or _matches(entry.name, layout.temporary):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    with contextlib.suppress(OSError):  # not empty: what is left is someone else's
        folder.rmdir()


def _owning_folder(path: Path) -> Path | None:
    """The folder of this package's (with a manifest) whose listed entry `path` is or lies inside, if any."""
    target = path.resolve()
    for folder in target.parents:
        manifest = read_manifest(folder)
        if manifest is not None and target.relative_to(folder).parts[0] in manifest.entries:
            return folder
    return None


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
def replaced_folder(
    output_dir: str | os.PathLike, layout: Layout = MODEL_LAYOUT, claims: Iterable[str] = ()
) -> Iterator[Path]:
    """Yield an empty sibling folder of `output_dir` to write the complete new folder (of `layout`'s kind, a model
    folder by default) into; on success it becomes `output_dir` in one atomic step, with a manifest listing what was
    written and `claims` (entries the caller writes into the folder afterwards: `train`'s results and figures). On an
    error the sibling is removed and `output_dir` is untouched. `output_dir` is taken as its real path: "." and
    symbolic links name the folder itself, whose sibling lies beside it (the commands refuse the current folder
    first, `check_output_folder`).

    Of an existing `output_dir`, only its own entries (`Layout`: those its manifest lists; in a model folder of an
    earlier version, the model's files, `MODEL_ENTRIES`) are replaced, or left behind with the old folder when the
    new one does not write them (stale weight shards, an old target_tokenizer/). Every other entry (one that
    appeared since the command checked the folder; a code file of an earlier version) is carried into the new
    folder as a hard link; one the new folder writes too raises OptionError before anything changes. The two
    folders are then swapped with renameat2(RENAME_EXCHANGE), one system call: at every moment `output_dir` is the
    whole old folder or the whole new one, and the old one (now at the sibling's path) is removed. Where that call
    is unavailable (not Linux, an old C library, a filesystem without it, e.g. NFS), two renames: the old folder to
    `.NAME.old-PID`, the new one to `output_dir`. A kill between the two leaves no `output_dir` but the whole old
    folder beside it, which the next write to `output_dir` (or any call of this function for it) renames back;
    still never a mix. Files are not fsynced: the promise covers killed processes, not power loss."""
    output_dir = Path(output_dir).resolve()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    _recover(output_dir)
    partial = output_dir.parent / f".{output_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        yield partial
        written = {entry.name for entry in partial.iterdir()}
        write_manifest(partial, layout.kind, written | set(claims))
        if not output_dir.exists():
            partial.rename(output_dir)
            return
        own = _own(output_dir, layout)
        removable = own if read_manifest(output_dir) is not None else is_model_entry  # earlier versions: as then
        for entry in sorted(output_dir.iterdir()):
            if entry.name == MANIFEST or (entry.name in written and own(entry.name)):
                continue
            if entry.name in written:
                raise OptionError(
                    f"{output_dir} gained {entry.name} while it was being written, which this package did not write; "
                    "the folder is left as it was. Move that file away and run the command again."
                )
            if not removable(entry.name):
                _link_tree(entry, partial / entry.name)
        if not _exchange(partial, output_dir):
            old = output_dir.parent / f".{output_dir.name}.old-{os.getpid()}"
            output_dir.rename(old)
            partial.rename(output_dir)
            shutil.rmtree(old)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # the new folder on an error, the old one after the swap


# ------------------------------------------------------------------------------------------------ one writer
# An output that a command writes for a long time (train's run folder, translate's --output) is held by an exclusive
# lock (`flock`) on `.NAME.lock` beside it, with the holder's PID in it: a second writer is refused, naming that PID.
# The operating system drops the lock when the holder dies, however it dies, so a killed writer blocks nothing. The
# lock file is never deleted: deleting it lets a waiting process lock the deleted file while a third locks a new one.


def lock_path(path: Path) -> Path:
    """The lock file of the output `path`: `.NAME.lock` beside it."""
    return path.parent / f".{path.name}.lock"


def _locked_by(path: Path, handle: IO[str], option: str, writer: str) -> OptionError | None:
    """None where `handle` (the open lock file of `path`) got the lock; else the error that names its holder, a
    `writer` ("training run") writing `option`."""
    import fcntl  # POSIX only: imported where a lock is taken, so that the module loads everywhere

    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        return OptionError(
            f"`{option}` {path} is in use by another {writer} (PID {holder}; lock {lock_path(path)}). Wait for it to "
            f"end or stop it, or pass another `{option}`."
        )
    return None


def refuse_if_locked(path: Path, option: str, writer: str) -> None:
    """Refuse (OptionError, naming the holder's PID) an output that another `writer` holds (`exclusive_lock`),
    changing nothing on disk: the lock file is only opened, and a lock got is let go at once."""
    try:
        handle = open(lock_path(path), encoding="utf-8")
    except OSError:  # no lock file (or none readable): no writer has held the output
        return
    with handle:
        error = _locked_by(path, handle, option, writer)
    if error is not None:
        raise error


@contextmanager
def exclusive_lock(path: Path, option: str, writer: str) -> Iterator[None]:
    """Hold the lock of the output `path` for the body; a second holder is refused with its PID (OptionError naming
    `option`; `writer` says what holds it). POSIX only (`fcntl`); `path`'s parent must exist."""
    with open(lock_path(path), "a+", encoding="utf-8") as handle:  # "a+": the holder's PID stays readable
        error = _locked_by(path, handle, option, writer)
        if error is not None:
            raise error
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield  # the lock goes with the file's closing, or with the process


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


def writable_file(path: str | os.PathLike, option: str, kind: str, example: str, inputs: Inputs = ()) -> Path:
    """`path` as a Path after checking that it is no folder, none of the command's `inputs` (nor inside an input
    folder: the model folder), no file inside what a folder of this package's lists as its own (a model folder's
    config.json), and that its folder (created if needed) is writable. `option` (a field) names it in the error,
    `kind` says what it holds ("JSON"), `example` is a file name to suggest. Any other file of that name is replaced:
    the option names that very file."""
    path = Path(path)
    if path.is_dir():
        raise OptionError(
            f"`{option}` {path} is a folder; it names the {kind} file to write. Pass a file name, e.g. "
            f"{path / example}."
        )
    refuse_inputs(path, option, inputs, f"Pass another file name, e.g. {example}.")
    owner = _owning_folder(path)
    if owner is not None:
        raise OptionError(
            f"`{option}` {path} lies inside {owner}, a {read_manifest(owner).kind} folder this package wrote, among "
            f"its own files. Pass a file name outside it, e.g. {example}."
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


# numpy's `ndarray.tofile` (onnx_ir's external data: `to-onnx`'s weights) reports a short write as an OSError
# without an errno: "N requested and M written", or "problem writing element N to file" for a strided array.
_NUMPY_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written|problem writing element \d+ to file")


def no_space_message(error: BaseException, path: str | os.PathLike, option: str) -> str | None:
    """The one-line message for a write that failed because the disk is full, or None for any other error. The
    failure comes as an OSError ENOSPC from Python, as "os error 28" inside a safetensors error, and without the
    errno from torch's zip writer (torch.save: Trainer checkpoints; a RuntimeError "[enforce fail at
    inline_container.cc...]") and from numpy's `tofile` (an OSError, `_NUMPY_SHORT_WRITE`): those writers fail so
    only when a write comes back short, which on a local disk means it is full. `path` is the command's output
    (named unless the OSError names its file), `option` the option that chose it."""
    cause: BaseException | None = error
    while cause is not None:  # the library may have wrapped the failed write
        text = str(cause)
        if (
            (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT))
            or "os error 28" in text
            or (isinstance(cause, RuntimeError) and "inline_container.cc" in text)
            or (isinstance(cause, OSError) and cause.errno is None and _NUMPY_SHORT_WRITE.fullmatch(text))
        ):
            where = getattr(cause, "filename", None) or path
            return f"no space left on device while writing {where}: free space or choose another {option}."
        cause = cause.__cause__ or cause.__context__
    return None


__all__ = [
    "ATTENTION_LAYOUT",
    "MANIFEST",
    "MODEL_DIR",
    "MODEL_ENTRIES",
    "MODEL_FILES",
    "MODEL_LAYOUT",
    "RESULTS_FILE",
    "TARGET_TOKENIZER",
    "TOKENIZER_FILES",
    "Layout",
    "Manifest",
    "check_output_folder",
    "claim_folder",
    "exclusive_lock",
    "existing_file",
    "foreign_entries",
    "is_model_entry",
    "lock_path",
    "no_space_message",
    "read_manifest",
    "refuse_if_locked",
    "refuse_inputs",
    "remove_own",
    "replaced_folder",
    "writable_file",
    "writable_folder",
    "write_manifest",
]
