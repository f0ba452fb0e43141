"""`train --dataset`: local jsonl (the `translation` format), csv and parquet files and save_to_disk folders, end to
end through the command line, and every bad input of issue 23 item 1 refused with one line and exit status 2
before the output folder exists. Local files only: the Hub is set offline, the datasets cache is the test's."""

import gzip
import json
import re

import datasets
import pytest
from datasets import Dataset, DatasetDict

from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.training.data import MULTI30K_DIR
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.run_data import load_training_data

from ..conftest import run

PAIRS = 60  # enough for a BPE of 400 tokens and two updates; a few seconds a run


@pytest.fixture(autouse=True)
def offline_datasets(monkeypatch, tmp_path_factory):
    """No network in these tests, and `datasets`' cache (load_dataset writes one) outside the user's home."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "datasets-cache")


@pytest.fixture(scope="module")
def multi30k_pairs() -> dict[str, list[str]]:
    """The first PAIRS Multi30k training sentences in en and de."""
    lines = {}
    for lang in ("en", "de"):
        with gzip.open(MULTI30K_DIR / f"train.{lang}.gz", "rt", encoding="utf-8") as handle:
            lines[lang] = [next(handle).rstrip("\n") for _ in range(PAIRS)]
    return lines


def write_jsonl(path, lines: dict[str, list[str]]) -> None:
    rows = ({"translation": {"en": en, "de": de}} for en, de in zip(lines["en"], lines["de"], strict=True))
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def train_argv(output, *data: str) -> list[str]:
    """A two-update run without the test-set evaluation (the model folder and results.json are still written)."""
    tiny = ("--vocab-size", "400", "--max-tokens", "1024", "--max-steps", "2", "--average-last", "1")
    return ["train", *data, *tiny, "--no-eval", "--no-progress", "--output-dir", str(output)]


class _TrainingStartedError(Exception):
    pass


@pytest.fixture
def stop_at_training(monkeypatch):
    """Stop `train` where the Trainer starts: data read, tokenized, model built (the full run is the jsonl test's)."""
    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer

    def train(self, **kwargs) -> None:
        raise _TrainingStartedError(len(self.train_dataset))

    monkeypatch.setattr(VanillaSeq2SeqTrainer, "train", train)


def test_jsonl_in_translation_format_trains_de_en(multi30k_pairs, tmp_path, capsys) -> None:
    """Issue 23's acceptance case: --dataset on a local jsonl file of {"translation": {...}} rows, DE->EN."""
    write_jsonl(tmp_path / "pairs.jsonl", multi30k_pairs)
    argv = train_argv(tmp_path / "run", "--dataset", str(tmp_path / "pairs.jsonl"), "--src-lang", "de")
    code, out, err = run([*argv, "--tgt-lang", "en"], capsys)
    assert code == 0, err
    assert f"Training pairs: {PAIRS} (pairs.jsonl, de -> en)" in out
    model = tmp_path / "run" / "model"
    assert (model / "model.safetensors").is_file() and (model / "tokenizer.json").is_file()
    results = json.loads((model / "results.json").read_text())
    assert results["data"] == "pairs.jsonl" and results["languages"] == ["de", "en"] and results["updates"] == 2


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_two_text_columns_from_csv_and_parquet(kind, multi30k_pairs, tmp_path, capsys, stop_at_training) -> None:
    table = Dataset.from_dict({"english": multi30k_pairs["en"], "german": multi30k_pairs["de"], "n": [1] * PAIRS})
    path = tmp_path / f"pairs.{kind}"
    table.to_csv(str(path), index=False) if kind == "csv" else table.to_parquet(str(path))
    data = ("--dataset", str(path), "--src-column", "english", "--tgt-column", "german")
    with pytest.raises(_TrainingStartedError, match=f"^{PAIRS}$"):
        main(train_argv(tmp_path / "run", *data))
    assert f"Training pairs: {PAIRS} (pairs.{kind}, en -> de)" in capsys.readouterr().out


def test_save_to_disk_dataset_dict_gives_train_validation_and_test(
    multi30k_pairs, tmp_path, capsys, stop_at_training
) -> None:
    rows = [{"en": en, "de": de} for en, de in zip(multi30k_pairs["en"], multi30k_pairs["de"], strict=True)]
    splits = {"train": rows[:50], "validation": rows[50:55], "test": rows[55:]}
    folder = tmp_path / "saved"
    DatasetDict({name: Dataset.from_dict({"translation": part}) for name, part in splits.items()}).save_to_disk(folder)
    data = load_training_data(TrainOptions(dataset=folder))
    assert (len(data.train), len(data.valid), len(data.test), data.name) == (50, 5, 5, "saved")
    assert data.valid[0] == {"source": multi30k_pairs["en"][50], "target": multi30k_pairs["de"][50]}
    # Files replace a split; a split can be picked by name (here the validation split tests).
    (tmp_path / "v.en").write_text("A dog.\n")
    (tmp_path / "v.de").write_text("Ein Hund.\n")
    options = TrainOptions(
        dataset=folder, valid_src=tmp_path / "v.en", valid_tgt=tmp_path / "v.de", test_split="validation"
    )
    data = load_training_data(options)
    assert data.valid["target"] == ["Ein Hund."] and data.test["source"] == multi30k_pairs["en"][50:55]
    with pytest.raises(_TrainingStartedError, match=r"^50$"):
        main(train_argv(tmp_path / "run", "--dataset", str(folder)))
    assert "Training pairs: 50 (saved, en -> de)" in capsys.readouterr().out


def test_a_folder_of_data_files_gives_its_splits(multi30k_pairs, tmp_path) -> None:
    """A folder of train/validation files (not save_to_disk) is read by load_dataset, splits named by the files."""
    write_jsonl(tmp_path / "train.jsonl", multi30k_pairs)
    write_jsonl(tmp_path / "validation.jsonl", {lang: lines[:3] for lang, lines in multi30k_pairs.items()})
    data = load_training_data(TrainOptions(dataset=tmp_path, src_lang="de", tgt_lang="en"))
    assert (len(data.train), len(data.valid), data.test) == (PAIRS, 3, None)
    assert data.valid["source"] == multi30k_pairs["de"][:3]


# ---------------------------------------------------------------------------------------------------- bad input
# Each case: (files to write: name -> bytes, the data options, the parts the one-line error must hold). The file
# errors' wording is data.read_lines / load_parallel_files'; the parts are what issue 23 requires of it: the file,
# the numbers (line counts, line), and the fix.

TRANSLATION_JSONL = (
    b'{"translation": {"en": "A dog.", "de": "Ein Hund."}}\n{"translation": {"en": "Hi.", "de": "Hallo."}}\n'
)
TWO_LINES = b"A dog.\nA cat.\n"


def parallel(src: bytes, tgt: bytes, kind: str = "train") -> tuple[dict[str, bytes], list[str]]:
    files = {f"{kind}.src": src, f"{kind}.tgt": tgt}
    options = [f"--{kind}-src", "{dir}/" + f"{kind}.src", f"--{kind}-tgt", "{dir}/" + f"{kind}.tgt"]
    if kind != "train":  # the training data itself is fine
        files |= {"train.src": TWO_LINES, "train.tgt": b"Ein Hund.\nEine Katze.\n"}
        options += ["--train-src", "{dir}/train.src", "--train-tgt", "{dir}/train.tgt"]
    return files, options


def dataset(name: str, content: bytes, *options: str) -> tuple[dict[str, bytes], list[str]]:
    return {name: content}, ["--dataset", "{dir}/" + name, *options]


BAD_INPUTS = {
    # line counts that differ: both counts and the first line past the shorter file (line 3 of train.src)
    "line counts": (*parallel(b"a\nb\nc\n", b"x\ny\n"), ["train.src", "train.tgt", r"\b3\b", r"\b2\b", r"line 3\b"]),
    "valid line counts": (*parallel(b"a\n", b"x\ny\n", "valid"), ["valid.src", "valid.tgt", r"\b1\b", r"line 2\b"]),
    "not UTF-8": (*parallel(b"A dog.\nCaf\xe9.\n", TWO_LINES), ["train.src", "UTF-8", r"line 2\b"]),
    "empty file": (*parallel(b"", b""), ["train.src", "empty"]),
    "damaged gzip": (
        {"train.src.gz": b"\x1f\x8b\x08\x00", "train.tgt": TWO_LINES},
        ["--train-src", "{dir}/train.src.gz", "--train-tgt", "{dir}/train.tgt"],
        ["train.src.gz", "gzip"],
    ),
    "missing split": (
        *dataset("pairs.jsonl", TRANSLATION_JSONL, "--valid-split", "dev"),
        ["pairs.jsonl", "no split 'dev'", "its splits: train", "--valid-split"],
    ),
    "missing column": (
        *dataset("pairs.csv", b"english,german\nA dog.,Ein Hund.\n", "--src-column", "english"),
        ["pairs.csv", "no column 'de'", "its columns: english, german", "--tgt-column"],
    ),
    "missing language": (
        *dataset("pairs.jsonl", TRANSLATION_JSONL, "--src-lang", "fr"),
        ["pairs.jsonl", "no language 'fr'", "its languages: de, en", "--src-lang"],
    ),
    "not JSON lines": (
        *dataset("pairs.jsonl", TRANSLATION_JSONL + b'{"translation": {"en": "Hi."\n'),
        ["pairs.jsonl", "line 3, column", "not valid JSON", "Fix that line"],
    ),
    "row missing a language": (
        *dataset("pairs.jsonl", TRANSLATION_JSONL + b'{"translation": {"en": "Hi."}}\n'),
        ["pairs.jsonl", "line 3 has no 'de' key in its `translation` dict", "its keys: en", "Add the 'de' text"],
    ),
    "dataset not UTF-8": (
        *dataset("pairs.csv", b"en,de\nA dog.,Ein Hund.\nCaf\xe9.,Kaffee.\n"),
        ["pairs.csv", "UTF-8", r"line 3\b"],
    ),
    "not parquet": (*dataset("pairs.parquet", b"PAR1 not really"), ["pairs.parquet", "could not be read", "Check"]),
    "unknown file type": (*dataset("pairs.txt", TWO_LINES), ["pairs.txt", "'.txt'", "`--train-src`/`--train-tgt`"]),
    "Hub dataset unreachable": (
        {},
        ["--dataset", "no-such-org/no-such-set"],
        ["no-such-org/no-such-set", "could not be loaded from the Hub", "OfflineModeIsEnabled", "--dataset-config"],
    ),
    "config of a local file": (
        *dataset("pairs.jsonl", TRANSLATION_JSONL, "--dataset-config", "de-en"),
        ["pairs.jsonl", "is a local path", "Drop `--dataset-config`"],
    ),
    "missing dataset": ({}, ["--dataset", "{dir}/nowhere.jsonl"], ["nowhere.jsonl", "does not exist"]),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_before_anything_is_written(case, tmp_path, capsys) -> None:
    files, options, parts = BAD_INPUTS[case]
    data = tmp_path / "data"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    output = tmp_path / "out"
    code, _, err = run(train_argv(output, *(option.format(dir=data) for option in options)), capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for part in parts:
        assert re.search(part, err), (part, err)
    assert not output.exists()
