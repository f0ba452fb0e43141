"""A trained model's own decoding of Multi30k val, prepared for CPU inference (`prepare_for_cpu_inference`,
cpu_inference.py) and as loaded (plain PyTorch): seconds per pass and whether the hypotheses agree.

    .venv/bin/python -m bench.packed_decoding MODEL_DIR [--rounds 2] [--batch-size 64]

MODEL_DIR is a folder written by `hf-vanilla-transformer train` (with its tokenizer). The two models (the same folder
loaded twice) alternate, `--rounds` times each; BLEU is sacreBLEU's, as `hf-vanilla-transformer evaluate` reports it.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_vanilla_transformer.inference.cpu_inference import prepare_for_cpu_inference
from hf_vanilla_transformer.inference.decoding import best_translations
from hf_vanilla_transformer.inference.evaluation import score_translations
from hf_vanilla_transformer.training.data import load_multi30k


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    validation = load_multi30k(args.src_lang, args.tgt_lang, splits=("validation",))["validation"]
    sources, references = list(validation["source"]), list(validation["target"])
    models = {
        "packed": prepare_for_cpu_inference(AutoModelForSeq2SeqLM.from_pretrained(args.model_dir)),
        "plain": AutoModelForSeq2SeqLM.from_pretrained(args.model_dir),
    }
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {len(sources)} sentences")
    hypotheses: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for setting, model in models.items():
            start = time.perf_counter()
            hypotheses[setting] = best_translations(model, tokenizer, sources, args.batch_size, progress=False)
            seconds = time.perf_counter() - start
            bleu = score_translations(hypotheses[setting], references)["bleu"]
            print(f"{setting}: {seconds:.1f} s, BLEU {bleu:.2f}", flush=True)
    same = sum(a == b for a, b in zip(hypotheses["packed"], hypotheses["plain"], strict=True))
    print(f"identical hypotheses: {same} / {len(sources)}")


if __name__ == "__main__":
    main()
