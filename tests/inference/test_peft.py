"""PEFT's LoRA on a model prepared for CPU inference (`prepare_for_cpu_inference`), and weight edits that bump no
version counter: a prepared model never decodes with weights it no longer has, as long as the documented rule is
kept (an edit through `.data` needs the step again; PEFT's merge needs nothing more)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import peft  # a dev dependency (CI installs it): missing, every test here fails, none skips
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.inference import cpu_inference
from hf_vanilla_transformer.inference.cpu_inference import PackedLinear, prepare_for_cpu_inference

from ..conftest import random_batch, tiny_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


@pytest.fixture
def packed_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[torch.nn.Module]]:
    """The layers of every product taken on the packed path, every product past the size threshold (the tiny model's
    are all below it otherwise)."""
    monkeypatch.setattr(cpu_inference, "PACKED_LINEAR_MIN_MACS", 0)
    calls: list[torch.nn.Module] = []
    packed_linear = cpu_inference.packed_linear
    monkeypatch.setattr(cpu_inference, "packed_linear", lambda *args: calls.append(args[0]) or packed_linear(*args))
    yield calls


def scored_generation(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and the logits of each step."""
    output = model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=8,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return output.sequences, torch.stack(output.logits)


def test_lora_fine_tuning_then_merge_of_a_prepared_model_decodes_the_merged_weights(
    packed_calls: list[torch.nn.Module], tmp_path: Path
) -> None:
    """Prepared → generate → LoRA steps (`train()`) → prepared again (as a command would) → generate →
    `merge_and_unload()` (which adds the adapters to the base weights through `.data`) → generate: the tokens and
    logits of a fresh load of the merged folder. The layers PEFT wraps stay plain, so the merge meets no packed
    copy; the others run packed throughout."""
    batch = random_batch()
    model = peft.get_peft_model(
        tiny_model(seed=3), peft.LoraConfig(r=8, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    prepare_for_cpu_inference(model.eval())
    wrapped = [module.base_layer for module in model.modules() if isinstance(module, peft.tuners.lora.Linear)]
    assert len(wrapped) == 2 * 2 * 2 + 2 * 2  # q and v of the 2 encoder and 2 decoder self-attentions, 2 cross
    assert {type(layer) for layer in wrapped} == {torch.nn.Linear}
    before, _ = scored_generation(model, batch)
    assert packed_calls
    packed_calls.clear()

    model.train()
    assert not any(type(module) is PackedLinear for module in model.modules())
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(5):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert packed_calls == []  # training multiplies by the plain weights
    model.eval()
    prepare_for_cpu_inference(model)
    adapted, adapted_logits = scored_generation(model, batch)
    assert packed_calls
    assert not torch.equal(adapted, before)  # the adapters changed the translation: the merge below matters

    merged = model.merge_and_unload()
    packed_calls.clear()
    tokens, logits = scored_generation(merged, batch)
    assert packed_calls and not {id(layer) for layer in packed_calls} & {id(layer) for layer in wrapped}
    merged.save_pretrained(tmp_path)
    fresh = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert {type(module) for module in fresh.modules() if isinstance(module, torch.nn.Linear)} == {torch.nn.Linear}
    fresh_tokens, fresh_logits = scored_generation(fresh, batch)
    assert torch.equal(tokens, fresh_tokens) and torch.equal(tokens, adapted)
    torch.testing.assert_close(logits, fresh_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, adapted_logits, atol=1e-4, rtol=1e-4)


def test_an_edit_through_data_needs_the_step_again_and_an_in_place_edit_does_not(
    packed_calls: list[torch.nn.Module],
) -> None:
    """`weight.data.mul_` (a feed-forward layer, and the embedding matrix tied to the output projection) bumps no
    version counter: after it, `prepare_for_cpu_inference` again gives the logits of the unprepared model with the
    same weights. `weight.mul_` under `torch.no_grad()` bumps it and is seen without the step."""
    batch = random_batch()
    model = prepare_for_cpu_inference(tiny_model(seed=4))
    model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=3)
    fc1 = model.model.decoder.layers[0].fc1
    assert fc1 in packed_calls and model.lm_head in packed_calls

    def logits_match_the_plain_model() -> bool:
        plain = tiny_model(seed=4)
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            expected = plain(**batch).logits
            packed_calls.clear()
            got = model(**batch).logits
        assert fc1 in packed_calls and model.lm_head in packed_calls  # the packed path ran
        return torch.allclose(got, expected, atol=1e-5, rtol=1e-5)

    fc1.weight.data.mul_(0.5)
    model.model.shared.weight.data.mul_(0.5)
    assert not logits_match_the_plain_model()  # stale copies: what the step's docstring warns of
    prepare_for_cpu_inference(model)
    assert logits_match_the_plain_model()

    with torch.no_grad():
        fc1.weight.mul_(0.5)
        model.model.shared.weight.mul_(0.5)
    assert logits_match_the_plain_model()


def test_prefix_tuning_generates_with_its_prompt_in_the_cache() -> None:
    """PEFT's prefix tuning hands its prompt's keys and values over as `past_key_values` beside generate()'s own
    `cache`: greedy decoding's step logits, and beam search's scores (α = 0: the sums of the log-probabilities), are
    those of one full forward pass with the prompt (PEFT's forward, no cache reuse), and the prompt changes them."""
    batch = random_batch()
    config = peft.PrefixTuningConfig(task_type="SEQ_2_SEQ_LM", num_virtual_tokens=3)
    model = peft.get_peft_model(tiny_model(seed=5), config).eval()
    source = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    tokens, logits = scored_generation(model, batch)
    beams = model.generate(
        **source,
        max_new_tokens=6,
        num_beams=3,
        length_penalty=0.0,
        do_sample=False,
        eos_token_id=None,
        output_scores=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        full = model(**source, decoder_input_ids=tokens[:, :-1]).logits
        beam_logits = model(**source, decoder_input_ids=beams.sequences[:, :-1]).logits
        with model.disable_adapter():
            plain = model(**source, decoder_input_ids=tokens[:, :-1]).logits
    torch.testing.assert_close(logits.transpose(0, 1), full, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(full, plain, atol=1e-2)
    chosen = beam_logits.log_softmax(-1).gather(-1, beams.sequences[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(beams.sequences_scores, chosen.sum(-1), atol=1e-4, rtol=1e-4)


def lora_on_lm_head(model: torch.nn.Module) -> peft.PeftModel:
    """LoRA on the output projection alone, with random (not zero) B: the adapter changes the logits at once."""
    config = peft.LoraConfig(r=4, lora_alpha=4, target_modules=["lm_head"], init_lora_weights=False)
    return peft.get_peft_model(model, config).eval()


def test_lora_on_the_tied_lm_head_warns_once_that_merging_moves_embeddings(caplog: pytest.LogCaptureFixture) -> None:
    """lm_head is the embedding matrix (§3.4 tying): an adapter on it, merged, moves the input embeddings too, so the
    merged model's logits are not the adapted model's. The first forward pass says so, once, naming the tie and how
    to untie."""
    batch = random_batch()
    model = lora_on_lm_head(tiny_model(seed=6))
    with caplog.at_level(logging.WARNING), torch.no_grad():
        adapted = model(**batch).logits
        model(**batch)
    ours = [message for message in caplog.messages if message.startswith("lm_head carries an adapter")]
    assert len(ours) == 1 and "tie_word_embeddings=False" in ours[0]
    with torch.no_grad():
        merged = model.merge_and_unload()(**batch).logits
    assert not torch.allclose(merged, adapted, atol=1e-3)  # what the warning is about


def test_a_model_loaded_untied_adapts_its_lm_head_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`from_pretrained(folder, tie_word_embeddings=False)` on a folder saved tied (no lm_head weights of its own):
    lm_head starts as a copy of the embeddings (the same logits as the tied model), LoRA on it says nothing, and the
    merged model keeps the embeddings and computes the adapted logits."""
    batch = random_batch()
    tied = tiny_model(seed=6)
    tied.save_pretrained(tmp_path)
    untied = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, tie_word_embeddings=False).eval()
    embeddings = untied.model.shared.weight.detach().clone()
    assert untied.lm_head.weight is not untied.model.shared.weight
    with torch.no_grad():
        torch.testing.assert_close(untied(**batch).logits, tied(**batch).logits)
    model = lora_on_lm_head(untied)
    with caplog.at_level(logging.WARNING), torch.no_grad():
        adapted = model(**batch).logits
    assert not any(message.startswith("lm_head carries an adapter") for message in caplog.messages)
    merged = model.merge_and_unload()
    assert torch.equal(merged.model.shared.weight, embeddings)
    with torch.no_grad():
        torch.testing.assert_close(merged(**batch).logits, adapted, atol=1e-5, rtol=1e-5)
