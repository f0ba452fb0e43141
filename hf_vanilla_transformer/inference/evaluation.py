"""Translate a test set and score it (§6.1 reports BLEU on newstest2014).

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
import time
from pathlib import Path
from typing import Any, NamedTuple

import sacrebleu
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

logger = logging.get_logger(__name__)


def _json_ready(value: Any) -> Any:
    """Values as JSON can hold them; anything else (tensors, processors) by its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_ready(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _json_ready(item) for key, item in value.items()}
    return repr(value)


class Hypothesis(NamedTuple):
    """One translation of a source: its detokenized `text` and, where asked for, its `score`: log P(Y | X) / lp(|Y|),
    the length-penalised log-probability that beam search ranks hypotheses by (transformers' `sequences_scores`;
    greedy decoding gets the same formula). lp is the decoding's length penalty: GNMT's ((5 + |Y|) / 6)^α for the
    paper's decoding (§6.1), else |Y|^α; |Y| counts the generated tokens, EOS included."""

    text: str
    score: float | None = None


def translate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    batch_size: int = 64,
    generation_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
    max_input_tokens: int | None = None,
) -> list[str]:
    """Translate `sources` with `model.generate` (the model's generation config, e.g. §6.1 paper decoding, plus
    `generation_kwargs`); one hypothesis per source, in input order.

    Sources are batched by length (longest first), so batches carry little padding and a batch that does not fit in
    memory fails at once. A source longer than `max_input_tokens` (default: the tokenizer's `model_max_length`) is
    cut to that many tokens, with one warning that counts them: its translation covers only the start.
    """
    generation_kwargs = dict(generation_kwargs or {})
    if generation_kwargs.get("num_return_sequences", 1) != 1:
        raise ValueError(
            f"Evaluation scores one hypothesis per source, got num_return_sequences="
            f"{generation_kwargs['num_return_sequences']}. Drop it from generation_kwargs."
        )
    hypotheses = translate_n_best(model, tokenizer, sources, batch_size, generation_kwargs, progress, max_input_tokens)
    return [best.text for best, *_ in hypotheses]


def source_token_counts(tokenizer: Any, sources: list[str], limit: int) -> list[int]:
    """The tokens of each source, `</s>` included, with one warning that counts the sources longer than `limit`,
    which decoding cuts to `limit`."""
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    cut = [length for length in lengths if length > limit]
    if cut:
        logger.warning(
            f"{len(cut)} of {len(sources)} sources are longer than {limit} tokens (the longest has {max(cut)}) and "
            f"are cut to {limit}: their translations cover only the start. Split long lines into sentences, or "
            f"raise the limit (`max_input_tokens`)."
        )
    return lengths


