"""The README's code blocks, run in document order, so that what a newcomer copies works as written.

Every fenced block of README.md is picked up: ```bash blocks run line by line, ```python blocks are executed, and a
```text block is a sample of what the shell block before it prints: each of its lines must match a line that the
command printed here (numbers stand for any number, `…` for anything). A block in another language, or a shell
command that no rule below knows, fails the test: a new command needs a rule here, so it cannot go unchecked.

How each command is checked:
- `hf-vanilla-transformer ...` runs as written through the console script's `main`, in a scratch folder that stands
  in for the clone (its package folder, with the bundled data, linked in); `train` gets a tiny budget on top of the
  README's options (2 updates on 300 pairs, a 400-token BPE, 4 dev sentences, the first sentence of its test set),
  options that change no file it reads: the data files are the README's own, and each is in the languages of its
  command. `--report-to tensorboard` must leave event files. So the commands and the Python that follow it run as
  written against a real trained run folder at `outputs/multi30k-en-de` (its model in `model/`).
- `make train` runs the Makefile's own `train` recipe (its `hf-vanilla-transformer` command plus `ARGS`) the same way.
- The clone, the virtual environment, the `pip install` lines, `make setup` and `make test` are checked against
  pyproject.toml and the Makefile instead of run: they need a network, would rebuild the environment this test runs
  in, or (`make test`) would run this test inside itself. What is checked: the clone's folder is the project's
  name, the venv is the Makefile's, the pinned torch is the Makefile's pin, the CPU wheel index is PyTorch's, the
  extras exist, the targets exist.

Also here: every relative link in README.md and docs/*.md points at a file of the repository, every test named in
the docs exists, LICENSE is the license pyproject.toml names, and CITATION.cff parses and names this project.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.training.options import TrainOptions

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PYPROJECT_TEXT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
CPU_WHEEL_INDEX = "https://download.pytorch.org/whl/cpu"
CONSOLE_SCRIPT = "hf-vanilla-transformer"
NUMBER = r"\d[\d,]*(?:\.\d+)?"


@dataclass
class Block:
    language: str
    text: str
    line: int  # of the opening fence, for messages

    def where(self) -> str:
        return f"README.md line {self.line} (```{self.language})"


def readme_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [
        Block(match["language"], match["body"], text.count("\n", 0, match.start()) + 1)
        for match in re.finditer(r"^```(?P<language>[\w-]*)\n(?P<body>.*?)^```[ \t]*$", text, re.MULTILINE | re.DOTALL)
    ]


def shell_commands(block: Block) -> list[list[str]]:
    """The block's commands as argument lists (comments dropped, `\\` continuations joined)."""
    joined = re.sub(r"\\\n", " ", block.text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


# ---------------------------------------------------------------------------------------------- pyproject, Makefile


def project_field(name: str) -> str:
    """A string field of pyproject.toml's [project] table (read with a pattern: tomllib needs Python 3.11)."""
    table = PYPROJECT_TEXT.split("[project]", 1)[1].split("\n[", 1)[0]
    match = re.search(rf'^{name} = "([^"]+)"', table, re.MULTILINE)
    assert match, f"pyproject.toml's [project] has no {name}"
    return match[1]


def project_extras() -> set[str]:
    table = PYPROJECT_TEXT.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([\w-]+) = \[", table, re.MULTILINE))


def make_variable(name: str) -> str:
    match = re.search(rf"^{name}\s*\?=\s*(\S+)", MAKEFILE, re.MULTILINE)
    assert match, f"the Makefile no longer sets {name}"
    return match[1]


def make_recipe(target: str) -> list[str]:
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", MAKEFILE, re.MULTILINE)
    assert match, f"the Makefile has no target `{target}`"
    return [line.strip() for line in match[1].splitlines()]


def pinned_torch() -> str:
    pins = re.findall(r"pip install -q torch==([\w.+]+)", MAKEFILE)
    assert len(pins) == 1, f"expected one torch pin in the Makefile, found {pins}"
    return pins[0]


# ---------------------------------------------------------------------------------------------- the commands


class Session:
    """The state a reader's shell would have: the clone's folder (here a scratch folder) and what was printed."""

    def __init__(self, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.folder, self.capsys = folder, capsys
        self.clone: str | None = None
        self.printed = ""

    def run(self, words: list[str], where: str) -> None:
        venv_bin = f"{make_variable('VENV')}/bin/"
        program = words[0].removeprefix(venv_bin)
        if program == "git" and words[1:2] == ["clone"]:
            self.check_clone(words[2:], where)
        elif program == "cd":
            assert self.clone is not None and words[1:] == [self.clone], f"{where}: `cd` into something but the clone"
        elif words[:3] == [make_variable("PYTHON"), "-m", "venv"]:
            assert words[3:] == [make_variable("VENV")], f"{where}: the venv must be the Makefile's {venv_bin}"
        elif program in ("source", "."):
            assert words[1:] == [f"{venv_bin}activate"], f"{where}: activate the Makefile's venv"
        elif program == "pip":
            assert words[0] == f"{venv_bin}pip", f"{where}: install into the Makefile's venv ({venv_bin})"
            self.check_pip(words[1:], where)
        elif program == "make":
            self.make(words[1:], where)
        elif program == CONSOLE_SCRIPT:
            self.console_script(words[1:], where)
        else:
            pytest.fail(f"{where}: no rule runs or checks `{shlex.join(words)}`; add one to tests/docs/test_readme.py")

    def check_clone(self, arguments: list[str], where: str) -> None:
        # Not run: it needs the network, and this test already runs inside a clone.
        assert len(arguments) == 2, f"{where}: `git clone URL FOLDER`, got {arguments}"
        self.clone = arguments[1]
        assert self.clone == project_field("name"), f"{where}: clone into the project's name"

    def check_pip(self, arguments: list[str], where: str) -> None:
        # Not run: it would reinstall the environment this test runs in, from the network.
        assert arguments[0] == "install", f"{where}: only `pip install` is checked"
        if arguments[1].startswith("torch"):
            assert arguments[1] == f"torch=={pinned_torch()}", f"{where}: torch must be the Makefile's pin"
            assert arguments[2:] in ([], ["--index-url", CPU_WHEEL_INDEX]), f"{where}: unexpected {arguments[2:]}"
        else:
            assert arguments[1] == "-e", f"{where}: install this checkout in editable mode, as `make setup`"
            extras = re.fullmatch(r"\.\[([\w,-]+)\]", arguments[2])
            assert extras and len(arguments) == 3, f'{where}: expected `pip install -e ".[extra]"`'
            for extra in extras[1].split(","):
                assert extra in project_extras(), f"{where}: no extra {extra!r}"

    def make(self, arguments: list[str], where: str) -> None:
        target, options = arguments[0], arguments[1:]
        recipe = make_recipe(target)
        if target in ("setup", "test"):
            # Not run: `setup` builds the environment this test runs in; `test` runs this test.
            assert not options, f"{where}: `make {target}` takes no options here"
            return
        assert target == "train", f"{where}: no rule runs `make {target}`; add one to tests/docs/test_readme.py"
        make_args = []
        for option in options:
            name, _, value = option.partition("=")
            assert name == "ARGS", f"{where}: `make train` takes ARGS=..., got {option}"
            make_args = shlex.split(value)
        (command,) = recipe
        words = shlex.split(command.replace("$(VENV)", make_variable("VENV")).replace("$(ARGS)", ""))
        assert words[0].endswith(f"/bin/{CONSOLE_SCRIPT}"), f"the Makefile's train recipe is {command!r}"
        self.console_script([*words[1:], *make_args], where)

    def console_script(self, argv: list[str], where: str) -> None:
        if argv[:1] == ["train"]:
            check_data_languages(argv, where)
            # The README's job with a budget of 2 updates (the README's budget stays, so that the printed lines keep
            # their form); a checkpoint after every update, so that there are two to average. No option here names
            # a file: the README's own data files are the ones read.
            argv = [*argv, "--max-time", "10m", "--max-steps", "2", "--max-train-pairs", "300", "--vocab-size", "400"]
            argv += ["--max-tokens", "1024", "--save-every", "0.001", "--test-max-sentences", "1", "--no-progress"]
            if "--valid-src" in argv or "--dataset" in argv:  # a dev set: score a few of its sentences, not 1,000
                argv += ["--eval-max-sentences", "4"]
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
        captured = self.capsys.readouterr()
        assert code == 0, f"{where}: `{shlex.join([CONSOLE_SCRIPT, *argv])}` exited {code}:\n{captured.err[-2000:]}"
        self.printed += captured.out
        if argv[:1] == ["train"] and "--report-to" in argv and "tensorboard" in argv[argv.index("--report-to") + 1]:
            run_folder = Path(argv[argv.index("--output-dir") + 1])
            events = list(run_folder.glob("checkpoints/runs/**/events.out.tfevents.*"))
            assert events, f"{where}: --report-to tensorboard wrote no event files"
        if argv[:1] == ["translate"]:
            sentences = [word for word in argv[2:] if not word.startswith("--")]
            assert len(captured.out.splitlines()) == len(sentences), f"{where}: one line out per sentence"


def check_data_languages(argv: list[str], where: str) -> None:
    """Each data file of a `train` command (`--train-src X.en.gz` ...) is in the command's language for its side: the
    bundled files are named `split.LANG.gz`."""
    languages = {"src": TrainOptions.src_lang, "tgt": TrainOptions.tgt_lang}
    for index, word in enumerate(argv[:-1]):
        if match := re.fullmatch(r"--(src|tgt)-lang", word):
            languages[match[1]] = argv[index + 1]
    for index, word in enumerate(argv[:-1]):
        if match := re.fullmatch(r"--(?:train|valid|test)-(src|tgt)", word):
            language = languages[match[1]]
            assert f".{language}." in Path(argv[index + 1]).name, f"{where}: {word} is not in {language}"


def line_pattern(sample: str) -> re.Pattern[str]:
    """A printed line's sample as a pattern: any number for a number, anything for `…`."""
    parts = re.split(rf"(…|{NUMBER})", sample)
    pattern = "".join(
        re.escape(part) if index % 2 == 0 else ".*" if part == "…" else NUMBER for index, part in enumerate(parts)
    )
    return re.compile(pattern)


def test_readme_blocks_run_in_order(tmp_path: Path, capsys, monkeypatch) -> None:
    blocks = readme_blocks()
    assert {block.language for block in blocks} >= {"bash", "python"}, "README.md lost its code blocks"
    folder = tmp_path / "clone"
    folder.mkdir()
    (folder / "hf_vanilla_transformer").symlink_to(ROOT / "hf_vanilla_transformer")  # the clone's bundled data
    monkeypatch.chdir(folder)
    session = Session(folder, capsys)
    for block in blocks:
        if block.language == "bash":
            session.printed = ""
            for words in shell_commands(block):
                session.run(words, block.where())
        elif block.language == "python":
            exec(compile(block.text, block.where(), "exec"), {"__name__": "__readme__"})
            capsys.readouterr()
        elif block.language == "text":
            printed = session.printed.splitlines()
            assert printed, f"{block.where()}: a sample output must follow a shell block that prints"
            for sample in block.text.splitlines():
                pattern = line_pattern(sample)
                assert any(pattern.fullmatch(line) for line in printed), (
                    f"{block.where()}: no printed line has the form {sample!r}; printed:\n" + "\n".join(printed)
                )
        else:
            pytest.fail(
                f"{block.where()}: no rule runs a ```{block.language} block; add one to tests/docs/test_readme.py"
            )


# ---------------------------------------------------------------------------------------------- links, files


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("**/*.md"))]


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#+ (.*)$", text, re.M)
    }


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_point_at_files_of_the_repository(page: Path) -> None:
    """Every relative link names a file of the repository, and a `page.md#anchor` link a heading of that page (so a
    section moved to another page is noticed)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{page.relative_to(ROOT)} links to {target}, which is not in the repository"
        assert ROOT in path.parents or path == ROOT, f"{page.relative_to(ROOT)} links outside the repository"
        if anchor and path.suffix == ".md":
            assert anchor in heading_anchors(path), f"{page.relative_to(ROOT)} links to {target}: no such heading"


@pytest.mark.parametrize("page", markdown_files(), ids=lambda path: str(path.relative_to(ROOT)))
def test_tests_named_in_the_docs_exist(page: Path) -> None:
    """`tests/x.py::test_name` in a page: the file exists and defines that test (so a moved test is noticed)."""
    for file, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", page.read_text(encoding="utf-8")):
        assert (ROOT / file).is_file(), f"{page.relative_to(ROOT)} names {file}, which does not exist"
        if name:
            source = (ROOT / file).read_text(encoding="utf-8")
            assert re.search(rf"def {name}\(", source), f"{page.relative_to(ROOT)} names {file}::{name}: not there"


def test_license_is_the_one_pyproject_names() -> None:
    assert project_field("license") == "Apache-2.0"
    lines = [line.strip() for line in (ROOT / "LICENSE").read_text(encoding="utf-8").splitlines()[:3]]
    assert lines[:2] == ["Apache License", "Version 2.0, January 2004"]


def test_citation_cff_names_this_project_and_the_paper() -> None:
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert citation["cff-version"] == "1.2.0"
    assert citation["version"] == project_field("version")
    assert citation["license"] == project_field("license")
    assert project_field("name") in citation["title"]
    assert citation["authors"] and citation["message"]
    paper = citation["preferred-citation"]
    assert (paper["title"], paper["year"], paper["authors"][0]["family-names"]) == (
        "Attention Is All You Need",
        2017,
        "Vaswani",
    )
    assert "1706.03762" in paper["url"]
