"""Without the optional extras (`pip install hf_vanilla_transformer`, no `[train]`, `[eval]` or `[serve]`): every
command's --help, and translating with a model folder, work; the commands that need an extra say which."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hf_vanilla_transformer import BUNDLED_MODEL

from ..conftest import run_script

# The optional extras' modules (pyproject.toml); each made unimportable in the child process.
EXTRAS = ("datasets", "sacrebleu", "matplotlib", "fastapi", "uvicorn")
COMMANDS = ("train", "evaluate", "translate", "average", "push", "curve", "attention", "serve")
# The opening of each child's script: the extras blocked, then the command line's entry point.
BLOCKED = f"import sys\nsys.modules.update(dict.fromkeys({EXTRAS!r}))\nfrom hf_vanilla_transformer.cli import main\n"


def without_extras(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`hf-vanilla-transformer ARGV` in a child process where the extras' modules cannot be imported."""
    return run_script(BLOCKED + "sys.exit(main(sys.argv[1:]))\n", tmp_path, *argv, package=True, timeout=120)


def test_every_command_help_without_the_extras(tmp_path: Path) -> None:
    script = BLOCKED + (
        "import contextlib, io\n"
        f"for command in {COMMANDS!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main([command, '--help'])\n"
        "    print(command, out.getvalue().startswith('usage: hf-vanilla-transformer ' + command))\n"
    )
    done = run_script(script, tmp_path, package=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"{command} True" for command in COMMANDS]


def test_translate_without_the_extras(tmp_path: Path) -> None:
    done = without_extras(tmp_path, "translate", str(BUNDLED_MODEL), "--num-beams", "1", "A man is riding a bike.")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert "Mann" in line


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (("serve", str(BUNDLED_MODEL)), "serve"),
        (("evaluate", str(BUNDLED_MODEL), "--max-sentences", "2"), "eval"),
        (("train", "--max-time", "1m"), "train"),
    ],
)
def test_a_command_that_needs_an_extra_says_which(argv: tuple[str, ...], extra: str, tmp_path: Path) -> None:
    done = without_extras(tmp_path, *argv, *(["--output-dir", str(tmp_path / "run")] if argv[0] == "train" else []))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"hf-vanilla-transformer {argv[0]}: error: ")
    assert f"pip install 'hf_vanilla_transformer[{extra}]'" in line
