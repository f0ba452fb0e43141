"""OpenNMT-py `transformer` import (conversion/opennmt.py), checked against OpenNMT-py's own outputs.

The oracle is conversion/reference/opennmt_tiny/, written by make_opennmt_reference.py with OpenNMT-py 3.5.1 itself
(two tiny models trained by onmt_train on digit-reversal data; see its README.md); OpenNMT-py is not needed here.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_vanilla_transformer
from conversion import opennmt
from conversion.__main__ import main
from conversion._common import Converted, reference_logits, safe_torch_load
from hf_vanilla_transformer.model.modeling_vanilla_transformer import sinusoid_table

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "conversion" / "reference" / "opennmt_tiny"
SEPARATE, SHARED = "separate_interleaved_nobias", "shared_concat_bias"
VARIANTS = (SEPARATE, SHARED)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decoding a d_model-32 model is thousands of tiny ops: one thread is faster than two that contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def converted(name: str) -> Converted:
    return opennmt.load_opennmt(REFERENCE / name / "model.pt")


@functools.cache
def generations(name: str) -> dict:
    return json.loads((REFERENCE / name / "generations.json").read_text())


def hypotheses(sequences: torch.Tensor, eos: int, limits: list[int]) -> list[list[int]]:
    """onmt_translate's form of generated rows: without the decoder start, up to and including the first </s>,
    at most each sentence's own length limit."""
    out = []
    for row, limit in zip(sequences.tolist(), limits, strict=True):
        row = row[1:]
        out.append((row[: row.index(eos) + 1] if eos in row else row)[:limit])
    return out


def translate(model, tokenizer, sources: list[str], limits: list[int], beams: int) -> list[list[int]]:
    """Our model with onmt_translate's settings; each row cut at its own limit (rows decode independently)."""
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    generation = opennmt.generation_config(model.config, beam=beams, max_length=max(limits))
    with torch.no_grad():
        output = model.generate(**batch, generation_config=generation)
    return hypotheses(output, model.config.eos_token_id, limits)


# ------------------------------------------------------------------------------------------ against OpenNMT-py
@pytest.mark.parametrize("name", VARIANTS)
def test_teacher_forced_logits_match_opennmt(name: str) -> None:
    """float64: the conversion itself; fp32 logits and log-probabilities: both implementations' rounding."""
    diffs = reference_logits(converted(name).model, REFERENCE / name / "teacher_forced.safetensors", 1e-5, 1e-5)
    assert set(diffs) == {"fp64", "fp32", "log_probs"}
    assert all(diff < 1e-5 for diff in diffs.values()), diffs


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_matches_onmt_translate(name: str) -> None:
    result = converted(name)
    expected = generations(name)
    limits = expected["greedy"]["max_length"]
    found = translate(result.model, result.tokenizers[""], expected["sources"], limits, beams=1)
    assert found == expected["greedy"]["ids"]
    target = result.tokenizers.get(opennmt.TARGET_TOKENIZER, result.tokenizers[""])
    assert target.batch_decode(found, skip_special_tokens=True) == expected["greedy"]["text"]


def test_beam5_matches_onmt_translate() -> None:
    """onmt_translate's default beam (5, no length penalty) on the confident model: all 40 agree. Not asserted on
    the 60%-accurate `shared_concat_bias` model, where the two searches part (22-24 of 40 agree, and most of ours
    are more probable): OpenNMT-py's finished hypotheses keep their beam slot, transformers' free it."""
    result = converted(SEPARATE)
    expected = generations(SEPARATE)
    limits = expected["beam5"]["max_length"]
    found = translate(result.model, result.tokenizers[""], expected["sources"], limits, beams=5)
    assert found == expected["beam5"]["ids"]


@pytest.mark.parametrize("name", VARIANTS)
def test_tokenizer_gives_opennmt_source_ids(name: str) -> None:
    """Whitespace split, nothing appended, unknown tokens to <unk>: the ids OpenNMT-py fed its encoder."""
    reference = load_file(REFERENCE / name / "teacher_forced.safetensors")
    tokenizer = converted(name).tokenizers[""]
    for i, source in enumerate(generations(name)["sources"][: reference["input_ids"].shape[0]]):
        expected = reference["input_ids"][i][reference["attention_mask"][i].bool()].tolist()
        assert tokenizer(source)["input_ids"] == expected
    assert tokenizer("never_seen")["input_ids"] == [tokenizer.unk_token_id]
    assert (tokenizer.pad_token, tokenizer.unk_token, tokenizer.eos_token) == ("<blank>", "<unk>", "</s>")


