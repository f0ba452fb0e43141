"""The §5.4 label-smoothed cross-entropy of the §3.4 pre-softmax projection, fused: the projection and the loss
computed together in row chunks, so that training never holds the (B*T, V) float32 logits and their gradients.
The model's `forward(..., skip_logits=True)` uses it. This file imports only torch: it is copied next to the model
code (remote code).
"""

from typing import Any

import torch
from torch import nn


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """The summed §5.4 loss of `hidden @ weight.T + bias` and its gradients, computed together in row chunks.

    The loss is scalar, so its gradients are known in the forward pass: per chunk, the logits (n, V) in the compute
    dtype, then in fp32 the log-normaliser, the loss and d loss / d logits = softmax - q (q: 1 - ε on the label plus
    ε / V everywhere, zero for ignored rows), then the two gradient GEMMs. The same three GEMMs as the unfused head;
    the fp32 (B*T, V) logits, log-probabilities and their gradients are never materialised.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden_states: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        label_smoothing: float,
        compute_dtype: torch.dtype,
        chunk_size: int,
    ) -> torch.Tensor:
        vocab = weight.shape[0]
        needs_grad = any(ctx.needs_input_grad[:3])
        weight_c = weight.to(compute_dtype)
        bias_c = None if bias is None else bias.to(compute_dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden_states.device)
        grad_hidden = torch.empty_like(hidden_states) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if ctx.needs_input_grad[2] else None
        # Traced by torch.compile, one chunk: a loop over row chunks would make dynamo specialize on the row count,
        # one graph per batch size (token-budget batches have a new one at almost every step).
        if torch.compiler.is_compiling():
            chunks = [slice(None)]
        else:
            chunks = [slice(start, start + chunk_size) for start in range(0, hidden_states.shape[0], chunk_size)]
        for chunk in chunks:
            hidden_c = hidden_states[chunk].to(compute_dtype)  # (n, D)
            labels_c = labels[chunk]
            keep = labels_c.ne(-100)
            targets = labels_c.clamp(min=0).unsqueeze(1)  # (n, 1)
            logits = nn.functional.linear(hidden_c, weight_c, bias_c).float()  # (n, V)
            log_normaliser = torch.logsumexp(logits, dim=-1)  # (n,)
            # -log p(label) and the mean over the vocabulary of -log p(v), per row.
            nll = log_normaliser - logits.gather(1, targets).squeeze(1)
            smooth = log_normaliser - logits.mean(dim=-1)
            total += torch.where(keep, (1.0 - label_smoothing) * nll + label_smoothing * smooth, 0.0).sum()
            if not needs_grad:
                continue
            grad_logits = logits.sub_(log_normaliser.unsqueeze(1)).exp_().sub_(label_smoothing / vocab)  # (n, V)
            grad_logits.scatter_add_(1, targets, torch.full_like(targets, label_smoothing - 1.0, dtype=torch.float32))
            grad_logits.mul_(keep.unsqueeze(1))
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
            grad_logits = grad_logits.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[chunk] = grad_logits @ weight_c  # (n, V) @ (V, D) -> (n, D)
            if grad_weight is not None:
                grad_weight += (grad_logits.T @ hidden_c).float()  # (V, n) @ (n, D) -> (V, D)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.dtypes = (hidden_states.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = [
            None if grad is None else (grad * grad_output).to(dtype)
            for grad, dtype in zip(ctx.saved_tensors, ctx.dtypes, strict=True)
        ]
        return (*grads, None, None, None, None)


def linear_label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """§5.4 label-smoothed cross-entropy of the §3.4 pre-softmax projection, summed over the rows whose label is
    not -100: for each row, (1 - ε) (-log p(label)) + ε mean_v (-log p(v)), as `nn.functional.cross_entropy(
    hidden_states @ weight.T + bias, labels, label_smoothing=ε, reduction="sum")`. hidden_states (N, D), weight (V, D),
    bias (V,) or None, labels (N,). Under autocast the GEMMs run in the autocast dtype, as `nn.Linear` would; the
    softmax and the loss in fp32. `chunk_size` rows at a time, so memory is (chunk_size, V), not (N, V); under
    `torch.compile` all N rows in one chunk, so that a new batch size needs no new graph."""
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be a positive number of rows, got {chunk_size}.")
    device_type = hidden_states.device.type
    compute_dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden_states.dtype
    )
    with torch.autocast(device_type, enabled=False):  # the dtypes are chosen above; the fp32 parts must stay fp32
        return _LinearLabelSmoothedCrossEntropy.apply(
            hidden_states, weight, bias, labels, label_smoothing, compute_dtype, chunk_size
        )
