"""ONNX export (`python -m conversion to-onnx`, conversion/onnx.py) run with onnxruntime: the same greedy tokens as
our `generate`. One tiny random model exported once per module (a few seconds)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime  # noqa: F401  the onnx extra, in dev (CI installs it): missing, every test here fails, none skips
import onnxscript  # noqa: F401
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import GenerationConfig

from conversion import onnx as onnx_export
from conversion.__main__ import main
from conversion.onnx import OnnxOptions, OnnxTranslator, decoding_note, verify
from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.errors import OptionError
from hf_vanilla_transformer.files import MANIFEST, write_manifest
from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config

from ..conftest import random_batch, tiny_model, tiny_tokenizer

# Batches of right-padded rows of different lengths: (batch, source length, seed).
BATCHES = [(4, 11, 1), (3, 5, 2), (1, 7, 3), (6, 14, 4)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[VanillaTransformerForConditionalGeneration, Path]:
    """A tiny model whose greedy output depends on its input (a random post-LN model with the paper's small init
    decodes the same tokens for every source; stronger encoder and cross-attention weights make the rows differ),
    saved with a tokenizer and exported through the command line."""
    model = tiny_model(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "encoder_attn" in name or "encoder.layers" in name:
                parameter.mul_(4)
    root = tmp_path_factory.mktemp("onnx")
    model.save_pretrained(root / "model")
    tiny_tokenizer().save_pretrained(root / "model")
    assert main(["to-onnx", str(root / "model"), str(root / "onnx"), "--max-positions", "64"]) == 0
    return model, root / "onnx"


def test_folder_holds_graphs_configs_tokenizer_and_readme(exported: tuple) -> None:
    _, folder = exported
    names = {path.name for path in folder.iterdir()}
    expected = {"encoder.onnx", "decoder.onnx", "onnx_config.json", "config.json", "generation_config.json"}
    assert expected | {"tokenizer.json", "README.md"} <= names
    assert "model.safetensors" not in names
    assert "OnnxTranslator" in (folder / "README.md").read_text()


def test_card_states_the_verified_difference_and_how_to_run_it(exported: tuple) -> None:
    """The shared `finish` step's model card: Hub metadata of an ONNX folder, the difference the export was
    verified with (measured again here: onnxruntime and torch are deterministic on the same inputs), the source's
    architecture, how to run the graphs with onnxruntime, and what the greedy loop keeps of the decoding."""
    model, folder = exported
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "onnx" and "onnx" in card.data.tags and card.data.pipeline_tag == "translation"
    measured = verify(model, folder, 1e-4)
    assert 0 < measured < 1e-4
    assert f"max abs logit difference to the PyTorch model: {measured:.1e} (fp32)" in card.text
    assert f"| d_model | {model.config.d_model} | 512 |" in card.text
    assert f'OnnxTranslator("{folder}")' in card.text and "`decoder.onnx`: one step" in card.text
    assert decoding_note(model.generation_config) in card.text


def test_decoding_note_says_what_greedy_keeps_of_the_papers_decoding() -> None:
    """§6.1: beam 4, GNMT length penalty 0.6, source length + 50; the export keeps the limit, not the beam."""
    note = decoding_note(paper_generation_config(tiny_model().config))
    assert "§6.1's per-sentence length limit (source length + 50)" in note
    assert "Beam search (beam size 4, GNMT length penalty α 0.6) is not part of the export" in note
    greedy = decoding_note(GenerationConfig(num_beams=1, max_new_tokens=20, forced_eos_token_id=2))
    assert "pad ids; the length limit; the EOS forced at the limit." in greedy and "Beam" not in greedy


@pytest.mark.parametrize(("batch", "length", "seed"), BATCHES)
def test_greedy_tokens_equal_ours(exported: tuple, batch: int, length: int, seed: int) -> None:
    model, folder = exported
    inputs = random_batch(batch=batch, src_len=length, seed=seed)
    with torch.no_grad():
        ours = model.generate(
            inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            num_beams=1,
            do_sample=False,
            max_new_tokens=12,
        )
    found = OnnxTranslator(folder).generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=12)
    np.testing.assert_array_equal(found, ours.numpy())


def test_rows_differ_so_the_comparison_means_something(exported: tuple) -> None:
    _, folder = exported
    inputs = random_batch(batch=4, src_len=11, seed=1)
    found = OnnxTranslator(folder).generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=12)
    assert len({tuple(row) for row in found.tolist()}) >= 3


def test_per_sentence_limit_forces_eos_and_pads_finished_rows(exported: tuple) -> None:
    """§6.1's max_new_tokens_offset from the generation config: rows end at their own length with EOS, then pad."""
    model, folder = exported
    translator = OnnxTranslator(folder)
    translator.generation_config.max_new_tokens_offset = 1
    inputs = random_batch(batch=4, src_len=9, seed=5)
    with torch.no_grad():
        ours = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens_offset=1)
    found = translator.generate(inputs["input_ids"], inputs["attention_mask"])
    np.testing.assert_array_equal(found, ours.numpy())
    lengths = inputs["attention_mask"].sum(-1)
    for row, length in zip(found, lengths.tolist(), strict=True):
        assert row[length + 1] == model.config.eos_token_id  # after the start token and `length` tokens
        assert (row[length + 2 :] == model.config.pad_token_id).all()


def test_translate_decodes_text(exported: tuple) -> None:
    _, folder = exported
    texts = OnnxTranslator(folder).translate(["w5 w9 w33", "w40"], max_new_tokens=5)
    assert len(texts) == 2 and all(text.startswith("w") for text in texts)


