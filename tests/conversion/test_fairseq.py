"""fairseq `transformer` import (conversion/fairseq.py), checked against fairseq's own outputs.

The oracle is conversion/reference/, written by make_fairseq_reference.py with fairseq 0.12.2 itself; fairseq is not
needed here. Inputs are the fixture's binarized test split (../shared/fixtures/fairseq_transformer_sym2math), read
with a small reader of fairseq's mmap format below.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessorList

import hf_vanilla_transformer
from conversion import fairseq
from conversion.__main__ import main
from conversion._common import reference_logits, safe_torch_load, verify_logits

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "fairseq_transformer_sym2math"
REFERENCE = ROOT / "conversion" / "reference"
TINY = ("fairseq_tiny_shareall_preln_learned", "fairseq_tiny_sharedecoder_unscaled")
needs_fixture = pytest.mark.skipif(not FIXTURE.is_dir(), reason=f"{FIXTURE} not found (../shared beside the clone)")


def read_binarized(prefix: Path) -> list[torch.Tensor]:
    """Sentences of a fairseq mmap indexed dataset (.idx header: magic, version, dtype code, count; then int32
    sizes and int64 byte offsets into .bin)."""
    index = Path(f"{prefix}.idx").read_bytes()
    assert index[:9] == b"MMIDIDX\x00\x00"
    dtype = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}[index[17]]
    count = int(np.frombuffer(index, np.uint64, 1, 18)[0])
    sizes = np.frombuffer(index, np.int32, count, 26)
    offsets = np.frombuffer(index, np.int64, count, 26 + 4 * count)
    data = np.fromfile(f"{prefix}.bin", dtype=dtype)
    step = np.dtype(dtype).itemsize
    return [
        torch.from_numpy(data[o // step : o // step + s].astype(np.int64)) for o, s in zip(offsets, sizes, strict=True)
    ]


def right_padded(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    input_ids = torch.full((len(rows), max(map(len, rows))), fairseq.PAD)
    attention_mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], attention_mask[i, : len(row)] = row, 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def hypotheses(sequences: torch.Tensor) -> list[list[int]]:
    """fairseq's form of generated rows: without the decoder start, up to and including the first </s>."""
    out = []
    for row in sequences.tolist():
        row = row[1:]
        out.append(row[: row.index(fairseq.EOS) + 1] if fairseq.EOS in row else row)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Decoding a d_model-40 model is thousands of tiny ops: one thread is several times faster than two that
    contend with other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture converted through the command line, verified against fairseq's logits on the way."""
    output = tmp_path_factory.mktemp("fairseq") / "sym2math"
    reference = REFERENCE / "fairseq_sym2math" / "teacher_forced.safetensors"
    assert main(["fairseq", str(FIXTURE), str(output), "--reference", str(reference), "--atol-fp32", "5e-5"]) == 0
    return output


@pytest.fixture(scope="module")
def model(folder: Path):
    return AutoModelForSeq2SeqLM.from_pretrained(folder, use_safetensors=True).eval()


@pytest.fixture(scope="module")
def test_sources() -> list[torch.Tensor]:
    return read_binarized(FIXTURE / "data-bin" / "test.sym-math.sym")[:100]


@pytest.fixture(scope="module")
def generations() -> dict:
    return json.loads((REFERENCE / "fairseq_sym2math" / "generations.json").read_text())


