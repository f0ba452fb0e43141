"""The evaluation after training on the run's clock (training/evaluation_budget.py): `--max-time T` bounds the
whole `train` command, evaluation included, to T + 10%; what does not fit is skipped, listed, and computable later."""

import json
from dataclasses import replace

import pytest

from hf_vanilla_transformer.training.evaluation_budget import (
    EVALUATION_SHARE,
    LEAST_SENTENCES,
    PROBE_SENTENCES,
    EvaluationClock,
    score_within,
)
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.recipes import RECIPES


class FakeClock:
    """A clock that only decoding moves: `seconds_per_sentence` for each sentence scored."""

    def __init__(self, seconds_per_sentence: float) -> None:
        self.now = 0.0
        self.seconds_per_sentence = seconds_per_sentence
        self.scored: list[int] = []

    def __call__(self) -> float:
        return self.now

    def score(self, count: int) -> dict:
        self.scored.append(count)
        self.now += count * self.seconds_per_sentence
        return {"n": count}


def test_the_deadline_is_the_start_plus_max_time_and_its_share_for_the_evaluation() -> None:
    """The command's deadline: its start + max_time x 1.1; no max_time (a budget of updates), no deadline."""
    assert EVALUATION_SHARE == 0.1
    clock = EvaluationClock.of_run(100.0, 3600.0, clock=lambda: 3700.0)
    assert clock.deadline == pytest.approx(100.0 + 3960.0)
    assert clock.left() == pytest.approx(360.0)
    assert EvaluationClock.of_run(100.0, None).left() == float("inf")
    # `evaluation_time` replaces the share (the GPU recipe's minute of training gets 2 minutes of evaluation).
    assert EvaluationClock.of_run(100.0, 60.0, 120.0, clock=lambda: 200.0).left() == pytest.approx(80.0)
    assert EvaluationClock.of_run(100.0, None, 120.0).left() == float("inf")
    assert TrainOptions.from_recipe(RECIPES["multi30k-gpu"]).evaluation_time == 120.0
    assert TrainOptions.from_recipe(RECIPES["multi30k-1h"]).evaluation_time is None


@pytest.mark.parametrize(
    ("seconds_per_sentence", "left", "cut", "expected_n", "decodings"),
    [
        # a trained model: the whole set fits; the first batch, then one pass over all of it
        (0.012, 320.0, True, 1000, [PROBE_SENTENCES, 1000]),
        (0.012, 320.0, False, 1000, [PROBE_SENTENCES, 1000]),
        # an untrained model, 1.8 s a sentence with beam 8: the averaged model's score is cut to what fits ...
        (1.8, 320.0, True, 161, [PROBE_SENTENCES, 161]),
        # ... an extra is skipped after its first batch ...
        (1.8, 320.0, False, None, [PROBE_SENTENCES]),
        # ... and past the deadline the score is of the first few sentences, the extra not even started
        (1.8, -5.0, True, LEAST_SENTENCES, [LEAST_SENTENCES]),
        (1.8, -5.0, False, None, []),
    ],
)
def test_a_decoding_runs_whole_cut_to_what_fits_or_not_at_all(
    seconds_per_sentence, left, cut, expected_n, decodings
) -> None:
    """`score_within` on a clock that only decoding moves: the rate of a first batch decides. 320 s is what an
    hour's run leaves (66 min - 1 min of start-up - 60 min of training); 161 = (320 - 16 x 1.8) / 1.8 sentences,
    rounded down."""
    fake = FakeClock(seconds_per_sentence)
    clock = EvaluationClock(deadline=left, clock=fake)
    result = score_within(clock, fake.score, 1000, cut)
    assert (result["n"] if result is not None else None) == expected_n
    assert fake.scored == decodings
    assert fake.now <= max(left, 0.0) + PROBE_SENTENCES * seconds_per_sentence  # at most one first batch past it


