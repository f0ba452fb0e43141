"""The training batches: sentence pairs padded into tensors on the host, every token id checked there, before the
batch is copied to the device.

`TrainingCollator` makes the batches `DataCollatorForSeq2Seq` makes for this model (the inputs padded with <pad>
and their attention mask, the labels padded with -100, the decoder inputs the labels shifted right behind the start
token, §3.1) with numpy instead of the tokenizer, and checks that every id lies inside its vocabulary. It holds
plain numbers only, neither the model nor the tokenizer, so that data-loader worker processes receive it whole
(also under the "spawn" start method) and a fork does not carry a tokenizer that has used its threads.

Checking the ids here, where they are numpy arrays in host memory, is what spares the model its own check in each
training step: that check reads the smallest and largest id back from the device (a host-device synchronisation on
a GPU), and `VanillaSeq2SeqTrainer` tells the model to skip it (`check_ids=False`) when its collator is this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import shift_tokens_right

LABEL_PAD = -100  # ignored by the loss (transformers' convention)


def pad_rows(rows: Sequence[Sequence[int]], value: int, left: bool) -> np.ndarray:
    """Rows of different lengths as one (rows, longest) int64 array, filled with `value` on the padding side."""
    batch = np.full((len(rows), max(len(row) for row in rows)), value, dtype=np.int64)
    for i, row in enumerate(rows):
        if left:
            batch[i, batch.shape[1] - len(row) :] = row
        else:
            batch[i, : len(row)] = row
    return batch


def check_batch_ids(ids: np.ndarray, vocab_size: int, name: str, ignored: int | None = None) -> None:
    """Every id of `ids` in [0, vocab_size) (`ignored` aside), else one line naming the field, the id and the fix."""
    values = ids[ids != ignored] if ignored is not None else ids
    if not values.size:
        return
    low, high = values.min(), values.max()
    if low < 0 or high >= vocab_size:
        bad = int(low if low < 0 else high)
        raise ValueError(
            f"`{name}` of a training batch holds token id {bad}, outside the vocabulary [0, {vocab_size}). "
            "Tokenize the data with the tokenizer saved with this model (hf_vanilla_transformer.training.data."
            "tokenize_pairs)."
        )


class TrainingCollator:
    """Pads a list of tokenized pairs (`input_ids`, `labels`, optionally `attention_mask`) into a batch of int64
    tensors and checks its ids on the host (module docstring).

    Args:
        config: the model's configuration (vocabulary sizes, <pad>, the decoder start token).
        padding_side: "right" (the tokenizers of this package) or "left", as the tokenizer's `padding_side`.
    """

    def __init__(self, config: VanillaTransformerConfig, padding_side: str = "right") -> None:
        if padding_side not in ("right", "left"):
            raise ValueError(f"`padding_side` must be 'right' or 'left', got {padding_side!r}.")
        self.vocab_size = config.vocab_size
        self.decoder_vocab_size = config.decoder_vocab_size
        self.pad_token_id = config.pad_token_id
        self.decoder_start_token_id = config.decoder_start_token_id
        self.left = padding_side == "left"

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        missing = {"input_ids", "labels"} - set(features[0])
        if missing:
            raise ValueError(
                f"Training examples need `input_ids` and `labels`; these lack {sorted(missing)}. Tokenize them with "
                "hf_vanilla_transformer.training.data.tokenize_pairs."
            )
        input_ids = pad_rows([feature["input_ids"] for feature in features], self.pad_token_id, self.left)
        labels = pad_rows([feature["labels"] for feature in features], LABEL_PAD, self.left)
        if "attention_mask" in features[0]:
            attention_mask = pad_rows([feature["attention_mask"] for feature in features], 0, self.left)
        else:
            attention_mask = pad_rows([[1] * len(feature["input_ids"]) for feature in features], 0, self.left)
        check_batch_ids(input_ids, self.vocab_size, "input_ids")
        check_batch_ids(labels, self.decoder_vocab_size, "labels", ignored=LABEL_PAD)
        labels_tensor = torch.from_numpy(labels)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "labels": labels_tensor,
            "decoder_input_ids": shift_tokens_right(labels_tensor, self.pad_token_id, self.decoder_start_token_id),
        }


__all__ = ["LABEL_PAD", "TrainingCollator", "check_batch_ids", "pad_rows"]
