"""Each training option is declared once, as a TrainOptions field (option_fields.option): its flag and help, its
`--config` key, its place in run_settings.json, run_config.json and the model card, and the recipes, all come from
that field. Run folders of earlier versions, whose run_settings.json names the options by their flags, still
resume."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from datasets import Dataset

import hf_vanilla_transformer.training.train as train_module
from hf_vanilla_transformer import cli
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.option_fields import flag_of, options_of
from hf_vanilla_transformer.training.options import TrainOptions, run_config
from hf_vanilla_transformer.training.recipes import MULTI30K, RECIPES, Recipe
from hf_vanilla_transformer.training.run_folder import SETTINGS_FILE, check_same_run, read_settings, run_settings

REPO = Path(__file__).resolve().parents[2]
PAIRS = Dataset.from_dict({"source": ["w4 w5"], "target": ["w6"]})


def given_options(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> TrainOptions:
    """The TrainOptions that `hf-vanilla-transformer train ARGV` hands to `train` (nothing is trained)."""
    seen: list[TrainOptions] = []
    monkeypatch.setattr(train_module, "train", lambda options: seen.append(options))
    assert cli.main(["train", *argv]) == 0
    return seen[0]


def test_every_option_is_a_flag_with_its_help_and_a_config_key(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    names = [item.name for item in options_of(TrainOptions)]
    assert len(names) == len(set(names)) and "command" not in names and "trainer_args" not in names
    for item in options_of(TrainOptions):
        assert f"{flag_of(item)} " in help_text, item.name
        assert " ".join(item.metadata["help"].split()[:6]) in help_text, item.name
    # run_config.json: every option but those that concern the folder, keyed by the options' names.
    assert set(run_config(TrainOptions())) == set(names) - {"resume", "overwrite"}


def test_a_config_file_and_the_command_line_read_values_alike(tmp_path, monkeypatch) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("max_time: 90s\nlr_cooldown: 30%\nno_such_thing: 1\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        cli.main(["train", "--config", str(config)])
    config.write_text("max_time: 90s\nlr_cooldown: 30%\npreset: transformer-tiny\n", encoding="utf-8")
    from_file = given_options(["--config", str(config)], monkeypatch)
    from_flags = given_options(
        ["--max-time", "90s", "--lr-cooldown", "30%", "--preset", "transformer-tiny"], monkeypatch
    )
    assert replace(from_file, command=None) == replace(from_flags, command=None)
    assert (from_file.max_time, from_file.lr_cooldown, from_file.preset) == (90.0, 0.3, "transformer-tiny")


def test_a_bad_config_value_is_worded_as_its_flag_would_be(tmp_path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("preset: transformer-huge\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--config", str(config)])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and len(error.strip().splitlines()) == 1
    assert "`preset`: invalid choice: 'transformer-huge'" in error


def test_run_settings_are_keyed_by_option_names_and_unset_ones_are_not_recorded() -> None:
    settings = run_settings(TrainOptions(), PAIRS, "tok", 0.3, False)
    assert settings["src_lang"] == "en" and settings["lr"] == 2e-3 and settings["bf16"] == "fp32"
    assert settings["tokenizer"] == "tok" and settings["dropout"] == 0.3
    assert not any(key.startswith("--") for key in settings)
    assert None not in settings.values()


def test_run_settings_of_earlier_versions_keyed_by_flags_still_resume(tmp_path) -> None:
    """A run folder written before the options were declared once names its settings by flag ("--src-lang"), as
    the committed runs under docs/runs do: read by the options' names, it matches the same run and refuses
    another."""
    now = run_settings(TrainOptions(), PAIRS, "a joint BPE of --vocab-size 8000", 0.3, False)
    earlier = {  # the main job's settings as a version before the options' names wrote them
        **{"--src-lang": "en", "--tgt-lang": "de", "training data": now["training data"], "--max-length": 256},
        **{"--max-length-ratio": None, "--tokenizer": "a joint BPE of --vocab-size 8000"},
        **{"--preset": "transformer-multi30k", "--dropout": 0.3, "--schedule": "inverse_sqrt", "--lr": 0.002},
        **{"--warmup-steps": 400, "--label-smoothing": 0.1, "--max-tokens": 4096, "--grad-accum": 1, "--seed": 1},
        **{"--bf16": "fp32", "processes": 1},
    }
    (tmp_path / SETTINGS_FILE).write_text(json.dumps(earlier), encoding="utf-8")
    assert check_same_run(tmp_path, now) is True
    with pytest.raises(OptionError, match=r"`lr` 0.001 now, 0.002 in the run"):
        check_same_run(tmp_path, {**now, "lr": 1e-3})
    with pytest.raises(OptionError, match=r"`warmup_steps` 800 now, 400 in the run"):
        check_same_run(tmp_path, {**now, "warmup_steps": 800})
    setting_names = {item.name for item in options_of(TrainOptions) if item.metadata.get("setting")}
    committed = sorted(REPO.glob("docs/runs/*/run_settings.json"))
    assert committed
    for path in committed:
        keys = set(read_settings(path.parent))
        assert keys <= setting_names | {"training data", "processes"}, (path, keys - setting_names)


def test_recipes_are_sets_of_option_values() -> None:
    names = {item.name for item in options_of(TrainOptions)}
    for recipe in RECIPES.values():
        assert set(recipe.values) <= names | {"trainer_args"}, recipe.name
        TrainOptions.from_recipe(recipe, init_from="x") if recipe.fine_tuning else TrainOptions.from_recipe(recipe)
    with pytest.raises(OptionError, match="has no budget"):
        TrainOptions.from_recipe(Recipe("none", "no budget", {"lr": 1e-3}))
    assert MULTI30K.lr == 2e-3 and MULTI30K.label_smoothing == 0.1  # its own value, else the option's default


def test_warmup_init_lr_is_one_field_with_its_flag_config_key_setting_card_row_and_recipe(
    tmp_path, monkeypatch, capsys
) -> None:
    """fairseq's --warmup-init-lr, added as one TrainOptions field: the command line, a --config file and a recipe
    set it; run_settings.json records it where given (a resume with another is refused), the card shows it, and the
    Trainer's schedule receives it."""
    from hf_vanilla_transformer.training.train import _card_settings, _trainer_arguments

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert "--warmup-init-lr WARMUP_INIT_LR" in capsys.readouterr().out
    assert given_options(["--warmup-init-lr", "1e-7"], monkeypatch).warmup_init_lr == 1e-7
    config = tmp_path / "run.yaml"
    config.write_text("warmup_init_lr: 1e-6\n", encoding="utf-8")  # YAML reads 1e-6 as a string: read as the flag
    assert given_options(["--config", str(config)], monkeypatch).warmup_init_lr == 1e-6
    monkeypatch.setitem(RECIPES, "warm-start", MULTI30K.but("warm-start", "a warmup from 1e-5", warmup_init_lr=1e-5))
    assert given_options(["--recipe", "warm-start"], monkeypatch).warmup_init_lr == 1e-5
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--warmup-init-lr", "-1"])
    assert exit_.value.code == 2 and "must be a number >= 0, got '-1'" in capsys.readouterr().err

    options = TrainOptions(warmup_init_lr=1e-5)
    assert run_settings(options, PAIRS, "tok", 0.3, False)["warmup_init_lr"] == 1e-5
    assert "warmup_init_lr" not in run_settings(TrainOptions(), PAIRS, "tok", 0.3, False)  # earlier runs resume
    assert run_config(options)["warmup_init_lr"] == 1e-5
    assert _card_settings(options)["Warmup's initial learning rate (deviation)"] == 1e-5
    assert _trainer_arguments(options, bf16=False, report_to=[])["warmup_init_lr"] == 1e-5
    with pytest.raises(OptionError, match=r"Trainer argument 'warmup_init_lr' is what `warmup_init_lr` sets"):
        _trainer_arguments(TrainOptions(trainer_args={"warmup_init_lr": 0.0}), bf16=False, report_to=[])
