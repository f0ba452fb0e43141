"""Fault injection. During training (`hf-vanilla-transformer train`, run as a subprocess through
tests/train_script.py): a run killed with SIGKILL and resumed with --resume ends bit-identical to an uninterrupted
one; a kill while a checkpoint is being written leaves the previous checkpoint loadable, and --resume must not pick
the half-written one. Model folder writes: a kill at any step leaves the old folder or the new one.

Every run: the test preset (1+1 layers, d_model 32, P_drop 0.1, so dropout draws from the RNG the checkpoint must
restore), 64 pairs in 10 batches per epoch, 24 updates, a checkpoint every 7 updates and at epoch ends, one thread.
"""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.files import MANIFEST

from ..conftest import cli
from ..train_script import REPO, TEST_PRESET, command, environment, run, train_args, write_corpus

MAX_STEPS = 24
SAVE_STEPS = ["--save-steps", "7"]  # with the epoch ends: checkpoints 7, 10, 14, 20, 21, 24


def run_args(corpus: Path, output: Path, *extra: str) -> list[str]:
    # --average-last 10: save_total_limit 11, so no checkpoint of a run is rotated away.
    return train_args(corpus, output, MAX_STEPS, "--average-last", "10", *extra)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def optimizer_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Adam's moments and step counts of a checkpoint, flattened to name -> tensor."""
    state = torch.load(path / "optimizer.pt", weights_only=True)["state"]
    return {f"{index}.{name}": value for index, entry in state.items() for name, value in entry.items()}


def assert_bit_identical(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], what: str) -> None:
    assert actual.keys() == expected.keys(), what
    differing = [key for key in expected if not torch.equal(actual[key], expected[key])]
    assert not differing, f"{what}: {len(differing)} of {len(expected)} tensors differ, e.g. {differing[:3]}"


def losses(checkpoint: Path) -> dict[int, float]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry["loss"] for entry in history if "loss" in entry}


def checkpoint_steps(output_dir: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in (output_dir / "checkpoints").glob("checkpoint-*"))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The uninterrupted run, with a record of the files it wrote."""
    output = tmp_path_factory.mktemp("reference") / "model"
    result = run([*SAVE_STEPS, "--trace", str(output.parent / "trace")], run_args(corpus, output))
    assert result.returncode == 0, result.stdout
    assert checkpoint_steps(output) == [7, 10, 14, 20, 21, 24]
    state = json.loads((output / "checkpoints" / "checkpoint-10" / "trainer_state.json").read_text())
    assert state["epoch"] == pytest.approx(1.0)  # 10 updates per epoch, as the kill points below assume
    return output


def assert_same_end(resumed: Path, reference: Path, resumed_from: int) -> None:
    """Weights (last checkpoint and the averaged model folder), Adam's state and the later losses are bit-identical."""
    last = f"checkpoints/checkpoint-{MAX_STEPS}"
    assert_bit_identical(weights(resumed / last), weights(reference / last), "last checkpoint")
    assert_bit_identical(weights(resumed / "model"), weights(reference / "model"), "averaged model folder")
    assert_bit_identical(optimizer_tensors(resumed / last), optimizer_tensors(reference / last), "Adam state")
    resumed_losses, reference_losses = losses(resumed / last), losses(reference / last)
    assert [resumed_losses[step] for step in range(resumed_from + 1, MAX_STEPS + 1)] == [
        reference_losses[step] for step in range(resumed_from + 1, MAX_STEPS + 1)
    ]


# ------------------------------------------------------------------------------------------ SIGKILL and resume


@contextlib.contextmanager
def paused_run(hooks: list[str], args: list[str], pause_at: int, log_path: Path) -> Iterator[subprocess.Popen]:
    """A training run (train_script.py with `hooks`) that is entered once update `pause_at` is done (the run then
    sleeps) and SIGKILLed from outside on leaving."""
    output = Path(args[args.index("--output-dir") + 1])
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command([*hooks, "--pause-at", str(pause_at)], args),
            cwd=REPO,
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            marker = output / f"paused-at-{pause_at}"
            deadline = time.monotonic() + 240
            while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert marker.exists(), f"the run never reached update {pause_at}:\n{log_path.read_text()}"
            yield process
            os.kill(process.pid, signal.SIGKILL)
            assert process.wait(timeout=60) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


