"""The model folder that ships with the package (hf_vanilla_transformer/pretrained): small, fp16, offline, and as good
as its card says: its recorded test_2016 BLEU reproduced with its own decoding."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from safetensors import safe_open
from transformers import pipeline

from hf_vanilla_transformer import BUNDLED_MODEL
from hf_vanilla_transformer.inference.evaluation import EvaluateOptions, evaluate

FOLDER = Path(BUNDLED_MODEL)
MAX_BYTES = 6 * 1024 * 1024


def refuse_connections(*args, **kwargs):
    raise AssertionError(f"the bundled model tried to reach the network: {args}")


def test_the_folder_is_small_and_fp16() -> None:
    files = [path for path in FOLDER.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert sum(path.stat().st_size for path in files) <= MAX_BYTES
    with safe_open(FOLDER / "model.safetensors", framework="pt") as weights:
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
    assert dtypes == {"F16"}


def test_it_translates_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", refuse_connections)
    monkeypatch.setattr(socket, "create_connection", refuse_connections)
    translator = pipeline("translation", model=BUNDLED_MODEL)
    (result,) = translator("A man is riding a bike.")
    german = result["translation_text"]
    assert "Mann" in german and german.endswith("."), german


def test_its_recorded_test_bleu_is_reproduced() -> None:
    """The full test_2016 set (1,000 sentences), the folder's own decoding (§6.1: beam 4, α 0.6), within 0.3 BLEU of
    the score in its results.json (which its card shows)."""
    recorded = json.loads((FOLDER / "results.json").read_text(encoding="utf-8"))["test"]
    results = evaluate(EvaluateOptions(FOLDER, progress=False))
    assert results["n"] == recorded["n"] == 1000
    assert (results["generation"]["num_beams"], results["generation"]["length_penalty"]) == (4, 0.6)
    assert abs(results["bleu"] - recorded["bleu"]) <= 0.3, (results["bleu"], recorded["bleu"])
