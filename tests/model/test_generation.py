"""§6.1 paper decoding: GNMT length penalty, per-example maximum length, and transformers' generate left intact
(and silent)."""

import json
import logging
import math
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import transformers
from transformers import GenerationConfig, pipeline
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import Seq2SeqLMOutput

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model import generation_vanilla_transformer
from hf_vanilla_transformer.model.generation_vanilla_transformer import (
    PaperGenerationMixin,
    SourceLengthLogitsProcessor,
    gnmt_length_penalty,
    paper_generation_config,
)

from ..conftest import random_batch, run_script, tiny_model, tiny_tokenizer

PAD, EOS = 1, 2


def test_model_class_uses_paper_decoding() -> None:
    assert issubclass(VanillaTransformerForConditionalGeneration, PaperGenerationMixin)
    assert VanillaTransformerForConditionalGeneration.can_generate()


def test_no_private_method_of_transformers_generation_is_overridden() -> None:
    # Private methods change between transformers minor versions; §6.1 decoding goes through public hooks only
    # (generate, a LogitsProcessor, custom_generate), which is what lets pyproject.toml allow transformers < 6.
    overridden = [
        name
        for name in vars(PaperGenerationMixin)
        if name.startswith("_") and not name.startswith("__") and hasattr(GenerationMixin, name)
    ]
    assert overridden == []


@pytest.mark.parametrize(("length", "expected"), [(1, 1.0), (7, 2**0.6), (13, 3**0.6), (55, 10**0.6)])
def test_gnmt_penalty_by_hand(length: int, expected: float) -> None:
    # ((5 + |Y|) / 6)^0.6: |Y| = 7 gives (12 / 6)^0.6 = 2^0.6, |Y| = 13 gives 3^0.6, |Y| = 55 gives 10^0.6.
    assert gnmt_length_penalty(length, 0.6) == pytest.approx(expected, rel=1e-12)


# A "model" whose next-token log-probabilities depend on the decoder prefix only, so a beam can be worked out by hand.
V, A, B, C, D = 8, 4, 5, 6, 7


def distribution(chosen: dict[int, float]) -> torch.Tensor:
    """Log-probabilities: the given ones, the remaining mass shared evenly by the other tokens."""
    others = [token for token in range(V) if token not in chosen]
    rest = math.log((1 - sum(math.exp(logp) for logp in chosen.values())) / len(others))
    return torch.tensor([chosen.get(token, rest) for token in range(V)])


PREFIX_TABLE = {
    (PAD,): distribution({A: -0.7, B: -0.8}),
    (PAD, A): distribution({EOS: -0.3}),  # H1 = A </s>: log P = -1.0, |Y| = 2
    (PAD, B): distribution({C: -0.1}),
    (PAD, B, C): distribution({C: -0.2}),
    (PAD, B, C, C): distribution({EOS: -0.2}),  # H2 = B C C </s>: log P = -1.3, |Y| = 4
}
DEAD_END = distribution({D: -1e-4})  # any other prefix: continues with D, practically never ends


