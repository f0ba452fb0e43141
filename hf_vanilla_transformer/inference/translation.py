"""Translating with a saved model folder (`translate`, `translate_stream`: the `translate` command; `Translator`: a
loaded model, e.g. a server's), from one typed options dataclass (`TranslateOptions`). Scoring on a test set (the
`evaluate` command) is evaluation.py's.

Beside the model's own decoding, the decoding modes of data work (docs/translation.md, "Decoding modes"): sampling
(back-translation), a forced target prefix per line (post-editing, interactive MT), hard word alignments from the
encoder-decoder attention, and scores per output."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from ..errors import OptionError, check_decoding
from ..option_fields import non_negative_int, option, positive_float, positive_int, with_role
from ..option_fields import top_p as top_p_value
from .attention_maps import eager_attention
from .decoding import sequence_scores, source_token_counts, translate_n_best
from .loading import (
    bf16_option,
    bf16_weights_option,
    check_precisions,
    device_option,
    int8_option,
    load_model,
    load_tokenizer,
    max_input_tokens_option,
    model_folder,
    num_beams_option,
    trust_remote_code_option,
)

logger = logging.get_logger(__name__)


# The command line's group of the decoding modes (docs/translation.md, "Decoding modes").
MODES = "decoding modes (docs/translation.md)"


@dataclass(frozen=True)
class TranslateOptions:
    """Translate `sentences` (or the lines given to `translate_stream`) with the model in `model_dir` and its own
    decoding (§6.1: beam 4, GNMT length penalty α = 0.6, at most source length + 50 tokens), changed by the options
    that are not None; `translate_stream` yields a chunk of `batch_size` lines once it is decoded.

    Decoding modes (docs/translation.md, "Decoding modes"): `n_best` is `num_return_sequences` N with `scores`
    (pass one of the two); a score is log P(Y | X) / lp(|Y|) (`Translation`). `sampling` is transformers'
    `do_sample`, and the options of the role `sampling` (option_fields.option) apply to it alone; `seed`: the k-th
    `generate()` call of a run (0, 1, ...) samples from `torch.manual_seed(seed + k)`, without changing the caller's
    random state. `prefixes`: a forced target prefix for each of `sentences` ("" for none; the command line reads
    them from a file); the length limits (source + 50, `max_new_tokens`) count the tokens after it."""

    model_dir: str | os.PathLike
    sentences: Sequence[str] = ()
    batch_size: int = option(32, help="lines per chunk (one batch)", parse=positive_int)
    num_beams: int | None = num_beams_option()
    length_penalty: float | None = option(
        None, help="override the model's length penalty alpha (its kind stays)", parse=float
    )  # any float: check_decoding words a value out of range in one line
    max_new_tokens: int | None = option(
        None, help="cap every translation at this many tokens (EOS included)", parse=positive_int
    )
    n_best: int | None = option(
        None,
        help="print the N best translations of each line, best first, as `translation<TAB>score` pairs joined by "
        "tabs on the line (score: log-probability / length penalty); needs --num-beams >= N",
        parse=positive_int,
        metavar="N",
    )
    num_return_sequences: int | None = option(
        None,
        help="print N outputs of each line, tab-separated on its line (best first for beam search, in drawing order "
        "for --sampling); beam search needs --num-beams >= N",
        group=MODES,
        parse=positive_int,
        metavar="N",
    )
    scores: bool = option(
        False, help="print each output's score (log-probability / length penalty) after it", group=MODES
    )
    sampling: bool = option(
        False,
        help="sample each token from the model's distribution (back-translation), with 1 beam unless --num-beams",
        group=MODES,
    )
    top_k: int | None = option(
        None,
        help="sample from the K likeliest tokens only (0: all)",
        group=MODES,
        parse=non_negative_int,
        metavar="K",
        sampling=True,
    )
    top_p: float | None = option(
        None,
        help="sample from the likeliest tokens whose probabilities reach P (nucleus; 1: all)",
        group=MODES,
        parse=top_p_value,
        metavar="P",
        sampling=True,
    )
    temperature: float | None = option(
        None,
        help="divide the logits by T before sampling (1: the model's own)",
        group=MODES,
        parse=positive_float,
        metavar="T",
        sampling=True,
    )
    seed: int | None = option(
        None,
        help="seed of the sampling: the same seed, lines and options, the same outputs",
        group=MODES,
        parse=non_negative_int,
        metavar="S",
        sampling=True,
    )
    prefixes: Sequence[str] = ()
    prefix_column: bool = option(
        False,
        help="each input line is `source<TAB>prefix` (no tab: no prefix); each output starts with its line's prefix",
        group=MODES,
    )
    alignments: bool = option(
        False,
        help="print each output's hard word alignment to its source after it, as Pharaoh `i-j` pairs (source word "
        "i, output word j, 0-based; encoder-decoder attention of the last layer, heads averaged)",
        group=MODES,
    )
    device: str = device_option()
    bf16: bool = bf16_option()
    bf16_weights: bool = bf16_weights_option()
    int8: bool = int8_option()
    max_input_tokens: int | None = max_input_tokens_option()
    trust_remote_code: bool = trust_remote_code_option()


class Translation(NamedTuple):
    """One output for one input line: its detokenized `text` (starting with the line's prefix, if any); with `scores`
    (or `n_best`) its `score`, log P(Y | X) / lp(|Y|) as decoding's `Hypothesis` defines it, over the tokens after
    the prefix (a sampled output's under the model's own distribution, not the top-k / top-p / temperature-shaped
    one it was drawn from); with `alignments` its `alignment`: (source word, output word) index pairs, 0-based, one
    per output word in output order, words being the white-space-separated pieces of the source line and of `text`
    (`word_alignment`)."""

    text: str
    score: float | None = None
    alignment: tuple[tuple[int, int], ...] | None = None


# The options that shape sampling (`sampling=True` in their declaration).
_SAMPLING_FIELDS = with_role(TranslateOptions, "sampling")
# Characters that show nothing and are no white space to str.strip(): zero-width space, non-joiner and joiner, word
# joiner, zero-width no-break space (BOM), soft hyphen. A line of these and white space is blank: decoded, it would
# get an invented translation of nothing.
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"


def is_blank(line: str) -> bool:
    """Whether `line` shows nothing: empty, or white space and invisible characters only (`_INVISIBLE`)."""
    return all(character.isspace() or character in _INVISIBLE for character in line)


def check_translate_options(options: TranslateOptions, default_beams: int = 1) -> None:
    """One-line errors for values the command line's parser would have refused (library callers) and for options
    that contradict each other; `default_beams`: the model's own beam count (`num_beams` unless given)."""
    batch_size = options.batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise OptionError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
    check_decoding(
        num_beams=options.num_beams,
        n_best=options.n_best,
        num_return_sequences=options.num_return_sequences,
        length_penalty=options.length_penalty,
        max_new_tokens=options.max_new_tokens,
        max_input_tokens=options.max_input_tokens,
    )
    # Seeds below 2**63: the k-th generate() call uses seed + k, and torch takes seeds below 2**64.
    for name, value, bound in (("top_k", options.top_k, ""), ("seed", options.seed, " below 2**63")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63):
            raise OptionError(f"`{name}` must be a non-negative integer{bound}, got {value!r}.")
    top_p = options.top_p
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise OptionError(f"`top_p` must be a number in (0, 1] (1: no cut), got {top_p!r}.")
    check_decoding(temperature=options.temperature)
    check_precisions(options.bf16, options.int8, options.bf16_weights)
    if not options.sampling:
        for name in _SAMPLING_FIELDS:
            if getattr(options, name) is not None:
                raise OptionError(f"`{name}` applies to sampling only: pass `sampling` too, or drop `{name}`.")
    if options.n_best is not None and options.num_return_sequences is not None:
        raise OptionError(
            "`n_best` N is `num_return_sequences` N with `scores`: pass one of `n_best` and `num_return_sequences`."
        )
    if options.prefixes and options.prefix_column:
        raise OptionError("`prefixes` and `prefix_column` both give the prefixes: pass one of them.")
    if options.prefixes and len(options.prefixes) != len(options.sentences):
        raise OptionError(
            f"`prefixes` has {len(options.prefixes)} lines, `sentences` {len(options.sentences)}: pass one prefix per "
            "sentence (an empty one for none)."
        )
    name = "n_best" if options.n_best is not None else "num_return_sequences"
    outputs, beams = options.n_best or options.num_return_sequences or 1, decoding_beams(options, default_beams)
    if outputs > beams and not (options.sampling and beams == 1):
        raise OptionError(
            f"`{name}` {outputs} needs at least {outputs} beams, but the decoding has {beams} (`num_beams`, else the "
            f"model's generation_config.json). Pass `num_beams={outputs}` or more, or a smaller `{name}`."
        )


def decoding_beams(options: TranslateOptions, default_beams: int = 1) -> int:
    """The beam count the decoding uses: `num_beams`; else 1 for sampling (plain multinomial sampling, fairseq's
    `--sampling` and Marian's `--output-sampling`), else the model's `default_beams`."""
    if options.num_beams is not None:
        return options.num_beams
    return 1 if options.sampling else default_beams


def generation_kwargs(options: TranslateOptions) -> dict[str, Any]:
    """The `generate()` arguments of `options` (beside the model's generation config): those given, and for
    sampling `do_sample`, one beam unless `num_beams`, and top-k / top-p / temperature with their neutral defaults
    (so that a model's generation config, or transformers' top_k=50, does not shape the samples unasked)."""
    kwargs: dict[str, Any] = {
        name: value
        for name, value in (
            ("num_beams", options.num_beams),
            ("length_penalty", options.length_penalty),
            ("max_new_tokens", options.max_new_tokens),
        )
        if value is not None
    }
    if options.sampling:
        kwargs |= {"do_sample": True, "num_beams": decoding_beams(options), "top_k": options.top_k or 0}
        kwargs |= {"top_p": options.top_p or 1.0, "temperature": options.temperature or 1.0}
    return kwargs


def token_words(text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """The word of `text` (its white-space-separated pieces, 0-based) that each token, given by its character span
    (start, end) in `text`, belongs to: the word of its first non-space character; a token of spaces only (a
    word-start marker such as SentencePiece's ▁ alone) belongs to the next word; an empty span (a byte of a character
    that a later token completes) to the previous token's word, or the next word for a first token. -1: no word."""
    word_at = [-1] * len(text)
    for word, match in enumerate(re.finditer(r"\S+", text)):
        word_at[match.start() : match.end()] = [word] * (match.end() - match.start())
    next_word = [-1] * (len(text) + 1)  # the word of the first non-space character at or after each position
    for position in range(len(text) - 1, -1, -1):
        next_word[position] = word_at[position] if word_at[position] >= 0 else next_word[position + 1]
    words, previous = [], -1
    for start, end in spans:
        start, end = min(start, len(text)), min(end, len(text))
        word = previous if start >= end and previous >= 0 else next_word[start]
        words.append(word)
        previous = word if word >= 0 else previous
    return words


def word_alignment(
    attention: torch.Tensor, source_words: Sequence[int], target_words: Sequence[int]
) -> tuple[tuple[int, int], ...]:
    """Hard word alignment from one token-level attention map: `attention` (T, S), row t the distribution of output
    token t over the source tokens; `source_words` (S) and `target_words` (T) each token's word (-1: none, such as
    </s> or padding). A source word's weight for an output token is the attention mass on its tokens (their sum);
    an output word takes the mean of its tokens' weights and is aligned to the source word of the largest (the
    first on a tie). Returns (source word, output word) pairs, in output word order; none without words."""
    source = torch.tensor(source_words, dtype=torch.long)
    target = torch.tensor(target_words, dtype=torch.long)
    kept_source, kept_target = source >= 0, target >= 0
    if not kept_source.any() or not kept_target.any():
        return ()
    attention = attention.float()[kept_target][:, kept_source]
    source, target = source[kept_source], target[kept_target]
    mass = attention.new_zeros(len(target), int(source.max()) + 1).index_add_(1, source, attention)
    # Summed over an output word's tokens: the same argmax as their mean, since each word's row has one divisor.
    weights = mass.new_zeros(int(target.max()) + 1, mass.shape[1]).index_add_(0, target, mass)
    present = torch.bincount(target, minlength=weights.shape[0]) > 0
    best = weights.argmax(-1).tolist()
    return tuple((best[word], word) for word in range(weights.shape[0]) if present[word])


def pharaoh(alignment: Iterable[tuple[int, int]]) -> str:
    """An alignment in the Pharaoh format of fairseq's --print-alignment and Marian's --alignment: `i-j` pairs
    (source word i, output word j, 0-based) joined by spaces."""
    return " ".join(f"{source}-{target}" for source, target in alignment)


def _decoder_start(model: PreTrainedModel) -> int:
    start = model.generation_config.decoder_start_token_id
    return model.config.decoder_start_token_id if start is None else start


class Translator:
    """The decoding of `options` with a loaded `model` and its `tokenizer`: `translate(sources, prefixes)` decodes a
    batch of lines (in `options.batch_size` batches). `translate_stream` makes one per run; a server can make one per
    request with that request's options (cheap: `model_dir` and the loading fields of `options` are not read here).
    The k-th `generate()` call of one Translator samples from `torch.manual_seed(seed + k)`."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, options: TranslateOptions) -> None:
        check_translate_options(options, model.generation_config.num_beams or 1)
        bf16 = "bf16" if options.bf16 else "bf16_weights" if options.bf16_weights else None
        if bf16 and model.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise OptionError(f"`{bf16}`: this GPU has no bf16 support. Drop `{bf16}`.")
        if options.alignments and not tokenizer.is_fast:
            raise OptionError(
                "`alignments` map source tokens to words by their character offsets, which only a fast tokenizer "
                "(tokenizer.json) gives, and this folder's tokenizer is slow. Drop `alignments`."
            )
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.outputs = options.n_best or options.num_return_sequences or 1
        self.scores = options.scores or options.n_best is not None
        self.generation_kwargs = generation_kwargs(options)
        self._seeds = itertools.count(options.seed) if options.seed is not None else None

    def translate(self, sources: Sequence[str], prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
        """The outputs of each of `sources`, in input order: `outputs` of them (best first for beam search, in drawing
        order for sampling); [] for a blank line (`is_blank`: nothing that shows), which is not decoded.
        `prefixes`: the forced target prefix of each source ("" for none)."""
        if prefixes is not None and len(prefixes) != len(sources):
            raise OptionError(
                f"`prefixes` has {len(prefixes)} lines, `sources` {len(sources)}: pass one prefix per source (an "
                "empty one for none)."
            )
        lines = [index for index, source in enumerate(sources) if not is_blank(source)]
        kept = [sources[index] for index in lines]
        kept_prefixes = [prefixes[index] if prefixes is not None else "" for index in lines]
        results: list[list[Translation]] = [[] for _ in sources]
        if not lines:
            return results
        # Autocast per call, never across a caller's yield: its state would leak into the caller's code.
        with torch.autocast(self.model.device.type, dtype=torch.bfloat16, enabled=self.options.bf16):
            if self.options.sampling or self.options.alignments or any(kept_prefixes):
                decoded = self._decode(kept, kept_prefixes)
            else:  # the model's own decoding, as `evaluate` runs it
                hypotheses = translate_n_best(
                    self.model,
                    self.tokenizer,
                    kept,
                    self.options.batch_size,
                    self.generation_kwargs,
                    progress=False,
                    max_input_tokens=self.options.max_input_tokens,
                    n_best=self.outputs,
                    scores=self.scores,
                )
                decoded = [[Translation(text, score) for text, score in line] for line in hypotheses]
        for index, translations in zip(lines, decoded, strict=True):
            results[index] = translations
        return results

    def _decode(self, sources: list[str], prefixes: list[str]) -> list[list[Translation]]:
        """`translate` for the decoding modes: `generate()` per batch of lines, each batch's prefixes as its
        `decoder_input_ids`."""
        tokenizer, batch_size = self.tokenizer, self.options.batch_size
        # A tokenizer saved without a limit reports transformers' VERY_LARGE_INTEGER (1e30): no cut then.
        limit = self.options.max_input_tokens or min(tokenizer.model_max_length, 2**31 - 1)
        lengths = source_token_counts(tokenizer, sources, limit)
        prefix_ids = tokenizer(text_target=prefixes, add_special_tokens=False)["input_ids"]
        # The decoder numbers positions from its first token and has no padding mask for a prompt, so prompts of
        # different lengths cannot share a batch: batches of one prefix length, longest sources first.
        order = sorted(range(len(sources)), key=lambda index: (len(prefix_ids[index]), -lengths[index]))
        results: list[list[Translation]] = [[] for _ in sources]
        for _, group in itertools.groupby(order, key=lambda index: len(prefix_ids[index])):
            rows = list(group)
            for start in range(0, len(rows), batch_size):
                batch = rows[start : start + batch_size]
                decoded = self._generate([sources[i] for i in batch], [prefix_ids[i] for i in batch], limit)
                for index, translations in zip(batch, decoded, strict=True):
                    results[index] = translations
        return results

    def _generate(self, sources: list[str], prefix_ids: list[list[int]], limit: int) -> list[list[Translation]]:
        """One `generate()` call for `sources`, whose prefixes have one length; then, for sampled scores or
        alignments, one teacher-forced pass over the outputs."""
        model, tokenizer, options = self.model, self.tokenizer, self.options
        encoded = tokenizer(
            sources,
            padding=True,
            truncation=True,
            max_length=limit,
            return_tensors="pt",
            return_offsets_mapping=options.alignments,
        )
        offsets = encoded.pop("offset_mapping", None)
        inputs = {name: encoded[name].to(model.device) for name in ("input_ids", "attention_mask")}
        kwargs = dict(self.generation_kwargs)
        if self.outputs > 1:
            kwargs["num_return_sequences"] = self.outputs
        searched_scores = self.scores and not options.sampling
        if searched_scores:
            kwargs |= {"return_dict_in_generate": True, "output_scores": True}
        prefix_length = len(prefix_ids[0])
        if prefix_length:
            prompts = [[_decoder_start(model), *ids] for ids in prefix_ids]
            kwargs["decoder_input_ids"] = torch.tensor(prompts, device=model.device)
        model.eval()
        with torch.inference_mode():
            with self._seeded():
                output = model.generate(**inputs, **kwargs)
            sequences = output.sequences if searched_scores else output
            scores = sequence_scores(model, output, kwargs).tolist() if searched_scores else None
            cross = None
            if options.alignments or (self.scores and options.sampling):
                scores, cross = self._teacher_forced(inputs, sequences, prefix_length, kwargs, scores)
        copies = sequences.shape[0] // len(sources)  # generate's rows: the outputs of each source in turn
        specials = set(tokenizer.all_special_ids)
        results: list[list[Translation]] = [[] for _ in sources]
        for row, ids in enumerate(sequences[:, 1:].tolist()):  # the tokens after the decoder start token
            source = row // copies
            kept = [position for position, token in enumerate(ids) if token not in specials]
            text = tokenizer.decode([ids[position] for position in kept], clean_up_tokenization_spaces=False)
            alignment = None
            if cross is not None:
                mask = encoded["attention_mask"][source].tolist()
                source_words = self._source_words(sources[source], offsets[source].tolist(), mask)
                alignment = word_alignment(cross[row], source_words, self._output_words(text, ids, kept))
            results[source].append(Translation(text.strip(), scores[row] if scores is not None else None, alignment))
        return results

    def _teacher_forced(
        self,
        inputs: dict[str, torch.Tensor],
        sequences: torch.Tensor,
        prefix_length: int,
        kwargs: dict[str, Any],
        scores: list[float] | None,
    ) -> tuple[list[float] | None, torch.Tensor | None]:
        """The model run again on its outputs (rows of `sequences`, each source's outputs in turn): with sampling and
        `scores`, the outputs' scores under the model's own distribution (the formula of beam search's scores over
        the steps after the prompt); with `alignments`, the encoder-decoder attention (rows, T - 1, S) of the last
        layer, averaged over its heads (fairseq's --print-alignment default), row t the query that predicts the
        output's token t + 1."""
        model, alignments = self.model, self.options.alignments
        copies = sequences.shape[0] // inputs["input_ids"].shape[0]
        repeated = {name: tensor.repeat_interleave(copies, dim=0) for name, tensor in inputs.items()}
        with eager_attention(model) if alignments else contextlib.nullcontext():
            output = model(**repeated, decoder_input_ids=sequences[:, :-1], output_attentions=alignments)
        if self.scores and self.options.sampling:
            steps = output.logits[:, prefix_length:].float()  # the positions that predict the generated tokens
            forced = SimpleNamespace(sequences=sequences, scores=tuple(steps.unbind(1)))
            scores = sequence_scores(model, forced, kwargs).tolist()
        cross = output.cross_attentions[-1].float().mean(1) if alignments else None  # (rows, H, T - 1, S) -> mean
        return scores, cross

    @staticmethod
    def _source_words(text: str, offsets: list[list[int]], mask: list[int]) -> list[int]:
        """Each source token's word in `text` (`token_words`, by the tokenizer's character offsets); -1 for padding
        and added special tokens (an empty span, such as </s>)."""
        tokens = [
            index
            for index, ((start, end), attended) in enumerate(zip(offsets, mask, strict=True))
            if attended and start < end
        ]
        words = [-1] * len(offsets)
        for index, word in zip(tokens, token_words(text, [tuple(offsets[i]) for i in tokens]), strict=True):
            words[index] = word
        return words

    def _output_words(self, text: str, ids: list[int], kept: list[int]) -> list[int]:
        """Each output token's word in `text`, the decoding of the tokens at `kept` (the others, special tokens, get
        -1): a token spans the characters its decoding adds to that of the tokens before it."""
        pieces = [ids[position] for position in kept]
        ends = [
            len(self.tokenizer.decode(pieces[:count], clean_up_tokenization_spaces=False))
            for count in range(len(pieces) + 1)
        ]
        words = [-1] * len(ids)
        for position, word in zip(kept, token_words(text, list(itertools.pairwise(ends))), strict=True):
            words[position] = word
        return words

    @contextlib.contextmanager
    def _seeded(self) -> Iterator[None]:
        """With a `seed`: the block samples from the next seed, and the caller's random state is restored after."""
        if self._seeds is None:
            yield
            return
        device = self.model.device
        devices = (
            [device.index if device.index is not None else torch.cuda.current_device()]
            if device.type == "cuda"
            else []
        )
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(next(self._seeds))
            yield


def _default_beams(model_dir: Path) -> int:
    """The model's own beam count, from its generation_config.json (read alone, before the model loads), else 1."""
    if (model_dir / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(model_dir).num_beams or 1
    return 1


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Chunks of at most `size` lines. Lines that say whether more are waiting (`ready()`: parallel_text.LineStream
    on a pipe) make a chunk of what has come as soon as nothing more waits, so a line piped in is answered at once
    while a burst of lines still fills whole batches; other iterables give chunks of `size`."""
    ready = getattr(lines, "ready", None)
    while chunk := list(itertools.islice(lines, 1 if ready is not None else size)):
        while ready is not None and len(chunk) < size and ready():
            if (line := next(lines, None)) is None:
                break
            chunk.append(line)
        yield chunk


def translate_stream(
    options: TranslateOptions, lines: Iterable[str] | None = None, prefixes: Iterable[str] | None = None
) -> Iterator[list[Translation]]:
    """Translate `lines` (default: `options.sentences`, with `options.prefixes`), read lazily in chunks of at most
    `options.batch_size` (`_chunks`): for each line, in order, its outputs (`Translator.translate`), yielded as soon
    as its chunk is decoded, so that a line read from a pipe is translated before the pipe closes. `prefixes`: the
    forced target prefix of each line ("" for none), read along with the lines; with `options.prefix_column` each
    line is `source<TAB>prefix` instead. A blank source yields an empty list. The model loads at the first `next()`."""
    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    check_translate_options(options, _default_beams(model_dir))
    if lines is None:
        lines, prefixes = options.sentences, options.prefixes or prefixes
    if prefixes is not None and options.prefix_column:
        raise OptionError("`prefixes` and `prefix_column` both give the prefixes: pass one of them.")
    if isinstance(lines, Sequence) and isinstance(prefixes, Sequence) and len(lines) != len(prefixes):
        raise OptionError(
            f"`prefixes` has {len(prefixes)} lines, the input {len(lines)}: pass one prefix per input line (an empty "
            "one for none)."
        )
    model = load_model(model_dir, options.trust_remote_code, options.device, options.int8, options.bf16_weights)
    translator = Translator(model, load_tokenizer(model_dir, options.trust_remote_code), options)
    prefix_lines, count = (iter(prefixes) if prefixes is not None else None), 0
    for chunk in _chunks(iter(lines), options.batch_size):
        count += len(chunk)
        chunk_prefixes: list[str] | None = None
        if options.prefix_column:
            chunk, chunk_prefixes = (
                [line.partition("\t")[0] for line in chunk],
                [line.partition("\t")[2] for line in chunk],
            )
        elif prefix_lines is not None:
            chunk_prefixes = list(itertools.islice(prefix_lines, len(chunk)))
            if len(chunk_prefixes) < len(chunk):
                raise OptionError(
                    f"`prefixes` ended before input line {count - len(chunk) + len(chunk_prefixes) + 1}: pass one "
                    "prefix per input line (an empty one for none)."
                )
        yield from translator.translate(chunk, chunk_prefixes)
    if prefix_lines is not None and next(prefix_lines, None) is not None:
        raise OptionError(
            f"`prefixes` has more lines than the {count} input lines: pass one prefix per input line (an empty one "
            "for none)."
        )


# Only "\n" (and "\r\n") end a line of the input (parallel_text.decode_lines) and "\t" separates the output's columns.
_ONE_FIELD = str.maketrans("\t\r\n", "   ")


def translation_line(translations: Sequence[Translation]) -> str:
    """One output line for one input line, as `translate` prints it: for each output (one, or N best first / in
    drawing order), its translation, then its alignment in the Pharaoh format (`pharaoh`) when it has one, then its
    score (4 decimals) when it has one, all joined by tabs (so `cut -f1` gives the first translation); an empty line
    for a blank input line. Tabs and line breaks inside a translation become spaces, so that columns and lines stay
    aligned with the input."""
    fields = []
    for translation in translations:
        fields.append(translation.text.translate(_ONE_FIELD))
        if translation.alignment is not None:
            fields.append(pharaoh(translation.alignment))
        if translation.score is not None:
            fields.append(f"{translation.score:.4f}")
    return "\t".join(fields)


def translate(options: TranslateOptions) -> list[str]:
    """The best (or first) translation of each of `options.sentences`, in input order ("" for a blank line); sources
    longer than `max_input_tokens` (default: the tokenizer's limit) are cut, with one warning per chunk that counts
    them."""
    model_folder(options.model_dir, options.trust_remote_code)
    if not options.sentences:
        raise OptionError("Nothing to translate: `sentences` is empty. Pass the sentences to translate.")
    return [translations[0].text if translations else "" for translations in translate_stream(options)]


__all__ = [
    "TranslateOptions",
    "Translation",
    "Translator",
    "check_translate_options",
    "decoding_beams",
    "generation_kwargs",
    "is_blank",
    "pharaoh",
    "token_words",
    "translate",
    "translate_stream",
    "translation_line",
    "word_alignment",
]
