"""Execute the walk-through notebooks from start to end, offline, and write them back with their outputs.

`python docs/walkthrough/execute.py` (what `make walkthrough` runs) re-executes every notebook of docs/walkthrough
and docs/walkthrough/ja in place; `python docs/walkthrough/execute.py FILE ...` only those. tests/walkthrough runs
`execute` on a copy, so that the test leaves the committed files as they are.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CELL_TIMEOUT_S = 900  # a guard against a hung cell: each takes seconds on 2 free cores
# Nothing may download: transformers and the Hub read only local files.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def notebooks() -> list[Path]:
    """Every notebook of the walk-through, English edition first, then the Japanese one."""
    return sorted(HERE.glob("*.ipynb")) + sorted((HERE / "ja").glob("*.ipynb"))


def execute(path: Path, out: Path | None = None, timeout: int = CELL_TIMEOUT_S) -> nbformat.NotebookNode:
    """Run the notebook at `path` in its own folder with the python3 kernel, offline, this checkout first on the
    path; write it with its outputs to `out` (default: `path`, through a temporary file) and return it. A cell that
    raises stops the run with nbclient's CellExecutionError (the cell and its traceback)."""
    notebook = nbformat.read(path, as_version=4)
    # The kernel inherits the environment: offline, and this checkout's package before any installed copy.
    previous = {name: os.environ.get(name) for name in [*OFFLINE, "PYTHONPATH"]}
    os.environ.update(OFFLINE)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), previous["PYTHONPATH"]]))
    try:
        client = NotebookClient(
            notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        )
        client.execute()
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    target = out or path
    partial = target.with_name(f".{target.name}.partial")
    nbformat.write(notebook, partial)
    partial.replace(target)
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="notebooks to execute (default: all of the walk-through)")
    args = parser.parse_args(argv)
    for path in args.files or notebooks():
        if not path.is_file():
            print(f"error: notebook {path} does not exist; pass an .ipynb file of docs/walkthrough.", file=sys.stderr)
            return 2
        print(f"executing {path}", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
