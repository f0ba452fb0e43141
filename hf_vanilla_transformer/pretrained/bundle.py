"""Make a bundled model folder from a trained one: the weights stored in fp16 (half the bytes), loaded in fp32.

`python -m hf_vanilla_transformer.pretrained.bundle RUN/model DESTINATION` after `make train-tiny` wrote RUN: the
model and its tokenizer, generation config, card (README.md) and results.json. The folder keeps no copy of the
model's code: it ships inside this package, which registers the classes (a copy would go stale with every change
of the model file). `config.json` says `float32`, so `from_pretrained` computes in fp32 from the fp16 weights; the
recorded BLEU (results.json "bundled") is measured on the folder as written, by `hf-vanilla-transformer evaluate`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from ..inference.evaluation import EvaluateOptions, evaluate

# What the folder holds besides what save_pretrained writes: the run's card and its record.
RUN_RECORDS = ("README.md", "results.json")


def bundle(model_dir: str | Path, destination: str | Path, max_sentences: int | None = None) -> Path:
    """Write `model_dir`'s model as an fp16-stored, fp32-loaded folder at `destination` (which must not exist),
    staged beside it and renamed into place; the BLEU recorded is that of the test set's first `max_sentences`
    (None: all)."""
    model_dir, destination = Path(model_dir), Path(destination)
    if destination.exists():
        raise FileExistsError(f"`destination` {destination} exists: remove it or pick another folder.")
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=torch.float32)
    staging = destination.with_name(f".{destination.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.to(torch.float16).save_pretrained(staging)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(staging)
    for code in staging.glob("*.py"):
        code.unlink()
    config = json.loads((staging / "config.json").read_text(encoding="utf-8"))
    config["dtype"] = "float32"  # from_pretrained's dtype="auto" reads it: fp32 compute, fp16 storage
    for pointer in ("auto_map", "custom_pipelines"):  # to code files the folder does not carry
        config.pop(pointer, None)
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in RUN_RECORDS:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, staging / name)
    _record_bleu(staging, destination.name, max_sentences)
    for path in staging.iterdir():
        path.chmod(0o644)  # package data: readable by every user of an installed package
    staging.rename(destination)
    return destination


def _record_bleu(folder: Path, name: str, max_sentences: int | None) -> None:
    """Score the test set with the folder as written (fp16 weights, the model's own decoding) and record it in
    results.json ("bundled") and in the card: the figure the tests reproduce."""
    scores = evaluate(EvaluateOptions(folder, progress=False, max_sentences=max_sentences))
    record = {
        "bleu": round(scores["bleu"], 2),
        "bleu_signature": scores["bleu_signature"],
        "n": len(scores["hypotheses"]),
        "weights": "float16",
        "command": f"hf-vanilla-transformer evaluate {name}",
    }
    results_file = folder / "results.json"
    results = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else {}
    results["bundled"] = record
    results_file.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    card = folder / "README.md"
    if card.is_file():
        card.write_text(
            card.read_text(encoding="utf-8").rstrip("\n")
            + f"\n\n## As bundled\n\nThe weights are stored in float16 (`config.json` says float32, so they load in "
            f"float32). Scored as stored, with `{record['command']}`: test_2016 BLEU {record['bleu']:.2f} "
            f"(`{record['bleu_signature']}`).\n",
            encoding="utf-8",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hf_vanilla_transformer.pretrained.bundle", description=__doc__)
    parser.add_argument("model_dir", help="a trained model folder (RUN/model)")
    parser.add_argument("destination", help="the folder to write (must not exist)")
    args = parser.parse_args(argv)
    print(bundle(args.model_dir, args.destination))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
