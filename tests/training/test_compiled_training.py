"""`train --torch-compile` (training/compiling.py): the compiled step computes what the eager one does, recompiles
stay bounded on token-budget batches, and the command trains, saves, resumes and evaluates compiled; where compiling
cannot work, one line says so and training goes on eagerly."""

import json
import subprocess
import sys
from typing import Any

import pytest
import torch

from hf_vanilla_transformer.model.label_smoothed_loss import linear_label_smoothed_cross_entropy
from hf_vanilla_transformer.training import compiling
from hf_vanilla_transformer.training.compiling import compile_failure, resolve_torch_compile

from ..conftest import make_trainer, tiny_setup
from ..train_script import REPO, command, environment, train_args, write_corpus

pytestmark = pytest.mark.slow


def _losses(tmp_path, compiled: bool) -> tuple[list[float], dict[str, torch.Tensor], int]:
    tokenizer, dataset, model = tiny_setup()  # P_drop 0: the same numbers, compiled or not
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_steps=12, logging_steps=1, torch_compile=compiled)
    graphs_before = compiling.compile_counts()[0]
    if compiled:
        trainer.add_callback(compiling.CompileReportCallback())
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    weights = {key: value.detach().clone() for key, value in trainer.model.state_dict().items()}
    return losses, weights, compiling.compile_counts()[0] - graphs_before


def test_compiled_training_follows_the_eager_loss_curve_with_bounded_recompiles(tmp_path, caplog) -> None:
    """12 updates on token-budget batches of a new shape almost every step: the compiled run's losses and final
    weights are the eager run's (float tolerance: inductor fuses and reorders sums), and after the first update's
    graph at most a few recompiles happen (automatic dynamic shapes), which the log counts."""
    eager, eager_weights, eager_graphs = _losses(tmp_path / "eager", compiled=False)
    with caplog.at_level("INFO", logger=compiling.__name__):
        compiled, compiled_weights, graphs = _losses(tmp_path / "compiled", compiled=True)
    assert eager_graphs == 0 and graphs >= 1
    assert len(compiled) == len(eager) == 12
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=2e-3, atol=2e-3)
    for key, value in compiled_weights.items():
        torch.testing.assert_close(value, eager_weights[key], rtol=1e-3, atol=2e-4, msg=key)
    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("torch.compile: compiled the training step") for line in lines), lines
    summary = [line for line in lines if "recompile(s)," in line]
    assert len(summary) == 1, lines
    recompiles = int(summary[0].split(" recompile(s)")[0].rsplit(" ", 1)[1])
    assert recompiles <= 3, summary  # bounded, though nearly every batch has a new shape


def test_the_compile_decision_says_what_it_decided(monkeypatch) -> None:
    cpu = torch.device("cpu")
    assert resolve_torch_compile("no", cpu) == (False, "eager (`torch_compile=no`)")
    compiled, line = resolve_torch_compile("auto", cpu)  # the rule: GPUs only, no timing
    assert not compiled and "compiles on a GPU only" in line
    monkeypatch.setattr(compiling, "compile_failure", lambda device: None)
    assert resolve_torch_compile("yes", cpu)[0]
    assert resolve_torch_compile("auto", torch.device("cuda"))[0]
    monkeypatch.setattr(compiling, "compile_failure", lambda device: "InvalidCxxCompiler: no compiler")
    compiled, line = resolve_torch_compile("yes", cpu)
    assert not compiled and "cannot work here (InvalidCxxCompiler: no compiler)" in line
    with pytest.raises(ValueError, match="`torch_compile` is 'maybe'"):
        resolve_torch_compile("maybe", cpu)


def test_compile_failure_is_found_without_a_cxx_compiler(tmp_path) -> None:
    """The probe on this machine compiles; with inductor pointed at a compiler that does not exist (and a fresh
    kernel cache, so nothing compiled earlier is reused) it reports why, in one line, without raising."""
    assert compile_failure(torch.device("cpu")) is None
    probe = "import torch\nfrom hf_vanilla_transformer.training.compiling import compile_failure\n"
    probe += "print(compile_failure(torch.device('cpu')))"
    env = environment(CXX=str(tmp_path / "no-such-g++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("InductorError: InvalidCxxCompiler"), result.stdout
    assert len(result.stdout.strip().splitlines()) == 1


def _train(corpus, run, steps: int, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = command([], train_args(corpus, run, steps, *extra))
    return subprocess.run(argv, capture_output=True, text=True, env=env or environment(), timeout=900, cwd=REPO)


def test_torch_compile_trains_saves_resumes_and_evaluates(tmp_path) -> None:
    """The command end to end, compiled: 6 updates saved, resumed to 10 (the resumed process compiles again and
    says so), the averaged model scored on the test set; its folder loads and translates like any other."""
    corpus = write_corpus(tmp_path / "corpus")
    run = tmp_path / "run"
    test_set = ("--test-src", str(corpus / "test.src"), "--test-tgt", str(corpus / "test.tgt"))
    first = _train(corpus, run, 6, "--torch-compile", *test_set)
    assert first.returncode == 0, first.stderr[-3000:]
    log = first.stdout + first.stderr
    assert "Compile: torch.compile, inductor" in log and "torch.compile: compiled the training step" in log, log
    assert "Traceback" not in log
    resumed = _train(corpus, run, 10, "--torch-compile", "--resume", *test_set)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stdout + resumed.stderr
    assert "torch.compile: compiled the training step" in log and "in 10 updates" in log, log
    results = json.loads((run / "model" / "results.json").read_text(encoding="utf-8"))
    assert results["test"]["bleu"] >= 0 and len(results["test"]["hypotheses"]) == 3
    last = max((run / "checkpoints").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert json.loads((last / "trainer_state.json").read_text(encoding="utf-8"))["global_step"] == 10
    from hf_vanilla_transformer.inference.loading import load_model

    model = load_model(run / "model")  # saved without torch.compile's `_orig_mod.` prefixes
    assert not any("_orig_mod" in key for key in model.state_dict())


def test_without_a_compiler_training_goes_on_eagerly_after_one_line(tmp_path) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    env = environment(CXX=str(tmp_path / "no-such-g++"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "cache"))
    result = _train(corpus, tmp_path / "run", 3, "--torch-compile", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    lines = [line for line in log.splitlines() if "torch.compile cannot work here" in line]
    assert len(lines) == 1 and "InvalidCxxCompiler" in lines[0] and "training goes on without it" in lines[0], log
    assert "Traceback" not in log and "torch.compile: compiled" not in log
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_the_fused_loss_compiles_one_graph_for_every_row_count() -> None:
    """The fused projection + loss loops over row chunks in eager mode; traced, a loop bounded by the row count would
    make dynamo specialize on it, one graph per batch size. Row counts past the 1024-row chunk, dynamic shapes: one
    graph, and the eager values."""
    graphs = []

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(graph)
        return graph.forward

    weight = torch.randn(50, 8, requires_grad=True)
    compiled = torch.compile(linear_label_smoothed_cross_entropy, backend=backend, dynamic=True)
    for rows in (1500, 2100, 2600, 3333):
        hidden, labels = torch.randn(rows, 8, requires_grad=True), torch.randint(0, 50, (rows,))
        loss = compiled(hidden, weight, None, labels, 0.1)
        loss.backward()
        torch.testing.assert_close(loss, linear_label_smoothed_cross_entropy(hidden, weight, None, labels, 0.1))
    assert len(graphs) == 1