def controlled_model() -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_paper(N=1, d_model=8, d_ff=16, h=2, vocab_size=V, dropout=0.0)
    model = VanillaTransformerForConditionalGeneration(config).eval()

    def forward(decoder_input_ids: torch.Tensor, **kwargs: object) -> Seq2SeqLMOutput:
        rows = [PREFIX_TABLE.get(tuple(row.tolist()), DEAD_END) for row in decoder_input_ids]
        return Seq2SeqLMOutput(logits=torch.stack(rows)[:, None, :].expand(-1, decoder_input_ids.shape[1], -1))

    model.forward = forward
    return model


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize("penalty", ["hf", "gnmt"])
def test_finished_hypotheses_ranked_as_by_hand(penalty: str, early_stopping: bool | str) -> None:
    """Beam 2 by hand. Step 1 keeps [A] -0.7 and [B] -0.8. Step 2: [B C] -0.9, [A </s>] -1.0 (finishes H1); the next
    best, [A x] ≈ -4.0, keeps running. Step 3: [B C C] -1.1 and [A x D]. Step 4: [B C C </s>] -1.3 finishes H2; two
    hypotheses have finished, so the sentence terminates with early_stopping=True; with False or "never" the
    running dead end (log P ≈ -4) cannot beat them under either penalty, and the result is the same.
    HF: H1 -1.0 / 2^0.6 = -0.660, H2 -1.3 / 4^0.6 = -0.566 -> H2 first.
    GNMT: H1 -1.0 / (7/6)^0.6 = -0.912, H2 -1.3 / (9/6)^0.6 = -1.019 -> H1 first."""
    h1, h2 = [PAD, A, EOS, PAD, PAD], [PAD, B, C, C, EOS]
    if penalty == "hf":
        expected = [(h2, -1.3 / 4**0.6), (h1, -1.0 / 2**0.6)]
    else:
        expected = [(h1, -1.0 / (7 / 6) ** 0.6), (h2, -1.3 / (9 / 6) ** 0.6)]
    output = controlled_model().generate(
        torch.tensor([[A, B, C]]),
        num_beams=2,
        num_return_sequences=2,
        length_penalty=0.6,
        length_penalty_type=penalty,
        early_stopping=early_stopping,
        max_new_tokens=10,
        use_cache=False,
        return_dict_in_generate=True,
        output_scores=True,
    )
    assert output.sequences.tolist() == [sequence for sequence, _ in expected]
    torch.testing.assert_close(output.sequences_scores, torch.tensor([score for _, score in expected]))


def eos_biased(model: VanillaTransformerForConditionalGeneration, bias: float) -> None:
    """Adds `bias` to the EOS logit of every step, so that a random model ends hypotheses at various lengths."""
    forward = model.forward

    def biased(*args: object, **kwargs: object) -> Seq2SeqLMOutput:
        output = forward(*args, **kwargs)
        output.logits[..., EOS] += bias
        return output

    model.forward = biased


def reference_beam_search(
    model: VanillaTransformerForConditionalGeneration, source: list[int], num_beams: int, max_new_tokens: int
) -> list[tuple[list[int], float]]:
    """GNMT beam search (α = 0.6, early termination) written from the rule, for one sentence, without a cache: each
    step runs the model on whole prefixes and ranks the continuations of the live beams by log P (float64); of the
    best 2 * num_beams, those among the first num_beams that end (EOS, or the length limit) finish with log P /
    ((5 + |Y|) / 6)^0.6, the best num_beams others live on. The sentence stops when num_beams have finished.
    Returns the finished (tokens, score), best first."""
    live: list[tuple[list[int], float]] = [([PAD], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for length in range(1, max_new_tokens + 1):
        candidates = []
        for prefix, log_p in live:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([prefix])).logits
            step = logits[0, -1].double().log_softmax(-1).tolist()
            candidates += [([*prefix, token], log_p + value) for token, value in enumerate(step)]
        best = sorted(candidates, key=lambda candidate: -candidate[1])[: 2 * num_beams]
        ends = [tokens[-1] == EOS or length == max_new_tokens for tokens, _ in best]
        first = zip(best[:num_beams], ends[:num_beams], strict=True)
        finished += [(tokens, log_p / ((5 + length) / 6) ** 0.6) for (tokens, log_p), end in first if end]
        live = [candidate for candidate, end in zip(best, ends, strict=True) if not end][:num_beams]
        if len(finished) >= num_beams:
            break
    return sorted(finished, key=lambda hypothesis: -hypothesis[1])[:num_beams]


@pytest.mark.parametrize("num_beams", [2, 4])
def test_gnmt_beam_search_equals_the_rule_written_out(num_beams: int) -> None:
    model = tiny_model(seed=4, init_std=0.3)
    eos_biased(model, 2.5)  # hypotheses end at different lengths, some at the limit
    batch = random_batch(batch=3, src_len=7, seed=4)
    output = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        num_beams=num_beams,
        num_return_sequences=num_beams,
        length_penalty=0.6,
        length_penalty_type="gnmt",
        early_stopping=True,
        max_new_tokens=8,
        max_new_tokens_offset=None,
        return_dict_in_generate=True,
        output_scores=True,
    )
    lengths = set()
    for row in range(3):
        source = batch["input_ids"][row, : int(batch["attention_mask"][row].sum())].tolist()
        expected = reference_beam_search(model, source, num_beams, max_new_tokens=8)
        for rank, (tokens, score) in enumerate(expected):
            found = output.sequences[row * num_beams + rank].tolist()
            assert found[: len(tokens)] == tokens and set(found[len(tokens) :]) <= {PAD}, (row, rank)
            # float32 sums of log-probabilities: a few ulps of |score| (~6) apart on some CPUs' kernels.
            assert output.sequences_scores[row * num_beams + rank].item() == pytest.approx(score, rel=1e-5, abs=1e-5)
            lengths.add(len(tokens))
    assert len(lengths) > 2, "every hypothesis has the same length: the penalty would not be tested"