def translate_n_best(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sources: list[str],
    batch_size: int = 64,
    generation_kwargs: dict[str, Any] | None = None,
    progress: bool = True,
    max_input_tokens: int | None = None,
    n_best: int = 1,
    scores: bool = False,
) -> list[list[Hypothesis]]:
    """`translate`, keeping the `n_best` best hypotheses of each source (best first; beam search with at least
    `n_best` beams for more than one) and, with `scores`, their scores (see `Hypothesis`)."""
    if batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size}.")
    if isinstance(n_best, bool) or not isinstance(n_best, int) or n_best < 1:
        raise ValueError(f"`n_best` must be a positive integer, got {n_best!r}.")
    if max_input_tokens is None:
        # A tokenizer saved without a limit reports transformers' VERY_LARGE_INTEGER (1e30): no cut then.
        max_input_tokens = min(tokenizer.model_max_length, 2**31 - 1)
    if isinstance(max_input_tokens, bool) or not isinstance(max_input_tokens, int) or max_input_tokens < 2:
        raise ValueError(
            f"`max_input_tokens` must be an integer of at least 2 (a token and `</s>`), got {max_input_tokens!r}."
        )
    generation_kwargs = dict(generation_kwargs or {})
    if n_best > 1:
        generation_kwargs["num_return_sequences"] = n_best
    if scores:
        generation_kwargs |= {"return_dict_in_generate": True, "output_scores": True}
    lengths = [min(length, max_input_tokens) for length in source_token_counts(tokenizer, sources, max_input_tokens)]
    order = sorted(range(len(sources)), key=lambda index: -lengths[index])
    hypotheses: list[list[Hypothesis]] = [[] for _ in sources]
    model.eval()
    with tqdm(total=len(sources), desc="translating", unit="sent", disable=not progress) as bar:
        for start in range(0, len(order), batch_size):
            indices = order[start : start + batch_size]
            batch = tokenizer(
                [sources[index] for index in indices],
                padding=True,
                truncation=True,
                max_length=max_input_tokens,
                return_tensors="pt",
            ).to(model.device)
            with torch.inference_mode():
                output = model.generate(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **generation_kwargs
                )
                output_ids = output.sequences if scores else output
                sequence_scores = _sequence_scores(model, output, generation_kwargs).tolist() if scores else None
            texts = tokenizer.batch_decode(output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for row, text in enumerate(texts):  # rows: n_best per source, best first (generate's order)
                score = sequence_scores[row] if sequence_scores is not None else None
                hypotheses[indices[row // n_best]].append(Hypothesis(text.strip(), score))
            bar.update(len(indices))
    return hypotheses


def _sequence_scores(model: PreTrainedModel, output: Any, generation_kwargs: dict[str, Any]) -> torch.Tensor:
    """(rows,) the `Hypothesis` score of each generated sequence: beam search's own `sequences_scores`, or for greedy
    decoding the same formula from the step scores (the tokens after EOS, padding, left out)."""
    if getattr(output, "sequences_scores", None) is not None:
        return output.sequences_scores.float()
    config = model.generation_config
    tokens = output.sequences[:, -len(output.scores) :]  # the generated tokens, after the decoder start token
    log_probs = model.compute_transition_scores(output.sequences, output.scores, normalize_logits=True).float()
    eos_ids = torch.tensor(config.eos_token_id if config.eos_token_id is not None else [], dtype=tokens.dtype)
    eos = torch.isin(tokens, eos_ids.reshape(-1).to(tokens.device))
    kept = eos.cumsum(-1) - eos.long() == 0  # up to and including the first EOS
    lengths = kept.sum(-1).clamp(min=1).float()
    alpha = generation_kwargs.get("length_penalty", config.length_penalty)
    if generation_kwargs.get("length_penalty_type", getattr(config, "length_penalty_type", None)) == "gnmt":
        penalty = ((5 + lengths) / 6) ** alpha  # gnmt_length_penalty, on a tensor
    else:
        penalty = lengths**alpha
    return log_probs.masked_fill(~kept, 0.0).sum(-1) / penalty


def score_translations(hypotheses: list[str], references: list[str]) -> dict[str, Any]:
    """sacreBLEU BLEU (cased, 13a), lowercased BLEU (13a) and chrF of detokenized text; see the module docstring."""
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
    """Translate `sources` (cut to `max_input_tokens` as `translate` does) and score the hypotheses against
    `references` (one per source).

    Returns {"n", "bleu", "bleu_signature", "bleu_lowercase", "bleu_lowercase_signature", "chrf",
    "chrf_signature", "hypotheses", "generation", "seconds"}; the module docstring says what each score is.
    """
    if len(sources) != len(references):
        raise ValueError(f"Got {len(sources)} sources but {len(references)} references; they must pair up.")
    if not sources:
        raise ValueError("`sources` is empty; pass at least one sentence to evaluate.")
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, batch_size, generation_kwargs, progress, max_input_tokens)
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
    (translation,) = translate(model, tokenizer, [source], progress=False)
    return {"source": source, "translation": translation}


def write_results_json(path: str | Path, results: dict[str, Any]) -> Path:
    """Write `results` (e.g. from `evaluate_translations`) as indented UTF-8 JSON; parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


__all__ = [
    "OUT_OF_DOMAIN",
    "Hypothesis",
    "evaluate_translations",
    "out_of_domain_translation",
    "score_translations",
    "source_token_counts",
    "translate",
    "translate_n_best",
    "write_results_json",
]