# ------------------------------------------------------------------------------------------------ the fixture
@needs_fixture
def test_folder_is_hub_ready_and_loads_with_auto_classes(folder: Path, model) -> None:
    assert isinstance(model, hf_vanilla_transformer.VanillaTransformerForConditionalGeneration)
    names = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}
    assert {"model.safetensors", "config.json", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert "target_tokenizer/tokenizer.json" in names  # separate source/target dictionaries
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    card = (folder / "README.md").read_text()
    assert "7bb7c443f9f80edf3afd296b26368da34251942fe2e47091c14a0566d1d27aae" in card  # the checkpoint, by hash
    assert "fp64" in card and "fp32" in card  # the measured differences
    config = model.config
    assert (config.sinusoidal_layout, config.position_offset, config.decoder_start_token_id) == ("fairseq", 2, 2)
    assert not config.share_encoder_decoder_embeddings and not config.tie_word_embeddings
    generation = model.generation_config
    assert (generation.num_beams, generation.length_penalty, generation.early_stopping) == (5, 1.0, True)
    assert (generation.max_new_tokens, generation.min_new_tokens, generation.suppress_tokens) == (201, 1, [1])


@needs_fixture
def test_reference_inputs_are_the_fixture_test_sentences(test_sources: list[torch.Tensor]) -> None:
    reference = load_file(REFERENCE / "fairseq_sym2math" / "teacher_forced.safetensors")
    targets = read_binarized(FIXTURE / "data-bin" / "test.sym-math.math")
    for i in range(reference["input_ids"].shape[0]):
        assert torch.equal(reference["input_ids"][i][reference["attention_mask"][i].bool()], test_sources[i])
        decoder_input = torch.cat([torch.tensor([fairseq.EOS]), targets[i][:-1]])
        assert torch.equal(
            reference["decoder_input_ids"][i][reference["decoder_attention_mask"][i].bool()], decoder_input
        )


@needs_fixture
def test_teacher_forced_logits_match_fairseq(model) -> None:
    """float64: the conversion itself (fairseq keeps its softmax in fp32, hence ~4e-7); fp32: each implementation's
    rounding alone is ~1.5e-5 from the exact logits (|logit| up to 28), so two differ by up to ~2e-5."""
    diffs = reference_logits(model, REFERENCE / "fairseq_sym2math" / "teacher_forced.safetensors", 1e-5, 5e-5)
    assert diffs["fp64"] < 1e-5 and diffs["fp32"] < 5e-5


@needs_fixture
def test_greedy_matches_fairseq_on_100_test_sentences(model, test_sources, generations) -> None:
    with torch.no_grad():
        output = model.generate(**right_padded(test_sources), num_beams=1)
    assert hypotheses(output) == generations["greedy"]["tokens"]  # most run to the limit: 200 tokens + forced </s>


@needs_fixture
def test_beam5_matches_fairseq_on_100_test_sentences(model, test_sources, generations) -> None:
    """The saved generation config alone (beam 5, lenpen 1, early stopping as fairseq's). All 100 agree; the
    threshold leaves room for near-ties that fp32 rounding may break differently."""
    found = []
    for start in range(0, 100, 50):
        with torch.no_grad():
            found += hypotheses(model.generate(**right_padded(test_sources[start : start + 50])))
    same = sum(ours == theirs for ours, theirs in zip(found, generations["beam5"]["tokens"], strict=True))
    assert same >= 95, f"beam-5 output equals fairseq's on {same}/100 sentences"


@needs_fixture
def test_tokenizers_keep_fairseq_ids(folder: Path, test_sources, generations) -> None:
    source = AutoTokenizer.from_pretrained(folder)
    target = AutoTokenizer.from_pretrained(folder, subfolder=fairseq.TARGET_TOKENIZER)
    for tokenizer, language in ((source, "sym"), (target, "math")):
        dictionary = (FIXTURE / "data-bin" / f"dict.{language}.txt").read_text().splitlines()
        words = [line.rsplit(" ", 1)[0] for line in dictionary]
        assert tokenizer(" ".join(words))["input_ids"] == [*range(4, 4 + len(words)), fairseq.EOS]
    for ids in test_sources[:8]:  # text -> ids round trip, </s> appended as fairseq's encode_line does
        text = source.decode(ids, skip_special_tokens=True)
        assert source(text)["input_ids"] == ids.tolist()
    greedy = generations["greedy"]["tokens"][0]
    assert target(target.decode(greedy, skip_special_tokens=True))["input_ids"] == greedy
    assert source("never_seen")["input_ids"] == [fairseq.UNK, fairseq.EOS]


# ----------------------------------------------------------- tiny checkpoints saved by fairseq's Trainer (cfg)
@pytest.mark.parametrize("name", TINY)
def test_cfg_format_checkpoints_match_fairseq(name: str) -> None:
    """New-format checkpoints covering share-all + pre-LN + learned positions + GELU + asymmetric stacks, and
    decoder-only tying + unscaled embeddings + separate vocabularies. With fairseq's end at the length limit
    (FairseqEOSAtMaxLength), tokens and beam scores match too; transformers' forced </s> (log-prob 0) re-ranks
    beams that reach the limit and changes one of the eight first-variant beam outputs."""
    folder = REFERENCE / name
    converted = fairseq.load_fairseq(*fairseq.locate(folder, None, None))
    model, settings = converted.model, converted.settings
    reference_logits(model, folder / "teacher_forced.safetensors", 1e-5, 5e-5)
    reference = load_file(folder / "teacher_forced.safetensors")
    expected = json.loads((folder / "generations.json").read_text())
    generation = fairseq.generation_config(model.config, settings["max_target_positions"])
    inputs = {"input_ids": reference["input_ids"], "attention_mask": reference["attention_mask"]}
    for key, beams in (("greedy", 1), ("beam5", 5)):
        limit = LogitsProcessorList([fairseq.FairseqEOSAtMaxLength(generation.max_new_tokens, fairseq.EOS)])
        with torch.no_grad():
            output = model.generate(
                **inputs,
                generation_config=generation,
                num_beams=beams,
                forced_eos_token_id=None,
                logits_processor=limit,
                output_scores=True,
                return_dict_in_generate=True,
            )
        assert hypotheses(output.sequences) == expected[key]["tokens"]
        if beams > 1:
            torch.testing.assert_close(output.sequences_scores, torch.tensor(expected[key]["scores"]))


def test_cfg_format_settings_map_to_config() -> None:
    folder = REFERENCE / "fairseq_tiny_shareall_preln_learned"
    config = fairseq.load_fairseq(*fairseq.locate(folder, None, None)).model.config
    assert config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert config.normalize_before and config.add_final_layer_norm
    assert (config.position_embedding_type, config.activation_function) == ("learned", "gelu")
    assert (config.encoder_layers, config.decoder_layers) == (2, 1)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (4, 2)


@needs_fixture
def test_legacy_weight_names_convert_to_the_same_logits(tmp_path: Path) -> None:
    """fairseq < 0.7 names: one fused in_proj per attention, numbered layer_norms, `embed_out`; same numbers."""
    state = safe_torch_load(FIXTURE / "checkpoint_best.pt", [argparse.Namespace])
    legacy = {}
    for key, tensor in state["model"].items():
        stack, _, rest = key.partition(".layers.")
        if key.endswith(("q_proj.weight", "q_proj.bias")):
            kind = key.rsplit(".", 1)[1]
            base = key[: -len(f"q_proj.{kind}")]
            fused = [state["model"][f"{base}{p}_proj.{kind}"] for p in "qkv"]
            legacy[f"{base}in_proj_{kind}"] = torch.cat(fused)
        elif key.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            continue
        elif "_layer_norm." in key and rest:
            order = ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"]
            if stack == "encoder":
                order.remove("encoder_attn_layer_norm")
            layer, name, kind = rest.split(".")
            legacy[f"{stack}.layers.{layer}.layer_norms.{order.index(name)}.{kind}"] = tensor
        elif key == "decoder.output_projection.weight":
            legacy["decoder.embed_out"] = tensor
        else:
            legacy[key] = tensor
    state["model"] = legacy
    torch.save(state, tmp_path / "checkpoint_best.pt")
    converted = fairseq.load_fairseq(tmp_path / "checkpoint_best.pt", FIXTURE / "data-bin")
    diffs = reference_logits(
        converted.model, REFERENCE / "fairseq_sym2math" / "teacher_forced.safetensors", 1e-5, 5e-5
    )
    assert diffs["fp64"] < 1e-5


# ---------------------------------------------------------------------------------------------- refusals
def tiny_checkpoint(tmp_path: Path, fmt: str = "cfg", weights=None, **settings: object) -> Path:
    """The real tiny `sharedecoder_unscaled` checkpoint with changed settings (or weights), saved as fmt."""
    source = REFERENCE / "fairseq_tiny_sharedecoder_unscaled"
    state = safe_torch_load(source / "checkpoint_last.pt", [argparse.Namespace])
    model_settings = state["cfg"]["model"]
    for key, value in settings.items():
        setattr(model_settings, key, value)
    if fmt == "args":
        state = {"args": model_settings, "model": state["model"]}
    if weights is not None:
        state["model"] = weights(dict(state["model"]))
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_text((source / name).read_text())
    torch.save(state, tmp_path / "checkpoint_last.pt")
    return tmp_path


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"layernorm_embedding": True}, "layernorm_embedding"),
        ({"adaptive_softmax_cutoff": "8,16"}, "adaptive_softmax_cutoff"),
        ({"no_token_positional_embeddings": True}, "no_token_positional_embeddings"),
        ({"quant_noise_pq": 0.1}, "quant_noise_pq"),
        ({"cross_self_attention": True}, "cross_self_attention"),
        ({"decoder_embed_dim": 16}, "decoder_embed_dim"),
        ({"decoder_normalize_before": True}, "normalize_before"),
        ({"encoder_learned_pos": True}, "learned_pos"),
        ({"activation_fn": "tanh"}, "tanh"),
        ({"arch": "lstm"}, "lstm"),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else None,
)
@pytest.mark.parametrize("fmt", ["cfg", "args"])
def test_unsupported_settings_are_refused(tmp_path: Path, settings: dict, named: str, fmt: str) -> None:
    source = tiny_checkpoint(tmp_path, fmt, **settings)
    with pytest.raises(NotImplementedError, match=named):
        fairseq.load_fairseq(*fairseq.locate(source, None, None))