def test_without_max_time_everything_is_decoded() -> None:
    fake = FakeClock(10.0)
    assert score_within(EvaluationClock(None, fake), fake.score, 1000, cut=False) == {"n": 1000}
    assert fake.scored == [1000]


def test_the_snapshots_are_scored_while_they_fit(tmp_path, monkeypatch) -> None:
    """The learning curve's snapshots in training order, each whole while its first batch says it fits: the early
    (slow, untrained) one is scored, then the budget ends; the rest are named as skipped, and the curve that the card
    shows holds the snapshots scored."""
    import hf_vanilla_transformer.training.evaluation_budget as budget
    from hf_vanilla_transformer.files import SNAPSHOT_FILE
    from hf_vanilla_transformer.training import learning_curve as curve_module
    from hf_vanilla_transformer.training.learning_curve import CURVE_DIR, CurveOptions

    from ..conftest import tiny_model

    run = tmp_path / "run"
    model = tiny_model()
    for step, seconds in ((10, 60.0), (20, 120.0), (30, 180.0)):
        model.save_pretrained(run / CURVE_DIR / f"step-{step}")
        (run / CURVE_DIR / f"step-{step}" / SNAPSHOT_FILE).write_text(
            json.dumps({"step": step, "seconds": seconds, "tgt_tokens": 0, "epoch": 1.0})
        )
    fake = FakeClock(1.0)
    sources = [f"s{i}" for i in range(100)]

    def evaluate(model, tokenizer, sources, references, *args, **kwargs) -> dict:
        fake.score(len(sources))
        return {"bleu": 1.0, "bleu_lowercase": 1.0, "chrf": 1.0, "generation": {}, "n": len(sources)}

    monkeypatch.setattr(budget, "evaluate_translations", evaluate)
    monkeypatch.setattr(curve_module, "load_multi30k", lambda *a, **k: {"validation": _pairs(sources)})
    monkeypatch.setattr(curve_module, "model_folder", lambda folder, *a, **k: folder)
    monkeypatch.setattr(curve_module, "load_tokenizer", lambda folder: None)
    (run / "model").mkdir()
    options = CurveOptions(run, "en", "de", progress=False, clock=EvaluationClock(deadline=150.0, clock=fake))
    result = curve_module.learning_curve(options)
    # step-10: 16 s, then 100 s (fits in 134); step-20: 16 s, then 100 > 18 s left: skipped; step-30 not started.
    assert [point["step"] for point in result.points] == [10]
    assert result.skipped == ["step-20", "step-30"]
    assert fake.scored == [16, 100, 16]
    assert result.png.is_file() and json.loads(result.json.read_text())[0]["step"] == 10
    # Nothing fits: no curve files at all.
    fresh = replace(options, run_dir=tmp_path / "again", clock=EvaluationClock(deadline=fake.now, clock=fake))
    (tmp_path / "again").mkdir()
    (run / CURVE_DIR).rename(tmp_path / "again" / CURVE_DIR)
    (tmp_path / "again" / "model").mkdir()
    empty = curve_module.learning_curve(fresh)
    assert empty.points == [] and empty.skipped == ["step-10", "step-20", "step-30"]
    assert not empty.png.exists() and not empty.json.exists()


def _pairs(sources: list[str]):
    from datasets import Dataset

    return Dataset.from_dict({"source": sources, "target": sources})