# ----------------------------------------------------------------------------------------------- the settings
def test_default_opennmt_settings_map_to_config() -> None:
    """OpenNMT-py 3.5's defaults: pre-LN + final LayerNorms, eps 1e-6, interleaved sinusoids from position 0,
    scaled embeddings, untied embeddings over separate vocabularies, no projection biases (zeros here)."""
    result = converted(SEPARATE)
    config, model = result.model.config, result.model
    assert config.normalize_before and config.add_final_layer_norm and config.scale_embedding
    assert (config.sinusoidal_layout, config.position_offset, config.layer_norm_eps) == ("interleaved", 0, 1e-6)
    assert not config.share_encoder_decoder_embeddings and not config.tie_word_embeddings and config.lm_head_bias
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.encoder_ffn_dim) == (2, 2, 32, 64)
    assert config.decoder_start_token_id == result.tokenizers[""].convert_tokens_to_ids("<s>")
    assert opennmt.TARGET_TOKENIZER in result.tokenizers
    biases = [p for n, p in model.named_parameters() if n.endswith(("proj.bias", "fc1.bias", "fc2.bias"))]
    assert len(biases) == 2 * 6 + 2 * 10 and all(not bias.any() for bias in biases)
    assert model.lm_head.bias.abs().sum() > 0


def test_shared_concat_biased_settings_map_to_config() -> None:
    result = converted(SHARED)
    config, model = result.model.config, result.model
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert (config.sinusoidal_layout, config.position_offset) == ("fairseq", 0)  # [sin | cos], 10000^(-k/(d/2-1))
    assert (config.activation_function, config.layer_norm_eps) == ("gelu", 1e-5)
    assert (config.encoder_layers, config.decoder_layers, config.d_model) == (2, 1, 16)
    assert model.model.encoder.layers[0].self_attn.k_proj.bias.abs().sum() > 0
    assert list(result.tokenizers) == [""]  # one vocabulary, one tokenizer


# ------------------------------------------------------------------------------------------- the written folder
@pytest.mark.parametrize("name", VARIANTS)
def test_command_line_writes_a_hub_ready_folder(name: str, tmp_path: Path) -> None:
    output = tmp_path / name
    source = REFERENCE / name / "model.pt"
    reference = REFERENCE / name / "teacher_forced.safetensors"
    assert main(["opennmt", str(source), str(output), "--reference", str(reference), "--atol-fp32", "1e-5"]) == 0
    names = {path.relative_to(output).as_posix() for path in output.rglob("*") if path.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert ("target_tokenizer/tokenizer.json" in names) == (name == SEPARATE)
    assert not [path for path in names if path.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    card = (output / "README.md").read_text()
    assert generations(name)["fixture_checkpoint_sha256"] in card and "OpenNMT-py" in card and "fp64" in card
    model = AutoModelForSeq2SeqLM.from_pretrained(output, use_safetensors=True).eval()
    assert isinstance(model, hf_vanilla_transformer.VanillaTransformerForConditionalGeneration)
    generation = model.generation_config
    assert (generation.num_beams, generation.length_penalty, generation.max_new_tokens) == (5, 0.0, 250)
    tokenizer = AutoTokenizer.from_pretrained(output)
    expected = generations(name)["greedy"]
    batch = tokenizer(generations(name)["sources"][:8], return_tensors="pt", padding=True)
    with torch.no_grad():
        output_ids = model.generate(**batch, num_beams=1)
    assert hypotheses(output_ids, model.config.eos_token_id, expected["max_length"][:8]) == expected["ids"][:8]


# ---------------------------------------------------------------------------------------------- refusals
def tiny_checkpoint(tmp_path: Path, name: str = SEPARATE, weights=None, vocab=None, **settings: object) -> Path:
    """A fixture checkpoint with changed options (or weights, or vocabulary), saved as OpenNMT-py saves one."""
    state = safe_torch_load(REFERENCE / name / "model.pt", [argparse.Namespace])
    for key, value in settings.items():
        setattr(state["opt"], key, value)
    if weights is not None:
        state["model"] = weights(dict(state["model"]))
    if vocab is not None:
        state["vocab"] = vocab(dict(state["vocab"]))
    torch.save(state, tmp_path / "model.pt")
    return tmp_path / "model.pt"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_relative_positions": 20}, "max_relative_positions=20"),
        ({"max_relative_positions": -1}, "rotary"),
        ({"max_relative_positions": -2}, "ALiBi"),
        ({"relative_positions_buckets": 32}, "relative_positions_buckets"),
        ({"layer_norm": "rms"}, "RMSNorm"),
        ({"position_encoding": False}, "position_encoding=False"),
        ({"position_encoding_type": "Learned"}, "position_encoding_type"),
        ({"pos_ffn_activation_fn": "silu"}, "silu"),
        ({"pos_ffn_activation_fn": "gated-gelu"}, "gated-gelu"),
        ({"self_attn_type": "average"}, "average"),
        ({"copy_attn": True}, "copy_attn"),
        ({"parallel_residual": True}, "parallel_residual"),
        ({"num_kv": 1}, "num_kv"),
        ({"multiquery": True}, "multiquery"),
        ({"num_experts": 4}, "num_experts"),
        ({"sliding_window": 16}, "sliding_window"),
        ({"n_src_feats": 1}, "n_src_feats"),
        ({"lora_layers": ["linear_values"]}, "lora_layers"),
        ({"encoder_type": "rnn"}, "encoder_type"),
        ({"decoder_type": "cnn"}, "decoder_type"),
        ({"model_task": "lm"}, "model_task"),
        ({"hidden_size": -1, "dec_hid_size": 64}, "dec_hid_size=64"),
    ],
    ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None,
)
def test_unsupported_settings_are_refused(tmp_path: Path, settings: dict, named: str) -> None:
    with pytest.raises(NotImplementedError, match=named):
        opennmt.load_opennmt(tiny_checkpoint(tmp_path, **settings))


