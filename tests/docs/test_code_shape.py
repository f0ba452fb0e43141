"""The shape that keeps the code easy to change: no function over 80 lines where users and maintainers read
(the package, conversion/, model_card/), bench scripts of at most 300 lines, a one-page docs/results.md."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80
MAX_BENCH_SCRIPT_LINES = 300
# The bench's one library module (models, batches, timing, host) that every script imports.
BENCH_LIBRARY = "common.py"


def _long_functions(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


@pytest.mark.parametrize("folder", ["hf_vanilla_transformer", "conversion", "model_card"])
def test_no_function_is_longer_than_80_lines(folder):
    assert _long_functions(ROOT / folder) == [], "split these functions into named steps"


def test_bench_scripts_are_at_most_300_lines():
    long = {
        path.name: len(path.read_text(encoding="utf-8").splitlines())
        for path in (ROOT / "bench").glob("*.py")
        if path.name != BENCH_LIBRARY
    }
    assert {name: lines for name, lines in long.items() if lines > MAX_BENCH_SCRIPT_LINES} == {}


def test_the_results_page_is_one_page():
    assert len((ROOT / "docs" / "results.md").read_text(encoding="utf-8").splitlines()) <= 250
