"""Keeps the decoder-start embedding row at zero in training, so that models trained here run in CTranslate2.

The decoder starts from <pad> (Marian's convention). CTranslate2's Marian loader ignores the start token's embedding
and feeds the decoder a zero vector at the first step (`start_from_zero_embedding`; the position-0 sinusoid is still
added), and it drops <pad> from the vocabulary. Our <pad> row of the §3.4 shared matrix is zero at initialisation
(`nn.Embedding(padding_idx=pad)`) and its lookups get no gradient, but the tied pre-softmax projection trains it: with
label smoothing every class, <pad> included, gets the gradient softmax - ε/V on every target position. So the row
drifts from zero in the first update, and CTranslate2 would decode a different model.

`ZeroStartEmbeddingCallback` zeroes the row when training begins and zeroes its gradient in every backward pass (a
hook on the weight, which with three-way tying is also the output projection), so Adam's moments for the row stay
zero and no update (weight decay included: it multiplies the row) moves it. What that changes in the paper's model:
the decoder's first input is the position-0 encoding alone instead of a learned start vector (the paper specifies
no start symbol), and the <pad> logit is fixed at 0; <pad> is never a label, so only label smoothing's ε/V target on
it cannot be met exactly. Under data parallelism (DDP) the hook acts before the gradients are reduced; sharded
training (FSDP, DeepSpeed ZeRO) replaces the weight and is not covered.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState

logger = logging.getLogger(__name__)

START_EMBEDDING_CHOICES = ("zero", "train")


def start_embedding_weight(model: PreTrainedModel) -> torch.nn.Parameter:
    """The decoder's input embedding matrix (with three-way tying also the encoder's and the output projection)."""
    return model.get_decoder().embed_tokens.weight


def start_embedding_max(model: PreTrainedModel) -> float:
    """Largest |value| of the decoder start token's embedding row, which CTranslate2 replaces by zeros."""
    return start_embedding_weight(model)[model.config.decoder_start_token_id].abs().max().item()


class ZeroStartEmbeddingCallback(TrainerCallback):
    """Sets the decoder start token's embedding row to zero when training begins and keeps it there (module
    docstring). A non-zero row at that point (a model initialised from a folder trained without this, or a resumed
    checkpoint of such a run) is zeroed with a warning: the model then changes at the first step, and training
    adapts it.

    The start token must be <pad>: it is never a label, whereas zeroing the row of a token that is one (e.g. </s>)
    would also fix that token's output logit at 0."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        if config.decoder_start_token_id != config.pad_token_id:
            raise ValueError(
                f"`decoder_start_embedding='zero'` needs decoder_start_token_id == pad_token_id, got "
                f"{config.decoder_start_token_id} and {config.pad_token_id} (zeroing a label's row would fix its "
                "logit at 0). Start the decoder from <pad>, or pass decoder_start_embedding='train'."
            )
        self.model = model
        self.row = config.decoder_start_token_id
        self.handle: torch.utils.hooks.RemovableHandle | None = None

    def _zero_row_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()  # autograd may hand the same tensor to other consumers
        grad[self.row] = 0
        return grad

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        weight = start_embedding_weight(self.model)
        before = start_embedding_max(self.model)
        if before:
            logger.warning(
                "The decoder start token's embedding row (id %d) was not zero (max |x| = %.3e); it is set to zero "
                "and kept there (decoder_start_embedding='zero'), so the model changes at the first step.",
                self.row,
                before,
            )
        with torch.no_grad():
            weight[self.row] = 0
        if self.handle is None:
            self.handle = weight.register_hook(self._zero_row_gradient)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None


__all__ = ["START_EMBEDDING_CHOICES", "ZeroStartEmbeddingCallback", "start_embedding_max", "start_embedding_weight"]
