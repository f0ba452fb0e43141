"""Validation during training: dev loss, BLEU and chrF in the Trainer's logs, the printed log and tensorboard;
early stopping on a dev BLEU that cannot improve; --keep-best; which checkpoints --average last/best/spread pick
(unit tests on made-up scores, and results.json of a run); the dev learning curve."""

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.inference import cpu_inference
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.training.averaging import (
    AverageSpan,
    CheckpointInfo,
    select_checkpoints,
    selectable_checkpoints,
)
from hf_vanilla_transformer.training.trainer import EvalSchedule, parse_eval_every

from ..train_script import MAX_TOKENS, TEST_PRESET


@pytest.fixture(scope="module")
def stall_dev_set(corpus: Path) -> None:
    """A dev set in the corpus, `stall`, whose references no model of its tokenizer can produce ("zzz" is not in its
    vocabulary), so dev BLEU is 0 at every evaluation: it never improves."""
    (corpus / "stall.src").write_text("w5 w6\nw7 w8 w9\n", encoding="utf-8")
    (corpus / "stall.tgt").write_text("zzz\nzzz zzz\n", encoding="utf-8")


def train(corpus: Path, run: Path, capsys, *extra: str, dev: str = "test") -> tuple[str, dict]:
    """A seconds-long `train` of the test preset with a dev set; its printed log and results.json."""
    argv = [
        *("train", "--train-src", str(corpus / "train.src"), "--train-tgt", str(corpus / "train.tgt")),
        *("--valid-src", str(corpus / f"{dev}.src"), "--valid-tgt", str(corpus / f"{dev}.tgt")),
        *("--tokenizer", str(corpus / "tokenizer"), "--preset", "transformer-test"),
        *("--max-tokens", str(MAX_TOKENS), "--save-every", "1h", "--eval-batch-size", "4"),
        *("--schedule", "inverse_sqrt", "--lr", "3e-3", "--warmup-steps", "5", "--seed", "3"),
        *("--logging-steps", "1", "--no-progress", "--no-eval", "--output-dir", str(run), *extra),
    ]
    assert main(argv) == 0
    return capsys.readouterr().out, json.loads((run / "model" / "results.json").read_text())


@pytest.fixture(autouse=True)
def test_preset(monkeypatch) -> None:
    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)