@pytest.mark.parametrize(
    ("pause_at", "newest"),
    [
        pytest.param(16, 14, id="mid-epoch"),  # resumes 4 batches into epoch 2: skip_first_batches + RNG re-sync
        pytest.param(12, 10, id="epoch-boundary"),  # resumes at the start of epoch 2
    ],
)
def test_sigkill_then_resume_is_bit_identical(corpus, reference, tmp_path, pause_at, newest) -> None:
    """SIGKILL from outside once update `pause_at` is done (checkpoint `newest` is the last one), then --resume:
    the end is bit-identical to the uninterrupted run (torch.equal on every weight and Adam moment, equal losses).
    Measured: bit-identical in both cases. Without rng_state.pth in the checkpoint the dropout masks change and the
    weights differ by up to ~1e-2, so the comparison does see the restored RNG."""
    output = tmp_path / "model"
    args = run_args(corpus, output)
    with paused_run(SAVE_STEPS, args, pause_at, tmp_path / "killed.log"):
        pass
    assert checkpoint_steps(output)[-1] == newest
    assert not (output / "checkpoints" / f"checkpoint-{MAX_STEPS}").exists()

    result = run(SAVE_STEPS, [*args, "--resume"])
    assert result.returncode == 0, result.stdout
    assert f"Trained {MAX_STEPS} updates" in result.stdout
    assert "missing keys" not in result.stdout  # the tied weights (issue 26, item 4): see test_faults below
    assert_same_end(output, reference, resumed_from=newest)


# ------------------------------------------------------------------------------------------ kill during a save


@pytest.fixture(scope="module")
def killed_in_save(corpus, tmp_path_factory) -> Path:
    """A run that SIGKILLs itself while writing checkpoint-14: after the weights, the optimizer and the scheduler,
    before rng_state.pth and trainer_state.json (the order of transformers 5.23's `Trainer._save_checkpoint`)."""
    output = tmp_path_factory.mktemp("killed-in-save") / "model"
    result = run([*SAVE_STEPS, "--kill-in-save", "14"], run_args(corpus, output))
    assert result.returncode == -signal.SIGKILL, result.stdout
    return output


def test_kill_during_save_leaves_the_previous_checkpoint_loadable(killed_in_save, reference) -> None:
    """transformers writes checkpoint-N in place (no temporary folder and rename), trainer_state.json last, so a kill
    mid-save leaves a folder without it; the checkpoints before it are complete, load, and hold the weights of the
    uninterrupted run."""
    checkpoints = killed_in_save / "checkpoints"
    assert checkpoint_steps(killed_in_save) == [7, 10, 14]
    half_written = checkpoints / "checkpoint-14"
    assert (half_written / "model.safetensors").is_file() and (half_written / "optimizer.pt").is_file()
    assert not (half_written / "trainer_state.json").exists() and not (half_written / "rng_state.pth").exists()

    previous = checkpoints / "checkpoint-10"
    assert json.loads((previous / "trainer_state.json").read_text())["global_step"] == 10
    assert_bit_identical(weights(previous), weights(reference / "checkpoints" / "checkpoint-10"), "checkpoint-10")
    model = AutoModelForSeq2SeqLM.from_pretrained(previous)
    assert model.config.d_model == 32
    optimizer_tensors(previous)  # the optimizer state loads too


