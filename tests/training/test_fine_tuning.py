"""Fine-tuning (issue 23 item 3): `train --init-from MODEL_DIR` starts from a folder of ours or a converted one with
its config, weights and tokenizer, and learns the new data; the options it replaces are refused, a resume checks the
folder; the `finetune` recipe needs --init-from."""

import json
import random
import re
import shutil
from pathlib import Path

import pytest

from conversion import marian
from hf_vanilla_transformer import cli
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.recipes import FINETUNE
from hf_vanilla_transformer.training.train import train

from ..conftest import TEXT, import_args, tiny_tokenizer
from ..train_script import TEST_PRESET


def copy_slice(folder: Path, words: range, pairs: int, seed: int) -> Path:
    """A copy task over `words` (w4 ... w60, the tiny tokenizer's): train and dev files in `folder`."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for split, count in (("train", pairs), ("dev", 40)):
        lines = [" ".join(f"w{rng.choice(words)}" for _ in range(rng.randint(2, 6))) for _ in range(count)]
        for side in ("src", "tgt"):
            (folder / f"{split}.{side}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def options(data: Path, output: Path, steps: int, **extra) -> TrainOptions:
    return TrainOptions(
        output_dir=output,
        train_src=data / "train.src",
        train_tgt=data / "train.tgt",
        preset="transformer-test",
        max_tokens=256,
        schedule="inverse_sqrt",
        warmup_steps=20,
        max_time=None,
        max_steps=steps,
        save_every=3600,
        average_last=1,
        evaluate=False,
        progress=False,
        logging_steps=50,
        **extra,
    )


def dev_loss(model_dir: Path, data: Path) -> float:
    """The model's mean token cross-entropy on the dev pairs of `data` (teacher-forced, no label smoothing)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    sources = (data / "dev.src").read_text().splitlines()
    targets = (data / "dev.tgt").read_text().splitlines()
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    with torch.no_grad():
        return model(**batch).loss.item()


def test_fine_tuning_on_another_slice_lowers_its_dev_loss(tmp_path, monkeypatch) -> None:
    """A tiny model trained to copy sentences of words w4-w32 is fine-tuned on sentences of w33-w60, which it has
    never seen: its dev loss on the second slice falls well below the start model's. (Dev loss, not BLEU: a model
    this small, trained for seconds, decodes the copy task at BLEU ~0 either way.)"""
    monkeypatch.setitem(PRESETS, "transformer-test", dict(TEST_PRESET, P_drop=0.0))
    tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    first = copy_slice(tmp_path / "first", range(4, 33), 160, seed=1)
    second = copy_slice(tmp_path / "second", range(33, 61), 160, seed=2)
    start = train(options(first, tmp_path / "start", 30, tokenizer=tmp_path / "tokenizer", lr=3e-3))
    before = dev_loss(start.model_dir, second)
    tuned = train(options(second, tmp_path / "tuned", 30, init_from=start.model_dir, lr=3e-3))
    after = dev_loss(tuned.model_dir, second)
    print(f"dev loss on the second slice: start model {before:.2f}, fine-tuned {after:.2f}")
    assert after < before - 1.0
    # The folder's tokenizer was kept (the options' preset and vocabulary did not apply).
    assert json.loads((tuned.model_dir / "tokenizer.json").read_text()) == json.loads(
        (start.model_dir / "tokenizer.json").read_text()
    )
    # results.json, uploaded with the model, names the start folder, not where it lies on this machine.
    assert tuned.summary["init_from"] == start.model_dir.name and tuned.summary["preset"] is None
    # A resume must start from the same folder (run_settings.json records it).
    shutil.copytree(start.model_dir, tmp_path / "copy")
    with pytest.raises(OptionError, match=r"other settings .*`init_from` .*copy .* now, .*start/model"):
        train(options(second, tmp_path / "tuned", 31, init_from=tmp_path / "copy", resume=True))


def test_init_from_a_converted_marian_folder_trains_and_writes_a_loadable_model(opus_folder, tmp_path) -> None:
    converted = tmp_path / "converted"
    marian.convert(import_args(opus_folder, converted))
    data = tmp_path / "data"
    data.mkdir()
    for side in ("src", "tgt"):
        (data / f"train.{side}").write_text("\n".join(TEXT * 4) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    argv = ["train", "--init-from", str(converted), "--train-src", str(data / "train.src")]
    argv += ["--train-tgt", str(data / "train.tgt"), "--max-steps", "2", "--max-tokens", "256", "--no-eval"]
    argv += ["--dropout", "0.2", "--attention-dropout", "0.15"]  # the dropouts override the folder's
    assert cli.main([*argv, "--no-progress", "--output-dir", str(run)]) == 0
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model")
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    assert type(tokenizer).__name__ == "MarianTokenizer"  # the converted folder's SentencePiece tokenizer
    folder_config = json.loads((converted / "config.json").read_text())
    assert model.config.vocab_size == folder_config["vocab_size"]
    assert (model.config.dropout, model.config.attention_dropout) == (0.2, 0.15)
    assert model.config.activation_dropout == folder_config["activation_dropout"]
    output = model.generate(**tokenizer(TEXT[:2], return_tensors="pt", padding=True), max_new_tokens=5)
    assert output.shape[0] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--preset", "transformer-base"], r"brings its own config and tokenizer, so `--preset` cannot apply"),
        (["--vocab-size", "300"], r"so `--vocab-size` cannot apply"),
        (["--tokenizer", "tok"], r"so `--tokenizer` cannot apply"),
    ],
)
def test_init_from_refuses_the_options_its_folder_replaces(extra, message, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--init-from", str(tmp_path), *extra, "--output-dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and len(error.strip().splitlines()) == 1 and re.search(message, error), error


def test_the_finetune_recipe_needs_init_from(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--recipe", "finetune", "--output-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "pass `--init-from MODEL_DIR`" in capsys.readouterr().err
    options = TrainOptions.from_recipe(FINETUNE, init_from=tmp_path)
    assert (options.learning_rate(), options.warmup_steps) == (5e-4, 100)
