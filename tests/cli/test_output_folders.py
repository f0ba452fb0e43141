"""Fault injection for issue 34, item 1 ("nothing of the user's is ever lost"): canary files, the user's own with known
content, lie under the output path of every command that writes (train, average, the converters, to-marian, to-onnx,
evaluate, translate, attention, push), with and without `--overwrite`. Each command either refuses before any work
(exit 2, one line naming the folder and a canary) or writes only its own files (those its manifest lists); every
canary survives byte for byte. The commands run in this process (cli.main, conversion's main); one tiny run of
`train` (tests/train_script.py's test preset, 2 updates) is the model folder and run folder they work on.

The rule itself, path by path: tests/cli/test_files.py."""

import json
import os
import shutil
from pathlib import Path

import pytest

from conversion.__main__ import main as conversion_main
from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.files import MANIFEST, read_manifest
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS

from ..conftest import cli
from ..train_script import TEST_PRESET, train_args

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "tests" / "conversion" / "fixtures" / "nn_transformer_tutorial" / "model.pt"

# The user's files, by path under the folder a command is pointed at: the names a command writes (README.md,
# config.json, tokenizer.json) and the run folder's subfolders (checkpoints/, curve/, model/).
CANARIES = {
    "notes.txt": b"the user's notes\n",
    "README.md": b"# the user's README\n",
    "config.json": b'{"the user": "config"}\n',
    "tokenizer.json": b'{"the user": "tokenizer"}\n',
    "checkpoints/notes.txt": b"the user's notes on checkpoints\n",
    "curve/data.csv": b"minutes,bleu\n1,2.5\n",
    "model/README.md": b"# the user's model card\n",
}


def plant(folder: Path, canaries: dict[str, bytes] = CANARIES) -> Path:
    for name, content in canaries.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def assert_canaries(folder: Path, canaries: dict[str, bytes] = CANARIES) -> None:
    assert {name: (folder / name).read_bytes() for name in canaries} == canaries


def assert_refused(code: int, err: str, folder: Path | str, *named: str) -> None:
    """Exit 2 and one line (no traceback) naming `folder` and one of `named` (a canary, or the input it is)."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert str(folder) in lines[0] and any(name in lines[0] for name in named), err


def assert_only_own_files(folder: Path) -> None:
    """Every entry of `folder` is one its manifest lists (what the command wrote there)."""
    manifest = read_manifest(folder)
    assert manifest is not None, f"{folder} has no manifest"
    assert {path.name for path in folder.iterdir()} - {MANIFEST} <= manifest.entries


def convert(argv: list[str], capsys) -> tuple[int, str]:
    """`python -m conversion ARGV` in this process: exit status and stderr."""
    try:
        code = conversion_main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def run_argv(corpus: Path, output: Path | str, *extra: str) -> list[str]:
    """A 2-update run of the test preset with a test set, so that its model folder has a card, results and plots."""
    test_set = ("--test-src", str(corpus / "test.src"), "--test-tgt", str(corpus / "test.tgt"))
    return train_args(corpus, Path(output), 2, *test_set, "--examples", "0", *extra)


@pytest.fixture(scope="module")
def run_dir(corpus, tmp_path_factory) -> Path:
    """A finished run folder, written among canaries (the user's files beside it survive, the run holds only its
    own entries)."""
    sandbox = plant(tmp_path_factory.mktemp("sandbox"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PRESETS, "transformer-test", TEST_PRESET)
        assert main(run_argv(corpus, sandbox / "run")) == 0
    assert_canaries(sandbox)
    assert_only_own_files(sandbox / "run")
    assert_only_own_files(sandbox / "run" / "model")
    return sandbox / "run"


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    return plant(tmp_path / "sandbox")


# ---------------------------------------------------------------------------------------------------------- train


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_train_refuses_a_folder_of_the_users(overwrite, corpus, sandbox, capsys, monkeypatch) -> None:
    """The issue's first break: `train --output-dir F` deleted F's checkpoints/notes.txt, curve/data.csv and
    model/README.md (and replaced README.md-like files), exit 0. Also through a symbolic link to F."""
    (sandbox.parent / "link").symlink_to(sandbox)
    for output in (sandbox, sandbox.parent / "link"):
        code, _, err = cli(run_argv(corpus, output, *overwrite), capsys, monkeypatch)
        assert_refused(code, err, output, "checkpoints/", "curve/", "model/", "notes.txt")
        assert_canaries(sandbox)
    assert not (sandbox.parent / ".sandbox.lock").exists()  # refused before the run took its lock


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_train_refuses_the_current_folder_with_the_data_in_it(overwrite, corpus, sandbox, capsys, monkeypatch) -> None:
    """`train --output-dir .` in the folder that holds the training data."""
    for name in ("train.src", "train.tgt"):
        shutil.copy(corpus / name, sandbox / name)
    monkeypatch.chdir(sandbox)
    argv = run_argv(corpus, ".", *overwrite)
    argv[argv.index("--train-src") + 1], argv[argv.index("--train-tgt") + 1] = "train.src", "train.tgt"
    code, _, err = cli(argv, capsys, monkeypatch)
    assert_refused(code, err, "`--output-dir` .", "train.src", "notes.txt", "checkpoints/")
    assert_canaries(sandbox)
    assert (sandbox / "train.src").read_bytes() == (corpus / "train.src").read_bytes()


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["plain", "overwrite"])
def test_train_refuses_its_own_run_folder_once_the_user_added_files(
    overwrite, run_dir, corpus, tmp_path, capsys, monkeypatch
) -> None:
    """A run folder of its own, where the user put notes beside the checkpoints, the curve snapshots, the run and the
    model: `--overwrite` replaces the run's files only, so the folder is refused while those are there."""
    own = shutil.copytree(run_dir, tmp_path / "run", symlinks=True)
    canaries = {"notes.txt": b"mine\n", "checkpoints/notes.txt": b"mine\n", "curve/data.csv": b"1,2\n"}
    for extra in ({}, {"model/notes.txt": b"mine\n"}):
        for name in canaries:
            (own / name).unlink(missing_ok=True)
        plant(own, {"model/notes.txt": b"mine\n"} if extra else canaries)
        code, _, err = cli(run_argv(corpus, own, *overwrite), capsys, monkeypatch)
        assert_refused(code, err, own, "notes.txt", "checkpoints/notes.txt", "curve/data.csv")
        assert_canaries(own, extra or canaries)
    assert sorted((own / "checkpoints").glob("checkpoint-*")) == [own / "checkpoints" / "checkpoint-2"]


