"""Paper decoding (§6.1 of Vaswani et al., 2017): "beam search with a beam size of 4 and length penalty α = 0.6 [31].
[...] We set the maximum output length during inference to input length + 50, but terminate early when possible."

Two `GenerationConfig` fields that transformers does not know select it; they are saved in generation_config.json
and can also be passed to `generate()`:

- `length_penalty_type`: "gnmt" ranks finished beam hypotheses by log P(Y) / lp(Y) with GNMT's
  lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016; reference [31] of the paper); "hf" (the default) by
  log P(Y) / |Y|^α, transformers' own penalty. α is `length_penalty`; |Y| counts the generated tokens, EOS included.
- `max_new_tokens_offset`: when set, each example generates at most (its source length + offset) tokens, EOS
  included, whatever the other rows of its batch; the source length is the number of attended positions
  (`attention_mask.sum(-1)`, or the whole input without a mask). EOS is forced at that length.

`PaperGenerationMixin` (a base of the model class) reads them in `generate`; `paper_generation_config` gives the
paper's settings. This file imports only torch and transformers: it is copied next to the model code (remote code).
"""

from __future__ import annotations

import copy
import math
from contextvars import ContextVar
from typing import Any

import torch
from transformers import GenerationConfig, PretrainedConfig
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.masking_utils import create_bidirectional_mask

LENGTH_PENALTY_TYPES = ("hf", "gnmt")