def test_nbest_scores_are_log_probability_over_gnmt_penalty() -> None:
    """Each returned hypothesis's score is its log P(Y | X), teacher-forced through the model, over lp(|Y|)."""
    model = tiny_model(seed=5, init_std=0.3)
    eos_biased(model, 2.0)
    batch = random_batch(batch=2, src_len=6, seed=5)
    output = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        **paper_generation_config(model.config).to_diff_dict(),
        num_return_sequences=4,
        max_new_tokens=10,
        return_dict_in_generate=True,
        output_scores=True,
    )
    for row, sequence in enumerate(output.sequences.tolist()):
        source = batch["input_ids"][row // 4, : int(batch["attention_mask"][row // 4].sum())]
        tokens = sequence[1 : sequence.index(EOS) + 1] if EOS in sequence else sequence[1:]
        with torch.no_grad():
            logits = model(input_ids=source[None], decoder_input_ids=torch.tensor([[PAD, *tokens[:-1]]])).logits[0]
        log_p = logits.double().log_softmax(-1)[torch.arange(len(tokens)), tokens].sum().item()
        expected = log_p / gnmt_length_penalty(len(tokens), 0.6)
        assert output.sequences_scores[row].item() == pytest.approx(expected, abs=1e-5)


def test_gnmt_beam_search_keeps_sharded_processes_in_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """generate(synced_gpus=True) (ZeRO-3 / FSDP) reaches the GNMT loop, which then asks every step whether all
    processes have finished (one process here: all_reduce returns its own flag) and decodes as without it."""
    flags: list[float] = []
    distributed = generation_vanilla_transformer.distributed
    monkeypatch.setattr(distributed, "all_reduce", lambda flag, op: flags.append(float(flag)))
    model, batch = tiny_model(), random_batch(batch=2, src_len=6)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    paper = {"num_beams": 4, "length_penalty_type": "gnmt", "max_new_tokens": 6, "max_new_tokens_offset": None}
    alone = model.generate(**inputs, **paper)
    assert flags == []
    synced = model.generate(**inputs, **paper, synced_gpus=True)
    assert torch.equal(synced, alone)
    assert flags, "synced_gpus did not reach the GNMT loop"
    assert flags[-1] == 0.0 and set(flags[:-1]) == {1.0}


def test_a_streamer_is_refused_by_gnmt_beam_search_as_by_transformers_beam_search() -> None:
    """A streamer gets nothing from beam search: transformers' own beam search refuses it, and so does the GNMT
    loop (a custom loop would otherwise drop it silently); greedy decoding streams every new token."""
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self) -> None:
            self.tokens: list[list[int]] = []

        def put(self, value: torch.Tensor) -> None:
            self.tokens.append(value.reshape(-1).tolist())

        def end(self) -> None:
            self.tokens.append([])

    model, batch = tiny_model(), random_batch(batch=1, src_len=6)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "max_new_tokens": 5}
    for penalty_type in ("gnmt", "hf"):
        with pytest.raises(ValueError, match="`streamer` cannot be used with beam search"):
            model.generate(**inputs, num_beams=4, length_penalty_type=penalty_type, streamer=Collect())
    streamer = Collect()
    output = model.generate(**inputs, num_beams=1, length_penalty_type="gnmt", streamer=streamer)
    assert [token for step in streamer.tokens for token in step] == output[0].tolist() and streamer.tokens[-1] == []


