"""The inference room reads test sets through the package's parallel_text module and imports nothing of training
(the one arrow that ran back up: `evaluate` imported training.data), and each command's module is named for it."""

from __future__ import annotations

import ast
from pathlib import Path

import hf_vanilla_transformer.inference as inference
from hf_vanilla_transformer.inference import decoding, evaluation, translation

ROOM = Path(inference.__file__).parent


def package_imports(path: Path) -> list[str]:
    """The package modules `path` (a module of the inference room) imports anywhere in it, relative imports
    resolved against the room."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = "hf_vanilla_transformer.inference".rsplit(".", node.level - 1)[0] if node.level else ""
            names.append(".".join(part for part in (base, node.module) if part))
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [name for name in names if name.startswith("hf_vanilla_transformer")]


def test_the_inference_room_imports_nothing_of_training() -> None:
    imports = {path.name: package_imports(path) for path in sorted(ROOM.glob("*.py"))}
    upward = {name: [module for module in found if ".training" in module] for name, found in imports.items()}
    assert upward == {name: [] for name in imports}
    assert "hf_vanilla_transformer.parallel_text" in imports["evaluation.py"]  # where the test sets come from


def test_each_command_lives_in_the_module_named_for_it() -> None:
    """`translate` in translation.py, `evaluate` in evaluation.py, batched decoding in decoding.py; no module
    defines another's command."""
    assert translation.translate.__module__ == translation.__name__ and not hasattr(translation, "evaluate")
    assert evaluation.evaluate.__module__ == evaluation.__name__ and not hasattr(evaluation, "translate")
    assert decoding.translate_n_best.__module__ == decoding.__name__
    assert not hasattr(decoding, "translate") and not hasattr(decoding, "evaluate")
