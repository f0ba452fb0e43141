"""Translate a test set and score it (§6.1 reports BLEU on newstest2014): `evaluate(EvaluateOptions(...))`, the
`evaluate` command, for a saved model folder; `evaluate_translations` for a loaded model.

Scores, all from sacreBLEU on the detokenized hypotheses and references:
- `bleu`: sacreBLEU's standard BLEU: cased, its own 13a (mteval-v13a) tokenization, exponential smoothing. This is
  the number to compare across papers (signature in `bleu_signature`).
- `bleu_lowercase`: the same BLEU on lowercased text (sacreBLEU `lowercase=True`, `tokenize="13a"`).
  It is not the paper's "tokenized BLEU" (multi-bleu.perl on Moses-tokenized, compound-split text, fairseq#1352),
  so neither score is directly comparable with the paper's 27.3 / 28.4.
- `chrf`: chrF (character 6-grams, β = 2).

`evaluate_translations` returns a JSON-ready dict: those scores and their signatures, `n`, `hypotheses` (in input
order), `generation` (the decoding settings used: the model's generation config plus the call's kwargs) and
`seconds`. `write_results_json` saves it; the model card reads that file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..errors import OptionError, check_decoding
from ..files import RESULTS_FILE, existing_file, writable_file
from ..option_fields import finite_float, option, positive_int
from .decoding import best_translations
from .loading import (
    bf16_weights_option,
    int8_option,
    load_model,
    load_tokenizer,
    max_input_tokens_option,
    model_folder,
    num_beams_option,
    trained_languages,
    trust_remote_code_option,
)


def _json_ready(value: Any) -> Any:
    """Values as JSON can hold them; anything else (tensors, processors) by its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    return repr(value)


