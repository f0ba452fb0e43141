"""The `hf-vanilla-transformer` command line: help everywhere, clear errors, and a tiny end-to-end `train` that
writes a folder that `pipeline("translation")` loads, then `evaluate`, `translate`, `average` and `--resume` on it."""

import gzip
import json

import pytest
from huggingface_hub import ModelCard
from transformers import pipeline

from hf_vanilla_transformer.cli import build_parser, main
from hf_vanilla_transformer.data import MULTI30K_DIR


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], ["train", "evaluate", "translate", "average", "attention", "curve"]),
        (["train"], ["--max-time", "--preset", "--src-lang", "--resume", "--average-last", "--bf16", "eq. (3)"]),
        (["evaluate"], ["model_dir", "--split", "--src", "--ref"]),
        (["translate"], ["model_dir", "stdin", "--num-beams"]),
        (["average"], ["checkpoints", "--last", "--output"]),
        (["attention"], ["model_dir", "sentence"]),
        (["curve"], ["model_dir", "--limit", "learning_curve.png"]),
    ],
)
def test_help(command, expected, capsys) -> None:
    code, out, _ = run([*command, "--help"], capsys)
    assert code == 0
    for text in expected:
        assert text in out


@pytest.mark.parametrize(
    ("flags", "bf16"), [([], "no"), (["--bf16"], "yes"), (["--bf16", "auto"], "auto"), (["--bf16", "no"], "no")]
)
def test_bf16_option(flags, bf16) -> None:
    assert build_parser().parse_args(["train", *flags]).bf16 == bf16


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--src-lang", "xx"], "`src_lang` must be one of en, de, fr for Multi30k, got 'xx'"),
        (["train", "--tgt-lang", "en"], "`src_lang` and `tgt_lang` must differ"),
        (["train", "--preset", "transformer-huge"], "invalid choice: 'transformer-huge'"),
        (["train", "--attn-implementation", "flash"], "invalid choice: 'flash'"),
        (["train", "--bf16", "maybe"], "invalid choice: 'maybe'"),
        (["train", "--max-time", "5x"], "Durations must look like '1h'"),
        (["train", "--dropout", "1.5"], "must be a number in [0, 1), got '1.5'"),
        (["train", "--train-src", "a.en"], "`--train-src` and `--train-tgt` go together"),
        (
            ["train", "--train-src", "missing.en", "--train-tgt", "missing.de"],
            "`--train-src` missing.en does not exist",
        ),
        (["train", "--schedule", "inverse_sqrt", "--lr", "1"], "`learning_rate` is the peak learning rate"),
        (["train", "--tokenizer", "nowhere"], "`--tokenizer` nowhere is not a folder"),
        (["evaluate", "nowhere"], "`model_dir` nowhere is not a saved model folder (no config.json)"),
        (["translate", "nowhere", "Hello"], "`model_dir` nowhere is not a saved model folder"),
        (["average", "missing-1", "missing-2", "-o", "out"], "Checkpoint missing-1 does not exist"),
        (["train", "--compare-curve", "curves.json"], "`--compare-curve` curves.json is drawn beside the learning"),
        (["train", "--curve-every", "1m", "--compare-curve", "nowhere.json"], "nowhere.json is not a readable JSON"),
    ],
)
def test_errors_name_the_value_and_the_fix(argv, message, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_unwritable_output_folder_and_resume_without_checkpoints(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run(["train", "--output-dir", str(blocker / "out")], capsys)
    assert code == 2 and f"`--output-dir` {blocker / 'out'} is not a writable folder" in err
    code, _, err = run(["train", "--resume", "--output-dir", str(tmp_path / "fresh")], capsys)
    assert code == 2 and "`--resume` found no checkpoint" in err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """300 Multi30k training pairs and 4 test pairs as plain text files."""
    folder = tmp_path_factory.mktemp("corpus")
    for lang in ("en", "de"):
        with gzip.open(MULTI30K_DIR / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines = [next(handle) for _ in range(300)]
        (folder / f"train.{lang}").write_text("".join(lines), encoding="utf-8")
        (folder / f"test.{lang}").write_text("".join(lines[:4]), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp("run") / "model"
    argv = [
        "train",
        *("--train-src", str(corpus / "train.en"), "--train-tgt", str(corpus / "train.de")),
        *("--test-src", str(corpus / "test.en"), "--test-tgt", str(corpus / "test.de")),
        # A checkpoint after every update (--save-every far below an update's time), whatever the machine's speed.
        *("--vocab-size", "400", "--max-tokens", "1024", "--max-steps", "4", "--save-every", "0.001"),
        *("--average-last", "3", "--output-dir", str(output), "--examples", "2", "--no-progress"),
        *("--curve-every", "0.01", "--license", "cc-by-nc-4.0"),
    ]
    assert main(argv) == 0
    return output


def test_train_writes_a_folder_the_translation_pipeline_loads(trained, corpus) -> None:
    config = json.loads((trained / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("modeling_vanilla_transformer.")
    assert (config["d_model"], config["encoder_layers"], config["dropout"], config["vocab_size"]) == (256, 3, 0.3, 400)
    generation = json.loads((trained / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)
    for name in ("model.safetensors", "tokenizer.json", "modeling_vanilla_transformer.py"):
        assert (trained / name).is_file()
    results = json.loads((trained / "results.json").read_text())
    assert results["updates"] == 4 and results["languages"] == ["en", "de"]
    assert results["test"]["n"] == 4 and len(results["test"]["hypotheses"]) == 4
    assert 0.0 <= results["test"]["bleu"] <= 100.0
    assert len(results["averaged_checkpoints"]) == 3
    assert results["train"]["train_tgt_tokens_per_second"] > 0
    # Averaged vs last checkpoint, both scored with the same decoding and named in the model card.
    assert results["test_last_checkpoint"]["n"] == 4
    card = (trained / "README.md").read_text()
    assert "last checkpoint alone scores BLEU" in card and "attention/cross_attention.png" in card
    assert (trained / "attention" / "cross_attention.png").is_file()
    # The card's metadata: --license as given; the user's files are no Hub dataset, so none is listed; the widget
    # is the first test source (the data's own domain); the out-of-domain translation is recorded and shown.
    data = ModelCard(card).data
    assert data.license == "cc-by-nc-4.0" and data.datasets is None and data.language == ["en", "de"]
    assert data.widget == [{"text": (corpus / "test.en").read_text().splitlines()[0]}]
    assert results["out_of_domain"]["source"].startswith("The Transformer is based solely on attention")
    assert f'output: "{results["out_of_domain"]["translation"]}"' in card
    assert "| Updates | 4 |" in card and "the user's own parallel data" in card
    translator = pipeline("translation", model=str(trained))
    output = translator(["A man is riding a bike."], max_new_tokens=5)
    assert isinstance(output[0]["translation_text"], str)


def test_evaluate_translate_and_average_on_the_trained_folder(trained, corpus, capsys, tmp_path) -> None:
    argv = ["evaluate", str(trained), "--src", str(corpus / "test.en"), "--ref", str(corpus / "test.de")]
    code, out, _ = run([*argv, "--num-beams", "1", "--output", str(tmp_path / "scores.json"), "--no-progress"], capsys)
    assert code == 0 and out.startswith("BLEU ") and "nrefs:1|case:mixed" in out
    assert json.loads((tmp_path / "scores.json").read_text())["n"] == 4

    code, out, _ = run(["translate", str(trained), "A dog.", "Two men.", "--num-beams", "1"], capsys)
    assert code == 0 and len(out.splitlines()) == 2

    checkpoints = trained / "checkpoints"
    code, out, _ = run(["average", str(checkpoints), "--last", "2", "-o", str(tmp_path / "avg")], capsys)
    assert code == 0 and "Averaged 2 checkpoints (checkpoint-3, checkpoint-4)" in out
    assert (tmp_path / "avg" / "model.safetensors").is_file()


def test_learning_curve_snapshots_and_plot(trained, capsys, tmp_path) -> None:
    snapshots = sorted((trained / "curve").glob("step-*"))
    assert snapshots, "train --curve-every wrote no snapshots"
    infos = [json.loads((path / "snapshot.json").read_text()) for path in snapshots]
    assert all(info["seconds"] > 0 and info["tgt_tokens"] > 0 for info in infos)
    assert sorted(info["step"] for info in infos) == sorted(int(p.name.split("-")[1]) for p in snapshots)
    code, out, _ = run(["curve", str(trained), "--limit", "3", "--batch-size", "3", "--no-progress"], capsys)
    assert code == 0 and "learning_curve.png" in out
    points = json.loads((trained / "learning_curve.json").read_text())
    assert [p["step"] for p in points] == sorted(info["step"] for info in infos)
    assert all(0.0 <= p["bleu"] <= 100.0 and p["decoding"]["num_beams"] == 1 for p in points)
    assert (trained / "learning_curve.png").stat().st_size > 10_000
    # A comparison curve only from a file passed: here the run's own curve, copied.
    compare = tmp_path / "earlier-run" / "learning_curve.json"
    compare.parent.mkdir()
    compare.write_text((trained / "learning_curve.json").read_text())
    argv = [
        "curve",
        str(trained),
        "--limit",
        "3",
        "--batch-size",
        "3",
        "--no-progress",
        "--compare-curve",
        str(compare),
    ]
    code, out, _ = run(argv, capsys)
    assert code == 0 and "learning_curve.png" in out
    code, _, err = run([*argv[:-1], str(tmp_path / "missing.json")], capsys)
    assert code == 2 and "`--compare-curve`" in err and "missing.json is not a readable JSON file" in err


def test_rerun_needs_resume_and_resume_continues(trained, corpus, capsys) -> None:
    base = ["train", "--train-src", str(corpus / "train.en"), "--train-tgt", str(corpus / "train.de")]
    base += ["--vocab-size", "400", "--max-tokens", "1024", "--output-dir", str(trained), "--no-progress"]
    code, _, err = run([*base, "--max-steps", "4"], capsys)
    assert code == 2 and "already holds checkpoints of an earlier run" in err and "--resume" in err
    code, out, _ = run([*base, "--max-steps", "6", "--resume", "--no-eval", "--average-last", "1"], capsys)
    assert code == 0 and "Trained 6 updates" in out
    assert json.loads((trained / "results.json").read_text())["updates"] == 6


class _StopTrainingError(Exception):
    pass


@pytest.mark.parametrize(("option", "expected"), [([], "eager"), (["--attn-implementation", "sdpa"], "sdpa")])
def test_training_attention_is_eager_on_the_cpu_unless_chosen(option, expected, corpus, tmp_path, monkeypatch) -> None:
    from hf_vanilla_transformer.training import VanillaSeq2SeqTrainer

    seen = []

    def train(self, **kwargs) -> None:
        seen.append(self.model.config._attn_implementation)
        raise _StopTrainingError  # the choice is made; no need to train

    monkeypatch.setattr(VanillaSeq2SeqTrainer, "train", train)
    argv = ["train", "--train-src", str(corpus / "train.en"), "--train-tgt", str(corpus / "train.de")]
    argv += ["--vocab-size", "400", "--max-steps", "1", "--output-dir", str(tmp_path / "m"), *option]
    with pytest.raises(_StopTrainingError):
        main(argv)
    assert seen == [expected]


def test_evaluate_refuses_unknown_languages_before_loading_the_model(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    code, _, err = run(["evaluate", str(tmp_path), "--src-lang", "xx"], capsys)
    assert code == 2 and "`src_lang` must be one of en, de, fr for Multi30k, got 'xx'" in err