@pytest.mark.parametrize("damage", ["killed-after-the-weights", "killed-while-writing-the-weights"])
def test_resume_skips_a_half_written_checkpoint(corpus, killed_in_save, reference, tmp_path, damage) -> None:
    """--resume after a kill mid-save resumes from the last complete checkpoint (10), says that it skipped the
    half-written one (14), and ends bit-identical to the uninterrupted run. Picking checkpoint-14 would stop
    with "No such file or directory: .../checkpoint-14/trainer_state.json"."""
    output = tmp_path / "model"
    shutil.copytree(killed_in_save, output)
    if damage == "killed-while-writing-the-weights":  # what a kill inside safetensors' write leaves
        weights_file = output / "checkpoints" / "checkpoint-14" / "model.safetensors"
        weights_file.write_bytes(weights_file.read_bytes()[: weights_file.stat().st_size // 2])
    result = run(SAVE_STEPS, run_args(corpus, output, "--resume"))
    assert result.returncode == 0, result.stdout
    assert "checkpoint-14" in result.stdout and "incomplete" in result.stdout
    assert (output / "checkpoints" / "checkpoint-14" / "trainer_state.json").is_file()  # rewritten by the resume
    assert_same_end(output, reference, resumed_from=10)


def test_each_checkpoint_is_written_once(reference) -> None:
    """The last checkpoint is saved once: WallClockCallback asks for a save at max_steps, and the epoch-end save
    (save_strategy="epoch") must not write the same folder again (twice the time spent saving, and a window where a
    kill corrupts a checkpoint that already has its trainer_state.json)."""
    writes = (reference.parent / "trace" / "writes-rank0.txt").read_text().splitlines()
    checkpoint_files = [path for path in writes if "/checkpoints/checkpoint-" in path]
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json"):
        written = [path for path in checkpoint_files if path.endswith(f"/{name}")]
        assert len(written) == len(set(written)) == 6, sorted(written)


# ------------------------------------------------------------------------------------------ the run folder

# Issue 26, items 2-4: options refused before the run folder changes, one run per folder, --resume of the same run.
# Refusals run the CLI in this process (a second or so each); training runs go through tests/train_script.py.


def bpe_args(corpus: Path, output: Path, max_steps: int, *extra: str) -> list[str]:
    """`train_args` with a joint BPE of 300 trained on the data instead of the corpus's word-level tokenizer."""
    args = train_args(corpus, output, max_steps)
    del args[args.index("--tokenizer") : args.index("--tokenizer") + 2]
    return [*args, "--vocab-size", "300", "--bf16", "no", *extra]  # fp32 on every CPU: the bf16 case changes it


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (the run folder and what lies beside it), by path."""
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def earlier_run(corpus, tmp_path_factory) -> Path:
    """A finished 2-update run with a BPE: checkpoint-2, the model folder, run_settings.json."""
    output = tmp_path_factory.mktemp("earlier") / "model"
    result = run([], bpe_args(corpus, output, 2))
    assert result.returncode == 0, result.stdout
    assert checkpoint_steps(output) == [2] and (output / "run_settings.json").is_file()
    return output


@pytest.fixture(scope="module")
def blank_corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("blank")
    (folder / "train.src").write_text("w4 w5\n \n\n", encoding="utf-8")
    (folder / "train.tgt").write_text("\nw6\n\t\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param("blank", "`--train-src` ", id="all-blank-data"),
        pytest.param(["--vocab-size", "100"], "`--vocab-size 100` is below the smallest BPE, 261", id="vocab-size"),
        pytest.param(["--max-length", "1"], "`--max-length 1` must be at least 2", id="max-length"),
        pytest.param(["--max-tokens", "8"], "`--max-tokens 8` is below the longest training pair", id="max-tokens"),
        pytest.param(["--seed", "-1"], "`--seed -1` must lie in [0, 2**32 - 1]", id="seed"),
    ],
)
def test_a_refused_option_changes_nothing_on_disk(
    change, message, earlier_run, corpus, blank_corpus, tmp_path, capsys, monkeypatch
) -> None:
    """Options refused late used to come after `--overwrite` had deleted the earlier run's checkpoints and after
    `--output-dir` was created, in the library's terms (`max_tokens` must be ...). Now: exit 2, one line naming the
    option and its value, the earlier run's files (and the lock file beside them) byte for byte as they were, and
    no folder created for a new --output-dir."""
    before = tree(earlier_run.parent)
    data = blank_corpus if change == "blank" else corpus
    extra = [] if change == "blank" else change
    for output, more in ((earlier_run, ["--overwrite"]), (tmp_path / "new" / "model", [])):
        code, _, error = cli(bpe_args(data, output, 2, *extra, *more), capsys, monkeypatch)
        assert code == 2 and message in error and len(error.strip().splitlines()) == 1, error
        assert "Traceback" not in error
    assert tree(earlier_run.parent) == before
    assert not (tmp_path / "new").exists()


def test_resume_of_a_run_folder_of_the_older_layout(earlier_run, corpus, tmp_path, capsys, monkeypatch) -> None:
    """A run folder from before RUN/model (the model at its top level, beside checkpoints/) resumes: the new model
    goes to RUN/model, and one line says that the old top-level model files can be deleted."""
    output = shutil.copytree(earlier_run, tmp_path / "old-layout")
    for entry in (output / "model").iterdir():
        entry.rename(output / entry.name)
    (output / "model").rmdir()
    code, out, err = cli(bpe_args(corpus, output, 2, "--resume"), capsys, monkeypatch)
    assert code == 0, err
    assert f"{output} holds a model at its top level (a run of an older version); this run writes its model to " in out
    assert json.loads((output / "model" / "results.json").read_text())["updates"] == 2


def test_one_run_per_folder_and_a_killed_holder_blocks_nothing(corpus, tmp_path) -> None:
    """Two `train` processes on one --output-dir both exited 0 with their checkpoints mixed (issue 26, item 3).
    While a run holds the folder (paused after update 1, checkpoint-1 written), a second run exits 2 naming the
    holder's PID, with or without --overwrite, and changes nothing; once the holder is SIGKILLed (the OS drops its
    lock), --resume of its run goes ahead."""
    output = tmp_path / "model"
    args = train_args(corpus, output, 3)
    with paused_run(["--save-steps", "1"], args, 1, tmp_path / "holder.log") as holder:
        before = tree(tmp_path)
        for extra in ([], ["--overwrite"]):
            second = run([], [*args, *extra])
            assert second.returncode == 2, second.stdout
            assert f"is in use by another training run (PID {holder.pid};" in second.stdout.splitlines()[-1]
        assert tree(tmp_path) == before
    resumed = run([], [*args, "--resume"])
    assert resumed.returncode == 0, resumed.stdout
    assert checkpoint_steps(output)[-1] == 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(["--dropout", "0.3"], "`--dropout` 0.3 now, 0.1 in the run", id="dropout"),
        # A deviation's dropout: the earlier run, without it, recorded none (as runs from before the option).
        pytest.param(
            ["--attention-dropout", "0.2"],
            "`--attention-dropout` 0.2 now, (not set) in the run",
            id="attention-dropout",
        ),
        pytest.param("other-data", "training data 64 pairs, sha256 ", id="data"),
        pytest.param(["--max-tokens", "64"], "`--max-tokens` 64 now, 48 in the run", id="max-tokens"),
        pytest.param(["--bf16", "yes"], "`--bf16` bf16 now, fp32 in the run", id="bf16"),
        pytest.param(
            ["--vocab-size", "320"],
            "`--tokenizer` a joint BPE of --vocab-size 320 now, a joint BPE of --vocab-size 300 in the run",
            id="vocab-size",
        ),
        pytest.param("tokenizer", "`--tokenizer` vocabulary sha256 ", id="tokenizer"),
        # Another d_model: a size-mismatch traceback from load_state_dict before.
        pytest.param(
            ["--preset", "transformer-tiny"], "`--preset` transformer-tiny now, transformer-test", id="preset"
        ),
        pytest.param(["--seed", "4"], "`--seed` 4 now, 3 in the run", id="seed"),
    ],
)
def test_resume_refuses_another_run(change, message, earlier_run, corpus, tmp_path, capsys, monkeypatch) -> None:
    """--resume with a setting that defines the run changed (issue 26, item 4: accepted silently, or a traceback for
    another d_model): exit 2, one line naming the setting with both values, nothing on disk changed."""
    extra = change if isinstance(change, list) else []
    data = corpus
    if change == "other-data":
        data = shutil.copytree(corpus, tmp_path / "other")
        lines = (data / "train.tgt").read_text(encoding="utf-8").splitlines()
        (data / "train.tgt").write_text("\n".join(["w4", *lines[1:]]) + "\n", encoding="utf-8")
    if change == "tokenizer":
        extra = ["--tokenizer", str(corpus / "tokenizer")]
    before = tree(earlier_run.parent)
    code, _, error = cli(bpe_args(data, earlier_run, 2, *extra, "--resume"), capsys, monkeypatch)
    assert code == 2 and len(error.strip().splitlines()) == 1, error
    assert "was started with other settings (run_settings.json)" in error and message in error
    assert tree(earlier_run.parent) == before


def test_run_settings_record_the_dropout_deviations_only_where_given() -> None:
    """Unset, the attention and ReLU dropouts are the preset's or the `init_from` folder's (a converted fairseq
    folder may have 0.1), which run_settings.json records already: no key, as in runs from before the options, so
    those still resume. Given, even as 0, the option is recorded as given."""
    from datasets import Dataset

    from hf_vanilla_transformer.training.options import TrainOptions
    from hf_vanilla_transformer.training.run_folder import run_settings

    pairs = Dataset.from_dict({"source": ["w4 w5"], "target": ["w6"]})
    unset = run_settings(TrainOptions(), pairs, "tok", 0.3, False)
    assert not {"attention_dropout", "activation_dropout"} & set(unset)
    given = run_settings(TrainOptions(attention_dropout=0.0, activation_dropout=0.2), pairs, "tok", 0.3, False)
    assert (given["attention_dropout"], given["activation_dropout"]) == (0.0, 0.2)
    deviations = ("attention_dropout", "activation_dropout")
    assert {name: value for name, value in given.items() if name not in deviations} == unset


def test_resume_honours_max_steps(earlier_run, corpus, tmp_path, capsys, monkeypatch) -> None:
    """--resume --max-steps below the checkpoint's step trained one more update (a step-4 checkpoint with
    --max-steps 2 went to step 5): now refused, as a run cannot go back. --max-steps equal to it finishes the run
    (averaging, results) without an update, as for a run killed after its last checkpoint."""
    code, _, error = cli(bpe_args(corpus, earlier_run, 1, "--resume"), capsys, monkeypatch)
    assert code == 2 and "`--max-steps 1` is below the 2 updates of checkpoint-2" in error, error

    # A run from before run_settings.json: resumed with a note, and its settings recorded from now on.
    output = shutil.copytree(earlier_run, tmp_path / "model")
    (output / "run_settings.json").unlink()
    checkpoint = (output / "checkpoints" / "checkpoint-2" / "model.safetensors").read_bytes()
    code, out, _ = cli(bpe_args(corpus, output, 2, "--resume"), capsys, monkeypatch)
    assert code == 0
    assert "records no run_settings.json" in out and "checkpoint-2 is at --max-steps 2 already: no training" in out
    assert (output / "run_settings.json").read_bytes() == (earlier_run / "run_settings.json").read_bytes()
    assert checkpoint_steps(output) == [2]
    assert (output / "checkpoints" / "checkpoint-2" / "model.safetensors").read_bytes() == checkpoint
    assert json.loads((output / "model" / "results.json").read_text())["updates"] == 2


def test_only_real_missing_keys_are_reported_on_resume(tmp_path, monkeypatch) -> None:
    """Every resume warned "There were missing keys in the checkpoint model loaded" for the embeddings and lm_head,
    which safetensors stores once, as model.shared.weight, and which load with it. A key really missing from the
    checkpoint is still reported, alone."""
    import transformers.trainer
    from safetensors.torch import save_file

    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer, VanillaSeq2SeqTrainingArguments

    from ..conftest import tiny_model

    warnings: list[str] = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *args: warnings.append(message))
    checkpoint = tmp_path / "checkpoint-1"
    tiny_model(seed=1).save_pretrained(checkpoint)
    args = VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
    trainer = VanillaSeq2SeqTrainer(model=tiny_model(seed=2), args=args)
    trainer._load_from_checkpoint(str(checkpoint))
    assert warnings == []
    assert torch.equal(trainer.model.lm_head.weight, weights(checkpoint)["model.shared.weight"])

    damaged = weights(checkpoint)
    del damaged["model.encoder.layers.0.fc1.weight"]
    save_file(damaged, checkpoint / "model.safetensors", metadata={"format": "pt"})
    trainer._load_from_checkpoint(str(checkpoint))
    assert len(warnings) == 1 and "['model.encoder.layers.0.fc1.weight']" in warnings[0], warnings


# ------------------------------------------------------------------------------------------ kill during a folder write

# Writes a new model folder over an old one through `replaced_folder`, counting every filesystem change (the `os`
# calls that create, rename or remove a path, and the renameat2 swap) and SIGKILLing itself right after change
# number argv[3] (0: never). Prints the number of changes. Loads files.py (and errors.py, which it imports) from a
# stand-in for the package, without its __init__: no transformers import per run.
FOLDER_WRITER = """
import importlib, os, signal, sys, types
package = types.ModuleType("package")
package.__path__ = [os.path.dirname(sys.argv[1])]
sys.modules["package"] = package
files = importlib.import_module("package.files")
kill_after, changes = int(sys.argv[3]), 0