def test_pre_ln_without_decoder_final_norm_is_refused(tmp_path: Path) -> None:
    source = tiny_checkpoint(
        tmp_path, encoder_normalize_before=True, decoder_normalize_before=True, no_decoder_final_norm=True
    )
    with pytest.raises(NotImplementedError, match="final LayerNorm"):
        fairseq.load_fairseq(*fairseq.locate(source, None, None))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda w: {**w, "decoder.layernorm_embedding.weight": torch.ones(12)}, "match no rule"),
        (lambda w: {k: v for k, v in w.items() if k != "decoder.layers.1.fc2.bias"}, "lacks"),
        (
            lambda w: {**w, "decoder.output_projection.weight": torch.zeros_like(w["decoder.embed_tokens.weight"])},
            "tied",
        ),
        (lambda w: {**w, "encoder.embed_positions.weight": torch.zeros(1026, 12)}, "no place"),
        (lambda w: {**w, "encoder.layers.0.fc1.weight": torch.zeros(21, 12)}, "shape"),
    ],
    ids=["leftover", "missing", "untied-copy", "unexpected", "shape"],
)
def test_weights_that_do_not_fit_are_refused(tmp_path: Path, change, message: str) -> None:
    source = tiny_checkpoint(tmp_path, weights=change)
    with pytest.raises(ValueError, match=message):
        fairseq.load_fairseq(*fairseq.locate(source, None, None))