def test_a_recipe_cut_short_ends_with_its_folder_and_says_what_it_skipped(tmp_path, monkeypatch, capsys) -> None:
    """`train --recipe multi30k-1h --max-time 3s` (curve snapshots every 10 minutes; a tiny model, and the test set
    cut to 64 sentences decoded greedily, for a short test): exit 0 with results.json and the card; the deadline being
    past, the test set is cut to its first few sentences (before: all of it, which with the recipe's beam 8 an
    untrained Multi30k model makes half an hour on 2 cores) and the card's attention maps and out-of-domain example
    are left out, which the card and results.json say with the commands that make them, and the missing learning
    curve is one line (before: exit 2, "…/curve does not exist: a learning curve needs the snapshots")."""
    from hf_vanilla_transformer.cli import main
    from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
    from hf_vanilla_transformer.training import train as train_module

    from ..train_script import TEST_PRESET

    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)  # seconds, not minutes, on 2 cores
    plot = train_module.plot_attention_maps  # one layer and head: the figures are tested elsewhere
    monkeypatch.setattr(train_module, "plot_attention_maps", lambda o: plot(replace(o, layers=[0], heads=[0])))
    run = tmp_path / "run"
    argv = [
        *("train", "--recipe", "multi30k-1h", "--max-time", "3s", "--max-train-pairs", "300"),
        *("--tokenizer-sample", "600", "--vocab-size", "400", "--preset", "transformer-test"),
        *("--max-tokens", "1024", "--test-max-sentences", "64", "--test-num-beams", "1", "--examples", "0"),
        *("--no-progress",),
        *("--output-dir", str(run)),
    ]
    code = main(argv)
    output = capsys.readouterr()
    assert code == 0, output.err
    assert "Traceback" not in output.err
    results = json.loads((run / "model" / "results.json").read_text(encoding="utf-8"))
    assert results["test"]["n"] == LEAST_SENTENCES and results["test"]["generation"]["num_beams"] == 1
    whole, attention, out_of_domain, *extras = results["skipped"]
    # Where the 3 seconds held more than one epoch (a fast host), its checkpoints are averaged, and the last alone
    # is skipped too.
    assert [item["what"].split(" (")[0] for item in extras] in ([], ["the last checkpoint alone"]), extras
    assert whole["what"] == f"the whole test set (64 sentences; its first {LEAST_SENTENCES} are scored)"
    assert whole["command"] == (
        "hf-vanilla-transformer evaluate model --src-lang en --tgt-lang de --num-beams 1 --max-sentences 64"
    )
    assert attention["command"].startswith("hf-vanilla-transformer attention model 'A man in an orange hat")
    assert out_of_domain["command"].startswith("hf-vanilla-transformer translate model 'The Transformer is based")
    assert "learning_curve" not in results and results["out_of_domain"] is None
    card = " ".join((run / "model" / "README.md").read_text(encoding="utf-8").split())
    assert "Not evaluated within the run's time" in card and "the whole test set (64 sentences" in card
    logged = output.out + output.err
    lines = [line for line in logged.splitlines() if "learning curve" in line.lower()]
    assert lines == [
        "No learning curve: the run saved no snapshot (one every 10 minutes of training, --curve-every)."
    ], lines
    assert "After training, the evaluation gets 0 s (--evaluation-time; the command ends by 0.1 minutes" in logged


def test_evaluate_scores_the_first_max_sentences(bpe_model, tmp_path, capsys) -> None:
    """`evaluate --max-sentences N` (the command a cut or skipped scoring names) scores the first N pairs; 0 is
    refused, naming the option."""
    from hf_vanilla_transformer.cli import main
    from hf_vanilla_transformer.errors import OptionError
    from hf_vanilla_transformer.inference.evaluation import EvaluateOptions, evaluate

    lines = "".join(f"A man number {index} rides a bike.\n" for index in range(5))
    (tmp_path / "src.txt").write_text(lines, encoding="utf-8")
    (tmp_path / "ref.txt").write_text(lines, encoding="utf-8")
    files = ["--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt"), "--num-beams", "1"]
    assert main(["evaluate", str(bpe_model), *files, "--max-sentences", "2", "--no-progress"]) == 0
    assert "\n2 sentences in " in capsys.readouterr().out
    with pytest.raises(OptionError, match=r"`max_sentences=0` must be at least 1"):
        evaluate(EvaluateOptions(bpe_model, src=tmp_path / "src.txt", ref=tmp_path / "ref.txt", max_sentences=0))
