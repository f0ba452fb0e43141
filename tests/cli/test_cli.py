"""The `hf-vanilla-transformer` command line: help everywhere, clear errors, and a tiny end-to-end `train` that
writes a folder that `pipeline("translation")` loads, then `evaluate`, `translate`, `average` and `--resume` on it."""

import gzip
import io
import json
import shutil
import struct

import pytest
from huggingface_hub import ModelCard
from transformers import pipeline

from hf_vanilla_transformer.cli import _flag_wording, _option_flags, build_parser, main
from hf_vanilla_transformer.files import MANIFEST
from hf_vanilla_transformer.hub import hub_files

from ..conftest import one_line_error, run, write_multi30k_sample


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], ["train", "evaluate", "translate", "average", "push", "attention", "curve"]),
        (["train"], ["--max-time", "--preset", "--resume", "--average-last", "--bf16", "eq. (3)", "--push-to-hub"]),
        (["evaluate"], ["model_dir", "--split", "--src", "--ref"]),
        (["translate"], ["model_dir", "stdin", "--num-beams"]),
        (["average"], ["checkpoints", "--last", "--output"]),
        (["attention"], ["model_dir", "sentence"]),
        (["curve"], ["run_dir", "--limit", "learning_curve.png"]),
        (["push"], ["model_dir", "repo_id", "--private", "--revision", "--force", "hf auth login"]),
    ],
)
def test_help(command, expected, capsys) -> None:
    code, out, _ = run([*command, "--help"], capsys)
    assert code == 0
    for text in expected:
        assert text in out
    # An option without a default says so in its own words, not with argparse's "(default: None)".
    assert "(default: None)" not in out


def test_help_shows_real_defaults(capsys) -> None:
    _, out, _ = run(["train", "--help"], capsys)
    words = " ".join(out.split())  # argparse wraps lines
    assert "side (</s> included) (default: 256)" in words  # --max-length
    assert "decoded greedily (default: multi30k)" in words  # --recipe


@pytest.mark.parametrize(
    ("flags", "bf16"), [([], "auto"), (["--bf16"], "yes"), (["--bf16", "auto"], "auto"), (["--bf16", "no"], "no")]
)
def test_bf16_option(flags, bf16) -> None:
    assert build_parser().parse_args(["train", *flags]).bf16 == bf16


