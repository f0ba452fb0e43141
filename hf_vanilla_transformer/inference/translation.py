"""Translating with a saved model folder (`translate`, `translate_stream`: the `translate` command) and scoring it on a
test set (`evaluate`: the `evaluate` command), each from one typed options dataclass."""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from ..errors import OptionError
from ..files import existing_file, writable_file
from .evaluation import Hypothesis, evaluate_translations, translate_n_best, write_results_json
from .loading import check_precisions, load_model, load_tokenizer, model_folder, trained_languages


@dataclass(frozen=True)
class TranslateOptions:
    """Translate `sentences` (or the lines given to `translate_stream`) with the model in `model_dir` and its own
    decoding (§6.1: beam 4, GNMT length penalty α = 0.6, at most source length + 50 tokens), changed by the options
    that are not None: `num_beams`, `length_penalty` (α, with the model's kind of penalty), `max_new_tokens` (a cap
    on every output, EOS included, beside the paper's per-source limit).

    `batch_size`: lines per chunk; `translate_stream` yields a chunk's translations once it is decoded.
    `n_best`: None gives the best translation of each line; N gives the N best, each with its score (evaluation's
    `Hypothesis`); more than one needs at least N beams. `device`: one of loading.DEVICES. `bf16`: decode under bf16
    autocast (fast on GPUs and on CPUs with bf16 matrix units; CPUs without them emulate bf16 much slower than
    float32). `bf16_weights`: decode with the weights cast to bf16 (no autocast, every op in bf16): faster than
    autocast on a CPU with bf16 units (docs/results.md, the decoding table), at the same BLEU there.
    """

    model_dir: str | os.PathLike
    sentences: Sequence[str] = ()
    batch_size: int = 32
    num_beams: int | None = None
    max_input_tokens: int | None = None
    trust_remote_code: bool = False
    length_penalty: float | None = None
    max_new_tokens: int | None = None
    n_best: int | None = None
    device: str = "auto"
    bf16: bool = False
    bf16_weights: bool = False
    int8: bool = False  # int8 linear layers on the CPU (quantization.quantize_int8)


