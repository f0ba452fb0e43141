"""Parallel data: bundled Multi30k in every direction, text files, existing datasets, length filtering, errors."""

import gzip

import pytest
from datasets import Dataset

from hf_vanilla_transformer.training import data
from hf_vanilla_transformer.training.data import (
    DEFAULT_MAX_LENGTH,
    DEFAULT_TOKENIZER_SAMPLE,
    MULTI30K_DIR,
    decode_lines,
    from_dataset,
    load_multi30k,
    load_parallel_files,
    pair_lengths,
    prepare_pairs,
    read_lines,
    tokenize_pairs,
    tokenizer_sample,
)

from ..conftest import tiny_tokenizer


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
    with pytest.raises(ValueError, match=r"no language 'fr' \(its languages: de, en\)\. Pass `tgt_lang`"):
        from_dataset(translation, "en", "fr")
    columns = Dataset.from_dict({"en": ["A cat."], "fr": ["Un chat."], "n": [1]})
    with pytest.raises(ValueError, match=r"has no column 'de' \(its columns: en, fr, n\)\. Pass `src_column`"):
        from_dataset(columns, "de", "fr")
    with pytest.raises(ValueError, match=r"column 'n' holds Value\('int64'\), not text"):
        from_dataset(columns, "en", "fr", tgt_column="n")
    with pytest.raises(ValueError, match="the languages are needed"):
        from_dataset(columns)
    with pytest.raises(ValueError, match=r"must be a datasets.Dataset, got dict"):
        from_dataset({"train": columns}, "en", "fr")


def test_hub_translation_features_and_missing_values() -> None:
    """The Hub's `Translation` feature (wmt14's) picks languages like a plain dict column; a missing text (an empty
    csv cell, a language absent from one row's dict) becomes "", which tokenize_pairs drops and counts."""
    from datasets import Features, Translation

    features = Features({"translation": Translation(languages=["de", "en"])})
    hub = Dataset.from_dict({"translation": [{"de": "Ein Hund.", "en": "A dog."}]}, features=features)
    assert from_dataset(hub, "en", "de")[0] == {"source": "A dog.", "target": "Ein Hund."}
    holes = Dataset.from_dict({"translation": [{"en": "A dog.", "de": None}, {"en": None, "de": "Katze."}]})
    assert from_dataset(holes, "en", "de")[:] == {"source": ["A dog.", ""], "target": ["", "Katze."]}
    cells = Dataset.from_dict({"src": ["A cat.", None], "tgt": ["Un chat.", "Rien."]})
    assert from_dataset(cells, "en", "fr", "src", "tgt")["source"] == ["A cat.", ""]


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
    assert "kept 1 of 4 pairs; dropped 1 with an empty side, 2 over `max_length=5` tokens" in caplog.text
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


# ---------------------------------------------------------------------------------------------- corpus of any size


def test_streamed_files_give_what_reading_them_whole_gave(tmp_path) -> None:
    # The earlier loader decoded each file whole (decode_lines); the streamed Arrow dataset must hold the same pairs.
    source = "One.\r\n\n  Three\u2028kept \u00e9.\nFour\r\n".encode()
    target = b"Eins.\nZwei.\nDrei.\nVier"  # no final newline
    (tmp_path / "a.en").write_bytes(source)
    (tmp_path / "a.de.gz").write_bytes(gzip.compress(target))
    pairs = load_parallel_files(tmp_path / "a.en", tmp_path / "a.de.gz", cache_dir=tmp_path / "cache")
    assert pairs.to_dict() == {"source": decode_lines(source, "a.en"), "target": decode_lines(target, "a.de")}
    assert pairs.cache_files and str(pairs.cache_files[0]["filename"]).startswith(str(tmp_path / "cache"))


def test_a_changed_file_is_read_again_not_taken_from_the_cache(tmp_path) -> None:
    (tmp_path / "a.en").write_text("A dog.\n")
    (tmp_path / "a.de").write_text("Ein Hund.\n")
    assert load_parallel_files(tmp_path / "a.en", tmp_path / "a.de", cache_dir=tmp_path)["target"] == ["Ein Hund."]
    (tmp_path / "a.de").write_text("Ein Hund!\n")
    assert load_parallel_files(tmp_path / "a.en", tmp_path / "a.de", cache_dir=tmp_path)["target"] == ["Ein Hund!"]


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        # Both counts, and the first line past the shorter file, in whichever file is longer.
        ("a\nb\nc\nd\n", "a\nb\n", r"`\S*s\.txt` has 4 lines but `\S*t\.txt` has 2: line 3 of `\S*s\.txt` has no"),
        ("a\n", "a\nb\nc\n", r"`\S*t\.txt` has 3 lines but `\S*s\.txt` has 1: line 2 of `\S*t\.txt` has no"),
        ("a\nb\n", "", r"`\S*t\.txt` is empty. Pass files with at least one sentence pair"),
        ("", "", r"`\S*s\.txt` is empty"),
        ("a\nb\n", "a\nb\xe9\n", r"t\.txt is not UTF-8 text: line 2 has the byte 0xe9.* Convert it to UTF-8"),
    ],
)
def test_file_errors_name_the_file_the_counts_and_the_line(tmp_path, source, target, message) -> None:
    (tmp_path / "s.txt").write_bytes(source.encode("latin-1"))
    (tmp_path / "t.txt").write_bytes(target.encode("latin-1"))
    with pytest.raises(ValueError, match=message):
        load_parallel_files(tmp_path / "s.txt", tmp_path / "t.txt", cache_dir=tmp_path / "cache")


