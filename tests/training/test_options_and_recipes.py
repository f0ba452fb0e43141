"""The library's commands from Python (typed options in, typed results out, `OptionError` naming the field for bad
options) and the recipes: the command line's `train` options are a recipe plus the options given, and `make train-1h`
/ `make train-2h` run the same settings as the flags they replaced."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from hf_vanilla_transformer import cli
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.inference.evaluation import EvaluateOptions, evaluate
from hf_vanilla_transformer.inference.translation import TranslateOptions, translate
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.training.averaging import AverageOptions, average
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.recipes import (
    DEFAULT_RECIPE,
    MULTI30K,
    MULTI30K_1H,
    MULTI30K_2H,
    PAPER_BASE,
    RECIPES,
)
from hf_vanilla_transformer.training.train import train

from ..train_script import MAX_TOKENS, TEST_PRESET, write_corpus
from .conftest import cli_train_options

REPO = Path(__file__).resolve().parents[2]


def test_the_command_line_defaults_are_the_library_defaults(monkeypatch) -> None:
    options = cli_train_options([], monkeypatch)
    assert options == TrainOptions.from_recipe(DEFAULT_RECIPE, command="hf-vanilla-transformer train")
    assert options.learning_rate() == TrainOptions().learning_rate()  # TrainOptions() leaves lr to its schedule
    assert replace(options, lr=None, command=None) == TrainOptions()
    assert (options.preset, options.max_time, options.learning_rate()) == ("transformer-multi30k", 840.0, 2e-3)


def test_a_recipe_is_the_defaults_and_explicit_options_override_it(monkeypatch) -> None:
    options = cli_train_options(["--recipe", "multi30k-2h", "--warmup-steps", "500"], monkeypatch)
    assert (options.warmup_steps, options.max_time, options.bf16, options.curve_every) == (500, 7200.0, "auto", 600.0)
    # A budget option replaces the recipe's whole budget: --max-steps alone means no time limit.
    options = cli_train_options(["--recipe", "multi30k-2h", "--max-steps", "7"], monkeypatch)
    assert (options.max_steps, options.max_time) == (7, None)
    # The recipe's learning rate goes with its schedule.
    assert cli_train_options(["--schedule", "paper"], monkeypatch).learning_rate() == 1.0
    assert TrainOptions.from_recipe(PAPER_BASE, schedule="inverse_sqrt").learning_rate() == MULTI30K.lr
    assert TrainOptions.from_recipe(PAPER_BASE).learning_rate() == 1.0


def test_make_train_1h_and_2h_run_the_flags_they_replaced() -> None:
    """The Makefile's targets used to spell their settings as flags on top of the main job's defaults (and now
    average 5 checkpoints spread over the run's last 40%; the hour decodes with beam 8, α 1.4, the two hours with
    §6.1's decoding)."""
    flags = dict(
        max_time=3600.0, bf16="auto", save_every=600.0, curve_every=600.0, average="spread", average_span="40%"
    )
    one_hour = TrainOptions.from_recipe(MULTI30K, **flags, num_beams=8, length_penalty=1.4)
    assert TrainOptions.from_recipe(MULTI30K_1H) == one_hour
    flags.update(max_time=7200.0, warmup_steps=800)
    assert TrainOptions.from_recipe(MULTI30K_2H) == TrainOptions.from_recipe(MULTI30K, **flags)
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for target, recipe in (("train-1h", MULTI30K_1H), ("train-2h", MULTI30K_2H)):
        command = re.search(rf"^{target}:.*\n\t(.*)$", makefile, re.MULTILINE).group(1)
        assert f"--recipe {recipe.name} " in command and f"--output-dir runs/multi30k-en-de-{target[6:]}" in command


def test_every_recipe_names_a_preset_and_the_paper_recipes_are_the_papers() -> None:
    assert DEFAULT_RECIPE is RECIPES["multi30k"]
    assert all(recipe.preset in PRESETS for recipe in RECIPES.values())
    base, big = RECIPES["paper-base"], RECIPES["paper-big"]
    # §5.3 eq. (3) with warmup 4000, §5.4 ε_ls 0.1, §5.1 ~25k tokens, §6.1 100k / 300k steps, 5 / 20 averaged.
    assert (base.schedule, base.lr, base.warmup_steps, base.label_smoothing) == ("paper", 1.0, 4000, 0.1)
    assert (base.max_tokens, base.max_steps, base.average_last) == (25000, 100_000, 5)
    assert (big.preset, big.max_steps, big.average_last) == ("transformer-big", 300_000, 20)


def test_unknown_options_and_recipes_are_refused(capsys) -> None:
    with pytest.raises(OptionError, match=r"Unknown training options \['warmup'\]"):
        TrainOptions.from_recipe(MULTI30K, warmup=800)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--recipe", "multi30k-3h"])
    assert exit_.value.code == 2 and "invalid choice: 'multi30k-3h'" in capsys.readouterr().err


def test_train_translate_evaluate_and_average_from_python(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)
    corpus = write_corpus(tmp_path / "corpus")
    options = TrainOptions(
        output_dir=tmp_path / "model",
        train_src=corpus / "train.src",
        train_tgt=corpus / "train.tgt",
        tokenizer=corpus / "tokenizer",
        preset="transformer-test",
        max_tokens=MAX_TOKENS,
        max_time=None,
        max_steps=3,
        save_every=1e-3,  # a checkpoint after every update
        average_last=2,
        evaluate=False,
        progress=False,
    )
    result = train(options)
    assert result.output_dir == tmp_path / "model" and result.summary["updates"] == 3
    assert result.summary["averaged_checkpoints"] == ["checkpoint-2", "checkpoint-3"]
    assert json.loads(result.results_file.read_text())["command"] is None  # not started from the command line

    translations = translate(TranslateOptions(result.model_dir, ["w5 w6", "w7"], num_beams=1))
    assert len(translations) == 2 and all(isinstance(text, str) for text in translations)
    scores = evaluate(EvaluateOptions(result.model_dir, src=corpus / "test.src", ref=corpus / "test.tgt", num_beams=1))
    assert scores["n"] == 3 and 0.0 <= scores["bleu"] <= 100.0
    averaged = average(AverageOptions([result.output_dir / "checkpoints"], tmp_path / "avg", last=2))
    assert [path.name for path in averaged.checkpoints] == ["checkpoint-2", "checkpoint-3"]
    assert (averaged.output / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda tmp: translate(TranslateOptions(tmp, ["Hello"])), "is not a saved model folder"),
        (lambda tmp: evaluate(EvaluateOptions(tmp / "x", src="a")), "is not a saved model folder"),
        (lambda tmp: average(AverageOptions([tmp / "a", tmp / "b"], tmp / "o", last=2)), "`last` takes one folder"),
        (lambda tmp: train(TrainOptions(train_src=tmp / "a.en")), "`train_src` and `train_tgt` go together"),
        (lambda tmp: train(TrainOptions(compare_curve=tmp / "c.json")), "needs `curve_every`"),
        (lambda tmp: train(TrainOptions(max_length_ratio=0.5)), r"`max_length_ratio=0.5` must be at least 1"),
        (lambda tmp: train(TrainOptions(tokenizer_sample=1)), r"`tokenizer_sample=1` must be at least 2"),
    ],
)
def test_bad_options_raise_option_errors_naming_fields(call, message, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default output folder is relative
    with pytest.raises(OptionError, match=message):
        call(tmp_path)
