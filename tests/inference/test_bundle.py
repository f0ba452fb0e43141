"""pretrained/bundle.py: a trained folder stored in fp16, loaded in fp32, with its BLEU measured as stored."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla_transformer.pretrained.bundle import bundle


def test_a_bundled_folder_stores_fp16_loads_fp32_and_records_its_bleu(bpe_model, tmp_path):
    (bpe_model / "README.md").write_text("# card\n", encoding="utf-8")
    folder = bundle(bpe_model, tmp_path / "bundled", max_sentences=2)

    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.float16}
    assert not list(folder.glob("*.py"))  # the code ships in the package, not as a copy that goes stale
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["dtype"] == "float32" and "auto_map" not in config
    loaded = AutoModelForSeq2SeqLM.from_pretrained(folder)
    original = AutoModelForSeq2SeqLM.from_pretrained(bpe_model)
    assert loaded.dtype == torch.float32
    for (name, mine), theirs in zip(loaded.state_dict().items(), original.state_dict().values(), strict=True):
        torch.testing.assert_close(mine, theirs.half().float(), rtol=0, atol=0, msg=name)
    record = json.loads((folder / "results.json").read_text(encoding="utf-8"))["bundled"]
    assert record["n"] == 2 and record["weights"] == "float16" and 0 <= record["bleu"] <= 100
    assert f"BLEU {record['bleu']:.2f}" in (folder / "README.md").read_text(encoding="utf-8")
    assert not list(tmp_path.glob(".*partial"))


def test_bundle_refuses_an_existing_destination(bpe_model, tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="`destination`"):
        bundle(bpe_model, tmp_path / "taken")