def counted(function):
    def wrapper(*args, **kwargs):
        global changes
        result = function(*args, **kwargs)
        changes += 1
        if changes == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapper

for name in ("mkdir", "rename", "replace", "link", "symlink", "unlink", "rmdir"):
    setattr(os, name, counted(getattr(os, name)))
if hasattr(files, "_exchange"):
    files._exchange = counted(files._exchange)
with files.replaced_folder(sys.argv[2]) as folder:
    (folder / "config.json").write_text("new")
    (folder / "model.safetensors").write_bytes(b"new weights")
    (folder / "tokenizer.json").write_text("new")
print(changes)
"""


def folder_state(folder: Path) -> dict[str, bytes] | None:
    if not folder.is_dir():
        return None
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_a_kill_at_any_step_of_a_folder_write_leaves_the_old_or_the_new_folder(tmp_path) -> None:
    """SIGKILL right after each filesystem change of a folder write (issue 26, item 5): the folder is always the
    whole old one (its stale target_tokenizer/ included) or the whole new one (without it), and the run's
    checkpoints/ survive every kill. Writing file by file with os.replace into the old folder left a new
    config.json beside the old weights after the first replace. A later write cleans up what the kill left."""
    files_py = REPO / "hf_vanilla_transformer" / "files.py"
    old = {  # a model folder of an earlier version (no manifest) at the top of a run folder, as runs were
        "config.json": b'{"model_type": "vanilla_transformer"}',
        "model.safetensors": b"old weights",
        "tokenizer.json": b"old",
        "target_tokenizer/tokenizer.json": b"old target",
        "checkpoints/checkpoint-7/optimizer.pt": b"adam",
    }
    new = {"config.json": b"new", "model.safetensors": b"new weights", "tokenizer.json": b"new"}
    new["checkpoints/checkpoint-7/optimizer.pt"] = b"adam"

    def write(target: Path, kill_after: int) -> subprocess.CompletedProcess:
        args = [str(files_py), str(target), str(kill_after)]
        return subprocess.run([sys.executable, "-c", FOLDER_WRITER, *args], capture_output=True, text=True)

    def old_folder(root: Path) -> Path:
        target = root / "model"
        for name, content in old.items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).write_bytes(content)
        return target

    uninterrupted = write(old_folder(tmp_path / "uninterrupted"), 0)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    manifest = tmp_path / "uninterrupted" / "model" / MANIFEST  # written into the new folder before the swap
    assert json.loads(manifest.read_text())["entries"] == ["config.json", "model.safetensors", "tokenizer.json"]
    new[MANIFEST] = manifest.read_bytes()
    assert folder_state(tmp_path / "uninterrupted" / "model") == new
    changes = int(uninterrupted.stdout)
    seen = set()
    for kill_after in range(1, changes + 1):
        target = old_folder(tmp_path / f"kill-{kill_after}")
        result = write(target, kill_after)
        assert result.returncode == -signal.SIGKILL, result.stderr
        state = folder_state(target)
        assert state in (old, new), f"killed after change {kill_after} of {changes}: {state}"
        seen.add("old" if state == old else "new")
        write(target, 0)  # the next write recovers and removes the killed writer's sibling folders
        assert folder_state(target) == new and os.listdir(target.parent) == ["model"], kill_after
    assert seen == {"old", "new"}  # the kill points span the swap


# ------------------------------------------------------------------------------------------ damaged checkpoints

TUTORIAL = REPO / "tests" / "conversion" / "fixtures" / "nn_transformer_tutorial" / "model.pt"
ANNOTATED = REPO / "tests" / "conversion" / "fixtures" / "annotated_transformer" / "model.pt"


def convert(source: Path, output: Path, capsys, fmt: str = "nn-transformer") -> tuple[int, str]:
    """`python -m conversion FMT SOURCE OUTPUT --heads 4` (both fixtures have 4 heads): exit code and stderr."""
    from conversion.__main__ import main

    try:
        code = main([fmt, str(source), str(output), "--heads", "4"])
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err


def zero_bytes_inside_the_largest_tensor(source: Path, target: Path) -> None:
    """Copy `source` with 64 bytes in the middle of its largest tensor's data zeroed (a torch .pt is a zip of
    stored members: the data lies in the file as is)."""
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        member = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda i: i.file_size)
    header = data[member.header_offset : member.header_offset + 30]
    name_length, extra_length = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
    start = member.header_offset + 30 + name_length + extra_length + member.file_size // 2 - 32
    assert any(data[start : start + 64])
    data[start : start + 64] = bytes(64)
    target.write_bytes(bytes(data))


@pytest.mark.parametrize(("fmt", "source"), [("nn-transformer", TUTORIAL), ("annotated", ANNOTATED)])
def test_zeroed_bytes_inside_a_tensor_are_refused(fmt, source, tmp_path, capsys) -> None:
    """64 zeroed bytes inside a tensor (issue 26, item 5: a fairseq checkpoint so damaged converted with exit 0 and
    weights silently zero): the zip's CRC-32 catches them; one line naming the file, exit 2, nothing written."""
    damaged = tmp_path / "model.pt"
    zero_bytes_inside_the_largest_tensor(source, damaged)
    code, error = convert(damaged, tmp_path / "out", capsys, fmt)
    assert code == 2
    assert str(damaged) in error and "damaged" in error and "CRC-32" in error and "Re-download" in error
    assert len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("size", [0, 100, "half"], ids=["empty", "100-bytes", "half"])
