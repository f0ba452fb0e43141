"""nn.Transformer tutorial import (conversion/nn_transformer.py), checked against the tutorial's own outputs.

The oracle is fixtures/nn_transformer_tutorial/, written by fixtures/make_fixtures.py with the tutorial's model
classes and torch's nn.Transformer (see its README); neither is needed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_vanilla_transformer
from conversion import nn_transformer
from conversion.__main__ import main
from conversion._common import TARGET_TOKENIZER, reference_logits, safe_torch_load
from conversion.nn_transformer import NnTransformerOptions

from .state_dict_edits import added, without

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nn_transformer_tutorial"
PAD, BOS, EOS = 1, 2, 3
GENERATIONS = json.loads((FIXTURE / "generations.json").read_text())


def options(source: Path = FIXTURE / "model.pt", heads: int = 4, **settings: Any) -> NnTransformerOptions:
    """The converter's options (the in-memory conversion writes nothing); the fixture has 4 heads."""
    return NnTransformerOptions(source, Path("unused"), heads=heads, **settings)


def saved(tmp_path: Path, change) -> Path:
    """The fixture's state dict, changed, saved as the tutorial would (torch.save of a plain dict of tensors)."""
    weights = safe_torch_load(FIXTURE / "model.pt")
    torch.save(change(dict(weights)), tmp_path / "model.pt")
    return tmp_path / "model.pt"


def hypotheses(sequences: torch.Tensor) -> list[list[int]]:
    """Generated rows as the tutorial's greedy_decode returns them: start symbol, tokens, up to the first <eos>."""
    return [row[: row.index(EOS) + 1] if EOS in row else row for row in sequences.tolist()]


@pytest.fixture(scope="module")
def converted() -> nn_transformer.Converted:
    vocab = {"src_vocab": FIXTURE / "src_vocab.txt", "tgt_vocab": FIXTURE / "tgt_vocab.txt"}
    return nn_transformer.load_nn_transformer(options(**vocab))


def test_settings_map_to_config(converted) -> None:
    config = converted.model.config
    assert (config.vocab_size, config.decoder_vocab_size, config.d_model) == (24, 28, 32)
    assert (config.encoder_layers, config.decoder_layers, config.encoder_ffn_dim) == (2, 1, 64)
    assert not config.normalize_before and config.add_final_layer_norm and config.lm_head_bias
    assert not config.share_encoder_decoder_embeddings and not config.tie_word_embeddings
    assert (config.sinusoidal_layout, config.position_offset, config.max_position_embeddings) == ("interleaved", 0, 80)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.1, 0.1, 0.1)
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        PAD,
        BOS,
        EOS,
        BOS,
    )


def test_teacher_forced_logits_match_the_tutorial(converted) -> None:
    diffs = reference_logits(converted.model, FIXTURE / "teacher_forced.safetensors", 1e-5, 1e-5)
    assert diffs["fp64"] < 1e-5 and diffs["fp32"] < 1e-5


def test_norm_first_gelu_and_eps_options_match_nn_transformer() -> None:
    """The same weights in nn.Transformer(norm_first=True, activation="gelu", layer_norm_eps=1e-6)."""
    model = nn_transformer.load_nn_transformer(options(norm_first=True, activation="gelu", layer_norm_eps=1e-6)).model
    config = model.config
    assert config.normalize_before and config.add_final_layer_norm and config.activation_function == "gelu"
    reference = FIXTURE / "teacher_forced_norm_first_gelu.safetensors"
    assert reference_logits(model, reference, 1e-5, 1e-5)["fp32"] < 1e-5
    with pytest.raises(ValueError, match="exceeds atol"):  # the options matter: post-LN weights do not match it
        reference_logits(nn_transformer.load_nn_transformer(options()).model, reference, 1e-5, 1e-5)


def test_greedy_matches_the_tutorial(converted) -> None:
    """The saved generation config alone (translate's greedy search), one right-padded batch of 16 sentences."""
    sources = GENERATIONS["greedy"]["sources"]
    input_ids = torch.full((len(sources), max(map(len, sources))), PAD)
    for i, row in enumerate(sources):
        input_ids[i, : len(row)] = torch.tensor(row)
    model = converted.model
    model.generation_config = converted.generation_config
    with torch.no_grad():
        output = model.generate(input_ids=input_ids, attention_mask=(input_ids != PAD).long())
    assert hypotheses(output) == GENERATIONS["greedy"]["tokens"]


def test_generation_limit_is_the_tutorials(converted) -> None:
    """translate: max_len = source length + 5 with the start symbol, so at most source length + 4 new tokens."""
    generation = converted.generation_config
    assert (generation.num_beams, generation.max_new_tokens_offset, generation.decoder_start_token_id) == (1, 4, BOS)


