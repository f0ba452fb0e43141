"""Writing model folders so that a kill never leaves a half-written file behind (write, then rename)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replaced_folder(output_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty sibling folder of `output_dir` to write into. On success, a new `output_dir` is that folder,
    renamed; an existing one (which may hold other files: checkpoints, results) gets each written file through
    `os.replace`, so that every file there is whole at any moment, the old version or the new one. On an error the
    partial folder is removed and `output_dir` is untouched."""
    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = output_dir.parent / f".{output_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        yield partial
        if not output_dir.exists():
            partial.rename(output_dir)
            return
        for source in sorted(path for path in partial.rglob("*") if path.is_file()):
            target = output_dir / source.relative_to(partial)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


__all__ = ["replaced_folder"]