# Set by `PaperGenerationMixin.generate` for the duration of one call (a ContextVar, so that threads sharing a model
# do not see each other's setting); read inside transformers' beam search.
_GNMT_PENALTY: ContextVar[bool] = ContextVar("vanilla_transformer_gnmt_penalty", default=False)


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), used with α = 0.6 in §6.1."""
    return ((5 + length) / 6) ** alpha


def gnmt_exponent(length: int, alpha: float) -> float:
    """The exponent e with length^e = lp(length): transformers divides a hypothesis score by length ** e, so passing
    e instead of α makes it divide by the GNMT penalty. lp(1) = 1 = 1^e for every e, so α is returned there."""
    if length <= 1:
        return alpha
    return alpha * math.log((5 + length) / 6) / math.log(length)


def paper_generation_config(config: PretrainedConfig) -> GenerationConfig:
    """§6.1 decoding as a `GenerationConfig` with the model's special tokens: beam 4, GNMT length penalty α = 0.6,
    at most source length + 50 output tokens per example, early termination (`early_stopping=True`: a sentence
    stops as soon as `num_beams` hypotheses have finished, fairseq's stopping rule; "never" continues until no
    running hypothesis can beat them under the same penalty).

    Set it as `model.generation_config` before `save_pretrained` so that `generate()` and the pipeline default to it.
    """
    return GenerationConfig(
        num_beams=4,
        length_penalty=0.6,
        length_penalty_type="gnmt",
        max_new_tokens_offset=50,
        early_stopping=True,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
    )


class SourceLengthLogitsProcessor(LogitsProcessor):
    """§6.1 "maximum output length [...] input length + 50", per example: forces EOS as the `max_new_tokens[i]`-th
    generated token of row i, so no output is longer than its own limit (EOS included).

    Args:
        max_new_tokens: (B,) the limit of each source row, e.g. source length + 50. Beam and sample rows
            (B * k, in `generate`'s repeat-interleaved order) share their source row's limit.
        eos_token_id: the id(s) to force; several ids all get log-probability 0, as `ForcedEOSTokenLogitsProcessor`.

    One instance serves one `generate` call: the first call sees the decoder prompt, whose length is remembered.
    """

    def __init__(self, max_new_tokens: torch.Tensor, eos_token_id: int | list[int]) -> None:
        if max_new_tokens.dim() != 1 or max_new_tokens.numel() == 0:
            raise ValueError(
                f"`max_new_tokens` must be a non-empty (batch,) tensor, got shape {max_new_tokens.shape}."
            )
        self.max_new_tokens = max_new_tokens.long()
        self.eos_token_id = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        self.prompt_length: int | None = None
        # Speed only: before the smallest limit's last step no row is due, and the scores pass unchanged without
        # the two (rows, vocabulary) passes of forcing (5% of a paper-decoding beam search on a CPU).
        self.first_due_step = int(self.max_new_tokens.min()) - 1

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B * k, prompt + generated); scores (B * k, V). Returns the scores with EOS forced where due."""
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        step = input_ids.shape[1] - self.prompt_length  # tokens generated so far
        if step < self.first_due_step:
            return scores
        rows, batch = scores.shape[0], self.max_new_tokens.numel()
        if rows % batch:
            raise ValueError(f"{rows} generation rows do not split into the {batch} source rows given.")
        limits = self.max_new_tokens.to(scores.device).repeat_interleave(rows // batch)  # (B,) -> (B * k,)
        due = step >= limits - 1  # the next token is the last allowed one
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.eos_token_id] = 0
        return torch.where(due[:, None], forced, scores)


def source_lengths(
    attention_mask: torch.Tensor | None, inputs: torch.Tensor | None, encoder_outputs: Any | None
) -> torch.Tensor:
    """Number of source positions the encoder attends to, per row: (B,)."""
    if attention_mask is not None:
        return attention_mask.sum(-1)
    if inputs is None and encoder_outputs is not None:
        inputs = encoder_outputs[0]
    if inputs is None:
        raise ValueError(
            "`max_new_tokens_offset` needs the source: pass input_ids (or inputs_embeds / encoder_outputs) and "
            "attention_mask to generate(), or set max_new_tokens_offset=None."
        )
    return torch.full((inputs.shape[0],), inputs.shape[1], dtype=torch.long, device=inputs.device)


def cross_attention_mask(
    config: PretrainedConfig,
    encoder_attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor,
    encoder_hidden_states: torch.Tensor,
    past_key_values: Cache | None,
) -> torch.Tensor | None:
    """The decoder's encoder-decoder attention mask (no attention to source padding), built once per generation.

    Speed only: every decoding step brings the same source mask, so the mask of the first step is kept with the cache
    and reused while the source mask, the number of new positions, the dtype and the attention backend stay the
    same; building it again costs more than a small model's whole step on a CPU."""
    if past_key_values is None or torch.compiler.is_compiling():
        return create_bidirectional_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
    source_mask = encoder_attention_mask
    key = (
        None if source_mask is None or source_mask.is_inference() else source_mask._version,  # edited in place?
        tuple(encoder_hidden_states.shape[:2]),
        inputs_embeds.shape[1],
        inputs_embeds.dtype,
        config._attn_implementation,
    )
    kept = getattr(past_key_values, "vanilla_transformer_cross_attention_mask", None)
    if kept is None or kept[0] is not source_mask or kept[1] != key:
        mask = create_bidirectional_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=source_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        kept = past_key_values.vanilla_transformer_cross_attention_mask = (source_mask, key, mask)
    return kept[2]


def _setting(name: str, kwargs: dict[str, Any], *configs: GenerationConfig | None) -> Any:
    """A paper-decoding field: popped from the generate() kwargs, else from the first config that sets it."""
    if name in kwargs:
        return kwargs.pop(name)
    for config in configs:
        if config is not None and getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


class PaperGenerationMixin(GenerationMixin):
    """`GenerationMixin` plus the §6.1 decoding controls `length_penalty_type` and `max_new_tokens_offset`
    (module docstring). Without them, `generate` is transformers' own: greedy, sampling, beam search,
    `num_return_sequences`, caching all behave as usual."""

    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor: LogitsProcessorList | None = None,
        stopping_criteria: Any | None = None,
        **kwargs: Any,
    ) -> Any:
        """`GenerationMixin.generate` with the paper-decoding fields read from kwargs, then `generation_config`,
        then `self.generation_config`. With `max_new_tokens_offset`, the call's `max_new_tokens` becomes the largest
        per-example limit unless `max_new_tokens` / `max_length` are passed, which then cap every example."""
        penalty_type = _setting("length_penalty_type", kwargs, generation_config, self.generation_config) or "hf"
        offset = _setting("max_new_tokens_offset", kwargs, generation_config, self.generation_config)
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {penalty_type!r}. Use 'gnmt' for "
                "the paper's ((5 + |Y|) / 6)^α or 'hf' for transformers' |Y|^α."
            )
        if penalty_type == "gnmt" and not hasattr(GenerationMixin, "_update_finished_beams"):
            raise NotImplementedError(
                "length_penalty_type='gnmt' hooks transformers' beam search (`_update_finished_beams`), which this "
                "transformers version lacks. Install transformers>=5.23,<5.25 or use length_penalty_type='hf'."
            )
        if offset is not None:
            generation_config, logits_processor = self._limit_by_source_length(
                offset, inputs, generation_config, logits_processor, kwargs
            )
        token = _GNMT_PENALTY.set(penalty_type == "gnmt")
        try:
            return super().generate(
                inputs,
                generation_config=generation_config,
                logits_processor=logits_processor,
                stopping_criteria=stopping_criteria,
                **kwargs,
            )
        finally:
            _GNMT_PENALTY.reset(token)

    def _limit_by_source_length(
        self,
        offset: int,
        inputs: torch.Tensor | None,
        generation_config: GenerationConfig | None,
        logits_processor: LogitsProcessorList | None,
        kwargs: dict[str, Any],
    ) -> tuple[GenerationConfig | None, LogitsProcessorList]:
        """Add the per-example limit (source length + offset) and, unless the caller capped the length, set the
        call's `max_new_tokens` to the largest limit (in `kwargs`, or in a copy of a passed `generation_config`)."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(
                f"`max_new_tokens_offset` must be a non-negative integer or None, got {offset!r}. The paper uses 50."
            )
        eos = kwargs.get("eos_token_id")
        for config in (generation_config, self.generation_config, self.config):
            eos = eos if eos is not None else getattr(config, "eos_token_id", None)
        if eos is None:
            raise ValueError("`max_new_tokens_offset` forces EOS, but no `eos_token_id` is set. Pass eos_token_id.")
        source = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        limits = source_lengths(kwargs.get("attention_mask"), source, kwargs.get("encoder_outputs")) + offset
        logits_processor = LogitsProcessorList([*(logits_processor or []), SourceLengthLogitsProcessor(limits, eos)])
        capped = any(
            config.get("max_new_tokens") is not None or config.get("max_length") is not None
            for config in (kwargs, generation_config.to_dict() if generation_config is not None else {})
        )
        if not capped and generation_config is not None:
            # The passed config gets the length itself: generate() deprecates a config plus generation kwargs.
            generation_config = copy.deepcopy(generation_config)
            generation_config.max_new_tokens = int(limits.max())
        elif not capped:
            kwargs["max_new_tokens"] = int(limits.max())
        return generation_config, logits_processor

    def _update_finished_beams(self, *, cur_len: int, decoder_prompt_len: int, length_penalty: float, **kwargs: Any):
        # transformers scores a hypothesis finishing now as log P / |Y| ** length_penalty, |Y| = cur_len + 1 - prompt.
        if _GNMT_PENALTY.get():
            length_penalty = gnmt_exponent(cur_len + 1 - decoder_prompt_len, length_penalty)
        return super()._update_finished_beams(
            cur_len=cur_len, decoder_prompt_len=decoder_prompt_len, length_penalty=length_penalty, **kwargs
        )

    def _check_early_stop_heuristic(
        self,
        *,
        cur_len: int,
        max_length: int,
        decoder_prompt_len: int,
        early_stopping: bool | str,
        length_penalty: float,
        **kwargs: Any,
    ):
        # The bound on what a running beam can still score uses the same penalty; |Y| as transformers chooses it.
        if _GNMT_PENALTY.get():
            never_and_positive = early_stopping == "never" and length_penalty > 0.0
            length = (max_length if never_and_positive else cur_len) - decoder_prompt_len
            length_penalty = gnmt_exponent(length, length_penalty)
        return super()._check_early_stop_heuristic(
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
            **kwargs,
        )


__all__ = [
    "LENGTH_PENALTY_TYPES",
    "PaperGenerationMixin",
    "SourceLengthLogitsProcessor",
    "gnmt_exponent",
    "gnmt_length_penalty",
    "paper_generation_config",
    "source_lengths",
]