class NotAllowed:
    """A class a weights-only load must refuse to build."""


def test_checkpoints_load_without_running_pickled_code(tmp_path: Path) -> None:
    state = safe_torch_load(
        REFERENCE / "fairseq_tiny_sharedecoder_unscaled" / "checkpoint_last.pt", [argparse.Namespace]
    )
    state["extra_state"] = NotAllowed()
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(ValueError, match="weights-only"):
        fairseq.load_fairseq(tmp_path / "model.pt", REFERENCE / "fairseq_tiny_sharedecoder_unscaled")


@pytest.mark.parametrize(
    ("lines", "error", "message"),
    [
        ("a 1\na 2\n", ValueError, "duplicate"),
        ("a 1\na 2 #fairseq:overwrite\n", NotImplementedError, "two ids"),
        ("a\n", ValueError, "expected"),
    ],
)
def test_malformed_dictionaries_are_refused(tmp_path: Path, lines: str, error: type, message: str) -> None:
    (tmp_path / "dict.x.txt").write_text(lines)
    with pytest.raises(error, match=message):
        fairseq.read_dictionary(tmp_path / "dict.x.txt")


def test_dictionary_keeps_fairseq_order_and_special_ids(tmp_path: Path) -> None:
    (tmp_path / "dict.x.txt").write_text("b 5\n-1 3\nmadeupword0000 0\n")
    assert fairseq.read_dictionary(tmp_path / "dict.x.txt") == [
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
        "b",
        "-1",
        "madeupword0000",
    ]


# ---------------------------------------------------------------------------------------------- command line
def test_help_lists_the_formats(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m conversion --help`, run in this interpreter (a fresh one spends seconds importing torch)."""
    monkeypatch.setattr(sys, "argv", ["python -m conversion", "--help"])
    monkeypatch.delitem(sys.modules, "conversion.__main__")  # imported above; runpy executes it afresh
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("conversion", run_name="__main__")
    assert exit_info.value.code == 0
    assert "fairseq" in capsys.readouterr().out


def test_command_line_reports_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    source = tiny_checkpoint(tmp_path / "in", layernorm_embedding=True)
    with pytest.raises(SystemExit) as exit_info:
        main(["fairseq", str(source), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "layernorm_embedding" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_verify_logits_reports_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    """The measured difference is returned, not printed (the command line prints `finish`'s report)."""
    reference = torch.zeros(2, 3, 5)
    ours = reference.clone()
    ours[1, 2] = 1.0  # a padded position, masked out below
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert verify_logits(reference, ours, 1e-5, mask=mask) == 0.0
    assert verify_logits(reference, ours, 1.0) == 1.0
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match=r"what: max \|Δ\| = 1.000e\+00 exceeds atol 1e-05"):
        verify_logits(reference, ours, 1e-5, what="what")
    with pytest.raises(ValueError, match="exceeds atol"):
        verify_logits(reference, ours, 1e-5)
    with pytest.raises(ValueError, match="exceeds atol"):
        verify_logits(reference, torch.full_like(reference, float("nan")), 1e-5)
