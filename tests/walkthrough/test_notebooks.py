"""The walk-through notebooks (docs/walkthrough, English, and docs/walkthrough/ja, Japanese): each runs from start to
end offline (on a copy: the committed file keeps its outputs), the two editions share their code cells character for
character, and each edition, as committed, checks what it shows (`assert` lines) and shows it (pictures)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
WALKTHROUGH = ROOT / "docs" / "walkthrough"
EDITIONS = {"en": WALKTHROUGH, "ja": WALKTHROUGH / "ja"}
MIN_ASSERTS, MIN_PICTURES = 15, 12


def load_executor():
    spec = importlib.util.spec_from_file_location("walkthrough_execute", WALKTHROUGH / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_cells(path: Path) -> list[str]:
    return [cell.source for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def english_names() -> list[str]:
    return sorted(path.name for path in WALKTHROUGH.glob("*.ipynb"))


def test_the_walkthrough_has_its_notebooks_in_both_editions() -> None:
    assert "01_model.ipynb" in english_names()
    assert sorted(path.name for path in EDITIONS["ja"].glob("*.ipynb")) == english_names()


@pytest.mark.parametrize("name", english_names())
def test_the_editions_share_their_code_cells(name: str) -> None:
    english, japanese = code_cells(EDITIONS["en"] / name), code_cells(EDITIONS["ja"] / name)
    assert len(english) == len(japanese), f"{name}: {len(english)} code cells in English, {len(japanese)} in Japanese"
    for index, (a, b) in enumerate(zip(english, japanese, strict=True)):
        assert a == b, f"{name}: code cell {index} differs between the editions"


def edition_counts(folder: Path) -> tuple[int, int]:
    """(`assert` statements in code cells, image outputs) over the edition's committed notebooks."""
    asserts = pictures = 0
    for path in sorted(folder.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            asserts += sum(line.lstrip().startswith("assert ") for line in cell.source.splitlines())
            pictures += sum("image/png" in output.get("data", {}) for output in cell.get("outputs", []))
    return asserts, pictures


@pytest.mark.parametrize("edition", sorted(EDITIONS))
def test_each_edition_checks_and_shows(edition: str) -> None:
    asserts, pictures = edition_counts(EDITIONS[edition])
    assert asserts >= MIN_ASSERTS, f"the {edition} edition has {asserts} assert lines, fewer than {MIN_ASSERTS}"
    assert pictures >= MIN_PICTURES, f"the {edition} edition shows {pictures} pictures, fewer than {MIN_PICTURES}"


@pytest.mark.parametrize("name", english_names())
def test_committed_notebooks_hold_their_outputs_without_errors(name: str) -> None:
    """They read well unexecuted: every code cell was run, none ended in an error."""
    for folder in EDITIONS.values():
        for index, cell in enumerate(nbformat.read(folder / name, as_version=4).cells):
            if cell.cell_type == "code" and cell.source.strip():
                assert cell.execution_count is not None, f"{folder.name}/{name}: code cell {index} was not executed"
                assert all(output.output_type != "error" for output in cell.outputs), f"{name}: cell {index} failed"


@pytest.mark.slow
@pytest.mark.parametrize(
    "path",
    [folder / name for name in english_names() for folder in EDITIONS.values()],
    ids=lambda path: str(path.relative_to(WALKTHROUGH)),
)
def test_notebook_executes_offline(path: Path, tmp_path: Path) -> None:
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    committed = path.read_bytes()
    executed = load_executor().execute(copy)
    assert all(
        output.output_type != "error" for cell in executed.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert path.read_bytes() == committed
