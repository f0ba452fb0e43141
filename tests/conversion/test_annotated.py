"""Annotated Transformer import (conversion/annotated.py), checked against the Annotated Transformer's own outputs.

The oracle is fixtures/annotated_transformer/, written by fixtures/make_fixtures.py with the upstream
the_annotated_transformer.py (see its README); it is not needed here.

The Annotated LayerNorm, a_2 * (x - mean) / (std + eps) + b_2 with the unbiased std, is not nn.LayerNorm: the
converted config says `layer_norm_type="annotated_std"`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from conversion import annotated
from conversion.__main__ import main
from conversion._common import TARGET_TOKENIZER, load_with_key_map, reference_logits, safe_torch_load
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

from .state_dict_edits import added, without

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "annotated_transformer"
BOS, EOS, PAD = 0, 1, 2
GENERATIONS = json.loads((FIXTURE / "generations.json").read_text())


def options(source: Path = FIXTURE / "model.pt", heads: int = 4, **settings: Any) -> annotated.AnnotatedOptions:
    """The converter's options (the in-memory conversion writes nothing); the fixture has 4 heads."""
    return annotated.AnnotatedOptions(source, Path("unused"), heads=heads, **settings)


def converted_model(weights: dict[str, torch.Tensor], given: annotated.AnnotatedOptions):
    """The converter's config and key map on `weights` (in memory)."""
    config = annotated.vanilla_config(weights, given)
    model = VanillaTransformerForConditionalGeneration(config)
    load_with_key_map(model, weights, annotated.key_map(config))
    return model.eval()


def hypotheses(sequences: torch.Tensor) -> list[list[int]]:
    """Rows up to the first </s>, as check_outputs cuts greedy_decode's output."""
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in sequences.tolist()]


def upstream_hypotheses() -> list[list[int]]:
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in GENERATIONS["greedy"]["tokens"]]


def greedy(model, generation_config) -> list[list[int]]:
    sources = GENERATIONS["greedy"]["sources"]
    input_ids = torch.full((len(sources), max(map(len, sources))), PAD)
    for i, row in enumerate(sources):
        input_ids[i, : len(row)] = torch.tensor(row)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids, attention_mask=(input_ids != PAD).long(), generation_config=generation_config
        )
    return hypotheses(output)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return safe_torch_load(FIXTURE / "model.pt")


def test_settings_map_to_config(weights) -> None:
    fields = annotated.config_fields(weights, options())
    assert (fields["vocab_size"], fields["decoder_vocab_size"], fields["d_model"]) == (20, 24, 24)
    assert (fields["encoder_layers"], fields["decoder_layers"], fields["encoder_ffn_dim"]) == (2, 2, 48)
    assert fields["normalize_before"] and fields["add_final_layer_norm"] and fields["lm_head_bias"]
    assert not fields["share_encoder_decoder_embeddings"] and not fields["tie_word_embeddings"]
    assert (fields["sinusoidal_layout"], fields["position_offset"], fields["layer_norm_eps"]) == (
        "interleaved",
        0,
        1e-6,
    )
    assert (fields["bos_token_id"], fields["eos_token_id"], fields["pad_token_id"]) == (BOS, EOS, PAD)
    assert fields["layer_norm_type"] == "annotated_std"


def test_nn_layer_norm_would_not_be_exact(weights) -> None:
    """Why the field exists: with nn.LayerNorm the same weights give other logits."""
    fields = {**annotated.config_fields(weights, options()), "layer_norm_type": "standard"}
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**fields))
    load_with_key_map(model, weights, annotated.key_map(model.config))
    with pytest.raises(ValueError, match="exceeds atol"):
        reference_logits(model.eval(), FIXTURE / "teacher_forced.safetensors", 1e-5, 1e-5)


def test_converted_model_matches_upstream() -> None:
    converted = annotated.load_annotated(options())
    diffs = reference_logits(converted.model, FIXTURE / "teacher_forced.safetensors", 1e-5, 1e-5)
    assert diffs["fp64"] < 1e-5 and diffs["fp32"] < 1e-5 and diffs["log_probs"] < 1e-5
    assert greedy(converted.model, converted.generation_config) == upstream_hypotheses()


def test_folder_from_the_command_line(tmp_path: Path) -> None:
    output = tmp_path / "annotated"
    vocab = ["--src-vocab", str(FIXTURE / "src_vocab.txt"), "--tgt-vocab", str(FIXTURE / "tgt_vocab.txt")]
    reference = ["--reference", str(FIXTURE / "teacher_forced.safetensors"), "--atol-fp32", "1e-5"]
    assert main(["annotated", str(FIXTURE / "model.pt"), str(output), "--heads", "4", *vocab, *reference]) == 0
    names = {path.relative_to(output).as_posix() for path in output.rglob("*") if path.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert f"{TARGET_TOKENIZER}/tokenizer.json" in names
    assert GENERATIONS["checkpoint_sha256"] in (output / "README.md").read_text()
    model = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    assert reference_logits(model, FIXTURE / "teacher_forced.safetensors", 1e-5, 1e-5)["fp32"] < 1e-5
    assert greedy(model, model.generation_config) == upstream_hypotheses()
    source = AutoTokenizer.from_pretrained(output)
    assert source("de0 de1 unseen")["input_ids"] == [BOS, 4, 5, 3, EOS]  # <s> ... </s>, unknown words to <unk>
    assert AutoTokenizer.from_pretrained(output, subfolder=TARGET_TOKENIZER).convert_ids_to_tokens([4]) == ["en0"]


# ---------------------------------------------------------------------------------------------- refusals
def flipped_positions(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**weights, "tgt_embed.1.pe": weights["tgt_embed.1.pe"].flip(-1)}


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (added("encoder.layers.0.self_attn.linears.4.weight", torch.ones(24, 24)), ValueError, "match no rule"),
        (without(lambda key: key == "decoder.layers.1.sublayer.2.norm.b_2"), ValueError, "lacks"),
        (without(lambda key: key.startswith("generator")), ValueError, "generator.proj"),
        (added("decoder.layers.0.feed_forward.w_1.weight", torch.ones(40, 24)), ValueError, "shape"),
        (flipped_positions, NotImplementedError, "interleaved"),
    ],
    ids=["leftover", "missing", "not-annotated", "shape", "positions"],
)
def test_weights_that_do_not_fit_are_refused(weights, change, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        converted_model(change(dict(weights)), options())


def test_tied_embeddings_are_recognised(weights) -> None:
    """The `if False:` tying snippet: generator.proj.weight = tgt_embed[0].lut.weight."""
    tied = {**weights, "generator.proj.weight": weights["tgt_embed.0.lut.weight"].clone()}
    model = converted_model(tied, options())
    assert model.config.tie_word_embeddings and not model.config.share_encoder_decoder_embeddings
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight


def test_checkpoints_load_without_running_pickled_code(tmp_path: Path) -> None:
    torch.save({"model": nn.Linear(2, 2)}, tmp_path / "model.pt")  # a pickled module, not a state dict
    with pytest.raises(ValueError, match="weights-only"):
        annotated.load_weights(options(tmp_path / "model.pt"))