@pytest.mark.parametrize(
    ("flags", "share"), [([], None), (["--lr-cooldown", "30%"], 0.3), (["--lr-cooldown", "1"], 1.0)]
)
def test_lr_cooldown_option(flags, share) -> None:
    assert build_parser().parse_args(["train", *flags]).lr_cooldown == share


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--src-lang", "xx"], "`--src-lang` must be one of en, de, fr for Multi30k, got 'xx'"),
        (["train", "--tgt-lang", "en"], "`--src-lang` and `--tgt-lang` must differ"),
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
        (["train", "--lr-cooldown", "150%"], "must be a share in (0, 1], as 0.3 or 30%, got '150%'"),
        (["train", "--lr-cooldown", "0.3", "--epochs", "2"], "set `--max-time` or `--max-steps`, or drop"),
        (["evaluate", "nowhere"], "`model_dir` nowhere is not a saved model folder (no config.json)"),
        (["translate", "nowhere", "Hello"], "`model_dir` nowhere is not a saved model folder"),
        (["average", "missing-1", "missing-2", "-o", "out"], "Checkpoint missing-1 does not exist"),
        (["train", "--compare-curve", "curves.json"], "`--compare-curve` curves.json is drawn beside the learning"),
        (["train", "--curve-every", "1m", "--compare-curve", "nowhere.json"], "nowhere.json is not a readable JSON"),
    ],
)
def test_errors_name_the_value_and_the_fix(argv, message, capsys, tmp_path, monkeypatch) -> None:
    """Exit 2 and stderr one line, `PROG COMMAND: error: ...` naming the value: nothing else (no warning, no
    traceback), except that argparse's own errors (an invalid choice or value) come after its usage."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(argv, capsys)
    assert code == 2
    *usage, line = err.splitlines()
    assert err.endswith("\n") and line.startswith(f"hf-vanilla-transformer {argv[0]}: error: "), err
    assert message in line, err
    if line.startswith(f"hf-vanilla-transformer {argv[0]}: error: argument "):  # argparse's own
        assert usage[0].startswith("usage: ") and all(text.startswith(" ") for text in usage[1:]), err
    else:
        assert not usage, err


def test_unwritable_output_folder_and_resume_without_checkpoints(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run(["train", "--output-dir", str(blocker / "out")], capsys)
    assert code == 2 and f"`--output-dir` {blocker / 'out'} is not a writable folder" in err
    code, _, err = run(["train", "--resume", "--output-dir", str(tmp_path / "fresh")], capsys)
    assert code == 2 and "`--resume` found no checkpoint" in err


@pytest.fixture(scope="module")
def multi30k(tmp_path_factory):
    """300 Multi30k training pairs and 4 test pairs as plain text files."""
    return write_multi30k_sample(tmp_path_factory.mktemp("corpus"), 300, 4)


@pytest.fixture(scope="module")
def trained(multi30k, tmp_path_factory):
    output = tmp_path_factory.mktemp("run") / "model"
    argv = [
        "train",
        *("--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")),
        *("--test-src", str(multi30k / "test.en"), "--test-tgt", str(multi30k / "test.de")),
        # A checkpoint after every update (--save-every far below an update's time), whatever the machine's speed.
        *("--vocab-size", "400", "--max-tokens", "1024", "--max-steps", "4", "--save-every", "0.001"),
        *("--average-last", "3", "--output-dir", str(output), "--examples", "2", "--no-progress"),
        *("--curve-every", "0.01", "--license", "cc-by-nc-4.0"),
    ]
    assert main(argv) == 0
    return output


def test_train_dropout_deviations_reach_the_model(multi30k, tmp_path, capsys) -> None:
    """--attention-dropout / --activation-dropout (deviations; every preset has 0, the paper's) set the config's
    fields beside the preset's P_drop; the start-up line and the card name them; run_settings.json records them."""
    output = tmp_path / "run"
    argv = [
        "train",
        *("--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")),
        *("--vocab-size", "400", "--max-tokens", "1024", "--max-steps", "1", "--average-last", "1"),
        *("--test-src", str(multi30k / "test.en"), "--test-tgt", str(multi30k / "test.de"), "--examples", "1"),
        *("--attention-dropout", "0.1", "--activation-dropout", "0.25", "--no-progress", "--output-dir", str(output)),
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    config = json.loads((output / "model" / "config.json").read_text())
    assert (config["dropout"], config["attention_dropout"], config["activation_dropout"]) == (0.3, 0.1, 0.25)
    assert "parameters, P_drop 0.3, attention dropout 0.1, ReLU dropout 0.25; training with" in out
    settings = json.loads((output / "run_settings.json").read_text())
    assert (settings["dropout"], settings["attention_dropout"], settings["activation_dropout"]) == (
        0.3,
        0.1,
        0.25,
    )
    card = (output / "model" / "README.md").read_text()
    assert "| Attention dropout (deviation) | 0.1 |" in card and "| ReLU dropout (deviation) | 0.25 |" in card


def test_train_sets_the_saved_models_decoding(multi30k, tmp_path, capsys) -> None:
    """--num-beams / --length-penalty replace §6.1's beam 4 and α 0.6 in the saved folder's generation_config.json:
    the test scoring at the end decodes with them, the start-up log and the card say so, and the averaged model
    keeps them."""
    output = tmp_path / "run"
    argv = [
        "train",
        *("--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")),
        *("--vocab-size", "400", "--max-tokens", "1024", "--max-steps", "2", "--save-every", "0.001"),
        *("--test-src", str(multi30k / "test.en"), "--test-tgt", str(multi30k / "test.de"), "--examples", "1"),
        *("--average-last", "2", "--num-beams", "3", "--length-penalty", "1.4", "--no-progress"),
        *("--output-dir", str(output)),
    ]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    generation = json.loads((output / "model" / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (3, 1.4)
    assert generation["length_penalty_type"] == "gnmt"
    results = json.loads((output / "model" / "results.json").read_text())
    assert len(results["averaged_checkpoints"]) == 2
    assert (results["test"]["generation"]["num_beams"], results["test"]["generation"]["length_penalty"]) == (3, 1.4)
    assert "The saved model decodes with beam 3, length penalty α 1.4 (§6.1: beam 4, α 0.6)" in out
    card = (output / "model" / "README.md").read_text()
    assert "| Beam size | 3 |" in card and "| Length penalty α | 1.4 |" in card
    assert "Defaults from `generation_config.json`; the paper's §6.1 settings are beam 4 and GNMT α 0.6." in card


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-beams", "0"], "argument --num-beams: must be a positive integer, got '0'"),
        (["--length-penalty", "nan"], "argument --length-penalty: must be a finite number, got 'nan'"),
    ],
)
def test_train_refuses_a_decoding_it_cannot_use(flags, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err, err


def test_train_writes_a_folder_the_translation_pipeline_loads(trained, multi30k) -> None:
    model = trained / "model"
    config = json.loads((model / "config.json").read_text())
    assert config["auto_map"]["AutoModelForSeq2SeqLM"].startswith("modeling_vanilla_transformer.")
    assert (config["d_model"], config["encoder_layers"], config["dropout"], config["vocab_size"]) == (256, 3, 0.3, 400)
    generation = json.loads((model / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (4, 0.6)
    for name in ("model.safetensors", "tokenizer.json", "modeling_vanilla_transformer.py"):
        assert (model / name).is_file()
    results = json.loads((model / "results.json").read_text())
    assert results["updates"] == 4 and results["languages"] == ["en", "de"]
    assert results["test"]["n"] == 4 and len(results["test"]["hypotheses"]) == 4
    assert 0.0 <= results["test"]["bleu"] <= 100.0
    assert len(results["averaged_checkpoints"]) == 3
    assert results["train"]["train_tgt_tokens_per_second"] > 0
    # Averaged vs last checkpoint, both scored with the same decoding and named in the model card.
    assert results["test_last_checkpoint"]["n"] == 4
    card = (model / "README.md").read_text()
    assert "last checkpoint alone scores BLEU" in card and "attention/cross_attention.png" in card
    assert (model / "attention" / "cross_attention.png").is_file()
    # The card's metadata: --license as given; the user's files are no Hub dataset, so none is listed; the widget
    # is the first test source (the data's own domain); the out-of-domain translation is recorded and shown.
    data = ModelCard(card).data
    assert data.license == "cc-by-nc-4.0" and data.datasets is None and data.language == ["en", "de"]
    assert data.widget == [{"text": (multi30k / "test.en").read_text().splitlines()[0]}]
    assert results["out_of_domain"]["source"].startswith("The Transformer is based solely on attention")
    assert f'output: "{results["out_of_domain"]["translation"]}"' in card
    assert "| Updates | 4 |" in card and "the user's own parallel data" in card
    translator = pipeline("translation", model=str(model))
    output = translator(["A man is riding a bike."], max_new_tokens=5)
    assert isinstance(output[0]["translation_text"], str)


def test_the_model_folder_holds_exactly_the_hub_files(trained) -> None:
    """The model folder is what its Hub repository holds, nothing else; the run's other files stay beside it."""
    model = trained / "model"
    held = sorted(path.relative_to(model).as_posix() for path in model.rglob("*") if path.is_file())
    assert [name for name in held if not name.endswith(MANIFEST)] == hub_files(model)  # the manifest stays local
    assert {"results.json", "README.md", "attention/cross_attention.png", "tokenizer.json"} <= set(held)
    run_level = {path.name for path in trained.iterdir()}
    assert {"checkpoints", "curve", "run_settings.json", "model"} <= run_level and "config.json" not in run_level


def test_the_model_folder_shows_no_local_folder(trained, multi30k) -> None:
    """The model folder is what `push` uploads: its card reproduces the training command with file names
    (`--train-src train.en`, not the absolute path given), and no file of it (card, results.json, configs,
    tokenizer files) holds the folders of the machine that trained. (Before the resume below, which rewrites the
    folder without a card: `--no-eval`.)"""
    model = trained / "model"
    card = (model / "README.md").read_text()
    assert "--train-src train.en --train-tgt train.de" in card, card
    for path in sorted(model.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".json", ".txt"):
            text = path.read_text(encoding="utf-8")
            for folder in (str(multi30k), str(trained), str(trained.parent)):
                assert folder not in text, f"{path.name} holds {folder}"


def test_evaluate_translate_and_average_on_the_trained_folder(trained, multi30k, capsys, tmp_path) -> None:
    argv = ["evaluate", str(trained / "model"), "--src", str(multi30k / "test.en"), "--ref", str(multi30k / "test.de")]
    code, out, _ = run([*argv, "--num-beams", "1", "--output", str(tmp_path / "scores.json"), "--no-progress"], capsys)
    assert code == 0 and out.startswith("BLEU ") and "nrefs:1|case:mixed" in out
    assert json.loads((tmp_path / "scores.json").read_text())["n"] == 4
    # --length-penalty overrides α for this decoding only (tuning it on validation, as §6.1 did): the folder keeps 0.6.
    scores = tmp_path / "alpha.json"
    code, out, err = run([*argv, "--num-beams", "2", "--length-penalty", "1.4", "--output", str(scores)], capsys)
    assert code == 0, err
    generation = json.loads(scores.read_text())["generation"]
    assert (generation["num_beams"], generation["length_penalty"]) == (2, 1.4)
    assert generation["length_penalty_type"] == "gnmt"
    assert json.loads((trained / "model" / "generation_config.json").read_text())["length_penalty"] == 0.6
    code, _, err = run([*argv, "--length-penalty", "inf"], capsys)
    assert code == 2 and "argument --length-penalty: must be a finite number, got 'inf'" in err, err

    code, out, _ = run(["translate", str(trained / "model"), "A dog.", "Two men.", "--num-beams", "1"], capsys)
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
    assert (trained / "model" / "learning_curve.png").stat().st_size > 10_000
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


def test_rerun_needs_resume_and_resume_continues(trained, multi30k, capsys) -> None:
    base = ["train", "--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")]
    base += ["--vocab-size", "400", "--max-tokens", "1024", "--output-dir", str(trained), "--no-progress"]
    code, _, err = run([*base, "--max-steps", "4"], capsys)
    assert code == 2 and "already holds checkpoints of an earlier run" in err and "--resume" in err
    code, out, _ = run([*base, "--max-steps", "6", "--resume", "--no-eval", "--average-last", "1"], capsys)
    assert code == 0 and "Trained 6 updates" in out
    assert json.loads((trained / "model" / "results.json").read_text())["updates"] == 6


class _StopTrainingError(Exception):
    pass


@pytest.mark.parametrize(("option", "expected"), [([], "eager"), (["--attn-implementation", "sdpa"], "sdpa")])
def test_training_attention_is_eager_on_the_cpu_unless_chosen(
    option, expected, multi30k, tmp_path, monkeypatch
) -> None:
    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer

    seen = []

    def train(self, **kwargs) -> None:
        seen.append(self.model.config._attn_implementation)
        raise _StopTrainingError  # the choice is made; no need to train

    monkeypatch.setattr(VanillaSeq2SeqTrainer, "train", train)
    argv = ["train", "--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")]
    argv += ["--vocab-size", "400", "--max-steps", "1", "--output-dir", str(tmp_path / "m"), *option]
    with pytest.raises(_StopTrainingError):
        main(argv)
    assert seen == [expected]


def test_a_vocabulary_far_below_vocab_size_is_a_warning_in_flags(multi30k, tmp_path, monkeypatch, caplog) -> None:
    """300 pairs cannot fill `--vocab-size 30000`: the warning says so, in the command line's words on stderr."""
    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer

    def train(self, **kwargs) -> None:
        raise _StopTrainingError  # the tokenizer is trained; no need to train the model

    monkeypatch.setattr(VanillaSeq2SeqTrainer, "train", train)
    argv = ["train", "--train-src", str(multi30k / "train.en"), "--train-tgt", str(multi30k / "train.de")]
    argv += ["--vocab-size", "30000", "--max-steps", "1", "--output-dir", str(tmp_path / "m"), "--no-progress"]
    with caplog.at_level("WARNING", logger="hf_vanilla_transformer"), pytest.raises(_StopTrainingError):
        main(argv)
    # pytest's log capture keeps main's stderr handler out (basicConfig): word the record as that handler does.
    (record,) = [record for record in caplog.records if "asked for" in record.getMessage()]
    line = _flag_wording(record.getMessage(), _option_flags(build_parser(), "train"))
    assert line.startswith("`--vocab-size 30000` asked for, the BPE learned "), line
    assert "pass a smaller `--vocab-size` (e.g. " in line, line


def test_evaluate_refuses_unknown_languages_before_loading_the_model(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "vanilla_transformer"}')
    (tmp_path / "tokenizer.json").write_text("{}")
    code, _, err = run(["evaluate", str(tmp_path), "--src-lang", "xx"], capsys)
    assert code == 2 and "`--src-lang` must be one of en, de, fr for Multi30k, got 'xx'" in err


# ---------------------------------------------------------------------------------------------------- bad input
# Each error is one line on stderr with exit status 2, naming the file or option and the fix.


def translate_stdin(folder, data: bytes, capsys, monkeypatch, *options: str) -> tuple[int, str, str]:
    """`translate FOLDER` with `data` on stdin, which Python (like the real stdin) splits at "\n" only. The untrained
    model's output may hold any character, so its lines are counted by "\n"."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="\n"))
    return run(["translate", str(folder), "--num-beams", "1", *options], capsys)


def test_translate_reads_crlf_input_as_lf(bpe_model, capsys, monkeypatch, tmp_path) -> None:
    lines = ["A man in a blue shirt.", "Two dogs play in the snow.", "A girl."]
    code, lf, _ = translate_stdin(bpe_model, "".join(f"{line}\n" for line in lines).encode(), capsys, monkeypatch)
    assert code == 0 and lf.count("\n") == 3
    crlf = "".join(f"{line}\r\n" for line in lines).encode()
    assert translate_stdin(bpe_model, crlf, capsys, monkeypatch)[:2] == (0, lf)
    (tmp_path / "input.txt").write_bytes(crlf)
    assert run(["translate", str(bpe_model), "--input", str(tmp_path / "input.txt"), "--num-beams", "1"], capsys)[
        :2
    ] == (0, lf)


def test_max_input_tokens_cuts_with_one_warning_that_counts(bpe_model, capsys, monkeypatch, caplog) -> None:
    data = ("A dog. " * 40 + "\nA girl.\nA man on a bike. " + "A dog. " * 30 + "\n").encode()
    code, out, _ = translate_stdin(bpe_model, data, capsys, monkeypatch, "--max-input-tokens", "20")
    assert code == 0 and out.count("\n") == 3
    warnings = [record.getMessage() for record in caplog.records if "longer than" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("2 of 3 sources are longer than 20 tokens"), warnings


def test_translate_refuses_stdin_that_is_not_utf8(bpe_model, capsys, monkeypatch) -> None:
    code, _, err = translate_stdin(bpe_model, b"A dog.\nCaf\xe9 au lait.\n", capsys, monkeypatch)
    one_line_error(code, err, "stdin is not UTF-8 text: line 2 has the byte 0xe9", "iconv")


def _folder_without_tokenizer(folder, target) -> None:
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("tokenizer*"))


def _bart_folder(folder, target) -> None:
    shutil.copytree(folder, target)
    (target / "config.json").write_text('{"model_type": "bart", "vocab_size": 300, "d_model": 32}')


def _config_not_json(folder, target) -> None:
    shutil.copytree(folder, target)
    (target / "config.json").write_text('{"model_type": ')


def _edited(name: str, **values: object):
    """A damage: the folder with `values` set in its JSON file `name`."""

    def damage(folder, target) -> None:
        shutil.copytree(folder, target)
        (target / name).write_text(json.dumps(json.loads((target / name).read_text()) | values))

    damage.__name__ = f"{name}:{','.join(f'{key}={value}' for key, value in values.items())}"
    return damage


def _replaced(name: str, text: str):
    """A damage: the folder with `text` as its file `name`."""

    def damage(folder, target) -> None:
        shutil.copytree(folder, target)
        (target / name).write_text(text)

    damage.__name__ = f"{name}:{text}"
    return damage


WRONG_FOLDERS = {
    _folder_without_tokenizer: "has no tokenizer (no tokenizer.json). Save the tokenizer into the folder",
    _bart_folder: "holds a model of type 'bart', not 'vanilla_transformer'. Pass a folder written by `train`",
    _config_not_json: "config.json is not valid JSON (Expecting value",
    # Values no machine holds: refused before the allocator refuses terabytes (a RuntimeError traceback before).
    _edited("config.json", d_model=10**9): "config.json is invalid: `d_model=1000000000` makes a model of",
    _edited("config.json", max_position_embeddings=10**12): (
        "config.json is invalid: `max_position_embeddings=1000000000000` makes a model of"
    ),
    # A ZeroDivisionError traceback from beam search before.
    _edited("generation_config.json", num_beams=0): (
        'generation_config.json has `"num_beams": 0`, which generate() cannot run: it must be an integer of at least 1'
    ),
    # One line before, but without the file's name (or an OSError traceback for the generation config).
    _replaced("generation_config.json", '{"num_beams'): "generation_config.json is not valid JSON (",
    _replaced("tokenizer.json", '{"model'): "tokenizer.json is not valid JSON (",
    _replaced("tokenizer_config.json", '{"model'): "tokenizer_config.json is not valid JSON (",
    _replaced("tokenizer_config.json", "[1]"): "tokenizer_config.json is not a JSON object",
    _replaced("tokenizer.json", "{}"): "cannot be read (KeyError: 'added_tokens'): the folder is damaged",
}


@pytest.mark.parametrize(
    ("damage", "message", "command"),
    [
        (damage, message, command)
        for damage, message in WRONG_FOLDERS.items()
        for command in ("translate", "evaluate", "attention", "average")
        # Checkpoints average without a tokenizer: a folder without one is no error there.
        if not (command == "average" and damage is _folder_without_tokenizer)
    ],
)
def test_wrong_model_folders_are_one_line(bpe_model, tmp_path, capsys, damage, message, command) -> None:
    folder = tmp_path / "folder"
    damage(bpe_model, folder)
    argv = {
        "translate": ["translate", str(folder), "A dog."],
        "evaluate": ["evaluate", str(folder), "--split", "validation"],
        "attention": ["attention", str(folder), "A dog.", "--out", str(tmp_path / "maps")],
        "average": ["average", str(bpe_model), str(folder), "-o", str(tmp_path / "avg")],
    }[command]
    code, _, err = run(argv, capsys)
    one_line_error(code, err, str(folder), message)


def test_attention_on_a_missing_folder_is_one_line(tmp_path, capsys) -> None:
    code, _, err = run(["attention", str(tmp_path / "missing"), "A dog."], capsys)
    one_line_error(code, err, f"`model_dir` {tmp_path / 'missing'} is not a saved model folder (no config.json)")


def test_evaluate_output_folder_is_refused_before_decoding(bpe_model, tmp_path, capsys, monkeypatch) -> None:
    import hf_vanilla_transformer.inference.evaluation as evaluation

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded before checking --output")

    monkeypatch.setattr(evaluation, "best_translations", no_decoding)
    (tmp_path / "src.txt").write_text("A dog.\n")
    argv = ["evaluate", str(bpe_model), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "src.txt")]
    code, _, err = run([*argv, "--output", str(tmp_path)], capsys)
    one_line_error(code, err, f"`--output` {tmp_path} is a folder; it names the JSON file to write")


def test_damaged_results_json_is_named(bpe_model, tmp_path, capsys) -> None:
    folder = tmp_path / "model"
    shutil.copytree(bpe_model, folder)
    (folder / "results.json").write_text('{"languages": ')
    code, _, err = run(["evaluate", str(folder)], capsys)
    one_line_error(code, err, f"{folder / 'results.json'} is damaged", "Pass `--src-lang` and `--tgt-lang`")


def test_average_names_a_safetensors_file_with_an_absurd_header_length(bpe_model, tmp_path, capsys) -> None:
    folder = tmp_path / "damaged"
    shutil.copytree(bpe_model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 2**62) + weights.read_bytes()[8:])
    code, _, err = run(["average", str(bpe_model), str(folder), "-o", str(tmp_path / "avg")], capsys)
    one_line_error(code, err, f"{weights} is damaged: not a readable safetensors file (", "header too large")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"A dog.\nCaf\xe9.\n", "train.src is not UTF-8 text: line 2 has the byte 0xe9"),
        (b"\x1f\x8b\x08\x00\x00\x00", "train.src.gz is not a readable gzip file ("),
    ],
)
def test_training_data_that_cannot_be_read_is_named(tmp_path, capsys, content, message) -> None:
    name = "train.src.gz" if content.startswith(b"\x1f\x8b") else "train.src"
    (tmp_path / name).write_bytes(content)
    (tmp_path / "train.tgt").write_text("Ein Hund.\nKaffee.\n")
    argv = ["train", "--train-src", str(tmp_path / name), "--train-tgt", str(tmp_path / "train.tgt")]
    code, _, err = run([*argv, "--output-dir", str(tmp_path / "out")], capsys)
    one_line_error(code, err, message)


def test_truncated_gzip_data_is_named(tmp_path) -> None:
    from hf_vanilla_transformer.training.data import read_lines

    whole = gzip.compress(("A dog on the grass.\n" * 200).encode())
    (tmp_path / "data.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"data\.gz is not a readable gzip file .* truncated or damaged"):
        read_lines(tmp_path / "data.gz")


# ---------------------------------------------------------------------------------------------------- remote code


def _remote_code_folder(folder, target):
    """`folder` as another model type whose config.json auto_map points at a code file that, when imported, writes
    a marker file (what a malicious folder would do instead)."""
    shutil.copytree(folder, target)
    config = json.loads((target / "config.json").read_text())
    config.update(
        model_type="evil",
        auto_map={
            "AutoConfig": "evil_code.EvilConfig",
            "AutoModelForSeq2SeqLM": "evil_code.EvilModel",
            "AutoTokenizer": ["evil_code.EvilTokenizer", None],
        },
    )
    (target / "config.json").write_text(json.dumps(config))
    marker = target.parent / "code-ran"
    (target / "evil_code.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    return marker


@pytest.mark.parametrize("command", ["translate", "evaluate", "attention"])
def test_remote_code_never_runs_without_trust_remote_code(bpe_model, tmp_path, capsys, command) -> None:
    folder = tmp_path / "foreign"
    marker = _remote_code_folder(bpe_model, folder)
    argv = {
        "translate": ["translate", str(folder), "A dog."],
        "evaluate": ["evaluate", str(folder), "--split", "validation"],
        "attention": ["attention", str(folder), "A dog.", "--out", str(tmp_path / "maps")],
    }[command]
    code, _, err = run(argv, capsys)
    one_line_error(code, err, "holds a model of type 'evil'", "Pass `--trust-remote-code` if you trust the folder")
    assert not marker.exists()


def test_loading_passes_trust_remote_code_false_unless_asked(bpe_model, tmp_path, capsys, monkeypatch) -> None:
    """Our own folders load without the flag (their model type is registered by the installed package); every
    from_pretrained of the CLI is told trust_remote_code=False (so transformers never asks), True with the flag."""
    import transformers

    seen = []
    for auto in (transformers.AutoModelForSeq2SeqLM, transformers.AutoTokenizer):
        original = auto.from_pretrained.__func__

        def spy(cls, *args, _original=original, **kwargs):
            seen.append((cls.__name__, kwargs.get("trust_remote_code")))
            return _original(cls, *args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", classmethod(spy))
    code, out, _ = run(["translate", str(bpe_model), "A dog.", "--num-beams", "1"], capsys)
    assert code == 0 and out.count("\n") == 1
    assert sorted(seen) == [("AutoModelForSeq2SeqLM", False), ("AutoTokenizer", False)]
    seen.clear()
    code, _, _ = run(["translate", str(bpe_model), "A dog.", "--num-beams", "1", "--trust-remote-code"], capsys)
    assert code == 0 and sorted(seen) == [("AutoModelForSeq2SeqLM", True), ("AutoTokenizer", True)]


def test_ctrl_c_is_one_line_with_the_command_that_resumes_a_run(capsys, monkeypatch, tmp_path) -> None:
    """Ctrl-C (KeyboardInterrupt) ends a command with exit status 130 and one line, no traceback; for `train`, the
    line gives the same command with --resume (here, once the run saved a complete checkpoint)."""
    from hf_vanilla_transformer import cli

    def interrupted(args: object) -> int:
        checkpoint = tmp_path / "my run" / "checkpoints" / "checkpoint-3"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "trainer_state.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_train", interrupted)
    monkeypatch.setattr(cli, "run_translate", interrupted)
    output = str(tmp_path / "my run")
    code, out, err = run(["train", "--output-dir", output, "--max-steps", "5"], capsys)
    assert code == 130 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("hf-vanilla-transformer train: interrupted.")
    assert err.rstrip().endswith(f"train --output-dir '{output}' --max-steps 5 --resume"), err
    code, _, err = run(["translate", str(tmp_path), "A man."], capsys)
    assert code == 130 and err.count("\n") == 1 and "--resume" not in err, err


# ------------------------------------------------------------------------------------------- issue 34: signals


@pytest.fixture
def sigterm_guard():
    """A SIGTERM handler of the test's own while it runs: a command that fails to install its handler meets this
    one (an AssertionError) instead of pytest's default, which would end the whole test session."""
    import signal

    def guard(signum, frame):
        raise AssertionError("SIGTERM reached the test's handler: the command had none of its own")

    previous = signal.signal(signal.SIGTERM, guard)
    yield guard
    signal.signal(signal.SIGTERM, previous)


def _terminate_self(*args: object) -> int:
    """A command's work that gets SIGTERM from outside (here from itself) and would go on for seconds."""
    import os
    import signal
    import time

    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    raise AssertionError("SIGTERM did not stop the command")


@pytest.mark.parametrize(
    ("argv", "function"),
    [
        (["evaluate", "model"], "run_evaluate"),
        (["translate", "model", "A man."], "run_translate"),
        (["average", "a", "b", "-o", "out"], "run_average"),
        (["push", "model", "me/model"], "run_push"),
    ],
)
def test_sigterm_ends_a_command_with_143_and_one_line(argv, function, capsys, monkeypatch, sigterm_guard) -> None:
    """SIGTERM (a `kill`, a scheduler's stop) ends a command as Ctrl-C does, with one line saying where things
    stand and exit status 143 (128 + SIGTERM, what a shell reports), no traceback; the command's handler is its
    own only while it runs (the previous one is back afterwards)."""
    import signal

    from hf_vanilla_transformer import cli

    monkeypatch.setattr(cli, function, _terminate_self)
    code, out, err = run(argv, capsys)
    assert code == 143 and out == "", err
    assert err == f"hf-vanilla-transformer {argv[0]}: terminated (SIGTERM). Run it again to redo it.\n"
    assert signal.getsignal(signal.SIGTERM) is sigterm_guard


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_conversion_is_one_line(how, capsys, monkeypatch, sigterm_guard, tmp_path) -> None:
    """`python -m conversion`: SIGTERM exits 143, Ctrl-C 130, each with one line saying that OUTPUT_DIR is whole
    (files.replaced_folder swaps the new folder in at once), no traceback."""
    from dataclasses import replace

    import conversion.__main__ as conversion_main

    def interrupted(options: object) -> None:
        raise KeyboardInterrupt

    stop = _terminate_self if how == "SIGTERM" else interrupted
    monkeypatch.setitem(conversion_main.FORMATS, "marian", replace(conversion_main.FORMATS["marian"], convert=stop))
    output = tmp_path / "out"
    try:
        code = conversion_main.main(["marian", str(tmp_path / "opus"), str(output)])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == (143 if how == "SIGTERM" else 130), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    word = "terminated" if how == "SIGTERM" else "interrupted"
    assert err.startswith(f"python -m conversion marian: {word}; {output} is whole"), err


def test_interrupted_train_says_where_the_run_stands(capsys, monkeypatch, tmp_path) -> None:
    """The line of an interrupted `train` gives a command that works from where the run stands: with no
    checkpoint of this run yet, the same command (not --resume, which would find nothing); with only a half-written
    one, --overwrite; with an earlier run's checkpoints that --overwrite has not yet removed, the same command
    again (not --resume, which would continue the run the user asked to replace); with one of its own, --resume
    without --overwrite (the two contradict each other)."""
    import os

    from hf_vanilla_transformer import cli

    output = tmp_path / "run"
    checkpoints = output / "checkpoints"
    state = checkpoints / "checkpoint-3" / "trainer_state.json"
    saves = []  # what the run writes before it is interrupted

    def interrupted(args: object) -> int:
        for path in saves:
            path.touch()
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_train", interrupted)

    def line(*flags: str) -> str:
        code, _, err = run(["train", "--output-dir", str(output), "--max-steps", "5", *flags], capsys)
        assert code == 130 and err.count("\n") == 1, err
        return err.strip()

    assert line().endswith(
        f"No checkpoint of this run was saved yet; to start it again: hf-vanilla-transformer "
        f"train --output-dir {output} --max-steps 5"
    )
    (checkpoints / "checkpoint-4").mkdir(parents=True)  # killed while saving: no trainer_state.json
    assert line().endswith(
        f"No checkpoint in {checkpoints} is complete; to start afresh: hf-vanilla-transformer "
        f"train --output-dir {output} --max-steps 5 --overwrite"
    )
    state.parent.mkdir()
    state.write_text("{}")
    os.utime(state, (0, 0))  # an earlier run's
    assert line("--overwrite").endswith(
        f"to start it again: hf-vanilla-transformer train --output-dir {output} --max-steps 5 --overwrite"
    )
    saves.append(state)  # this run's
    assert line("--overwrite").endswith(
        f"checkpoints up to checkpoint-3; to continue from it: hf-vanilla-transformer "
        f"train --output-dir {output} --max-steps 5 --resume"
    )


def test_a_file_written_after_the_start_is_never_older_than_the_start(tmp_path) -> None:
    """The start time `train` compares checkpoints with is on the file system's clock: a file written right after
    it is never stamped earlier (time.time() is ahead of Linux's file stamps by up to a tick, which once made a
    run's own checkpoint look like an earlier run's)."""
    from hf_vanilla_transformer import cli

    path = tmp_path / "written"
    for _ in range(2000):
        started = cli._file_clock()
        path.write_bytes(b"")
        assert path.stat().st_mtime >= started


# ------------------------------------------------------------------------------------------- issue 34: arguments


def test_sentences_may_follow_options(bpe_model, capsys) -> None:
    """`translate MODEL --int8 "A man."` (a sentence after an option) translates, as argparse's intermixed parsing
    allows: the same lines as with the sentences first, in the order given, also on both sides of an option; an
    unknown option is still refused."""
    model = str(bpe_model)
    code, out, err = run(["translate", model, "--int8", "A man."], capsys)
    assert code == 0 and out.count("\n") == 1, err
    code, first, err = run(["translate", model, "A man.", "A dog.", "--num-beams", "1"], capsys)
    assert code == 0 and first.count("\n") == 2, err
    code, after, err = run(["translate", model, "--num-beams", "1", "A man.", "A dog."], capsys)
    assert code == 0 and after == first, err
    code, around, err = run(["translate", model, "A man.", "--num-beams", "1", "A dog."], capsys)
    assert code == 0 and around == first, err
    code, _, err = run(["translate", model, "--num-beams", "1", "A man.", "--bogus"], capsys)
    assert code == 2 and "unrecognized arguments: --bogus" in err


# ------------------------------------------------------------------------------------------- issue 34: card values


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--src-lang", "en\nlicense: mit"], "`--src-lang` 'en\\nlicense: mit' is not a language tag the Hub accepts"),
        (["--tgt-lang", "<script>alert(1)</script>"], "`--tgt-lang` '<script>alert(1)</script>' is not a language"),
        (["--src-lang", "x" * 5000], "... (5,000 characters) is not a language tag the Hub accepts. Pass a BCP-47"),
        (["--src-lang", "EN"], "`--src-lang` 'EN' is not a language tag the Hub accepts. Write it en"),
        (["--license", "mit\nbase_model: x"], "`--license` 'mit\\nbase_model: x' is not a license id of the Hub"),
        (["--license", "MIT"], "`--license` 'MIT' is not a license id of the Hub (did you mean mit?)"),
        (["--license", "other"], "`--license other` needs `--license-name`, a short kebab-case name of the terms"),
        (["--license", "mit", "--license-name", "x"], "`--license-name` 'x' names the terms of `--license other`"),
    ],
    ids=[
        "newline",
        "html",
        "5000-chars",
        "case",
        "license-newline",
        "license-case",
        "other-unnamed",
        "name-not-other",
    ],
)
def test_card_values_are_refused_in_one_line_before_the_data_is_read(flags, message, capsys, tmp_path) -> None:
    """Languages and the license end up in the model card's YAML and Markdown: a value the Hub would not take is
    one line naming the option, the value (a line break shown as \\n, a long one cut) and the fix, exit 2, before
    the data is read (the missing training files are not what is reported) and before the run folder exists."""
    output = tmp_path / "run"
    files = ["--train-src", str(tmp_path / "missing.en"), "--train-tgt", str(tmp_path / "missing.de")]
    code, _, err = run(["train", *files, "--max-steps", "1", "--output-dir", str(output), *flags], capsys)
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and len(err) < 600, err
    assert not output.exists()


