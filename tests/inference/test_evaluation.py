"""evaluate_translations: length-sorted batches give the per-sentence translations; scores are sacreBLEU's own."""

import json

import pytest
import sacrebleu

from hf_vanilla_transformer.inference.decoding import best_translations
from hf_vanilla_transformer.inference.evaluation import evaluate_translations, score_translations, write_results_json

from ..conftest import tiny_model, tiny_tokenizer

SOURCES = ["w5 w6 w7 w8", "w9", "w11 w12 w13 w14 w15 w16", "w20 w21", "w30 w31 w32"]


def one_by_one(model, tokenizer, **generate_kwargs: object) -> list[str]:
    """Reference translations: each sentence alone, in input order, no padding."""
    hypotheses = []
    for text in SOURCES:
        ids = model.generate(**tokenizer(text, return_tensors="pt"), **generate_kwargs)
        hypotheses.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    return hypotheses


@pytest.mark.parametrize("generation_kwargs", [{"max_new_tokens": 6}, {"max_new_tokens": 6, "num_beams": 3}])
def test_scores_match_sacrebleu_on_the_per_sentence_translations(generation_kwargs: dict) -> None:
    # A large init_std makes the random model's output depend on its input, so a mixed-up order would show.
    model, tokenizer = tiny_model(seed=3, init_std=1.0), tiny_tokenizer()
    expected = one_by_one(model, tokenizer, **generation_kwargs)
    assert len(set(expected)) >= 4
    # References share some words with the hypotheses, so the scores are neither 0 nor 100.
    references = [" ".join([*hypothesis.split()[:2], "w40"]) for hypothesis in expected]
    results = evaluate_translations(
        model, tokenizer, SOURCES, references, batch_size=2, generation_kwargs=generation_kwargs
    )
    assert results["hypotheses"] == expected
    assert results["n"] == len(SOURCES)
    assert results["bleu"] == sacrebleu.corpus_bleu(expected, [references]).score
    assert 0 < results["bleu"] < 100
    assert results["chrf"] == sacrebleu.corpus_chrf(expected, [references]).score
    assert results["generation"]["max_new_tokens"] == 6
    assert "tok:13a" in results["bleu_signature"] and "case:mixed" in results["bleu_signature"]
    assert "case:lc" in results["bleu_lowercase_signature"]


def test_lowercase_bleu_is_sacrebleu_lowercase_13a() -> None:
    hypotheses = ["The cat sat on the mat .", "A Dog barked loudly"]
    references = ["the cat sat on the mat.", "A dog barked loudly"]
    scores = score_translations(hypotheses, references)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score
    lowercase = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a", lowercase=True).score
    assert scores["bleu_lowercase"] == lowercase
    assert scores["bleu_lowercase"] > scores["bleu"]  # "The"/"the" and "Dog"/"dog" only match lowercased
    assert scores["chrf"] == sacrebleu.corpus_chrf(hypotheses, [references]).score


def test_results_json_round_trip(tmp_path) -> None:
    model, tokenizer = tiny_model(), tiny_tokenizer()
    results = evaluate_translations(
        model, tokenizer, SOURCES[:2], ["w5", "w9"], generation_kwargs={"max_new_tokens": 3}, progress=False
    )
    path = write_results_json(tmp_path / "eval" / "results.json", results)
    assert json.loads(path.read_text(encoding="utf-8")) == results


@pytest.mark.parametrize(
    ("sources", "references", "kwargs", "message"),
    [
        (["w5"], ["w5", "w6"], {}, "Got 1 sources but 2 references"),
        ([], [], {}, "`sources` is empty"),
        (["w5"], ["w5"], {"batch_size": 0}, "`batch_size` must be a positive integer, got 0"),
        (["w5"], ["w5"], {"generation_kwargs": {"num_return_sequences": 2}}, "num_return_sequences=2"),
    ],
)
def test_bad_inputs_name_the_problem(sources: list, references: list, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate_translations(tiny_model(), tiny_tokenizer(), sources, references, **kwargs)


def test_long_sources_are_cut_with_one_warning_that_counts_them(caplog) -> None:
    model, tokenizer = tiny_model(seed=3, init_std=1.0), tiny_tokenizer()
    long_source = " ".join(f"w{5 + index % 30}" for index in range(40))
    sources = [long_source, "w9", long_source]
    with caplog.at_level("WARNING", logger="hf_vanilla_transformer.inference.decoding"):
        cut = best_translations(model, tokenizer, sources, generation_kwargs={"max_new_tokens": 4}, max_input_tokens=8)
    warnings = [record.getMessage() for record in caplog.records if "cut to 8" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("2 of 3 sources are longer than 8 tokens")
    # The cut sources translate as their first 7 tokens + </s> do.
    first = tokenizer.decode(tokenizer(long_source)["input_ids"][:7])
    assert cut[0] == cut[2] == best_translations(model, tokenizer, [first], generation_kwargs={"max_new_tokens": 4})[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hf_vanilla_transformer.inference.decoding"):
        best_translations(model, tokenizer, ["w9"], generation_kwargs={"max_new_tokens": 4}, max_input_tokens=8)
    assert not caplog.records
    with pytest.raises(ValueError, match="`max_input_tokens` must be an integer of at least 2"):
        best_translations(model, tokenizer, sources, max_input_tokens=1)
