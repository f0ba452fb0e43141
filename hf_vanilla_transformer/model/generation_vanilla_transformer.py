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

`PaperGenerationMixin` (a base of the model class) reads them in `generate` and reaches transformers only through
public hooks: the per-example limit is a `LogitsProcessor`, and GNMT beam search is `gnmt_beam_search`, a decoding loop
passed as `generate(custom_generate=...)`. transformers prepares the inputs, cache, logits processors and stopping
criteria as for its own beam search; the loop is transformers' beam search (the same candidates, the same stopping
rules) with finished hypotheses scored by GNMT's penalty. When nothing sets a length (no `max_length`,
`max_new_tokens` or `max_new_tokens_offset` in the call or in either config), each example stops at its source length
+ 50, §6.1's limit, instead of transformers' 20 tokens (which cut sentences, with a warning). `paper_generation_config`
gives the paper's settings. This file imports only torch and transformers: it is copied next to the model code
(remote code).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import distributed, nn
from transformers import GenerationConfig, PretrainedConfig
from transformers.cache_utils import Cache
from transformers.generation import (
    GenerateBeamEncoderDecoderOutput,
    GenerationMixin,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteriaList,
)
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from transformers.integrations.fsdp import is_fsdp_managed_module
from transformers.masking_utils import create_bidirectional_mask

LENGTH_PENALTY_TYPES = ("hf", "gnmt")
# §6.1's "input length + 50": the per-example limit when neither the call nor a config sets any length.
PAPER_MAX_NEW_TOKENS_OFFSET = 50
LENGTH_FIELDS = ("max_length", "max_new_tokens")
# The decoder cache's name in generate()'s model kwargs and in model outputs: `cache` from transformers 5.24,
# `past_key_values` before (the old name still works in 5.24, with a deprecation warning).
CACHE_NAME = "cache" if "cache" in GenerateBeamEncoderDecoderOutput.__dataclass_fields__ else "past_key_values"


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """GNMT's length penalty lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), used with α = 0.6 in §6.1."""
    return ((5 + length) / 6) ** alpha


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
        max_new_tokens_offset=PAPER_MAX_NEW_TOKENS_OFFSET,
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
    training: bool = False,
) -> torch.Tensor | None:
    """The decoder's encoder-decoder attention mask (no attention to source padding), built once per generation.

    Speed only: every decoding step brings the same source mask, so the mask of the first step is kept with the cache
    and reused while the source mask, the number of new positions, the dtype and the attention backend stay the
    same; building it again costs more than a small model's whole step on a CPU.
    In a `training` step (training mode, with gradients) a given mask is kept without looking at it: transformers
    would read it back from the device to drop it where nothing is padded (a host-device synchronisation every
    step), and training batches of several lengths are padded almost always. Without a mask none is built."""
    if past_key_values is None or torch.compiler.is_compiling():
        return create_bidirectional_mask(
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=not training or encoder_attention_mask is None,
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


def _setting(name: str, kwargs: dict[str, Any], *configs: GenerationConfig | None, pop: bool = True) -> Any:
    """A generation field as generate() resolves it: from the kwargs (popped when `pop`, for the fields transformers
    does not know), else from the first config that sets it (not None), else None."""
    if name in kwargs:
        return kwargs.pop(name) if pop else kwargs[name]
    for config in configs:
        if config is not None and getattr(config, name, None) is not None:
            return getattr(config, name)
    return None


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """tensor (B, K, ...) gathered along K by indices (B, K'): (B, K', ...)."""
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


def all_peers_finished(this_peer_finished: bool, synced_gpus: bool, device: torch.device) -> bool:
    """Whether decoding is over: for this process, or with `synced_gpus` for every process of the group."""
    if not synced_gpus:
        return this_peer_finished
    unfinished = torch.tensor(0.0 if this_peer_finished else 1.0, device=device)
    distributed.all_reduce(unfinished, op=distributed.ReduceOp.SUM)
    return unfinished.item() == 0.0


def synced_gpus_default(model: torch.nn.Module) -> bool:
    """generate()'s `synced_gpus=None`: on when the model is sharded (ZeRO-3, FSDP) over several processes."""
    world_size = distributed.get_world_size() if distributed.is_available() and distributed.is_initialized() else 1
    return (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model)) and world_size > 1


