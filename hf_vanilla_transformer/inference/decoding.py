"""Decoding a list of sources with a loaded model in batches: `translate_n_best` (the `n_best` hypotheses of each
source, with their scores where asked for: `Hypothesis`) and `best_translations` (the one best text of each), with
the model's own decoding (its generation config, e.g. §6.1) plus the call's settings. `evaluate`, `translate`'s
`Translator` and the training's test decoding all decode through them."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

logger = logging.get_logger(__name__)


class Hypothesis(NamedTuple):
    """One translation of a source: its detokenized `text` and, where asked for, its `score`: log P(Y | X) / lp(|Y|),
    the length-penalised log-probability that beam search ranks hypotheses by (transformers' `sequences_scores`;
    greedy decoding gets the same formula). lp is the decoding's length penalty: GNMT's ((5 + |Y|) / 6)^α for the
    paper's decoding (§6.1), else |Y|^α; |Y| counts the generated tokens, EOS included."""

    text: str
    score: float | None = None


def best_translations(
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
    """`best_translations`, keeping the `n_best` best hypotheses of each source (best first; beam search with at least
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
                row_scores = sequence_scores(model, output, generation_kwargs).tolist() if scores else None
            texts = tokenizer.batch_decode(output_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            for row, text in enumerate(texts):  # rows: n_best per source, best first (generate's order)
                score = row_scores[row] if row_scores is not None else None
                hypotheses[indices[row // n_best]].append(Hypothesis(text.strip(), score))
            bar.update(len(indices))
    return hypotheses


def sequence_scores(model: PreTrainedModel, output: Any, generation_kwargs: dict[str, Any]) -> torch.Tensor:
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


__all__ = ["Hypothesis", "best_translations", "sequence_scores", "source_token_counts", "translate_n_best"]