def score_translations(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU BLEU (cased, 13a), lowercased BLEU (13a) and chrF of detokenized text; see the module docstring."""
    import sacrebleu  # the `eval` extra: the options above build the command line without it

    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references; pass one reference per source."
        )
    metrics = {
        "bleu": sacrebleu.BLEU(tokenize="13a"),
        "bleu_lowercase": sacrebleu.BLEU(tokenize="13a", lowercase=True),
        "chrf": sacrebleu.CHRF(),
    }
    results: dict[str, Any] = {}
    for name, metric in metrics.items():
        results[name] = metric.corpus_score(hypotheses, [references]).score
        results[f"{name}_signature"] = str(metric.get_signature())
    return results


def evaluate_translations(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    references: list[str],
    batch_size: int = 64,
    generation_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
    max_input_tokens: int | None = None,
) -> dict[str, Any]:
    """Translate `sources` (`best_translations`, cut to `max_input_tokens`) and score the hypotheses against
    `references` (one per source).

    Returns {"n", "bleu", "bleu_signature", "bleu_lowercase", "bleu_lowercase_signature", "chrf",
    "chrf_signature", "hypotheses", "generation", "seconds"}; the module docstring says what each score is.
    """
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} references; they must pair up.")
    if not sources:
        raise ValueError("`sources` is empty; pass at least one sentence to evaluate.")
    started = time.perf_counter()
    hypotheses = best_translations(
        model, tokenizer, sources, batch_size, generation_kwargs, progress, max_input_tokens
    )
    seconds = time.perf_counter() - started
    generation = model.generation_config.to_diff_dict() | dict(generation_kwargs or {})
    generation = {
        key: value for key, value in generation.items() if key not in ("transformers_version", "_from_model_config")
    }
    return {
        "n": len(sources),
        **score_translations(hypotheses, references),
        "hypotheses": hypotheses,
        "generation": _json_ready(generation),
        "seconds": round(seconds, 3),
    }


# A sentence outside the image-description domain of Multi30k (from the paper's abstract), by source language: the
# model card shows its translation to make the domain limitation concrete.
OUT_OF_DOMAIN = {
    "en": "The Transformer is based solely on attention mechanisms, dispensing with recurrence and convolutions.",
    "de": "Der Transformer beruht ausschließlich auf Aufmerksamkeitsmechanismen, ohne Rekurrenz und Faltungen.",
    "fr": "Le Transformer repose uniquement sur des mécanismes d'attention, sans récurrence ni convolutions.",
}


def out_of_domain_translation(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, src_lang: str
) -> dict[str, str] | None:
    """{"source", "translation"}: the model's translation (its own decoding) of the out-of-domain sentence in
    `src_lang`, for the model card's limitations; None for a language without one."""
    source = OUT_OF_DOMAIN.get(src_lang)
    if source is None:
        return None
    (translation,) = best_translations(model, tokenizer, [source], progress=False)
    return {"source": source, "translation": translation}


def write_results_json(path: str | Path, results: dict[str, Any]) -> Path:
    """Write `results` (e.g. from `evaluate_translations`) as indented UTF-8 JSON; parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


@dataclass(frozen=True)
class EvaluateOptions:
    """Score `model_dir` on Multi30k's `split` (languages: the options', else the folder's results.json, else
    en-de) or on the files `src` and `ref` (their first `max_sentences` pairs, if given); `output` receives the
    scores and hypotheses as JSON."""

    model_dir: str | os.PathLike
    src_lang: str | None = option(
        None, help=f"Multi30k source language (default: the model's, from {RESULTS_FILE}, or en)"
    )
    tgt_lang: str | None = option(None, help="Multi30k target language (default: the model's, or de)")
    split: str = option("test", help="Multi30k split", choices=("test", "validation"))
    src: str | os.PathLike | None = option(None, help="a source file instead of Multi30k (one sentence per line)")
    ref: str | os.PathLike | None = option(None, help="its reference file")
    batch_size: int = option(64, help="sentences per batch", parse=positive_int)
    num_beams: int | None = num_beams_option()
    # α, with the model's kind of penalty (§6.1: GNMT, 0.6)
    length_penalty: float | None = option(
        None, help="override the model's length penalty α (its kind stays)", parse=finite_float
    )
    output: str | os.PathLike | None = option(None, help="write the scores and hypotheses to this JSON file")
    max_sentences: int | None = option(None, help="score only the first N sentences", parse=positive_int)
    int8: bool = int8_option()
    bf16_weights: bool = bf16_weights_option()
    max_input_tokens: int | None = max_input_tokens_option()
    trust_remote_code: bool = trust_remote_code_option()
    progress: bool = option(True, help="no progress bar", negated="--no-progress")


def evaluate(options: EvaluateOptions) -> dict[str, Any]:
    """Translate the test set with the model's own decoding (§6.1 unless `num_beams` / `length_penalty`) and score
    it; returns `evaluate_translations`' results (BLEU, lowercased BLEU, chrF, the signature, the
    hypotheses)."""
    # Here, not at the top: the test sets are read through `datasets` (the optional `train` extra), which the rest
    # of this module does not need.
    from ..parallel_text import load_multi30k, read_lines

    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    check_decoding(
        num_beams=options.num_beams, length_penalty=options.length_penalty, max_input_tokens=options.max_input_tokens
    )
    if options.max_sentences is not None and not options.max_sentences >= 1:
        raise OptionError(f"`max_sentences={options.max_sentences}` must be at least 1, or None for every sentence.")
    if (options.src is None) != (options.ref is None):
        raise OptionError("`src` and `ref` go together; pass both files or neither.")
    if options.output is not None:  # checked before the data is read and decoded, which can take long
        inputs = [("model_dir", options.model_dir), ("src", options.src), ("ref", options.ref)]
        writable_file(options.output, "output", "JSON", "scores.json", inputs)
    if options.src is not None:
        sources = read_lines(existing_file(options.src, "src"))
        references = read_lines(existing_file(options.ref, "ref"))
    else:
        src_lang, tgt_lang = trained_languages(model_dir, options.src_lang, options.tgt_lang)
        pairs = load_multi30k(src_lang, tgt_lang, splits=(options.split,))[options.split]
        sources, references = list(pairs["source"]), list(pairs["target"])
    sources, references = sources[: options.max_sentences], references[: options.max_sentences]
    model = load_model(model_dir, options.trust_remote_code, int8=options.int8, bf16_weights=options.bf16_weights)
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    results = evaluate_translations(
        model,
        tokenizer,
        sources,
        references,
        options.batch_size,
        {
            name: value
            for name, value in (("num_beams", options.num_beams), ("length_penalty", options.length_penalty))
            if value is not None
        },
        progress=options.progress,
        max_input_tokens=options.max_input_tokens,
    )
    if options.output is not None:
        write_results_json(options.output, results)
    return results


__all__ = [
    "OUT_OF_DOMAIN",
    "EvaluateOptions",
    "evaluate",
    "evaluate_translations",
    "out_of_domain_translation",
    "score_translations",
    "write_results_json",
]