def test_train_overwrite_replaces_its_own_run_and_nothing_beside_it(run_dir, corpus, capsys, monkeypatch) -> None:
    """Without the user's files in it, `--overwrite` starts the run afresh in its own folder: the canaries beside
    the run folder survive and the folder holds only the run's entries."""
    own = shutil.copytree(run_dir, run_dir.parent / "rerun", symlinks=True)
    code, _, err = cli(run_argv(corpus, own, "--overwrite"), capsys, monkeypatch)
    assert code == 0, err
    assert_canaries(run_dir.parent)
    assert_only_own_files(own)
    assert_only_own_files(own / "model")


# ------------------------------------------------------------------------------------------------ average, convert


def test_average_refuses_a_folder_of_the_users_and_the_current_folder(run_dir, sandbox, capsys, monkeypatch) -> None:
    """`average CK -o F` deleted F's README.md and replaced its config.json and tokenizer.json; `-o .` failed with
    `OSError: File name too long`. Both are one line now, the canaries intact; `-o .` in an empty folder too."""
    checkpoint = str(run_dir / "checkpoints" / "checkpoint-2")
    code, _, err = cli(["average", checkpoint, "-o", str(sandbox)], capsys, monkeypatch)
    assert_refused(code, err, sandbox, "README.md", "config.json")
    monkeypatch.chdir(sandbox)
    code, _, err = cli(["average", checkpoint, "-o", "."], capsys, monkeypatch)
    assert_refused(code, err, "`--output` .", "README.md", "config.json")
    assert_canaries(sandbox)
    (sandbox / "empty").mkdir()
    monkeypatch.chdir(sandbox / "empty")
    code, _, err = cli(["average", checkpoint, "-o", "."], capsys, monkeypatch)
    assert_refused(code, err, "`--output` .", "is the current folder")
    assert os.listdir(sandbox / "empty") == []


def test_average_replaces_its_own_folder_and_nothing_beside_it(run_dir, sandbox, capsys, monkeypatch) -> None:
    checkpoints = str(run_dir / "checkpoints")
    for _ in range(2):  # a new folder, then its own
        code, _, err = cli(["average", checkpoints, "--last", "1", "-o", str(sandbox / "avg")], capsys, monkeypatch)
        assert code == 0, err
        assert_only_own_files(sandbox / "avg")
    assert_canaries(sandbox)
    other_run = shutil.copytree(run_dir, sandbox / "other-run", symlinks=True)
    before = tree(other_run)
    code, _, err = cli(["average", checkpoints, "--last", "1", "-o", str(other_run)], capsys, monkeypatch)
    assert_refused(code, err, other_run, "is a run folder of this package, not a model folder")
    assert tree(other_run) == before


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["to-marian", "{model}", "{out}"], id="to-marian"),
        pytest.param(["to-onnx", "{model}", "{out}"], id="to-onnx"),
        pytest.param(["nn-transformer", str(TUTORIAL), "{out}", "--heads", "4"], id="nn-transformer"),
    ],
)
def test_converters_refuse_a_folder_of_the_users(argv, run_dir, sandbox, capsys) -> None:
    """`python -m conversion to-marian SRC F` replaced F's files as `average` did; every format goes through the
    same check (conversion/_common.check_output) before it reads its source."""
    model = run_dir / "model"
    code, err = convert([arg.format(model=model, out=sandbox) for arg in argv], capsys)
    assert_refused(code, err, sandbox, "README.md", "config.json")
    assert_canaries(sandbox)


