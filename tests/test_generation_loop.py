"""The decoding loop's speed-ups (generation_vanilla_transformer.py: `SignatureMemoLogitsProcessorList`, the light
`prepare_inputs_for_generation`) give token for token what transformers' own loop gives, with every generate()
argument users pass: greedy, beam 4 with the paper's GNMT penalty, sampling with a seed, num_return_sequences, a
logits processor, a stopping criterion, a streamer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import GenerationMixin, LogitsProcessor, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_vanilla_transformer.model.generation_vanilla_transformer import (
    PaperGenerationMixin,
    SignatureMemoLogitsProcessorList,
    paper_generation_config,
)
from tests.conftest import random_batch, tiny_model

LOOP_METHODS = ("prepare_inputs_for_generation", "_get_logits_processor")


@contextlib.contextmanager
def transformers_loop() -> Iterator[None]:
    """Within the block, generate() runs transformers' own per-step methods instead of ours."""
    saved = {name: PaperGenerationMixin.__dict__[name] for name in LOOP_METHODS}
    try:
        for name in LOOP_METHODS:
            setattr(PaperGenerationMixin, name, getattr(GenerationMixin, name))
        yield
    finally:
        for name, method in saved.items():
            setattr(PaperGenerationMixin, name, method)


class BanToken(LogitsProcessor):
    """A user's processor: bans one token and counts its calls."""

    def __init__(self, token: int) -> None:
        self.token, self.calls = token, 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return scores.index_fill(1, torch.tensor([self.token]), -float("inf"))


class StopAfter(StoppingCriteria):
    """A user's stopping criterion: every row stops once the sequences reach `length` tokens."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool)


class Collect(BaseStreamer):
    """A streamer that keeps every chunk it is sent."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True


CASES: dict[str, dict[str, Any]] = {
    "greedy": dict(num_beams=1, do_sample=False, max_new_tokens=12),
    "beam4 gnmt (paper §6.1)": dict(generation_config="paper", max_new_tokens=10),
    "sampling": dict(do_sample=True, top_k=20, temperature=0.9, max_new_tokens=12),
    "num_return_sequences beam": dict(num_beams=4, num_return_sequences=3, max_new_tokens=10),
    "num_return_sequences sampling": dict(do_sample=True, num_return_sequences=2, max_new_tokens=10),
    "repetition penalty, no-repeat n-grams": dict(repetition_penalty=1.3, no_repeat_ngram_size=2, max_new_tokens=8),
}


def generate(model: torch.nn.Module, batch: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> Any:
    kwargs = dict(kwargs)
    if kwargs.get("generation_config") == "paper":
        kwargs["generation_config"] = paper_generation_config(model.config)
    torch.manual_seed(7)  # sampling draws the same numbers in both loops
    with torch.no_grad():
        return model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            return_dict_in_generate=True,
            output_scores=True,
            **kwargs,
        )


@pytest.mark.parametrize("name", list(CASES))
def test_fast_loop_equals_transformers_loop(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(seed=3)
    model.generation_config = GenerationConfig(
        bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=1
    )
    batch = random_batch(batch=3, src_len=9)
    light_steps = []
    prepare = PaperGenerationMixin.prepare_inputs_for_generation

    def counting(self: Any, input_ids: torch.Tensor, next_sequence_length: int | None = None, **kwargs: Any) -> Any:
        inputs = prepare(self, input_ids, next_sequence_length, **kwargs)
        light_steps.append(next_sequence_length == 1 and "decoder_input_ids" in inputs)
        return inputs

    monkeypatch.setattr(PaperGenerationMixin, "prepare_inputs_for_generation", counting)
    fast = generate(model, batch, CASES[name])
    assert sum(light_steps) >= 5  # the fast path really ran
    with transformers_loop():
        reference = generate(model, batch, CASES[name])
    assert torch.equal(fast.sequences, reference.sequences)
    for ours, theirs in zip(fast.scores, reference.scores, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_user_processor_stopping_criterion_and_streamer_work_as_in_transformers_loop() -> None:
    model = tiny_model(seed=4)
    batch = random_batch(batch=1, src_len=7)
    results = []
    for loop in (contextlib.nullcontext, transformers_loop):
        processor, streamer = BanToken(5), Collect()
        with loop(), torch.no_grad():
            output = model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                num_beams=1,
                min_new_tokens=8,  # EOS is banned until then, so the stopping criterion ends the run
                max_new_tokens=20,
                logits_processor=[processor],
                stopping_criteria=StoppingCriteriaList([StopAfter(6)]),
                streamer=streamer,
            )
        assert output.shape[1] == 6 and 5 not in output[0, 1:].tolist()
        assert processor.calls == 5 and streamer.ended
        results.append((output, streamer.chunks))
    assert torch.equal(results[0][0], results[1][0])
    assert results[0][1] == results[1][1] == [[t] for t in results[0][0][0].tolist()]


def test_memo_list_asks_for_a_processor_s_extra_arguments() -> None:
    """Signatures read once still check them: a processor with a third parameter needs it passed."""

    class NeedsCurLen(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, cur_len: int) -> torch.Tensor:
            return scores + cur_len

    processors = SignatureMemoLogitsProcessorList([NeedsCurLen()])
    scores = torch.zeros(1, 3)
    assert processors(torch.zeros(1, 1, dtype=torch.long), scores, cur_len=2).tolist() == [[2.0, 2.0, 2.0]]
    with pytest.raises(ValueError, match="cur_len"):
        processors(torch.zeros(1, 1, dtype=torch.long), scores)
