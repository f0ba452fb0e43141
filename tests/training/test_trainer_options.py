"""Every Trainer option reachable (issue 23 item 6): any Seq2SeqTrainingArguments field from the command line (as
run_translation.py spells it) or a --config YAML/JSON file, the command line over the file, `train`'s own options
first (a Trainer field they set is refused), and RUN/run_config.json repeating a run."""

import json
import re
from pathlib import Path

import pytest

from hf_vanilla_transformer import cli
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.training.run_folder import RUN_CONFIG_FILE, TRAINER_ARGUMENTS_FILE

from ..train_script import TEST_PRESET, train_args, write_corpus
from .conftest import cli_train_options


def test_trainer_arguments_from_the_command_line_are_typed_like_run_translation(monkeypatch) -> None:
    options = cli_train_options(
        [
            "--optim",
            "adafactor",
            "--max_grad_norm",
            "1.0",
            "--weight-decay",
            "0.01",
            "--gradient_checkpointing",
            "--torch_compile",
            "--lr",
            "1e-3",
        ],
        monkeypatch,
    )
    assert options.trainer_args == {
        "optim": "adafactor",
        "max_grad_norm": 1.0,
        "weight_decay": 0.01,
        "gradient_checkpointing": True,
    }
    assert options.lr == 1e-3  # our own option, not a Trainer argument
    assert options.torch_compile == "yes"  # transformers' switch, spelled as run_translation.py does: ours


def test_a_config_file_holds_options_and_trainer_arguments_and_the_command_line_wins(tmp_path, monkeypatch) -> None:
    config = tmp_path / "run.yaml"
    # YAML reads 1e-3 as a string and 2m is a duration: both are typed as on the command line.
    config.write_text(
        "recipe: multi30k-1h\nlr: 1e-3\nmax_time: 2m\nwarmup-steps: 50\nadam_beta2: '0.997'\nmax_grad_norm: 1.0\n",
        encoding="utf-8",
    )
    options = cli_train_options(["--config", str(config), "--warmup-steps", "60", "--max_grad_norm", "2"], monkeypatch)
    assert (options.lr, options.max_time, options.warmup_steps) == (1e-3, 120.0, 60)
    assert options.curve_every == 600.0  # the file's recipe
    assert options.trainer_args == {"adam_beta2": 0.997, "max_grad_norm": 2.0}
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"lr": 5e-4, "report_to": "tensorboard", "optim": "adafactor"}), encoding="utf-8")
    options = cli_train_options(["--config", str(config)], monkeypatch)
    assert (options.lr, options.report_to, options.trainer_args) == (5e-4, "tensorboard", {"optim": "adafactor"})


@pytest.mark.parametrize(
    ("argv", "config", "message"),
    [
        (["--warmup_steps", "5"], None, r"'warmup_steps' is what `--warmup-steps` sets; pass `--warmup-steps`"),
        (["--learning_rate", "5"], None, r"'learning_rate' is what `--lr` sets"),
        (["--max_grad_nrom", "1"], None, r"Unknown option `--max_grad_nrom` \(did you mean --max_grad_norm"),
        (["--weight_decay", "much"], None, r"Trainer argument: argument --weight_decay.*invalid float value"),
        ([], "lerning_rate: 1\n", r"unknown key `lerning_rate` \(did you mean learning_rate"),
        ([], "gradient_accumulation_steps: 2\n", r"'gradient_accumulation_steps' is what `--grad-accum` sets"),
        ([], "- lr\n", "must hold a mapping"),
    ],
)
def test_unknown_and_clashing_trainer_arguments_are_one_line_errors(argv, config, message, tmp_path, capsys) -> None:
    if config is not None:
        (tmp_path / "run.yaml").write_text(config, encoding="utf-8")
        argv = [*argv, "--config", str(tmp_path / "run.yaml")]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", *argv, "--output-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and len(error.strip().splitlines()) == 1, error
    assert re.search(message, error), error
    assert not (tmp_path / "run").exists()


def test_run_config_repeats_the_run(tmp_path, monkeypatch) -> None:
    """A tiny run with Trainer arguments, then `train --config RUN/run_config.json` into a new folder: the same
    resolved configuration and the same Trainer arguments (what the Trainer used, folders aside)."""
    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)
    corpus = write_corpus(tmp_path / "corpus")
    first, second = tmp_path / "first", tmp_path / "second"
    trainer = ["--weight_decay", "0.01", "--max_grad_norm", "1.0", "--optim", "adamw_torch"]
    assert cli.main([*train_args(corpus, first, 2), *trainer]) == 0
    assert cli.main(["train", "--config", str(first / RUN_CONFIG_FILE), "--output-dir", str(second)]) == 0
    configs = [json.loads((run / RUN_CONFIG_FILE).read_text()) for run in (first, second)]
    assert configs[0]["weight_decay"] == 0.01 and configs[0]["max_steps"] == 2
    assert {**configs[0], "output_dir": None} == {**configs[1], "output_dir": None}
    used = [json.loads((run / TRAINER_ARGUMENTS_FILE).read_text()) for run in (first, second)]
    assert (used[0]["weight_decay"], used[0]["max_grad_norm"], used[0]["optim"]) == (0.01, 1.0, "adamw_torch")
    assert used[0]["learning_rate"] == 3e-3 and used[0]["warmup_steps"] == 5  # train's own options
    folders = ("output_dir", "logging_dir")
    assert {**used[0], **dict.fromkeys(folders)} == {**used[1], **dict.fromkeys(folders)}
    for run in (first, second):
        assert json.loads((run / "model" / "results.json").read_text())["updates"] == 2
    assert Path(used[1]["output_dir"]).parent == second