def test_a_converter_writes_a_new_folder_then_replaces_its_own(sandbox, capsys) -> None:
    for _ in range(2):
        code, err = convert(["nn-transformer", str(TUTORIAL), str(sandbox / "converted"), "--heads", "4"], capsys)
        assert code == 0, err
        assert_only_own_files(sandbox / "converted")
    assert_canaries(sandbox)


def test_a_converter_never_writes_over_its_source(run_dir, capsys) -> None:
    """`to-marian SRC SRC` turned the source into a Marian config beside stale code files; inside the source
    (`SRC/marian`) or holding it (the run folder) are refused alike."""
    model = run_dir / "model"
    before = tree(run_dir)
    for output in (model, model / "marian", run_dir):
        code, err = convert(["to-marian", str(model), str(output)], capsys)
        assert_refused(code, err, output, "SOURCE")
    assert tree(run_dir) == before


# -------------------------------------------------------------------------------- evaluate, translate, attention


def test_evaluate_and_translate_never_write_over_an_input_or_the_model(run_dir, corpus, sandbox, capsys, monkeypatch):
    """`evaluate CK --src x.en --ref x.de --output x.en` put JSON into the source file; `translate CK ... --output
    CK/config.json` overwrote the model's config."""
    model = run_dir / "model"
    before = tree(run_dir)
    source = sandbox / "notes.txt"  # the user's file as the data to score
    evaluate = ["evaluate", str(model), "--src", str(source), "--ref", str(source), "--no-progress"]
    for output, named in ((source, "`--src`"), (model / "config.json", "`model_dir`")):
        code, _, err = cli([*evaluate, "--output", str(output)], capsys, monkeypatch)
        assert_refused(code, err, output, named)
    code, _, err = cli(["translate", str(model), "w4 w5", "--output", str(model / "config.json")], capsys, monkeypatch)
    assert_refused(code, err, model / "config.json", "`model_dir`")
    code, _, err = cli(["translate", str(model), "--input", str(source), "--output", str(source)], capsys, monkeypatch)
    assert_refused(code, err, source, "`--input`")
    assert_canaries(sandbox)
    assert tree(run_dir) == before
    code, _, err = cli([*evaluate, "--output", str(sandbox / "scores.json")], capsys, monkeypatch)
    assert code == 0, err
    assert json.loads((sandbox / "scores.json").read_text())["n"] == 1
    assert_canaries(sandbox)


def test_attention_writes_only_its_plots(run_dir, sandbox, capsys, monkeypatch) -> None:
    """`attention --out DIR`: a folder of the user's and the model folder itself are refused; a new folder gets the
    three plots and their manifest, and is its own the next time."""
    model = run_dir / "model"
    before = tree(run_dir)
    for out, named in ((sandbox, "README.md"), (model, "`model_dir`")):
        code, _, err = cli(["attention", str(model), "w4 w5", "--out", str(out)], capsys, monkeypatch)
        assert_refused(code, err, out, named)
    assert tree(run_dir) == before
    for _ in range(2):
        code, out, err = cli(["attention", str(model), "w4 w5", "--out", str(sandbox / "plots")], capsys, monkeypatch)
        assert code == 0 and len(out.splitlines()) == 3, err
        assert_only_own_files(sandbox / "plots")
    assert_canaries(sandbox)


def test_push_uploads_the_model_and_writes_nothing_here(hub, run_dir, tmp_path, capsys, monkeypatch) -> None:
    """`push` writes no local file: the model folder (with a file of the user's in it) stays byte for byte, and
    neither that file nor the manifest is uploaded."""
    _, state = hub
    model = plant(shutil.copytree(run_dir / "model", tmp_path / "model"), {"notes.txt": b"mine\n"})
    before = tree(model)
    code, _, err = cli(["push", str(model), "me/tiny"], capsys, monkeypatch)
    assert code == 0, err
    assert tree(model) == before
    uploaded = set(state.files("me/tiny"))
    assert "notes.txt" not in uploaded and MANIFEST not in uploaded and "config.json" in uploaded