def test_tokenized_cache_is_reused_by_a_second_call(tmp_path, monkeypatch, caplog) -> None:
    (tmp_path / "a.en").write_text("w4 w5\nw6\n")
    (tmp_path / "a.de").write_text("w7\nw8 w9\n")
    pairs = load_parallel_files(tmp_path / "a.en", tmp_path / "a.de", cache_dir=tmp_path)
    first = prepare_pairs(pairs, tiny_tokenizer())
    assert not first.reused and first.cache_file.is_file()

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(data, "_encode", no_tokenizing)
    caplog.set_level("INFO", logger="hf_vanilla_transformer.training.data")
    again = prepare_pairs(
        load_parallel_files(tmp_path / "a.en", tmp_path / "a.de", cache_dir=tmp_path), tiny_tokenizer()
    )
    assert again.reused and again.cache_file == first.cache_file
    assert f"Reusing tokenized cache {first.cache_file}" in caplog.text
    assert again.dataset["input_ids"] == first.dataset["input_ids"] == [[4, 5, 2], [6, 2]]
    # Another tokenizer is another cache: tokenizing is attempted (and here refused).
    other = tiny_tokenizer()
    other.add_tokens(["w99"])
    with pytest.raises(Exception, match="tokenized again"):
        prepare_pairs(pairs, other)


def test_cleaning_counts_each_reason_once() -> None:
    pairs = Dataset.from_dict(
        {
            "source": ["w4 w5", " ", "w4 " * 9, "w4", "w4 w5 w6 w7", "w4 w5", "w6"],
            "target": ["w7", "w8", "w8", "w4 w5 w6 w7", "w4 " * 9, "w4 w5 w6", ""],
        }
    )
    prepared = prepare_pairs(pairs, tiny_tokenizer(), max_length=6, max_length_ratio=2)
    cleaning = prepared.cleaning
    # " " / "" sides: empty (2); 9 tokens + </s> > 6 on a side: too long (2); 4 text tokens vs 1: ratio 4 > 2 (1).
    assert (cleaning.pairs, cleaning.empty, cleaning.too_long, cleaning.ratio, cleaning.kept) == (7, 2, 2, 1, 2)
    assert prepared.dataset["source"] == ["w4 w5", "w4 w5"]  # ratios 2 (kept: not above 2) and 1.5
    assert cleaning.summary() == (
        "Cleaning: kept 2 of 7 pairs; dropped 2 with an empty side, 2 over `max_length=6` tokens, 1 over "
        "`max_length_ratio=2`"
    )
    assert prepared.source_lengths.tolist() == [3, 3] and prepared.target_lengths.tolist() == [2, 4]
    without_ratio = prepare_pairs(pairs, tiny_tokenizer(), max_length=6).cleaning
    assert (without_ratio.ratio, without_ratio.kept) == (0, 3)
    with pytest.raises(ValueError, match="`max_length_ratio` must be a number >= 1"):
        prepare_pairs(pairs, tiny_tokenizer(), max_length_ratio=0.5)


def test_pair_lengths_come_from_the_length_columns_or_the_arrow_offsets() -> None:
    pairs = Dataset.from_dict({"source": ["w4 w5", "", "w4 w5 w6"], "target": ["w7", "w8", "w9 w9 w9 w9"]})
    prepared = prepare_pairs(pairs, tiny_tokenizer())
    expected = ([3, 4], [2, 5])
    assert [lengths.tolist() for lengths in pair_lengths(prepared.dataset)] == list(expected)
    # A dataset tokenized elsewhere, rows selected: the list lengths, read from Arrow.
    tokens_only = prepared.dataset.remove_columns(["source_length", "target_length"]).select([1, 0])
    assert [lengths.tolist() for lengths in pair_lengths(tokens_only)] == [expected[0][::-1], expected[1][::-1]]


def test_tokenizer_sample_is_seeded_and_bounded() -> None:
    pairs = Dataset.from_dict({"source": [f"s{i}" for i in range(50)], "target": [f"t{i}" for i in range(50)]})
    every = list(tokenizer_sample(pairs, 100))
    assert every == [f"s{i}" for i in range(50)] + [f"t{i}" for i in range(50)]  # all of it, in the old order
    sample = list(tokenizer_sample(pairs, 21, seed=3))
    assert len(sample) == 20 and sample == list(tokenizer_sample(pairs, 21, seed=3))
    assert [text[1:] for text in sample[:10]] == [text[1:] for text in sample[10:]]  # both sides of 10 pairs
    assert len(set(sample)) == 20 and sample != list(tokenizer_sample(pairs, 21, seed=4))
    assert DEFAULT_TOKENIZER_SAMPLE >= 2 * 29_000  # Multi30k's BPE is trained on all of it
    with pytest.raises(ValueError, match="`tokenizer_sample`"):
        next(tokenizer_sample(pairs, 1))