def onmt_table(positions: int, dim: int) -> torch.Tensor:
    """§3.5's interleaved table computed in float32 throughout, as OpenNMT-py's PositionalEncoding stores it."""
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float) * -(math.log(10000.0) / dim))
    angles = torch.arange(positions).unsqueeze(1).float() * div_term
    table = torch.zeros(positions, dim)
    table[:, 0::2], table[:, 1::2] = torch.sin(angles), torch.cos(angles)
    return table.unsqueeze(1)  # (max_len, 1, dim), OpenNMT-py's buffer shape


def test_stored_position_tables_are_checked_and_dropped(tmp_path: Path) -> None:
    """A checkpoint as onmt_train saves it (with its 5000-row tables) converts to the same model; a table of
    another layout than position_encoding_type names is refused."""
    table = {f"{stack}.embeddings.make_embedding.pe.pe": onmt_table(5000, 32) for stack in ("encoder", "decoder")}
    full = opennmt.load_opennmt(tiny_checkpoint(tmp_path, weights=lambda w: {**w, **table}))
    reference = REFERENCE / SEPARATE / "teacher_forced.safetensors"
    assert reference_logits(full.model, reference, 1e-5, 1e-5)["fp64"] < 1e-5
    concat = {"decoder.embeddings.make_embedding.pe.pe": sinusoid_table(5000, 32, "concat").unsqueeze(1)}
    with pytest.raises(ValueError, match="SinusoidalInterleaved table"):
        opennmt.load_opennmt(tiny_checkpoint(tmp_path, weights=lambda w: {**w, **concat}))


def drop(key: str):
    return lambda weights: {k: v for k, v in weights.items() if k != key}


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        (
            SEPARATE,
            lambda w: {
                **w,
                "decoder.transformer_layers.0.self_attn.relative_positions_embeddings.weight": torch.ones(3),
            },
            "match no rule",
        ),
        (SEPARATE, drop("decoder.transformer_layers.1.feed_forward.w_2.weight"), "lacks"),
        (
            SEPARATE,
            lambda w: {**w, "encoder.transformer.0.self_attn.linear_keys.bias": torch.zeros(32)},
            "add_qkvbias",
        ),
        (SHARED, drop("decoder.transformer_layers.0.context_attn.linear_query.bias"), "lacks"),
        (SHARED, drop("encoder.transformer.1.feed_forward.w_1.bias"), "lacks"),
        (
            SHARED,
            lambda w: {
                **w,
                "decoder.embeddings.make_embedding.emb_luts.0.weight": torch.zeros_like(
                    w["decoder.embeddings.make_embedding.emb_luts.0.weight"]
                ),
            },
            "tied",
        ),
        (SEPARATE, lambda w: {**w, "encoder.transformer.0.feed_forward.w_1.weight": torch.zeros(65, 32)}, "shape"),
    ],
    ids=["leftover", "missing", "bias-without-add_qkvbias", "missing-qkv-bias", "missing-ffn-bias", "untied", "shape"],
)
def test_weights_that_do_not_fit_are_refused(tmp_path: Path, name: str, change, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        opennmt.load_opennmt(tiny_checkpoint(tmp_path, name, weights=change))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda v: {**v, "tgt": [*v["tgt"], "extra"]}, "rows"),
        (lambda v: {**v, "src": [*v["src"][:-1], v["src"][4]]}, "twice"),
        (lambda v: {**v, "src": [token for token in v["src"] if token != "<blank>"] + ["x"]}, "<blank>"),
        (lambda v: {**v, "src_feats": [["a"]]}, "src_feats"),
    ],
    ids=["size", "duplicate", "no-pad", "features"],
)
def test_vocabularies_that_do_not_fit_are_refused(tmp_path: Path, change, message: str) -> None:
    with pytest.raises((ValueError, NotImplementedError), match=message):
        opennmt.load_opennmt(tiny_checkpoint(tmp_path, vocab=change))


class NotAllowed:
    """A class a weights-only load must refuse to build."""


def test_checkpoints_load_without_running_pickled_code(tmp_path: Path) -> None:
    state = safe_torch_load(REFERENCE / SEPARATE / "model.pt", [argparse.Namespace])
    state["optim"] = NotAllowed()
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="weights-only"):
        opennmt.load_opennmt(tmp_path / "model.pt")


def test_other_files_are_refused(tmp_path: Path) -> None:
    torch.save({"model": {}, "args": argparse.Namespace()}, tmp_path / "model.pt")
    with pytest.raises(ValueError, match=r"not an OpenNMT-py 3\.x checkpoint"):
        opennmt.load_opennmt(tmp_path / "model.pt")


def test_command_line_reports_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    source = tiny_checkpoint(tmp_path / "in", layer_norm="rms")
    with pytest.raises(SystemExit) as exit_info:
        main(["opennmt", str(source.parent), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "layer_norm='rms'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
