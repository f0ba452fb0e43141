"""The training loop's batches in the main process or in worker processes: target tokens per second of
`VanillaSeq2SeqTrainer` updates with `dataloader_num_workers` 0 (the default on a CPU) and 2 (the default on a CUDA
device), alternating ABBA, so that the rule for the CPU rests on a measurement (docs/training.md, "The training
loop").

    .venv/bin/python -m bench.loop [--updates 12] [--reps 4] [--max-tokens 2000] [--json FILE]

The bundled Multi30k validation split (EN→DE, 1,014 pairs) with an 8,000-token joint BPE trained on it, the
`transformer-multi30k` sizes (bench.py's "tiny": d_model 256, 3+3 layers), fp32, dropout 0.1, on the CPU. Each rep
builds a fresh Trainer (untimed) and times `train()` for `--updates` updates, worker start-up included.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile

import torch

from bench.common import CONFIGS, host, paired_ratio, summary
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.data import load_multi30k, prepare_pairs
from hf_vanilla_transformer.training.tokenization import special_token_ids, train_bpe_tokenizer
from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer, VanillaSeq2SeqTrainingArguments

WORKERS = (0, 2)


def timed_run(dataset, tokenizer, config: VanillaTransformerConfig, workers: int, updates: int, max_tokens: int):
    """Seconds and target tokens of `updates` updates from a fresh model and Trainer."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config)
    with tempfile.TemporaryDirectory() as folder:
        args = VanillaSeq2SeqTrainingArguments(
            output_dir=folder,
            max_tokens=max_tokens,
            lr_schedule="inverse_sqrt",
            learning_rate=1e-3,
            warmup_steps=100,
            max_steps=updates,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            logging_steps=updates,
            dataloader_num_workers=workers,
            seed=1,
        )
        trainer = VanillaSeq2SeqTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        metrics = trainer.train().metrics
    return metrics["train_runtime"], metrics["train_tgt_tokens"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    pairs = load_multi30k("en", "de", ("validation",))["validation"]
    tokenizer = train_bpe_tokenizer(itertools.chain(pairs["source"], pairs["target"]), 8000)
    dataset = prepare_pairs(pairs, tokenizer).dataset
    size = CONFIGS["tiny"]
    config = VanillaTransformerConfig.from_paper(
        N=size["layers"], d_model=size["d_model"], d_ff=size["ffn"], h=size["heads"], P_drop=0.1,
        vocab_size=len(tokenizer), **special_token_ids(tokenizer),
    )  # fmt: skip
    seconds: dict[int, list[float]] = {workers: [] for workers in WORKERS}
    rates: dict[int, list[float]] = {workers: [] for workers in WORKERS}
    for rep in range(args.reps):
        for workers in WORKERS if rep % 2 == 0 else reversed(WORKERS):
            runtime, tokens = timed_run(dataset, tokenizer, config, workers, args.updates, args.max_tokens)
            seconds[workers].append(runtime)
            rates[workers].append(tokens / runtime)
            print(f"rep {rep} workers {workers}: {tokens / runtime:,.0f} target tokens/s", flush=True)
    machine = host()
    result = {
        "host": machine,
        "threads": torch.get_num_threads(),
        "updates": args.updates,
        "max_tokens": args.max_tokens,
        "target_tokens_per_s": {str(workers): summary(rates[workers]) for workers in WORKERS},
        "speed_2_workers_over_0": paired_ratio(seconds[0], seconds[2]),
    }
    print(f"{machine['cpu']}, torch {machine['torch']}, {result['threads']} threads")
    for workers in WORKERS:
        print(f"workers {workers}: {result['target_tokens_per_s'][str(workers)]['median']:,.0f} target tokens/s")
    ratio = result["speed_2_workers_over_0"]
    print(f"2 workers / 0 workers: {ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
