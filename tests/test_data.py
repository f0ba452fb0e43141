"""Parallel data: bundled Multi30k in every direction, text files, existing datasets, length filtering, errors."""

import gzip

import pytest
from datasets import Dataset

from hf_vanilla_transformer.data import (
    DEFAULT_MAX_LENGTH,
    MULTI30K_DIR,
    from_dataset,
    load_multi30k,
    load_parallel_files,
    read_lines,
    tokenize_pairs,
)

from .conftest import tiny_tokenizer


def first_line(split: str, lang: str) -> str:
    with gzip.open(MULTI30K_DIR / f"{split}.{lang}.gz", "rt", encoding="utf-8") as handle:
        return handle.readline().rstrip("\n")


def test_bundled_files_and_readme_are_there() -> None:
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de", "fr"):
            assert (MULTI30K_DIR / f"{split}.{lang}.gz").is_file()
    readme = (MULTI30K_DIR / "README.md").read_text(encoding="utf-8")
    assert "Elliott" in readme and "W16-3210" in readme


def test_multi30k_en_de_splits() -> None:
    data = load_multi30k("en", "de")
    assert {split: len(data[split]) for split in data} == {"train": 29000, "validation": 1014, "test": 1000}
    assert data["train"].column_names == ["source", "target"]
    assert data["train"][0] == {"source": first_line("train", "en"), "target": first_line("train", "de")}
    assert data["test"][0] == {
        "source": first_line("test_2016_flickr", "en"),
        "target": first_line("test_2016_flickr", "de"),
    }


@pytest.mark.parametrize(("src", "tgt"), [("de", "en"), ("fr", "de"), ("en", "fr")])
def test_multi30k_any_pair_either_direction(src, tgt) -> None:
    validation = load_multi30k(src, tgt, splits=("validation",))["validation"]
    assert validation[0] == {"source": first_line("val", src), "target": first_line("val", tgt)}


@pytest.mark.parametrize(
    ("src", "tgt", "message"),
    [
        ("xx", "de", "`src_lang` must be one of en, de, fr for Multi30k, got 'xx'. For other languages pass"),
        ("en", "cs", "`tgt_lang` must be one of en, de, fr for Multi30k, got 'cs'"),
        ("de", "de", "`src_lang` and `tgt_lang` must differ, got 'de'"),
    ],
)
def test_unknown_or_equal_languages_are_refused(src, tgt, message) -> None:
    with pytest.raises(ValueError, match=message):
        load_multi30k(src, tgt)


def test_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match=r"`splits` must be drawn from train, validation, test, got \['dev'\]"):
        load_multi30k("en", "de", splits=("dev",))


def test_parallel_files_plain_and_gzipped(tmp_path) -> None:
    (tmp_path / "a.en").write_text("Hello world.\r\nSecond\u2028line kept.\n", encoding="utf-8", newline="")
    with gzip.open(tmp_path / "a.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("Hallo Welt.\nZweite Zeile.")  # no final newline
    pairs = load_parallel_files(tmp_path / "a.en", tmp_path / "a.de.gz")
    assert pairs["source"] == ["Hello world.", "Second\u2028line kept."]
    assert pairs["target"] == ["Hallo Welt.", "Zweite Zeile."]


def test_parallel_files_with_different_line_counts_are_refused(tmp_path) -> None:
    (tmp_path / "a.en").write_text("one\ntwo\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"has 2 lines but .*a.de` has 1"):
        load_parallel_files(tmp_path / "a.en", tmp_path / "a.de")


def test_missing_or_empty_files_are_named(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing.en does not exist"):
        read_lines(tmp_path / "missing.en")
    (tmp_path / "e.en").write_text("", encoding="utf-8")
    (tmp_path / "e.de").write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"e.en` is empty"):
        load_parallel_files(tmp_path / "e.en", tmp_path / "e.de")


def test_existing_datasets_in_three_layouts() -> None:
    translation = Dataset.from_dict({"translation": [{"en": "A dog.", "de": "Ein Hund."}], "id": [7]})
    assert from_dataset(translation, "de", "en")[0] == {"source": "Ein Hund.", "target": "A dog."}
    columns = Dataset.from_dict({"en": ["A cat."], "fr": ["Un chat."]})
    assert from_dataset(columns, "en", "fr")[0] == {"source": "A cat.", "target": "Un chat."}
    ready = Dataset.from_dict({"source": ["x"], "target": ["y"], "extra": [1]})
    assert from_dataset(ready).column_names == ["source", "target"]


def test_existing_dataset_errors_name_the_value() -> None:
    translation = Dataset.from_dict({"translation": [{"en": "A dog.", "de": "Ein Hund."}]})
    with pytest.raises(ValueError, match=r"`tgt_lang` must be one of the languages \['de', 'en'\].*got 'fr'"):
        from_dataset(translation, "en", "fr")
    columns = Dataset.from_dict({"en": ["A cat."], "fr": ["Un chat."]})
    with pytest.raises(ValueError, match=r"`src_lang` must name a column .*got 'de'; the columns are \['en', 'fr'\]"):
        from_dataset(columns, "de", "fr")
    with pytest.raises(ValueError, match="`src_lang` and `tgt_lang` are needed"):
        from_dataset(columns)
    with pytest.raises(ValueError, match=r"must be a datasets.Dataset, got dict"):
        from_dataset({"train": columns}, "en", "fr")


def test_tokenize_pairs_filters_long_and_empty_pairs_explicitly(caplog) -> None:
    tokenizer = tiny_tokenizer()
    pairs = Dataset.from_dict(
        {
            "source": ["w4 w5", "w4 " * 9, "", "w6"],
            "target": ["w7", "w8", "w9", "w4 " * 9],
        }
    )
    kept = tokenize_pairs(pairs, tokenizer, max_length=5)
    assert kept["source"] == ["w4 w5"]
    assert kept[0]["input_ids"] == [4, 5, 2] and kept[0]["labels"] == [7, 2]
    assert "kept 1 of 4 pairs; dropped 1 with an empty side, 2 over --max-length 5 tokens" in caplog.text
    assert len(tokenize_pairs(pairs, tokenizer, max_length=None)) == 3  # only the empty pair goes
    assert DEFAULT_MAX_LENGTH >= 128


def test_tokenize_pairs_errors() -> None:
    tokenizer = tiny_tokenizer()
    pairs = Dataset.from_dict({"source": ["w4 w4 w4"], "target": ["w5"]})
    with pytest.raises(ValueError, match=r"No sentence pair is left .* longer than 3 tokens"):
        tokenize_pairs(pairs, tokenizer, max_length=3)
    with pytest.raises(ValueError, match="`max_length` must be an integer >= 2"):
        tokenize_pairs(pairs, tokenizer, max_length=1)
    with pytest.raises(ValueError, match="needs a `target` column"):
        tokenize_pairs(Dataset.from_dict({"source": ["w4"]}), tokenizer)