def test_a_model_larger_than_the_machines_memory_is_refused_before_loading(bpe_model, tmp_path, capsys) -> None:
    """A config that any machine might hold but this one cannot (here: a 64 MiB machine, a model of 2 position
    tables of 10**6 rows of 32 values, 244 MiB) is one line naming the field, before anything is allocated."""
    import hf_vanilla_transformer.inference.loading as loading

    folder = tmp_path / "long"
    shutil.copytree(bpe_model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 10**6}))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "machine_memory", lambda: 64 * 2**20)
        code, _, err = run(["translate", str(folder), "A dog."], capsys)
    one_line_error(
        code,
        err,
        f"{folder / 'config.json'}: `max_position_embeddings=1000000` makes a model of 244 MiB",
        "more than this machine's memory (64 MiB). Set `max_position_embeddings` to the size the model was built "
        "with. Or load the model on a machine with more memory.",
    )
    assert loading.machine_memory() > 2**20  # the real one, as the platform reports it


@pytest.mark.parametrize(
    ("settings", "shown"),
    [
        ({"num_beams": 0}, '`"num_beams": 0`, which generate() cannot run: it must be an integer of at least 1'),
        ({"num_beams": 2.5}, '`"num_beams": 2.5`, which generate() cannot run'),
        ({"max_length": 0}, '`"max_length": 0`, which generate() cannot run'),
        ({"max_new_tokens": -3}, '`"max_new_tokens": -3`, which generate() cannot run'),
        ({"max_new_tokens_offset": -1}, '`"max_new_tokens_offset": -1`, which generate() cannot run'),
        ({"num_return_sequences": 6}, '`"num_return_sequences": 6` with `"num_beams": 4`: beam search returns'),
        ({"length_penalty": "long"}, '`"length_penalty": "long"`; it must be a number from -5 to 5'),
        ({"length_penalty": 1e308}, '`"length_penalty": 1e+308`; it must be a number from -5 to 5'),
        ({"length_penalty_type": "wu"}, '`"length_penalty_type": "wu"`; it must be one of hf, gnmt'),
    ],
)
def test_generation_settings_are_checked_on_load(bpe_model, tmp_path, capsys, settings, shown) -> None:
    folder = tmp_path / "model"
    shutil.copytree(bpe_model, folder)
    file = folder / "generation_config.json"
    file.write_text(json.dumps(json.loads(file.read_text()) | settings))
    code, _, err = run(["translate", str(folder), "A dog."], capsys)
    one_line_error(code, err, f"{file} has {shown}", "of the file.")
