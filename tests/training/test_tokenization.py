"""The joint BPE tokenizer (§5.1): special ids, exact round trip on Multi30k, byte fallback, </s> on both sides."""

import unicodedata

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from hf_vanilla_transformer.training.data import load_multi30k
from hf_vanilla_transformer.training.tokenization import SPECIAL_TOKENS, special_token_ids, train_bpe_tokenizer


@pytest.fixture(scope="module")
def multi30k_train():
    return load_multi30k("en", "de", splits=("train",))["train"]


@pytest.fixture(scope="module")
def tokenizer(multi30k_train) -> PreTrainedTokenizerFast:
    return train_bpe_tokenizer(list(multi30k_train["source"]) + list(multi30k_train["target"]), vocab_size=10000)


def test_special_tokens_have_the_config_ids(tokenizer) -> None:
    assert [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert special_token_ids(tokenizer) == {
        "bos_token_id": 0,
        "pad_token_id": 1,
        "eos_token_id": 2,
        "decoder_start_token_id": 1,
    }
    assert len(tokenizer) == 10000


@pytest.mark.parametrize("side", ["source", "target"])
def test_multi30k_train_round_trips(tokenizer, multi30k_train, side) -> None:
    """≥ 99.9% of the training sentences (EN: source, DE: target) decode back to exactly the original text."""
    sentences = list(multi30k_train[side])
    decoded = tokenizer.batch_decode(tokenizer(sentences)["input_ids"], skip_special_tokens=True)
    unchanged = sum(original == text for original, text in zip(sentences, decoded, strict=True))
    assert unchanged / len(sentences) >= 0.999, [
        (original, text) for original, text in zip(sentences, decoded, strict=True) if original != text
    ][:5]


@pytest.mark.parametrize(
    "text", ["Ein Mädchen sagt: „Hallo!“", "emoji 😀 and 中文 are unseen", "two  spaces,\ttab", "trailing space "]
)
def test_unseen_characters_and_spacing_round_trip_without_unk(tokenizer, text) -> None:
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("text", ["a <pad> b", "x </s> y <s> z", "<unk>", "tags like <b> and </s></s>"])
def test_special_token_strings_in_text_are_text(tokenizer, tmp_path, text) -> None:
    """A user's "<pad>" is four characters, not the pad token: it is encoded as text and decodes back, also after
    save/load (the flag is saved with the tokenizer)."""
    tokenizer.save_pretrained(tmp_path)
    for tok in (tokenizer, AutoTokenizer.from_pretrained(tmp_path)):
        ids = tok(text)["input_ids"]
        assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
        assert not {tok.pad_token_id, tok.bos_token_id, tok.unk_token_id} & set(ids)
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_nfc_normalization_makes_decomposed_text_equal(tokenizer) -> None:
    composed = "Ein Mädchen läuft über die Straße."
    decomposed = unicodedata.normalize("NFD", composed)
    assert decomposed != composed
    assert tokenizer(decomposed)["input_ids"] == tokenizer(composed)["input_ids"]


def test_source_and_target_end_with_eos(tokenizer) -> None:
    encoded = tokenizer("A man is riding a bike.", text_target="Ein Mann fährt Fahrrad.")
    assert encoded["input_ids"][-1] == tokenizer.eos_token_id
    assert encoded["labels"][-1] == tokenizer.eos_token_id
    assert encoded["labels"].count(tokenizer.eos_token_id) == 1
    assert tokenizer.decode(encoded["labels"], skip_special_tokens=True) == "Ein Mann fährt Fahrrad."


def test_save_and_reload_gives_the_same_fast_tokenizer(tokenizer, tmp_path) -> None:
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.is_fast
    text = "Zwei Hunde spielen im Schnee 😀."
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"], skip_special_tokens=True) == text


@pytest.mark.parametrize("vocab_size", [100, 260, True, 5000.0])
def test_too_small_or_non_integer_vocab_size_is_refused(vocab_size) -> None:
    with pytest.raises(ValueError, match="`vocab_size` must be an integer of at least 261"):
        train_bpe_tokenizer(["a b c"], vocab_size=vocab_size)


def test_no_text_is_refused() -> None:
    with pytest.raises(ValueError, match="saw no text"):
        train_bpe_tokenizer([], vocab_size=1000)


def test_a_vocabulary_far_below_vocab_size_is_a_warning(caplog) -> None:
    """The BPE trainer stops when no pair is left to merge: 200 sentences cannot fill 30000 entries, which is said in
    a warning naming the field and the size learned; a vocabulary that is filled says nothing."""
    sentences = [f"sentence number {number} of a small corpus." for number in range(200)]
    with caplog.at_level("WARNING", logger="hf_vanilla_transformer.training.tokenization"):
        tokenizer = train_bpe_tokenizer(sentences, vocab_size=30000)
    assert len(tokenizer) < 27000
    messages = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert messages == [
        f"`vocab_size=30000` asked for, the BPE learned {len(tokenizer)} tokens: the training text has no more "
        f"merges to make; pass a smaller `vocab_size` (e.g. {len(tokenizer)}) or more data."
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_vanilla_transformer.training.tokenization"):
        train_bpe_tokenizer(sentences, vocab_size=300)
    assert not caplog.records