def never_ending(**generate_kwargs: object) -> dict[str, object]:
    """EOS (and padding) suppressed, so every row runs to its length limit, where EOS is forced."""
    return {"suppress_tokens": [EOS, PAD], **generate_kwargs}


@pytest.mark.parametrize(
    "mode",
    [
        {"num_beams": 1},
        {"num_beams": 4, "length_penalty_type": "gnmt", "length_penalty": 0.6, "early_stopping": True},
        {"num_beams": 3, "num_return_sequences": 2},
        {"do_sample": True, "num_return_sequences": 2},
    ],
    ids=["greedy", "paper-beam", "beam-3-returns-2", "sampling"],
)
@pytest.mark.parametrize("use_cache", [True, False])
def test_each_example_stops_at_its_own_source_length_plus_offset(mode: dict, use_cache: bool) -> None:
    batch = random_batch(batch=3, src_len=9)
    source_lengths = batch["attention_mask"].sum(-1).tolist()
    assert len(set(source_lengths)) == 3  # rows of different lengths, padded
    torch.manual_seed(0)
    output = tiny_model().generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens_offset=15,  # limits up to 24 > transformers' default max_length of 20
        use_cache=use_cache,
        **never_ending(**mode),
    )
    returns = mode.get("num_return_sequences", 1)
    assert output.shape == (3 * returns, 1 + max(source_lengths) + 15)
    for row, sequence in enumerate(output.tolist()):
        limit = source_lengths[row // returns] + 15
        generated = sequence[1:]
        assert generated[limit - 1] == EOS, (row, sequence)
        assert EOS not in generated[: limit - 1] and set(generated[limit:]) <= {PAD}


@pytest.mark.parametrize("num_beams", [1, 4])
def test_batched_equals_alone_under_the_per_example_rule(num_beams: int) -> None:
    model, batch = tiny_model(), random_batch(batch=3, src_len=9)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    together = model.generate(**inputs, num_beams=num_beams, max_new_tokens_offset=2, **never_ending())
    for row in range(3):
        length = int(batch["attention_mask"][row].sum())
        alone = model.generate(
            input_ids=batch["input_ids"][row : row + 1, :length],
            num_beams=num_beams,
            max_new_tokens_offset=2,
            **never_ending(),
        )
        assert together[row, : alone.shape[1]].tolist() == alone[0].tolist()


def test_processor_forces_eos_per_row_by_hand() -> None:
    processor = SourceLengthLogitsProcessor(torch.tensor([2, 4]), eos_token_id=EOS)
    scores = torch.zeros(4, 6)  # 2 source rows x 2 beams
    prompt = torch.full((4, 1), PAD)
    assert torch.equal(processor(prompt, scores), scores)  # first token of 2 and 4: not forced yet
    after_one = processor(torch.cat([prompt, prompt], dim=1), scores)  # next token is the 2nd: row 0's last
    assert after_one[:2, EOS].tolist() == [0.0, 0.0] and torch.isinf(after_one[:2, 3]).all()
    assert torch.equal(after_one[2:], scores[2:])


def test_processor_passes_scores_through_until_a_row_is_due() -> None:
    processor = SourceLengthLogitsProcessor(torch.tensor([3, 5]), eos_token_id=EOS)
    scores, prompt = torch.randn(2, 6), torch.full((2, 1), PAD)
    # Before the smallest limit's last step the scores are returned as they are, with no (rows, vocabulary) work.
    assert processor(prompt, scores) is scores
    assert processor(torch.cat([prompt] * 2, dim=1), scores) is scores
    due = processor(torch.cat([prompt] * 3, dim=1), scores)  # row 0's third and last token
    assert due is not scores and due[0, EOS] == 0 and torch.isinf(due[0, 3]) and torch.equal(due[1], scores[1])


def test_paper_generation_config_values_and_round_trip(tmp_path) -> None:
    config = paper_generation_config(tiny_model().config)
    assert (config.num_beams, config.length_penalty, config.early_stopping) == (4, 0.6, True)
    assert (config.length_penalty_type, config.max_new_tokens_offset) == ("gnmt", 50)
    assert (config.eos_token_id, config.pad_token_id, config.decoder_start_token_id) == (EOS, PAD, PAD)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert (saved["length_penalty_type"], saved["max_new_tokens_offset"]) == ("gnmt", 50)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert (loaded.length_penalty_type, loaded.max_new_tokens_offset) == ("gnmt", 50)


def test_saved_paper_config_is_the_default_and_cached_equals_uncached(tmp_path) -> None:
    # init_std=1.0: this random model runs its rows into their limits (source length + 50), forced EOS included.
    model = tiny_model(seed=1, init_std=1.0)
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    batch = random_batch(batch=3, src_len=9, seed=1)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    default = reloaded.generate(**inputs)
    explicit = tiny_model(seed=1, init_std=1.0).generate(
        **inputs,
        num_beams=4,
        length_penalty=0.6,
        length_penalty_type="gnmt",
        max_new_tokens_offset=50,
        early_stopping=True,
    )
    assert default.tolist() == explicit.tolist()
    assert default.shape[1] == 1 + 9 + 50
    assert reloaded.generate(**inputs, use_cache=False).tolist() == default.tolist()
    # The other settings stay one argument away.
    unlimited = reloaded.generate(**inputs, max_new_tokens_offset=None, max_new_tokens=5, **never_ending())
    assert unlimited.shape == (3, 6)
    capped = reloaded.generate(**inputs, max_new_tokens=3, **never_ending())  # caps every source length + 50
    assert capped.shape == (3, 4)


def test_passed_generation_config_gets_the_per_example_length() -> None:
    model, batch = tiny_model(), random_batch(batch=3, src_len=9)
    config = GenerationConfig(num_beams=2, max_new_tokens_offset=1, suppress_tokens=[EOS, PAD], eos_token_id=EOS)
    output = model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config
    )
    assert output.shape[1] == 1 + 9 + 1
    assert config.max_new_tokens is None  # the caller's object is left alone


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length_penalty_type": "wu"}, "must be one of ('hf', 'gnmt'), got 'wu'"),
        ({"max_new_tokens_offset": -1}, "must be a non-negative integer or None, got -1"),
        ({"max_new_tokens_offset": 2.5}, "got 2.5"),
    ],
)
def test_bad_settings_name_value_and_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny_model().generate(input_ids=torch.tensor([[5, 6, 7]]), num_beams=2, **kwargs)