def _check_translate_options(options: TranslateOptions) -> None:
    """One-line errors for values the command line's parser would have refused (library callers)."""
    counts = (("batch_size", options.batch_size), ("num_beams", options.num_beams))
    counts += (("max_new_tokens", options.max_new_tokens), ("n_best", options.n_best))
    for name, value in counts:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise OptionError(f"`{name}` must be a positive integer, got {value!r}.")
    penalty = options.length_penalty
    if penalty is not None and (isinstance(penalty, bool) or not math.isfinite(penalty)):
        raise OptionError(f"`length_penalty` must be a finite number (the paper's is 0.6), got {penalty!r}.")
    check_precisions(options.bf16, options.int8, options.bf16_weights)


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Chunks of at most `size` lines. Lines that say whether more are waiting (`ready()`: data.LineStream on a pipe)
    make a chunk of what has come as soon as nothing more waits, so a line piped in is answered at once while a burst
    of lines still fills whole batches; other iterables give chunks of `size`."""
    ready = getattr(lines, "ready", None)
    while chunk := list(itertools.islice(lines, 1 if ready is not None else size)):
        while ready is not None and len(chunk) < size and ready():
            if (line := next(lines, None)) is None:
                break
            chunk.append(line)
        yield chunk


def _beams(options: TranslateOptions, model_dir: Path) -> int:
    """The beam count of the decoding: `num_beams`, else the model's generation_config.json (read alone, before the
    model loads), else 1."""
    if options.num_beams is not None:
        return options.num_beams
    if (model_dir / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(model_dir).num_beams or 1
    return 1


def translate_stream(options: TranslateOptions, lines: Iterable[str] | None = None) -> Iterator[list[Hypothesis]]:
    """Translate `lines` (default: `options.sentences`), read lazily in chunks of at most `options.batch_size`
    (`_chunks`): for each line, in order, its hypotheses (one, or `n_best` best first with scores), yielded as soon
    as its chunk is decoded, so that a line read from a pipe is translated before the pipe closes. A blank (empty
    or white-space) line is not sent to the model and yields an empty list. The model loads at the first `next()`."""
    _check_translate_options(options)
    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    n_best = options.n_best or 1
    beams = _beams(options, model_dir)
    if n_best > beams:
        raise OptionError(
            f"`n_best` {n_best} needs at least {n_best} beams, but the decoding has {beams} (`num_beams`, else the "
            f"model's generation_config.json). Pass `num_beams={n_best}` or more, or a smaller `n_best`."
        )
    model = load_model(model_dir, options.trust_remote_code, options.device, options.int8, options.bf16_weights)
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    bf16 = "bf16" if options.bf16 else "bf16_weights" if options.bf16_weights else None
    if bf16 and model.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise OptionError(f"`{bf16}`: this GPU has no bf16 support. Drop `{bf16}`.")
    generation_kwargs = {
        name: value
        for name, value in (
            ("num_beams", options.num_beams),
            ("length_penalty", options.length_penalty),
            ("max_new_tokens", options.max_new_tokens),
        )
        if value is not None
    }
    for chunk in _chunks(iter(options.sentences if lines is None else lines), options.batch_size):
        sources = [line for line in chunk if line.strip()]
        # Autocast per chunk, never across a yield: its state would leak into the caller's code between chunks.
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=options.bf16):
            translated = iter(
                translate_n_best(
                    model,
                    tokenizer,
                    sources,
                    options.batch_size,
                    generation_kwargs,
                    progress=False,
                    max_input_tokens=options.max_input_tokens,
                    n_best=n_best,
                    scores=options.n_best is not None,
                )
                if sources
                else []
            )
        for line in chunk:
            yield next(translated) if line.strip() else []


# Only "\n" (and "\r\n") end a line of the input (data.decode_lines) and "\t" separates the n-best columns.
_ONE_FIELD = str.maketrans("\t\r\n", "   ")


def translation_line(hypotheses: list[Hypothesis]) -> str:
    """One output line for one input line, as `translate` prints it: the translation; or, for hypotheses with
    scores (`n_best`), `translation<TAB>score` pairs joined by tabs, best first (so `cut -f1` gives the best
    translation); an empty line for a blank input line. Tabs and line breaks inside a translation become spaces,
    so that columns and lines stay aligned with the input."""
    texts = [hypothesis.text.translate(_ONE_FIELD) for hypothesis in hypotheses]
    if all(hypothesis.score is None for hypothesis in hypotheses):
        return texts[0] if texts else ""
    return "\t".join(f"{text}\t{hypothesis.score:.4f}" for text, hypothesis in zip(texts, hypotheses, strict=True))


def translate(options: TranslateOptions) -> list[str]:
    """The best translation of each of `options.sentences`, in input order ("" for a blank line); sources longer
    than `max_input_tokens` (default: the tokenizer's limit) are cut, with one warning per chunk that counts them."""
    model_folder(options.model_dir, options.trust_remote_code)
    if not options.sentences:
        raise OptionError("Nothing to translate: `sentences` is empty. Pass the sentences to translate.")
    return [hypotheses[0].text if hypotheses else "" for hypotheses in translate_stream(options)]


@dataclass(frozen=True)
class EvaluateOptions:
    """Score `model_dir` on Multi30k's `split` (languages: the options', else the folder's results.json, else
    en-de) or on the files `src` and `ref`; `output` receives the scores and hypotheses as JSON."""

    model_dir: str | os.PathLike
    src_lang: str | None = None
    tgt_lang: str | None = None
    split: str = "test"
    src: str | os.PathLike | None = None
    ref: str | os.PathLike | None = None
    batch_size: int = 64
    num_beams: int | None = None
    output: str | os.PathLike | None = None
    progress: bool = True
    max_input_tokens: int | None = None
    trust_remote_code: bool = False
    int8: bool = False  # int8 linear layers on the CPU (quantization.quantize_int8)
    bf16_weights: bool = False  # the weights cast to bf16 (as translate's `bf16_weights`)


def evaluate(options: EvaluateOptions) -> dict[str, Any]:
    """Translate the test set with the model's own decoding (§6.1 unless `num_beams`) and score it; returns
    `evaluation.evaluate_translations`' results (BLEU, lowercased BLEU, chrF, the signature, the hypotheses)."""
    # Here, not at the top: the test sets are read through `datasets` (the optional `train` extra), which
    # translating does not need.
    from ..training.data import load_multi30k, read_lines

    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    if (options.src is None) != (options.ref is None):
        raise OptionError("`src` and `ref` go together; pass both files or neither.")
    if options.src is not None:
        sources = read_lines(existing_file(options.src, "src"))
        references = read_lines(existing_file(options.ref, "ref"))
    else:
        src_lang, tgt_lang = trained_languages(model_dir, options.src_lang, options.tgt_lang)
        pairs = load_multi30k(src_lang, tgt_lang, splits=(options.split,))[options.split]
        sources, references = list(pairs["source"]), list(pairs["target"])
    if options.output is not None:  # checked before decoding, which can take long
        writable_file(options.output, "output", "JSON", "scores.json")
    model = load_model(model_dir, options.trust_remote_code, int8=options.int8, bf16_weights=options.bf16_weights)
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    results = evaluate_translations(
        model,
        tokenizer,
        sources,
        references,
        options.batch_size,
        {"num_beams": options.num_beams} if options.num_beams is not None else None,
        progress=options.progress,
        max_input_tokens=options.max_input_tokens,
    )
    if options.output is not None:
        write_results_json(options.output, results)
    return results


__all__ = [
    "EvaluateOptions",
    "TranslateOptions",
    "evaluate",
    "translate",
    "translate_stream",
    "translation_line",
]
