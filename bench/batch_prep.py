"""The host's share of a training update: reading one token-budget batch from the Arrow table and padding it, as
`VanillaSeq2SeqTrainer`'s data loader does (in the main process on a CPU, in worker processes on a CUDA device). On a
GPU the model's step overlaps this work only while the host runs ahead of the GPU; a per-update read-back stops that,
and then each update costs this much more (docs/runs/gpu.md, "Compiled training on the H100").

    .venv/bin/python -m bench.batch_prep [--max-tokens 25000 4096] [--vocab-size 37000] [--batches 40]

The bundled Multi30k train set (EN→DE) with a joint BPE trained here, `prepare_pairs` and `TokenBudgetBatchSampler`
as `train` uses them, one thread. Prints, per token budget, the milliseconds per batch (median over `--batches`
batches in the sampler's order) of the fetch (`Dataset.__getitems__`), of `TrainingCollator` (the Trainer's
default collator: padding, the ids checked, decoder inputs from the labels) and of both. tests/bench/test_bench.py runs
it on the val split.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

import torch

from bench.common import host
from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.training.collator import TrainingCollator
from hf_vanilla_transformer.training.data import TokenizedPairs, load_multi30k, prepare_pairs
from hf_vanilla_transformer.training.tokenization import special_token_ids, train_bpe_tokenizer
from hf_vanilla_transformer.training.trainer import TokenBudgetBatchSampler


def measure(max_tokens: int, prepared: TokenizedPairs, collator: TrainingCollator, batches: int) -> dict[str, float]:
    dataset = prepared.dataset.select_columns(["input_ids", "attention_mask", "labels"])  # what the Trainer keeps
    sampler = TokenBudgetBatchSampler(prepared.source_lengths, prepared.target_lengths, max_tokens=max_tokens, seed=1)
    fetch, collate, pairs, target_tokens = [], [], [], []
    for indices in itertools.islice(iter(sampler), batches):
        start = time.perf_counter()
        rows = dataset.__getitems__(indices)
        middle = time.perf_counter()
        batch = collator(rows)
        end = time.perf_counter()
        fetch.append(middle - start)
        collate.append(end - middle)
        pairs.append(len(indices))
        target_tokens.append(int(batch["labels"].ne(-100).sum()))
    return {
        "pairs_per_batch": statistics.mean(pairs),
        "target_tokens_per_batch": statistics.mean(target_tokens),
        "fetch_ms": 1000 * statistics.median(fetch),
        "collate_ms": 1000 * statistics.median(collate),
        "both_ms": 1000 * statistics.median(f + c for f, c in zip(fetch, collate, strict=True)),
    }


def prepare(vocab_size: int, split: str = "train") -> tuple[TokenizedPairs, TrainingCollator]:
    """The bundled Multi30k `split` (EN→DE) tokenized with a joint BPE of `vocab_size` trained on it, and the
    Trainer's default collator for it."""
    pairs = load_multi30k("en", "de", (split,))[split]
    tokenizer = train_bpe_tokenizer(itertools.chain(pairs["source"], pairs["target"]), vocab_size)
    prepared = prepare_pairs(pairs, tokenizer)
    ids = special_token_ids(tokenizer)
    # The collator reads the vocabulary sizes and special ids from the config; a one-layer model's serves.
    config = VanillaTransformerConfig(
        vocab_size=len(tokenizer), d_model=8, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=8,
        decoder_ffn_dim=8, encoder_attention_heads=1, decoder_attention_heads=1, **ids,
    )  # fmt: skip
    return prepared, TrainingCollator(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[25000, 4096])
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prepared, collator = prepare(args.vocab_size)
    rows = {str(budget): measure(budget, prepared, collator, args.batches) for budget in args.max_tokens}
    machine = host()
    print(
        f"{machine['cpu']} ({machine['cpu_flags'] or 'no matrix units'}), torch {machine['torch']}, "
        f"load average {machine['load_average_at_start'][0]:.2f} at the start, 1 thread"
    )
    print("| max tokens | pairs/batch | target tokens/batch | fetch ms | collate ms | both ms |")
    print("|---|---|---|---|---|---|")
    for budget, row in rows.items():
        print(
            f"| {int(budget):,} | {row['pairs_per_batch']:,.0f} | {row['target_tokens_per_batch']:,.0f} | "
            f"{row['fetch_ms']:.1f} | {row['collate_ms']:.1f} | {row['both_ms']:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"host": machine, "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
