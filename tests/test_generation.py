"""§6.1 paper decoding: GNMT length penalty, per-example maximum length, and transformers' generate left intact."""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, pipeline
from transformers.modeling_outputs import Seq2SeqLMOutput

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.generation_vanilla_transformer import (
    PaperGenerationMixin,
    SourceLengthLogitsProcessor,
    gnmt_exponent,
    gnmt_length_penalty,
    paper_generation_config,
)

from .conftest import WITHOUT_THE_PACKAGE, random_batch, tiny_model, tiny_tokenizer

PAD, EOS = 1, 2


def test_model_class_uses_paper_decoding() -> None:
    assert issubclass(VanillaTransformerForConditionalGeneration, PaperGenerationMixin)
    assert VanillaTransformerForConditionalGeneration.can_generate()


@pytest.mark.parametrize(("length", "expected"), [(1, 1.0), (7, 2**0.6), (13, 3**0.6), (55, 10**0.6)])
def test_gnmt_penalty_by_hand(length: int, expected: float) -> None:
    # ((5 + |Y|) / 6)^0.6: |Y| = 7 gives (12 / 6)^0.6 = 2^0.6, |Y| = 13 gives 3^0.6, |Y| = 55 gives 10^0.6.
    assert gnmt_length_penalty(length, 0.6) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.6, 1.0, -0.5])
def test_exponent_turns_transformers_penalty_into_gnmt(alpha: float) -> None:
    # transformers divides by |Y| ** exponent; the exponent must make that GNMT's lp(Y) at every length.
    for length in range(1, 300):
        assert length ** gnmt_exponent(length, alpha) == pytest.approx(gnmt_length_penalty(length, alpha), rel=1e-12)


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


REMOTE_SCRIPT = WITHOUT_THE_PACKAGE + textwrap.dedent(
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

    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    out_file = str(tmp_path / "remote.json")
    result = subprocess.run(
        [sys.executable, "-P", "-c", REMOTE_SCRIPT, str(tmp_path / "model"), json.dumps(sentences), out_file],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = json.loads(Path(out_file).read_text())
    assert remote["module"].startswith("transformers_modules")
    assert remote["ids"] == expected.tolist()
