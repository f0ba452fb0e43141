"""Static batch shapes for CUDA graphs (`train --torch-compile graphs`, and `auto` for small models on a GPU).

A small model's training step is bound by kernel launches, not arithmetic: the Multi30k model (7.6M parameters,
4096-token batches) trained at 20.5 updates/s eagerly on an H200, about 49 ms an update for well under 1 ms of
matrix work. `torch.compile(mode="reduce-overhead")` replays the step as a CUDA graph, one launch, but a graph holds
one shape, and token-budget batches (§5.1) have a new (rows, length) at almost every update. Here each batch is
padded to one of a few fixed shapes:
- `LengthBuckets.fit`: the at most `count` lengths that pad the pairs' sizes (the longer side, as the sampler
  measures them) least, the last the longest pair's;
- the sampler plans its batches with each pair's size raised to its bucket length (`sizes`), so a batch whose
  longest pair falls in bucket L holds at most max_tokens // L rows;
- `StaticShapeCollator` pads that batch to exactly (max_tokens // L rows, L positions): one shape per bucket, at most
  `count` in all.
Padding changes no loss: padded positions carry label -100 (the loss and its token count skip them) and are masked
as attention keys; a padded row has all labels -100 and one unmasked key (its first <pad>), so its attention has
something to normalise over and yields no NaN. tests/training/test_static_shapes.py checks both on Multi30k's batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState

# Length buckets for CUDA graphs: 8 = torch._dynamo's default recompile limit per function, so that no bucket
# falls back to eager; more buckets pad less (see `LengthBuckets.padding`) but record more graphs.
GRAPH_LENGTH_BUCKETS = 8
# What each collated field is padded with; attention masks get a 1 at a padded row's first position (see above).
_PAD_VALUES = {"input_ids": "pad", "decoder_input_ids": "pad", "labels": -100, "attention_mask": 0}


def pair_sizes(source_lengths: Sequence[int], target_lengths: Sequence[int]) -> np.ndarray:
    """Each pair's size as the batch sampler measures it: its longer side."""
    return np.maximum(np.asarray(source_lengths), np.asarray(target_lengths))


@dataclass(frozen=True)
class LengthBuckets:
    """The fixed batch shapes: `lengths` (ascending) and the token budget that sets each one's rows."""

    lengths: tuple[int, ...]
    max_tokens: int

    @classmethod
    def fit(
        cls, source_lengths: Sequence[int], target_lengths: Sequence[int], count: int, max_tokens: int
    ) -> LengthBuckets:
        """The at most `count` bucket lengths that pad these pairs least: each pair's size (its longer side) raised to
        the smallest bucket length that holds it, the sum of those over the pairs made smallest (dynamic programming
        over the distinct sizes; the longest size is always a bucket, so every pair has one)."""
        if count < 1:
            raise ValueError(f"`count` is {count}; pass at least 1 length bucket.")
        sizes, counts = np.unique(pair_sizes(source_lengths, target_lengths), return_counts=True)
        upto = np.cumsum(counts)  # pairs of size <= sizes[i]
        n = len(sizes)
        # cost[i]: the least padded size of the pairs up to sizes[i] with a bucket at sizes[i]; parents[k][i]: the
        # bucket before it with k + 1 buckets (-1: none before it, -2: k buckets did no better).
        cost = sizes * upto
        parents = [np.full(n, -1)]
        for _ in range(1, min(count, n)):
            spans = cost[:, None] + sizes[None, :] * (upto[None, :] - upto[:, None])  # [j, i]: buckets ... j, i
            spans[np.tril_indices(n)] = np.iinfo(spans.dtype).max
            before = spans.argmin(axis=0)
            best = spans[before, np.arange(n)]
            parents.append(np.where(best < cost, before, -2))
            cost = np.minimum(best, cost)
        lengths, index = [], n - 1
        for parent in reversed(parents):
            if index < 0:
                break
            if parent[index] != -2:
                lengths.append(int(sizes[index]))
                index = int(parent[index])
        return cls(tuple(sorted(lengths)), max_tokens)

    def sizes(self, source_lengths: Sequence[int], target_lengths: Sequence[int]) -> np.ndarray:
        """Each pair's size raised to its bucket's length: the sizes the batch sampler plans with."""
        return np.asarray(self.lengths)[np.searchsorted(self.lengths, pair_sizes(source_lengths, target_lengths))]

    def shape(self, longest: int) -> tuple[int, int]:
        """(rows, length) of a batch whose longest side has `longest` tokens."""
        index = int(np.searchsorted(self.lengths, longest))
        if index == len(self.lengths):
            raise ValueError(
                f"A batch side of {longest} tokens is longer than the longest bucket ({self.lengths[-1]})."
            )
        length = self.lengths[index]
        return max(self.max_tokens // length, 1), length

    def padding(self, source_lengths: Sequence[int], target_lengths: Sequence[int]) -> float:
        """The share of the pairs' padded tokens that the buckets add (their sizes against the bucket lengths)."""
        return float(
            self.sizes(source_lengths, target_lengths).sum() / pair_sizes(source_lengths, target_lengths).sum() - 1.0
        )

    def describe(self) -> str:
        return f"{len(self.lengths)} length buckets {list(self.lengths)}, {self.max_tokens} tokens a side each"


class StaticShapeCollator:
    """Wraps the trainer's collator (`TrainingCollator`, padded on the right) so that every batch it returns has one
    of `buckets`' shapes, padded on the right further; needs batches planned with `buckets.sizes` (else a batch may
    hold more rows than its bucket's)."""

    def __init__(
        self, collator: Callable[[list[dict[str, Any]]], dict[str, Any]], buckets: LengthBuckets, pad_id: int
    ):
        self.collator = collator
        self.buckets = buckets
        self.pad_id = pad_id

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(features)
        unknown = sorted(set(batch) - set(_PAD_VALUES))
        if unknown:
            raise ValueError(f"Static batch shapes cannot pad the batch fields {unknown}; drop them from the dataset.")
        rows, length = self.buckets.shape(max(batch[name].shape[1] for name in batch))
        if batch["input_ids"].shape[0] > rows:
            raise ValueError(
                f"A batch of {batch['input_ids'].shape[0]} rows exceeds its bucket's {rows} rows: plan the batches "
                "with LengthBuckets.sizes."
            )
        padded = {}
        for name, tensor in batch.items():
            value = self.pad_id if _PAD_VALUES[name] == "pad" else _PAD_VALUES[name]
            out = torch.full((rows, length), value, dtype=tensor.dtype)
            out[: tensor.shape[0], : tensor.shape[1]] = tensor
            if name == "attention_mask":
                out[tensor.shape[0] :, 0] = 1
            padded[name] = out
        return padded


class CudaGraphStepCallback(TrainerCallback):
    """Marks each update's start for CUDA graph trees (`torch.compiler.cudagraph_mark_step_begin`), so that the
    graphs' output memory of the previous update is known to be free to reuse."""

    def on_step_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        torch.compiler.cudagraph_mark_step_begin()


__all__ = ["GRAPH_LENGTH_BUCKETS", "CudaGraphStepCallback", "LengthBuckets", "StaticShapeCollator", "pair_sizes"]