@dataclass
class _Beams:
    """The state of a beam search, per sentence (B) and beam (num_beams): the running hypotheses, the finished ones
    (at most num_beams, best first) and the generation settings they are scored by. Tensors as in transformers'
    `_beam_search`, whose names they keep."""

    num_beams: int
    alpha: float
    early_stopping: bool | str
    max_length: int
    prompt_length: int
    beams_to_keep: int
    top_num_beam_mask: torch.Tensor  # (beams_to_keep,): only the first num_beams candidates may finish
    running_sequences: torch.Tensor  # (B, num_beams, max_length)
    running_beam_scores: torch.Tensor  # (B, num_beams): accumulated log P
    running_beam_indices: torch.Tensor  # (B, num_beams, max_length - prompt)
    sequences: torch.Tensor  # finished, as running_sequences
    beam_scores: torch.Tensor  # finished: log P / lp(|Y|)
    beam_indices: torch.Tensor
    is_sent_finished: torch.Tensor  # (B, num_beams)
    can_improve: torch.Tensor  # (B, 1): transformers' is_early_stop_heuristic_unsatisfied

    @classmethod
    def start(cls, input_ids: torch.Tensor, generation_config: GenerationConfig, eos: torch.Tensor | None) -> _Beams:
        """The state before the first step: input_ids (B * num_beams, prompt) is the decoder prompt."""
        num_beams, max_length = generation_config.num_beams, generation_config.max_length
        batch_size, prompt_length = input_ids.shape[0] // num_beams, input_ids.shape[1]
        device = input_ids.device
        # transformers keeps K = (number of EOS ids + 1) * num_beams candidates, so that num_beams of them run on even
        # when the best ones all end; only the first num_beams may finish.
        beams_to_keep = max(2, 1 + (0 if eos is None else eos.numel())) * num_beams
        pad = generation_config.pad_token_id
        pad = int(eos[0]) if pad is None and eos is not None else pad
        fill = (pad or int(eos[0])) if eos is not None else -1  # transformers' fill, pad id 0 included
        running_sequences = torch.full((batch_size, num_beams, max_length), fill, dtype=torch.int64, device=device)
        running_sequences[:, :, :prompt_length] = input_ids.reshape(batch_size, num_beams, -1)
        # Only the first beam starts alive, so that the first step does not pick the same token num_beams times.
        running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
        running_beam_scores[:, 1:] = -1e9
        running_beam_indices = torch.full(
            (batch_size, num_beams, max_length - prompt_length), -1, dtype=torch.int32, device=device
        )
        return cls(
            num_beams=num_beams,
            alpha=generation_config.length_penalty,
            early_stopping=generation_config.early_stopping,
            max_length=max_length,
            prompt_length=prompt_length,
            beams_to_keep=beams_to_keep,
            top_num_beam_mask=torch.arange(beams_to_keep, device=device) < num_beams,
            running_sequences=running_sequences,
            running_beam_scores=running_beam_scores,
            running_beam_indices=running_beam_indices,
            sequences=running_sequences.clone(),
            beam_scores=torch.full((batch_size, num_beams), -1e9, dtype=torch.float, device=device),
            beam_indices=running_beam_indices.clone(),
            is_sent_finished=torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device),
            can_improve=torch.ones((batch_size, 1), dtype=torch.bool, device=device),
        )

    def top_k_continuations(
        self, log_probs: torch.Tensor, cur_len: int, do_sample: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The top K continuations of all beams by accumulated log P (sampled without replacement when
        `do_sample`), from log_probs (B * num_beams, V): their log P (B, K), sequences and beam indices."""
        batch_size, vocab_size = self.running_sequences.shape[0], log_probs.shape[-1]
        accumulated = log_probs.reshape(batch_size, self.num_beams, vocab_size) + self.running_beam_scores[:, :, None]
        accumulated = accumulated.reshape(batch_size, -1)
        if do_sample:
            topk_indices = torch.multinomial(nn.functional.softmax(accumulated, dim=-1), self.beams_to_keep)
            topk_log_probs = torch.gather(accumulated, 1, topk_indices)
            topk_log_probs, order = topk_log_probs.sort(dim=-1, descending=True)
            topk_indices = topk_indices.gather(-1, order)
        else:
            topk_log_probs, topk_indices = torch.topk(accumulated, k=self.beams_to_keep)
        topk_beams = topk_indices // vocab_size
        topk_running_beam_indices = _gather(self.running_beam_indices, topk_beams)
        topk_running_sequences = _gather(self.running_sequences, topk_beams)
        topk_running_sequences[:, :, cur_len] = topk_indices % vocab_size
        batch_offset = torch.arange(batch_size, device=log_probs.device).reshape(-1, 1) * self.num_beams
        topk_running_beam_indices[:, :, cur_len - self.prompt_length] = topk_beams + batch_offset
        return topk_log_probs, topk_running_sequences, topk_running_beam_indices

    def advance(
        self,
        topk_log_probs: torch.Tensor,
        topk_running_sequences: torch.Tensor,
        topk_running_beam_indices: torch.Tensor,
        stops: torch.Tensor,
        cur_len: int,
    ) -> None:
        """One step's bookkeeping given the top K continuations and which of them stop (B, K): the best num_beams
        that did not stop run on; the stopped ones among the top num_beams, scored log P / lp(|Y|) (GNMT, the one
        change from transformers), merge with the earlier finished ones, except into a full sentence
        (early_stopping=True) or one that cannot improve."""
        running_log_probs = topk_log_probs + stops.to(torch.float32) * -1.0e9
        next_indices = torch.topk(running_log_probs, k=self.num_beams)[1]
        self.running_sequences = _gather(topk_running_sequences, next_indices)
        self.running_beam_scores = _gather(running_log_probs, next_indices)
        self.running_beam_indices = _gather(topk_running_beam_indices, next_indices)

        just_finished = stops & self.top_num_beam_mask[None, :]
        finished_scores = topk_log_probs / gnmt_length_penalty(cur_len + 1 - self.prompt_length, self.alpha)
        full = torch.all(self.is_sent_finished, dim=-1, keepdim=True) & (self.early_stopping is True)
        finished_scores = finished_scores + full.to(torch.float32) * -1.0e9
        finished_scores = finished_scores + (~self.can_improve).to(torch.float32) * -1.0e9
        finished_scores = finished_scores + (~just_finished) * -1.0e9
        merged_scores = torch.cat((self.beam_scores, finished_scores), dim=1)
        best = torch.topk(merged_scores, k=self.num_beams)[1]
        self.sequences = _gather(torch.cat((self.sequences, topk_running_sequences), dim=1), best)
        self.beam_scores = _gather(merged_scores, best)
        self.beam_indices = _gather(torch.cat((self.beam_indices, topk_running_beam_indices), dim=1), best)
        self.is_sent_finished = _gather(torch.cat((self.is_sent_finished, just_finished), dim=1), best)

    def unfinished(self, stops: torch.Tensor, cur_len: int) -> bool:
        """After a step (cur_len now counts its token): whether any sentence may still improve, by transformers'
        bound on what the best running beam can still score (its length: now, or the maximum for "never" with a
        positive α) under the same penalty, its early stopping and whether any continuation is left."""
        best_length = self.max_length if self.early_stopping == "never" and self.alpha > 0.0 else cur_len
        best_possible = self.running_beam_scores[:, :1] / gnmt_length_penalty(
            best_length - self.prompt_length, self.alpha
        )
        worst_finished = torch.where(
            self.is_sent_finished, torch.min(self.beam_scores, dim=1, keepdim=True)[0], -1.0e9
        )
        self.can_improve = self.can_improve & torch.any(best_possible > worst_finished, dim=-1, keepdim=True)
        open_beam = ~(torch.all(self.is_sent_finished) & (self.early_stopping is True))
        return bool(torch.any(self.can_improve) & open_beam & ~torch.all(stops))

    def best(self, returned: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The best `returned` finished hypotheses of each sentence, cropped to the longest one kept: sequences
        (B * returned, prompt + generated), scores (B * returned,), beam indices (B * returned, generated)."""
        batch_size = self.sequences.shape[0]
        sequences = self.sequences[:, :returned].reshape(batch_size * returned, -1)
        beam_scores = self.beam_scores[:, :returned].reshape(-1)
        beam_indices = self.beam_indices[:, :returned].reshape(batch_size * returned, -1)
        generated = int((beam_indices + 1).bool().sum(dim=1).max())
        return sequences[:, : self.prompt_length + generated], beam_scores, beam_indices[:, :generated]


@dataclass
class _Recorded:
    """What `return_dict_in_generate` asks each step to keep (`output_scores`, ...), as transformers' beam search."""

    want: dict[str, bool]
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    decoder_attentions: list[Any] = field(default_factory=list)
    cross_attentions: list[Any] = field(default_factory=list)
    decoder_hidden_states: list[Any] = field(default_factory=list)

    @classmethod
    def asked_by(cls, generation_config: GenerationConfig) -> _Recorded:
        return_dict = generation_config.return_dict_in_generate
        names = ("scores", "logits", "attentions", "hidden_states")
        return cls({name: bool(return_dict and getattr(generation_config, f"output_{name}")) for name in names})

    def add(self, outputs: Any, logits: torch.Tensor, log_probs: torch.Tensor) -> None:
        if self.want["logits"]:
            self.logits.append(logits.clone())
        if self.want["scores"]:
            self.scores.append(log_probs.clone())
        if self.want["attentions"]:
            self.decoder_attentions.append(outputs.decoder_attentions)
            self.cross_attentions.append(outputs.cross_attentions)
        if self.want["hidden_states"]:
            self.decoder_hidden_states.append(outputs.decoder_hidden_states)

    def output(self, beams: _Beams, returned: int, model_kwargs: dict[str, Any]) -> GenerateBeamEncoderDecoderOutput:
        """generate()'s output of beam search, with the best `returned` hypotheses of each sentence."""
        sequences, beam_scores, beam_indices = beams.best(returned)
        want, encoder_outputs = self.want, model_kwargs["encoder_outputs"]
        return GenerateBeamEncoderDecoderOutput(
            sequences=sequences,
            sequences_scores=beam_scores if want["scores"] else None,
            scores=tuple(self.scores) if want["scores"] else None,
            logits=tuple(self.logits) if want["logits"] else None,
            beam_indices=beam_indices,
            encoder_attentions=encoder_outputs.get("attentions") if want["attentions"] else None,
            encoder_hidden_states=encoder_outputs.get("hidden_states") if want["hidden_states"] else None,
            decoder_attentions=tuple(self.decoder_attentions) if want["attentions"] else None,
            cross_attentions=tuple(self.cross_attentions) if want["attentions"] else None,
            decoder_hidden_states=tuple(self.decoder_hidden_states) if want["hidden_states"] else None,
            **{CACHE_NAME: model_kwargs.get(CACHE_NAME)},
        )


def _forward(
    model: GenerationMixin, flat_running_sequences: torch.Tensor, first: bool, model_kwargs: dict[str, Any]
) -> Any:
    """One forward pass of the decoder over the running beams (B * num_beams, cur_len): the whole prompt on the
    `first` step, with a cache the last token after it. Updates the cache and decoder mask in `model_kwargs`."""
    model_inputs = model.prepare_inputs_for_generation(
        flat_running_sequences,
        next_sequence_length=None if first or not model_kwargs.get("use_cache") else 1,
        is_first_iteration=first,
        **model_kwargs,
    )
    outputs = model(**model_inputs, return_dict=True)
    if getattr(outputs, CACHE_NAME, None) is not None:
        model_kwargs[CACHE_NAME] = getattr(outputs, CACHE_NAME)
    if model_kwargs.get("decoder_attention_mask") is not None:
        mask = model_kwargs["decoder_attention_mask"]
        model_kwargs["decoder_attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
    return outputs


def _reorder_cache(model: GenerationMixin, beam_idx: torch.Tensor, model_kwargs: dict[str, Any]) -> None:
    """The cache in `model_kwargs` follows the beams chosen (beam_idx: (B * num_beams,) rows of the last step)."""
    if model_kwargs.get(CACHE_NAME) is None:
        return
    reorder = getattr(model, "_reorder_cache", None)  # the model's own (faster) reordering, if it has one
    if reorder is not None:
        model_kwargs[CACHE_NAME] = reorder(model_kwargs[CACHE_NAME], beam_idx)
    else:
        model_kwargs[CACHE_NAME].reorder_cache(beam_idx)


def gnmt_beam_search(
    model: GenerationMixin,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    gnmt_synced_gpus: bool = False,
    **model_kwargs: Any,
) -> GenerateBeamEncoderDecoderOutput | torch.LongTensor:
    """Beam search (and beam sampling) of an encoder-decoder model, ranking finished hypotheses by log P(Y) / lp(Y)
    with GNMT's lp (`gnmt_length_penalty`, α = `length_penalty`); a decoding loop for `generate(custom_generate=...)`,
    which calls it with the prepared decoder prompt (B * num_beams, prompt), logits processors, stopping criteria,
    the resolved config and the model kwargs (encoder outputs, source mask, cache).

    Step by step it is transformers' `_beam_search` (5.23, 5.24; tests/model/test_upstream_beam_search.py holds
    digests of the upstream code): each step keeps the top 2 * num_beams continuations (more with several EOS ids)
    by log P, a continuation that stops (EOS, length) among the top num_beams finishes, the best num_beams others
    run on; `early_stopping` True stops a sentence when num_beams hypotheses have finished, False / "never" when no
    running beam can beat the worst finished one (transformers' bounds, with GNMT's penalty). Only the penalty
    differs, so the output has the same fields, and `sequences_scores` are log P / lp. transformers' loop cannot
    take another penalty: it divides by |Y|^α in `_update_finished_beams` and `_check_early_stop_heuristic`, and no
    logits processor or stopping criterion sees the finished hypotheses' scores. `gnmt_synced_gpus` is generate()'s
    `synced_gpus` (ZeRO-3 / FSDP on several GPUs: every process runs forward passes until all have finished), under
    a name of its own because generate() passes custom loops only the arguments its own loops do not take."""
    if generation_config.low_memory:
        raise ValueError("`low_memory=True` is not supported by beam search; leave it unset.")
    eos = generation_config.eos_token_id
    eos = None if eos is None else torch.tensor(eos, device=input_ids.device).reshape(-1)
    beams, recorded = _Beams.start(input_ids, generation_config, eos), _Recorded.asked_by(generation_config)
    batch_size, num_beams, prompt_length = input_ids.shape[0] // beams.num_beams, beams.num_beams, input_ids.shape[1]
    cur_len, device = prompt_length, input_ids.device
    flat_running_sequences, this_peer_finished = input_ids, False
    while not all_peers_finished(this_peer_finished, gnmt_synced_gpus, device):
        outputs = _forward(model, flat_running_sequences, cur_len == prompt_length, model_kwargs)
        if this_peer_finished:  # synced: only the forward pass, for the other processes' collectives
            continue
        logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32, device=device)
        log_probs = logits_processor(flat_running_sequences, nn.functional.log_softmax(logits, dim=-1))
        recorded.add(outputs, logits, log_probs)
        del outputs

        topk = beams.top_k_continuations(log_probs, cur_len, generation_config.do_sample)
        stops = stopping_criteria(
            topk[1][:, :, : cur_len + 1].reshape(batch_size * beams.beams_to_keep, -1),
            tuple(recorded.scores) if recorded.want["scores"] else None,
        ).reshape(batch_size, beams.beams_to_keep)
        beams.advance(*topk, stops, cur_len)
        _reorder_cache(model, beams.running_beam_indices[..., cur_len - prompt_length].reshape(-1), model_kwargs)
        cur_len += 1
        this_peer_finished = not beams.unfinished(stops, cur_len)
        flat_running_sequences = beams.running_sequences[:, :, :cur_len].reshape(batch_size * num_beams, -1)

    if not generation_config.return_dict_in_generate:
        return beams.best(generation_config.num_return_sequences)[0]
    return recorded.output(beams, generation_config.num_return_sequences, model_kwargs)


class PaperGenerationMixin(GenerationMixin):
    """`GenerationMixin` plus the §6.1 decoding controls `length_penalty_type` and `max_new_tokens_offset`
    (module docstring). Without them, `generate` is transformers' own: greedy, sampling, beam search,
    `num_return_sequences`, caching all behave as usual, except that an unset length is §6.1's per-example limit."""

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
        per-example limit unless `max_new_tokens` / `max_length` are passed, which then cap every example. With
        `length_penalty_type="gnmt"`, beam search (and beam sampling) runs `gnmt_beam_search` unless the call passes
        its own `custom_generate`."""
        configs = (generation_config, self.generation_config)
        penalty_type = _setting("length_penalty_type", kwargs, *configs) or "hf"
        if penalty_type not in LENGTH_PENALTY_TYPES:
            raise ValueError(
                f"`length_penalty_type` must be one of {LENGTH_PENALTY_TYPES}, got {penalty_type!r}. Use 'gnmt' for "
                "the paper's ((5 + |Y|) / 6)^α or 'hf' for transformers' |Y|^α."
            )
        num_beams = _setting("num_beams", kwargs, *configs, pop=False)
        if num_beams is not None and (isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1):
            # transformers' beam search would divide by it (ZeroDivisionError) or loop backwards
            raise ValueError(f"`num_beams` must be an integer of at least 1 (1 is greedy), got {num_beams!r}.")
        offset = self._length_offset(inputs, configs, kwargs)
        if offset is not None:
            generation_config, logits_processor = self._limit_by_source_length(
                offset, inputs, generation_config, logits_processor, kwargs
            )
        if penalty_type == "gnmt" and kwargs.get("custom_generate") is None and self._searches_beams(configs, kwargs):
            if kwargs.get("streamer") is not None:  # generate() would hand the streamer nothing from a custom loop
                raise ValueError(
                    "`streamer` cannot be used with beam search (as in transformers' own beam search). Make sure "
                    "that `num_beams` is set to 1."
                )
            kwargs["custom_generate"] = gnmt_beam_search
            synced_gpus = kwargs.pop("synced_gpus", None)
            kwargs["gnmt_synced_gpus"] = synced_gpus_default(self) if synced_gpus is None else synced_gpus
        return super().generate(
            inputs,
            generation_config=generation_config,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            **kwargs,
        )

    def _length_offset(
        self, inputs: torch.Tensor | None, configs: tuple[GenerationConfig | None, ...], kwargs: dict[str, Any]
    ) -> int | None:
        """`max_new_tokens_offset` (popped from kwargs); when no length is set anywhere (`max_new_tokens_offset=None`
        passed counts as set) and the call has a source, §6.1's 50."""
        passed = "max_new_tokens_offset" in kwargs
        offset = _setting("max_new_tokens_offset", kwargs, *configs)
        lengths = [_setting(name, kwargs, *configs, pop=False) for name in LENGTH_FIELDS]
        if offset is not None or passed or any(length is not None for length in lengths):
            return offset
        has_source = inputs is not None or any(
            kwargs.get(name) is not None for name in ("input_ids", "inputs_embeds", "encoder_outputs")
        )
        return PAPER_MAX_NEW_TOKENS_OFFSET if has_source else None

    def _searches_beams(self, configs: tuple[GenerationConfig | None, ...], kwargs: dict[str, Any]) -> bool:
        """Whether generate() will run beam search or beam sampling (the modes `_beam_search` serves), by the fields
        that choose the mode, resolved as generate() resolves them."""
        num_beams = _setting("num_beams", kwargs, *configs, pop=False) or 1
        groups = _setting("num_beam_groups", kwargs, *configs, pop=False) or 1
        constrained = any(
            _setting(name, kwargs, *configs, pop=False) is not None for name in ("constraints", "force_words_ids")
        )
        return num_beams > 1 and groups == 1 and not constrained

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
            if self.generation_config.max_length is not None:
                # E.g. the max_length 20 that Seq2SeqTrainer's evaluation writes into the model's config: the
                # per-example limit takes precedence, as max_new_tokens does in transformers, without its warning
                # that both are set.
                kwargs["max_length"] = None
        return generation_config, logits_processor


__all__ = [
    "LENGTH_PENALTY_TYPES",
    "PAPER_MAX_NEW_TOKENS_OFFSET",
    "PaperGenerationMixin",
    "SourceLengthLogitsProcessor",
    "all_peers_finished",
    "gnmt_beam_search",
    "gnmt_length_penalty",
    "paper_generation_config",
    "source_lengths",
    "synced_gpus_default",
]
