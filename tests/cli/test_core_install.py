"""Without the optional extras (`pip install hf_vanilla_transformer`, no `[train]`, `[eval]` or `[serve]`): every
command's --help, and translating with a model folder, work; the commands that need an extra say which."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hf_vanilla_transformer import BUNDLED_MODEL

# The optional extras' modules (pyproject.toml); each made unimportable in the child process.
EXTRAS = ("datasets", "sacrebleu", "matplotlib", "fastapi", "uvicorn")
COMMANDS = ("train", "evaluate", "translate", "average", "push", "curve", "attention", "serve")


def without_extras(*argv: str) -> subprocess.CompletedProcess[str]:
    """`hf-vanilla-transformer ARGV` in a child process where the extras' modules cannot be imported."""
    script = (
        "import sys\n"
        f"sys.modules.update(dict.fromkeys({EXTRAS!r}))\n"
        "from hf_vanilla_transformer.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=120, check=False
    )


def test_every_command_help_without_the_extras() -> None:
    script = (
        "import sys, contextlib, io\n"
        f"sys.modules.update(dict.fromkeys({EXTRAS!r}))\n"
        "from hf_vanilla_transformer.cli import main\n"
        f"for command in {COMMANDS!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "        main([command, '--help'])\n"
        "    print(command, out.getvalue().startswith('usage: hf-vanilla-transformer ' + command))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"{command} True" for command in COMMANDS]


def test_translate_without_the_extras() -> None:
    done = without_extras("translate", str(BUNDLED_MODEL), "--num-beams", "1", "A man is riding a bike.")
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
def test_a_command_that_needs_an_extra_says_which(argv: tuple[str, ...], extra: str, tmp_path) -> None:
    done = without_extras(*argv, *(["--output-dir", str(tmp_path / "run")] if argv[0] == "train" else []))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"hf-vanilla-transformer {argv[0]}: error: ")
    assert f"pip install 'hf_vanilla_transformer[{extra}]'" in line