@contextmanager
def everything_said() -> Iterator[list[str]]:
    """Every Python warning (each time, not once per place) and every transformers log record at WARNING or above
    (`warning_once` ones included: its memory of earlier messages is cleared) while the block runs."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    library_logger, verbosity = logging.getLogger("transformers"), transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()
    logging.Logger.warning_once.cache_clear()  # transformers' lru_cache'd method: forget what was said before
    library_logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield said
        said += [str(warning.message) for warning in caught]
    finally:
        library_logger.removeHandler(handler)
        transformers.logging.set_verbosity(verbosity)


def test_everything_said_hears_transformers_warnings() -> None:
    # The listener of the silence tests below hears both channels: a log record and a Python warning.
    model, batch = tiny_model(), random_batch(batch=2, src_len=5)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with everything_said() as said:
        model.generate(**inputs, max_new_tokens=3, max_length=5)
        model.generate(**inputs, max_new_tokens_offset=None)
    assert any("Both `max_new_tokens` (=3) and `max_length`(=5) seem to have been set" in text for text in said)
    assert any("model-agnostic default `max_length`" in text for text in said)


def model_with(settings: str) -> VanillaTransformerForConditionalGeneration:
    model = tiny_model(seed=6, init_std=0.3)
    if settings != "fresh":
        model.generation_config = paper_generation_config(model.config)
    if settings == "paper+max_length":
        model.generation_config.max_length = 20  # what Seq2SeqTrainer's predict_with_generate writes into it
    return model


@pytest.mark.parametrize("reloaded", [False, True], ids=["in-memory", "saved-and-reloaded"])
@pytest.mark.parametrize("settings", ["fresh", "paper", "paper+max_length"])
def test_plain_generate_says_nothing(settings: str, reloaded: bool, tmp_path: Path) -> None:
    """`model.generate(**batch)`, greedy and beam: no "Both `max_new_tokens` and `max_length`" (a paper config
    after Seq2SeqTrainer evaluation), no "model-agnostic default `max_length`" (a model without settings)."""
    model = model_with(settings)
    if reloaded:
        model.save_pretrained(tmp_path)
        model = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    batch = random_batch(batch=3, src_len=7, seed=6)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with everything_said() as said:
        model.generate(**inputs)
        model.generate(**inputs, num_beams=4 if settings == "fresh" else 1)
    assert said == []


@pytest.mark.parametrize("settings", ["fresh", "paper+max_length"])
def test_unset_length_is_the_source_length_plus_50(settings: str) -> None:
    """Without any length setting, and with the paper's settings plus the max_length 20 a trainer left behind, each
    row stops at its source length + 50 (§6.1), not at transformers' 20 tokens."""
    model, batch = model_with(settings), random_batch(batch=3, src_len=7, seed=6)
    output = model.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=1, **never_ending()
    )
    assert output.shape[1] == 1 + 7 + 50
    for row, sequence in enumerate(output.tolist()):
        assert sequence.index(EOS) == int(batch["attention_mask"][row].sum()) + 50


