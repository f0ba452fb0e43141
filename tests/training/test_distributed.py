"""Scale-out: `hf-vanilla-transformer train` under `torchrun --nproc_per_node 2` (gloo, CPU) is data parallel. Two
processes with batches of B tokens follow the loss curve of one process accumulating 2 batches of B tokens, one
process writes the checkpoints, the averaged model and the results, and the test set is evaluated once.

Runs go through tests/train_script.py (the CLI with the test preset and a record of the files each process writes).
"""

import json
import os
import pathlib
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_vanilla_transformer.files import writable_folder

from ..train_script import run, train_args

MAX_STEPS = 12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def logged(output: Path) -> tuple[dict[int, float], float]:
    """Loss per update and the epoch reached, from the last checkpoint."""
    state = json.loads((output / "checkpoints" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}, state["epoch"]


def written(trace: Path, rank: int) -> list[str]:
    path = trace / f"writes-rank{rank}.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict:
    """One process with gradient accumulation 2, and two processes, each with batches of <= 48 tokens per side, no
    dropout (two processes draw other masks than one process by construction)."""
    folder = tmp_path_factory.mktemp("runs")
    common = ("--dropout", "0", "--average-last", "2")
    single = run([], train_args(corpus, folder / "one", MAX_STEPS, *common, "--grad-accum", "2"))
    assert single.returncode == 0, single.stdout
    test_set = ("--test-src", str(corpus / "test.src"), "--test-tgt", str(corpus / "test.tgt"), "--examples", "1")
    double = run(
        ["--trace", str(folder / "trace-2")],
        train_args(corpus, folder / "two", MAX_STEPS, *common, *test_set),
        nproc=2,
        port=free_port(),
    )
    assert double.returncode == 0, double.stdout
    return {"folder": folder, "one": folder / "one", "two": folder / "two", "stdout": double.stdout}


def test_two_processes_follow_one_process_with_gradient_accumulation(runs) -> None:
    """Same global batches (rank r takes batches r, r + 2, ...; the single process accumulates batches 2t and
    2t + 1), so the same updates. Measured (torch 2.13, CPU, one thread per process): bit-identical losses and
    weights over 12 updates, since DDP's mean of two gradients and accumulating two halves round alike. Allowed:
    1e-6 relative on every loss and weight, for another reduction order; two processes each training alone on all
    the data (plain torchrun without use_cpu) are off by 8e-3 at the first update and 3e-2 at the second."""
    one_losses, one_epoch = logged(runs["one"])
    two_losses, two_epoch = logged(runs["two"])
    assert sorted(one_losses) == sorted(two_losses) == list(range(1, MAX_STEPS + 1))
    assert one_losses[5] != one_losses[6]  # the comparison below has something to compare
    for step in one_losses:
        assert two_losses[step] == pytest.approx(one_losses[step], rel=1e-6, abs=0), step
    # 10 batches per epoch: 5 updates in both (an even count, so no rank repeats a batch to fill its last step).
    assert one_epoch == two_epoch == pytest.approx(MAX_STEPS / 5)
    last = f"checkpoints/checkpoint-{MAX_STEPS}/model.safetensors"
    one_weights, two_weights = load_file(runs["one"] / last), load_file(runs["two"] / last)
    assert one_weights.keys() == two_weights.keys()
    for key in one_weights:
        torch.testing.assert_close(two_weights[key], one_weights[key], rtol=1e-6, atol=1e-7, msg=key)


def test_one_process_writes_checkpoints_results_and_evaluates(runs) -> None:
    """Rank 1 writes nothing but its own RNG state; rank 0 writes the checkpoints, the model folder and
    results.json, and the test set is decoded once (the averaged model and the last checkpoint, by rank 0)."""
    trace, output = runs["folder"] / "trace-2", runs["two"].resolve()
    # Each process probes --output-dir with a file it deletes again (the shared name is
    # test_output_folder_probe_survives_another_process's subject).
    rank1 = [p for p in written(trace, 1) if p.startswith(str(output)) and ".write-test" not in p]
    assert {pathlib.PurePath(path).name for path in rank1} <= {"rng_state_1.pth"}, rank1
    assert any(path.endswith("/rng_state_1.pth") for path in rank1)  # the trace does see rank 1's writes
    rank0 = written(trace, 0)
    assert not set(rank0) & set(rank1)
    assert rank0.count(str(output / "model" / "results.json")) == 1
    assert any(path.endswith(f"checkpoint-{MAX_STEPS}/model.safetensors") for path in rank0)
    assert runs["stdout"].count(f"Trained {MAX_STEPS} updates") == 1
    scores = [line for line in runs["stdout"].splitlines() if line.startswith("BLEU ")]
    assert len(scores) == 2, scores  # the averaged model and the last checkpoint alone
    results = json.loads((output / "model" / "results.json").read_text())
    assert results["updates"] == MAX_STEPS and results["test"]["n"] == 3


def test_torchrun_on_cpu_is_data_parallel_as_is(corpus, tmp_path) -> None:
    """Plain `torchrun --nproc_per_node 2 ... train` on a machine without a GPU. Without use_cpu, transformers
    leaves the processes out of the gloo group (parallel_mode is not DISTRIBUTED unless use_cpu or ACCELERATE_USE_CPU):
    each would train alone on all the data, and both would write the same checkpoints, model folder and results."""
    output = tmp_path / "model"
    result = run(
        ["--trace", str(tmp_path / "trace")],
        train_args(corpus, output, 2),
        nproc=2,
        port=free_port(),
    )
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("Trained 2 updates") == 1
    assert not [path for path in written(tmp_path / "trace", 1) if path.endswith(".safetensors")]
    # The command destroys its gloo group: one left to the interpreter's exit aborted a process now and then
    # ("terminate called without an active exception", exit code -6).
    for rank in (0, 1):
        assert (tmp_path / "trace" / f"group-at-exit-rank{rank}.txt").read_text() == "destroyed"


def test_output_folder_probe_survives_another_process(tmp_path, monkeypatch) -> None:
    """Every torchrun process checks --output-dir by writing and deleting the same `.write-test` file; when the other
    process deletes it first, this one reports the folder as not writable and the launch fails (seen in a torchrun
    run of this file: "`--output-dir` ... is not a writable folder (No such file or directory)"). The interleaving
    is played here deterministically: the other process runs its whole check between this one's write and delete."""
    write_text = Path.write_text
    interleaved: list[Path] = []

    def write_then_let_the_other_process_check(self, *args, **kwargs):
        count = write_text(self, *args, **kwargs)
        if self.name.startswith(".write-test") and not interleaved:
            interleaved.append(self)
            with monkeypatch.context() as other_process:
                other_process.setattr(os, "getpid", lambda: 4_000_000)
                writable_folder(self.parent, "output_dir")
        return count

    monkeypatch.setattr(Path, "write_text", write_then_let_the_other_process_check)
    assert writable_folder(tmp_path / "out", "output_dir") == tmp_path / "out"
    assert interleaved, "the probe was not written with Path.write_text; update this test"
    assert not list((tmp_path / "out").iterdir())  # both probes are gone