def test_folder_from_the_command_line(tmp_path: Path) -> None:
    output = tmp_path / "tutorial"
    vocab = ["--src-vocab", str(FIXTURE / "src_vocab.txt"), "--tgt-vocab", str(FIXTURE / "tgt_vocab.txt")]
    reference = ["--reference", str(FIXTURE / "teacher_forced.safetensors"), "--atol-fp32", "1e-5"]
    assert main(["nn-transformer", str(FIXTURE / "model.pt"), str(output), "--heads", "4", *vocab, *reference]) == 0
    names = {path.relative_to(output).as_posix() for path in output.rglob("*") if path.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert f"{TARGET_TOKENIZER}/tokenizer.json" in names
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl"))]
    card = (output / "README.md").read_text()
    assert GENERATIONS["checkpoint_sha256"] in card and "fp64" in card
    model = AutoModelForSeq2SeqLM.from_pretrained(output)
    assert isinstance(model, hf_vanilla_transformer.VanillaTransformerForConditionalGeneration)
    assert reference_logits(model.eval(), FIXTURE / "teacher_forced.safetensors", 1e-5, 1e-5)["fp32"] < 1e-5
    source = AutoTokenizer.from_pretrained(output)
    target = AutoTokenizer.from_pretrained(output, subfolder=TARGET_TOKENIZER)
    assert source("de0 de1 unseen")["input_ids"] == [BOS, 4, 5, 0, EOS]  # <bos> ... <eos>, unknown words to <unk>
    first = GENERATIONS["greedy"]["sources"][0]
    text = source.decode(first, skip_special_tokens=True)
    batch = source([text], return_tensors="pt")
    assert batch["input_ids"][0].tolist() == first
    with torch.no_grad():
        tokens = model.generate(**batch)[0].tolist()
    assert tokens == GENERATIONS["greedy"]["tokens"][0]
    assert target.decode(tokens, skip_special_tokens=True).split() == target.convert_ids_to_tokens(tokens[1:-1])


# ---------------------------------------------------------------------------------------------- refusals
def flipped_positions(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {**weights, "positional_encoding.pos_embedding": weights["positional_encoding.pos_embedding"].flip(-1)}


ENCODER_0, DECODER_0 = "transformer.encoder.layers.0.", "transformer.decoder.layers.0."


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (added(ENCODER_0 + "self_attn.q_proj_weight", torch.ones(32, 32)), ValueError, "match no rule"),
        (without(lambda key: key == DECODER_0 + "linear2.bias"), ValueError, "lacks"),
        (without(lambda key: key.endswith(".bias")), NotImplementedError, "bias=False"),
        (without(lambda key: key.startswith("generator")), ValueError, "generator.weight"),
        (added("transformer.decoder.layers.2.linear1.weight", torch.ones(64, 32)), ValueError, "numbered"),
        (added("transformer.encoder.layers.1.linear1.weight", torch.ones(48, 32)), ValueError, "shape"),
        (flipped_positions, NotImplementedError, "interleaved"),
    ],
    ids=["leftover", "missing", "bias-false", "not-the-tutorial", "layer-gap", "shape", "positions"],
)
def test_weights_that_do_not_fit_are_refused(tmp_path: Path, change, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        nn_transformer.load_nn_transformer(options(saved(tmp_path, change)))


def test_unsupported_options_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="`activation=tanh` is not supported"):
        nn_transformer.load_nn_transformer(options(activation="tanh"))
    with pytest.raises(ValueError, match="divisible"):
        nn_transformer.load_nn_transformer(options(heads=5))


def test_tied_weights_are_recognised(tmp_path: Path) -> None:
    """The tutorial unties everything; a user's variant may tie the generator to the target embedding."""
    source = saved(tmp_path, lambda w: {**w, "generator.weight": w["tgt_tok_emb.embedding.weight"].clone()})
    model = nn_transformer.load_nn_transformer(options(source)).model
    assert model.config.tie_word_embeddings and not model.config.share_encoder_decoder_embeddings
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight


class NotAllowed:
    """A class a weights-only load must refuse to build."""


def test_checkpoints_load_without_running_pickled_code(tmp_path: Path) -> None:
    torch.save({"model": NotAllowed()}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="weights-only"):
        nn_transformer.load_nn_transformer(options(tmp_path / "model.pt"))
    torch.save({"epoch": 3}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="no state dict"):
        nn_transformer.load_nn_transformer(options(tmp_path / "model.pt"))
    weights = safe_torch_load(FIXTURE / "model.pt")
    torch.save({"model_state_dict": weights, "epoch": 3}, tmp_path / "model.pt")  # a training script's checkpoint
    assert nn_transformer.load_nn_transformer(options(tmp_path / "model.pt")).model.config.d_model == 32


def test_vocabulary_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text(json.dumps(["<unk>", "<pad>", "<bos>", "<eos>", "a"]))
    with pytest.raises(ValueError, match="24 rows"):
        nn_transformer.load_nn_transformer(options(src_vocab=tmp_path / "vocab.json"))
    (tmp_path / "vocab.txt").write_text("<unk>\n<pad>\n<unk>\n")
    with pytest.raises(ValueError, match="twice"):
        nn_transformer.load_nn_transformer(options(tgt_vocab=tmp_path / "vocab.txt"))


def test_command_line_reports_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = saved(tmp_path, lambda w: {**w, "extra.weight": torch.ones(2)})
    with pytest.raises(SystemExit) as exit_info:
        main(["nn-transformer", str(source), str(tmp_path / "out"), "--heads", "4"])
    assert exit_info.value.code == 2
    assert "extra.weight" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