def test_verification_refuses_a_tolerance_below_the_measured_difference(exported: tuple) -> None:
    model, folder = exported
    assert verify(model, folder, 1e-4) < 1e-4
    with pytest.raises(ValueError, match="exceeds atol 0"):
        verify(model, folder, 0.0)


def test_command_refuses_to_write_above_the_tolerance(
    exported: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The verification runs before the folder is written: above --atol-fp32, exit 2 and no OUTPUT_DIR. The graphs
    are the fixture's (copied, not exported again, to keep the test fast)."""
    _, folder = exported

    def copy_graphs(model: object, target: Path, max_positions: int) -> None:
        for path in folder.glob("*.onnx*"):
            shutil.copy2(path, target / path.name)

    monkeypatch.setattr(onnx_export, "export_graphs", copy_graphs)
    with pytest.raises(SystemExit) as exit_info:
        main(["to-onnx", str(folder.parent / "model"), str(tmp_path / "out"), "--atol-fp32", "0"])
    assert exit_info.value.code == 2
    assert "exceeds atol 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    # The library call alike; an existing OUTPUT_DIR (an export of its own) stays as it was, and no partial sibling
    # is left.
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "encoder.onnx").write_text("kept")
    write_manifest(tmp_path / "out", "model", ["encoder.onnx"])
    with pytest.raises(ValueError, match="exceeds atol 0"):
        onnx_export.convert(OnnxOptions(folder.parent / "model", tmp_path / "out", atol_fp32=0.0))
    assert [path.name for path in tmp_path.iterdir()] == ["out"]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == [MANIFEST, "encoder.onnx"]
    assert (tmp_path / "out" / "encoder.onnx").read_text() == "kept"


def test_too_long_input_is_one_clear_error(exported: tuple) -> None:
    _, folder = exported
    with pytest.raises(ValueError, match=r"65 positions, more than the 64 this export holds.*larger max_positions"):
        OnnxTranslator(folder).generate(np.full((1, 65), 5), max_new_tokens=2)


@pytest.mark.parametrize("kind", ["missing", "other-model"])
def test_bad_source_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture, kind: str) -> None:
    source = tmp_path / "source"
    if kind == "other-model":
        source.mkdir()
        (source / "config.json").write_text('{"model_type": "marian"}')
    with pytest.raises(SystemExit) as exit_info:
        main(["to-onnx", str(source), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and f"error: `SOURCE` {source} " in error  # the library's `source`, as the flag
    assert not (tmp_path / "out").exists()


def test_too_few_positions_are_refused_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(OptionError, match="`max_positions=1` must be at least 2"):
        onnx_export.convert(OnnxOptions(tmp_path / "model", tmp_path / "out", max_positions=1))
    with pytest.raises(SystemExit):
        main(["to-onnx", str(tmp_path / "model"), str(tmp_path / "out"), "--max-positions", "1"])
    error = capsys.readouterr().err
    assert "error: `--max-positions 1` must be at least 2 (the start token and one more)" in error


def _export_error(source: Path, output: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`python -m conversion to-onnx SOURCE OUTPUT` of a fresh tiny model saved at `source`: exit code and the last
    line of stderr (loading's progress bar comes before it), after checking that stderr holds no traceback."""
    tiny_model(0).save_pretrained(source)
    tiny_tokenizer().save_pretrained(source)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["to-onnx", str(source), str(output)])
    error = capsys.readouterr().err
    assert "Traceback" not in error, error
    return exit_info.value.code, error.splitlines()[-1]


def _disk_full_line(output: Path) -> str:
    return (
        f"python -m conversion to-onnx: error: no space left on device while writing {output}: free space or choose "
        "another OUTPUT folder."
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, where every write fails with ENOSPC")
def test_a_full_disk_while_exporting_is_one_line_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graphs' weights are written by onnx_ir's external data, numpy's `tofile` for the sinusoid tables, which
    reports a full disk as "N requested and M written", an OSError without an errno (before: that OSError's
    traceback, exit 1). Here the weights of 64 KiB and more (the 1024-row tables, 128 KiB: larger than the C
    library's buffer, so that numpy's write itself fails) go to /dev/full, which fails every write as a full disk
    does; nothing is left beside the source."""
    from onnx_ir import external_data

    write_tensor = external_data._write_tensor_at

    def full_disk(tensor: Any, file: Any, offset: int) -> None:
        if tensor.nbytes < 2**16:
            write_tensor(tensor, file, offset)
            return
        with open("/dev/full", "wb", buffering=0) as full:  # unbuffered: numpy's own write is the one that fails
            write_tensor(tensor, full, 0)

    monkeypatch.setattr(external_data, "_write_tensor_at", full_disk)
    code, error = _export_error(tmp_path / "model", tmp_path / "out", capsys)
    assert (code, error) == (2, _disk_full_line(tmp_path / "out"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no output, no half-written sibling


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root; the /dev/full test covers the same path")
def test_a_real_full_disk_while_exporting_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The same on a real 96 KiB tmpfs (the tiny model's graphs are larger), where the system allows it."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(small)], check=False).returncode:
        pytest.skip("this system refuses to mount a tmpfs; the /dev/full test covers the same path")
    try:
        code, error = _export_error(tmp_path / "model", small / "out", capsys)
        assert (code, error) == (2, _disk_full_line(small / "out"))
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)