REMOTE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    directory, sentences, out_file = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    model = AutoModelForSeq2SeqLM.from_pretrained(directory, trust_remote_code=True).eval()
    batch = AutoTokenizer.from_pretrained(directory)(sentences, return_tensors="pt", padding=True)
    ids = model.generate(**batch).tolist()
    json.dump({"module": type(model).__module__, "ids": ids}, open(out_file, "w"))
    """
)


def test_paper_decoding_is_the_default_in_the_pipeline_and_as_remote_code(tmp_path) -> None:
    """A saved model decodes with §6.1 by default through pipeline("translation"), and in a process where only
    the saved code files (generation_vanilla_transformer.py among them) are available."""
    model, tokenizer = tiny_model(seed=2, init_std=1.0), tiny_tokenizer()
    model.generation_config = paper_generation_config(model.config)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    assert (tmp_path / "model" / "generation_vanilla_transformer.py").is_file()
    sentences = ["w5 w6 w7 w8 w9", "w10 w11"]
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    expected = model.generate(**batch)

    translator = pipeline("translation", model=str(tmp_path / "model"))
    texts = tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert translator(sentences) == [{"translation_text": text} for text in texts]

    out_file = str(tmp_path / "remote.json")
    result = run_script(
        REMOTE_SCRIPT, tmp_path, str(tmp_path / "model"), json.dumps(sentences), out_file, package=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(Path(out_file).read_text())
    assert remote["module"].startswith("transformers_modules")
    assert remote["ids"] == expected.tolist()


@pytest.mark.parametrize("num_beams", [0, -2, 2.5])
def test_a_beam_size_generate_cannot_run_is_named(num_beams: object, tmp_path) -> None:
    """From the call or from a saved generation_config.json (which transformers loads without checking it): one
    ValueError naming `num_beams` (before: 0 was a ZeroDivisionError from transformers' beam search)."""
    model = tiny_model()
    with pytest.raises(
        ValueError, match=rf"`num_beams` must be an integer of at least 1 \(1 is greedy\), got {num_beams}"
    ):
        model.generate(input_ids=torch.tensor([[5, 6, 7]]), num_beams=num_beams)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps(config | {"num_beams": num_beams}))
    reloaded = type(model).from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="`num_beams` must be an integer of at least 1"):
        reloaded.generate(input_ids=torch.tensor([[5, 6, 7]]))