def test_truncated_or_empty_checkpoints_are_one_clear_line(size, tmp_path, capsys) -> None:
    """An empty or truncated .pt: exit 2 with one line naming the file (before: torch's reader traceback)."""
    data = TUTORIAL.read_bytes()
    truncated = tmp_path / "model.pt"
    truncated.write_bytes(data[: len(data) // 2 if size == "half" else size])
    code, error = convert(truncated, tmp_path / "out", capsys)
    assert code == 2 and str(truncated) in error and ("empty" in error or "damaged" in error), error
    assert len(error.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda tensor: tensor.fill_(float("nan")), "non-finite", id="nan"),
        pytest.param(lambda tensor: tensor.view(-1)[3:4].fill_(float("inf")), "non-finite", id="one-inf"),
        pytest.param(lambda tensor: tensor.zero_(), "all zeros", id="all-zero-matrix"),
    ],
)
def test_non_finite_or_zeroed_weights_are_refused(damage, message, tmp_path, capsys) -> None:
    """A weight matrix with NaN or inf, or of exact zeros (a layer that was never loaded), is refused, naming it;
    without --reference nothing else would notice. A zero bias is fine (see the second conversion)."""
    from conversion._common import safe_torch_load

    weights = dict(safe_torch_load(TUTORIAL))
    name = "transformer.encoder.layers.0.linear1.weight"
    bias = name.replace(".weight", ".bias")
    damage(weights[name])
    torch.save({**weights, bias: torch.zeros_like(weights[bias])}, tmp_path / "damaged.pt")
    code, error = convert(tmp_path / "damaged.pt", tmp_path / "out", capsys)
    assert code == 2 and message in error, error
    assert f"`model.encoder.layers.0.fc1.weight` (from `{name}`)" in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()

    weights[name] = safe_torch_load(TUTORIAL)[name]
    torch.save({**weights, bias: torch.zeros_like(weights[bias])}, tmp_path / "zero-bias.pt")
    assert convert(tmp_path / "zero-bias.pt", tmp_path / "out", capsys)[0] == 0