def evaluations(run: Path) -> list[dict]:
    """The dev evaluations in the log history of the run's newest checkpoint."""
    newest = max((run / "checkpoints").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    history = json.loads((newest / "trainer_state.json").read_text())["log_history"]
    return [log for log in history if "eval_bleu" in log]


def test_dev_scores_reach_the_logs_tensorboard_the_curve_and_results(corpus, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    extra = ("--max-steps", "3", "--eval-every", "1", "--report-to", "tensorboard", "--average", "best")
    out, results = train(corpus, run, capsys, *extra, "--average-last", "2")
    logs = evaluations(run)
    assert [log["step"] for log in logs] == [1, 2, 3]
    assert all({"eval_loss", "eval_bleu", "eval_chrf", "elapsed_seconds"} <= log.keys() for log in logs)
    for log in logs:  # the printed log shows each evaluation's scores
        assert f"Dev at update {log['step']} " in out and f"BLEU {log['eval_bleu']:.2f}, chrF" in out
    assert "counted in --max-time" in out
    events = list((run / "checkpoints" / "runs").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(events[0].parent)).Reload().Tags()["scalars"]
    assert {"eval/bleu", "eval/chrf", "eval/loss"} <= set(scalars)
    curve = json.loads((run / "learning_curve.json").read_text())
    assert [(p["step"], p["bleu"], p["chrf"], p["loss"]) for p in curve] == [
        (log["step"], log["eval_bleu"], log["eval_chrf"], log["eval_loss"]) for log in logs
    ]
    assert (run / "model" / "learning_curve.png").stat().st_size > 10_000
    assert results["dev"]["evaluations"] == 3 and results["learning_curve"] == "learning_curve.png"
    # Every evaluation saved a checkpoint, so each score belongs to one; --average best took the 2 best by it.
    infos = [
        CheckpointInfo(Path(f"checkpoint-{log['step']}"), log["step"], log["elapsed_seconds"], log["eval_bleu"])
        for log in logs
    ]
    names = [info.path.name for info in select_checkpoints(infos, "best", 2)]
    record = results["averaging"]
    assert (record["mode"], record["k"]) == ("best", 2) and results["averaged_checkpoints"] == names
    scores = {info.path.name: info.bleu for info in infos}
    assert [(c["name"], c["dev_bleu"]) for c in record["checkpoints"]] == [(name, scores[name]) for name in names]
    # Training kept the best 2 so far and the newest (to resume from), nothing else.
    kept = {path.name for path in (run / "checkpoints").glob("checkpoint-*")}
    assert kept == {*names, "checkpoint-3"}


def test_early_stopping_stops_a_long_run_and_keep_best_keeps_the_best(corpus, stall_dev_set, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    extra = ("--max-steps", "200", "--eval-every", "1", "--early-stopping-patience", "2", "--keep-best")
    out, results = train(corpus, run, capsys, *extra, "--average-last", "1", dev="stall")
    # Update 1 sets the best (0.0); updates 2 and 3 are not better: two evaluations without improvement.
    logs = evaluations(run)
    assert [log["eval_bleu"] for log in logs] == [0.0, 0.0, 0.0]
    assert results["updates"] == 3 and "Early stopping at update 3" in out
    best = max(logs, key=lambda log: log["eval_bleu"])["step"]  # the first of equal scores: later ones are not better
    assert best == 1 and results["dev"]["best_checkpoint"] == f"checkpoint-{best}"
    # save_total_limit 2 (k = 1, + 1) removed checkpoint-2, not the best one; the newest stays to resume from.
    kept = sorted(path.name for path in (run / "checkpoints").glob("checkpoint-*"))
    assert kept == ["checkpoint-1", "checkpoint-3"]


def test_average_spread_records_what_it_averaged(corpus, tmp_path, capsys) -> None:
    run = tmp_path / "run"
    _, results = train(corpus, run, capsys, "--max-steps", "2", "--average", "spread", "--average-span", "100%")
    # --eval-every left out: scored at each save, here the one at the end (saves are an hour apart).
    record = results["averaging"]
    assert (record["mode"], record["k"], record["span"]) == ("spread", 5, "100%")
    assert [c["name"] for c in record["checkpoints"]] == ["checkpoint-2"] == results["averaged_checkpoints"]
    assert record["checkpoints"][0]["dev_bleu"] == evaluations(run)[-1]["eval_bleu"]


def test_the_last_update_is_scored_even_between_evaluations(corpus, tmp_path, capsys) -> None:
    """A run that ends before its first --eval-every still scores its final checkpoint, so --average best has one."""
    run = tmp_path / "run"
    extra = ("--max-steps", "2", "--eval-every", "1000", "--average", "best", "--average-last", "1")
    _, results = train(corpus, run, capsys, *extra)
    assert [log["step"] for log in evaluations(run)] == [2]
    assert results["averaged_checkpoints"] == ["checkpoint-2"]


def test_dev_evaluation_batches_keep_the_models_generation_config(corpus, tmp_path, capsys) -> None:
    """Seq2SeqTrainer writes generate()'s defaults (max_length 20) into the model's generation config after a batch;
    unrestored, every later batch warned that max_new_tokens and max_length were both set."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    generation_logger = transformers.logging.get_logger("transformers.generation.utils")
    generation_logger.addHandler(handler)
    try:
        train(corpus, tmp_path / "run", capsys, "--max-steps", "2", "--eval-every", "1", "--eval-batch-size", "1")
    finally:
        generation_logger.removeHandler(handler)
    messages = [record.getMessage() for record in records]
    assert not [message for message in messages if "max_new_tokens" in message], messages


def test_dev_loss_is_the_loss_of_the_weights_at_that_update(corpus, tmp_path, capsys, monkeypatch) -> None:
    """Each evaluation scores the weights of its own update: the logged dev loss equals the label-smoothed loss of the
    checkpoint saved at that update, recomputed here by the plain loaded model. The evaluations run prepared for CPU
    inference, every product on the packed path (threshold 0); the fused Adam step (the Trainer's default
    optimizer), which bumps no version counter, must not leave them a stale copy: the training step's
    `model.train()` undoes the preparation, and the next evaluation packs the new weights."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    packed_calls: list[bool] = []  # whether gradients were on, per packed product
    packed_linear = cpu_inference.packed_linear
    monkeypatch.setattr(
        cpu_inference,
        "packed_linear",
        lambda *args: packed_calls.append(torch.is_grad_enabled()) or packed_linear(*args),
    )
    run = tmp_path / "run"
    train(corpus, run, capsys, "--max-steps", "4", "--eval-every", "1", "--average-last", "4")
    assert packed_calls and not any(packed_calls)  # the evaluations took the packed path, training steps never
    assert json.loads((run / "trainer_arguments.json").read_text())["optim"] == "adamw_torch_fused"
    tokenizer = AutoTokenizer.from_pretrained(corpus / "tokenizer")
    sources, targets = ((corpus / f"test.{side}").read_text().splitlines() for side in ("src", "tgt"))
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    labels = batch.pop("labels")
    labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)
    logs = evaluations(run)
    assert [log["step"] for log in logs] == [1, 2, 3, 4]
    losses = []
    for log in logs:
        model = AutoModelForSeq2SeqLM.from_pretrained(run / "checkpoints" / f"checkpoint-{log['step']}").eval()
        with torch.no_grad():
            losses.append(model(**batch, labels=labels, label_smoothing=0.1).loss.item())
    assert len(set(losses)) == len(losses)  # the weights changed between updates
    assert [log["eval_loss"] for log in logs] == pytest.approx(losses, rel=1e-4)


def info(step: int, minutes: float, bleu: float | None = None) -> CheckpointInfo:
    return CheckpointInfo(Path(f"checkpoint-{step}"), step, minutes * 60, bleu)


# Checkpoints every 10 minutes for 100 minutes, with made-up dev BLEU.
RUN = [info(10 * i, 10 * i, bleu) for i, bleu in enumerate([5, 12, 20, 26, 25, 27, 24, 26, 25, 23], start=1)]


def steps(chosen: list[CheckpointInfo]) -> list[int]:
    return [checkpoint.step for checkpoint in chosen]


def test_last_and_best_pick_the_right_checkpoints() -> None:
    assert steps(select_checkpoints(RUN, "last", 3)) == [80, 90, 100]
    assert steps(select_checkpoints(RUN, "last", 20)) == steps(RUN)
    # The three best (27, 26, 26), in training order; of equal scores the later one is taken first.
    assert steps(select_checkpoints(RUN, "best", 3)) == [40, 60, 80]
    assert steps(select_checkpoints(RUN, "best", 2)) == [60, 80]
    unscored = [*RUN, info(110, 110)]  # a checkpoint without an evaluation is no candidate
    assert steps(select_checkpoints(unscored, "best", 1)) == [60]
    with pytest.raises(ValueError, match="No checkpoint has a dev BLEU"):
        select_checkpoints([info(1, 1)], "best", 1)


def test_spread_picks_checkpoints_evenly_over_the_span() -> None:
    # Half of the 100 minutes, k = 5: the nearest checkpoints to 100, 90, 80, 70 and 60 minutes.
    assert steps(select_checkpoints(RUN, "spread", 5, AverageSpan.parse("50%"))) == [60, 70, 80, 90, 100]
    # k = 3 over the last 60 minutes: 100, 80 and 60 minutes.
    assert steps(select_checkpoints(RUN, "spread", 3, AverageSpan.parse("1h"))) == [60, 80, 100]
    # The span spaced as the checkpoints (k × 10 minutes) is --average last.
    assert select_checkpoints(RUN, "spread", 4, AverageSpan.parse("40m")) == select_checkpoints(RUN, "last", 4)
    # A span holding fewer checkpoints than k gives those it holds.
    assert steps(select_checkpoints(RUN, "spread", 5, AverageSpan.parse("15m"))) == [90, 100]
    # Denser checkpoints: every minute of 100; k = 4 over the last 40% -> 100, 90, 80, 70 minutes.
    dense = [info(i, i) for i in range(1, 101)]
    assert steps(select_checkpoints(dense, "spread", 4, AverageSpan.parse("40%"))) == [70, 80, 90, 100]


def test_training_keeps_what_the_final_selection_may_still_pick() -> None:
    now = RUN[:6]  # at 60 minutes
    assert steps(selectable_checkpoints(now, "best", 2)) == [40, 60]
    # A later end only moves a span's start later: before 30 minutes (50% of 60), nothing can be picked again.
    assert steps(selectable_checkpoints(now, "spread", 3, AverageSpan.parse("50%"))) == [30, 40, 50, 60]
    assert steps(selectable_checkpoints(now, "spread", 3, AverageSpan.parse("20m"))) == [40, 50, 60]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, EvalSchedule()),
        ("save", EvalSchedule()),
        ("500", EvalSchedule(steps=500)),
        ("10m", EvalSchedule(seconds=600)),
    ],
)
def test_eval_every_syntax(text, expected) -> None:
    assert parse_eval_every(text) == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--average", "best"], "`--average best` needs a validation set"),
        (["--keep-best"], "`--keep-best` needs a validation set"),
        (["--early-stopping-patience", "2"], "`--early-stopping-patience 2` needs a validation set"),
        (["--eval-every", "0.5"], "`--eval-every` '0.5' is neither 'save', a whole number"),
        (["--average", "spread", "--average-span", "150%"], "`--average-span` '150%': a share"),
    ],
)
def test_bad_validation_options_are_refused(extra, message, corpus, tmp_path, capsys) -> None:
    argv = ["train", "--train-src", str(corpus / "train.src"), "--train-tgt", str(corpus / "train.tgt")]
    argv += ["--output-dir", str(tmp_path / "run"), *extra]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
