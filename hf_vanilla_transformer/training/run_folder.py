"""The run folder of `train` (its `--output-dir`): one run at a time, and `--resume` only for the same run.

- `exclusive_run`: an exclusive lock (`flock`) on `.NAME.lock` beside the folder, held for the whole run, with the
  holder's PID in it. The operating system drops the lock when the holder dies, however it dies, so a killed run
  never blocks its `--resume`. Beside the folder, not inside it: a model folder is swapped in whole
  (files.replaced_folder; RUN/model now, the run folder itself in runs of older versions), and a lock file inside
  the swapped folder would become another file (a copy where hard links are missing, or at the old folder's path
  after the swap); beside it, it stays one file for the run's whole life. It is never
  deleted: deleting a lock file lets a waiting process lock the deleted file while a third locks a new one.
- `run_settings` / `check_same_run`: the settings that define a run (data, tokenizer, model, optimization,
  precision), written to `run_settings.json` when it starts; `--resume` with any of them changed is refused,
  naming each setting and both values, before anything on disk changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..workflows import WorkflowError

if TYPE_CHECKING:
    from datasets import Dataset

SETTINGS_FILE = "run_settings.json"


def lock_path(output_dir: Path) -> Path:
    return output_dir.parent / f".{output_dir.name}.lock"


def _in_use(output_dir: Path, handle: Any) -> WorkflowError | None:
    """None where `handle` (the open lock file) got the lock; else the error that names its holder."""
    import fcntl

    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        return WorkflowError(
            f"`--output-dir` {output_dir} is in use by another training run (PID {holder}; lock "
            f"{lock_path(output_dir)}). Wait for it to end or stop it, or pass another --output-dir."
        )
    return None


def refuse_if_in_use(output_dir: Path) -> None:
    """Refuse (WorkflowError, naming the holder's PID) a run folder that another run holds, changing nothing on
    disk: the lock file is only opened, and a lock got is let go at once. Checked before what the folder holds."""
    try:
        handle = open(lock_path(output_dir), encoding="utf-8")
    except OSError:  # no lock file (or none readable): no run has held the folder
        return
    with handle:
        error = _in_use(output_dir, handle)
    if error is not None:
        raise error


@contextmanager
def exclusive_run(output_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock for the body; a second holder is refused with its PID (WorkflowError).
    POSIX only (`fcntl`); `output_dir`'s parent must exist."""
    with open(lock_path(output_dir), "a+", encoding="utf-8") as handle:  # "a+": the holder's PID stays readable
        error = _in_use(output_dir, handle)
        if error is not None:
            raise error
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield  # the lock goes with the file's closing, or with the process


def data_fingerprint(pairs: Dataset) -> str:
    """ "N pairs, sha256 X" of the training pairs (`source` / `target` columns), as text: the same data under
    another path is the same data. Streamed in batches: a corpus of any size is hashed without being held."""
    from .mapped_pages import PageReleaser

    digest = hashlib.sha256()
    releaser = PageReleaser(pairs)  # the corpus is read once: its pages need not stay resident
    for batch in pairs.select_columns(["source", "target"]).iter(batch_size=10_000):
        digest.update("".join(f"{s}\t{t}\n" for s, t in zip(batch["source"], batch["target"], strict=True)).encode())
        releaser.read(len(batch["source"]))
    return f"{len(pairs)} pairs, sha256 {digest.hexdigest()[:16]}"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """ "vocabulary sha256 X" of a tokenizer: its tokens and ids, and its special tokens."""
    vocabulary = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return f"vocabulary sha256 {hashlib.sha256(vocabulary.encode()).hexdigest()[:16]}"


def read_settings(output_dir: Path) -> dict[str, Any] | None:
    """The recorded settings, None for a run from before they were recorded."""
    path = output_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WorkflowError(
            f"`--resume`: {path} is damaged ({error}); it records the run's settings. Restore it, or start afresh "
            "with --overwrite."
        ) from None
    if not isinstance(settings, dict):
        raise WorkflowError(f"`--resume`: {path} is not a JSON object. Restore it, or start afresh with --overwrite.")
    return settings


def check_same_run(output_dir: Path, settings: dict[str, Any]) -> bool:
    """Refuse (WorkflowError) a resume whose `settings` differ from the run's; False where the run recorded none."""
    recorded = read_settings(output_dir)
    if recorded is None:
        return False
    differing = [
        f"{name} {_shown(settings.get(name))} now, {_shown(recorded.get(name))} in the run"
        for name in dict.fromkeys([*recorded, *settings])
        if settings.get(name) != recorded.get(name)
    ]
    if differing:
        raise WorkflowError(
            f"`--resume`: the run in {output_dir} was started with other settings ({SETTINGS_FILE}): "
            f"{'; '.join(differing)}. Resume with the run's settings, or start afresh with --overwrite or another "
            "--output-dir."
        )
    return True


def _shown(value: Any) -> str:
    return "(not set)" if value is None else str(value)


def write_settings(output_dir: Path, settings: dict[str, Any]) -> None:
    """Write run_settings.json whole: a kill leaves the old file or the new one."""
    partial = output_dir / f".{SETTINGS_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, output_dir / SETTINGS_FILE)


__all__ = [
    "SETTINGS_FILE",
    "check_same_run",
    "data_fingerprint",
    "exclusive_run",
    "lock_path",
    "read_settings",
    "refuse_if_in_use",
    "tokenizer_fingerprint",
    "write_settings",
]