# ------------------------------------------------------------------------------------------ what leaves the machine


def test_hub_files_are_the_model_and_its_code_files_only(tmp_path) -> None:
    """The upload list (issue 26, item 8): exactly the model's code files, those that config.json's auto_map
    and custom_pipelines name and that they import, never a stray `secrets_config.py` (every top-level *.py was
    listed); and every tokenizer file a converter writes, target_tokenizer/ included (source.spm and the others
    were left out, so an uploaded Marian conversion had no tokenizer)."""
    from hf_vanilla_transformer.hub import hub_files
    from model_card import write_model_card

    from ..conftest import CODE_FILES, tiny_model

    tiny_model().save_pretrained(tmp_path)
    write_model_card(tmp_path)
    (tmp_path / "secrets_config.py").write_text("TOKEN = 'hf_...'\n")
    tokenizer = ["source.spm", "target.spm", "target_vocab.json", "vocab.json", "sentencepiece.bpe.model"]
    for name in [*tokenizer, "target_tokenizer/tokenizer.json", "target_tokenizer/tokenizer_config.json"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("{}")
    code = sorted(CODE_FILES)
    model = ["README.md", "config.json", "generation_config.json", "model.safetensors"]
    target = ["target_tokenizer/tokenizer.json", "target_tokenizer/tokenizer_config.json"]
    assert hub_files(tmp_path) == sorted([*code, *model, *tokenizer, *target])


def test_averaging_writes_our_auto_map_never_a_foreign_one(tmp_path) -> None:
    """A checkpoint whose config.json points auto_map / custom_pipelines at other code (issue 26, item 8: a
    foreign AutoTokenizer entry survived `average`): the averaged folder names this package's code only. A
    checkpoint of another model type is refused."""
    from hf_vanilla_transformer.training.averaging import write_averaged_model

    from ..conftest import tiny_model

    checkpoint = tmp_path / "checkpoint-1"
    tiny_model().save_pretrained(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    ours = config["auto_map"], config["custom_pipelines"]
    config["auto_map"] = {"AutoModelForSeq2SeqLM": "evil.Model", "AutoTokenizer": ["evil.Tokenizer", None]}
    config["custom_pipelines"] = {"summarization": {"impl": "evil.Pipeline", "pt": ["AutoModelForSeq2SeqLM"]}}
    (checkpoint / "config.json").write_text(json.dumps(config))
    write_averaged_model([checkpoint], tmp_path / "averaged")
    written = json.loads((tmp_path / "averaged" / "config.json").read_text())
    assert (written["auto_map"], written["custom_pipelines"]) == ours
    assert not [path for path in (tmp_path / "averaged").iterdir() if path.name.startswith("evil")]

    (checkpoint / "config.json").write_text(json.dumps({**config, "model_type": "bart"}))
    with pytest.raises(ValueError, match="model_type 'bart'"):
        write_averaged_model([checkpoint], tmp_path / "bart")
    assert not (tmp_path / "bart").exists()


@pytest.mark.parametrize("fmt", ["nn-transformer", "annotated"])
def test_a_folder_given_as_the_checkpoint_is_one_clear_line(fmt, tmp_path, capsys) -> None:
    """A folder where the .pt file belongs (before: an IsADirectoryError traceback from torch.load)."""
    code, error = convert(TUTORIAL.parent, tmp_path / "out", capsys, fmt)
    assert code == 2 and f"{TUTORIAL.parent} is a folder; pass the checkpoint file itself" in error, error
    assert len(error.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------ disk full
# What a full disk raises, as recorded on a full tmpfs (torch 2.13, safetensors 0.7): torch.save (the Trainer's
# optimizer.pt, scheduler.pt, rng_state.pth) drops the errno; safetensors keeps it inside its own message.
TORCH_DISK_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"
SAFETENSORS_DISK_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def cli_error_line(argv: list[str], capsys) -> tuple[int, str]:
    """`hf-vanilla-transformer ARGV`: exit code and the last line of stderr (progress bars come before it)."""
    from hf_vanilla_transformer.cli import main

    try:
        code = main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    return code, capsys.readouterr().err.splitlines()[-1]


def last_line(error: str) -> str:
    """The error line of a command's stderr, after any progress bars; a traceback would end in another line."""
    return error.splitlines()[-1]


def test_disk_full_during_a_training_save_is_one_line(tmp_path, capsys, monkeypatch) -> None:
    """Before: `RuntimeError: [enforce fail at inline_container.cc:672]`, a traceback saying nothing about space."""
    from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS

    def full_disk(obj, f, *args, **kwargs):
        raise RuntimeError(TORCH_DISK_FULL)

    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)
    monkeypatch.setattr(torch, "save", full_disk)
    corpus, output = write_corpus(tmp_path / "corpus"), tmp_path / "model"
    code, error = cli_error_line(train_args(corpus, output, 2), capsys)
    assert code == 2
    assert error == (
        f"hf-vanilla-transformer train: error: no space left on device while writing {output}: free space or "
        "choose another --output-dir."
    )


@pytest.mark.parametrize("raised", ["oserror", "safetensors"])
def test_disk_full_while_averaging_or_converting_is_one_line(raised, tmp_path, capsys, monkeypatch) -> None:
    """Averaging (safetensors written by this package) and converting (by save_pretrained) on a full disk."""
    import transformers
    from safetensors import SafetensorError

    import hf_vanilla_transformer.training.averaging as averaging

    from ..conftest import tiny_model

    def full_disk(tensors, filename, *args, **kwargs):
        if raised == "oserror":
            raise OSError(28, "No space left on device", str(filename))
        raise SafetensorError(SAFETENSORS_DISK_FULL)

    tiny_model().save_pretrained(tmp_path / "checkpoint")
    monkeypatch.setattr(averaging, "save_file", full_disk)
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    output = tmp_path / "averaged"
    code, error = cli_error_line(["average", str(tmp_path / "checkpoint"), "-o", str(output)], capsys)
    # The OSError names the file it was writing (inside the sibling folder that replaces the output whole).
    where = "averaged" if raised == "oserror" else str(output)
    assert code == 2 and error.startswith("hf-vanilla-transformer average: error: no space left on device"), error
    assert f"while writing {tmp_path}" in error and where in error and error.endswith("choose another --output.")
    code, error = convert(TUTORIAL, tmp_path / "converted", capsys)
    error = last_line(error)
    assert code == 2 and error.startswith("python -m conversion nn-transformer: error: no space left on device")
    assert "converted" in error and error.endswith("free space or choose another OUTPUT folder."), error


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_real_full_disk_while_averaging_is_one_line(tmp_path, capsys) -> None:
    """The same on a real 64 KiB tmpfs (the tiny model's weights alone are larger), where the system allows it."""
    from ..conftest import tiny_model

    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=False).returncode:
        pytest.skip("this system refuses to mount a tmpfs")
    try:
        tiny_model().save_pretrained(tmp_path / "checkpoint")
        code, error = cli_error_line(["average", str(tmp_path / "checkpoint"), "-o", str(small / "averaged")], capsys)
        assert code == 2 and "no space left on device while writing" in error and str(small) in error, error
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_the_marian_converter_never_runs_a_folders_code(tmp_path, capsys) -> None:
    """A folder of another model type whose config.json auto_map names a code file (one that would write a marker
    when imported): one line, exit 2, and the code never runs (before: transformers' multi-line remote-code error, or
    its prompt on a terminal)."""
    from conversion.__main__ import main

    source, marker = tmp_path / "foreign", tmp_path / "code-ran"
    source.mkdir()
    auto_map = {"AutoConfig": "evil_code.EvilConfig", "AutoModelForSeq2SeqLM": "evil_code.EvilModel"}
    (source / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    (source / "evil_code.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["marian", str(source), str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and error.count("\n") == 1, error
    assert f"{source} holds a model of type 'evil', not a Marian" in error and not marker.exists()
