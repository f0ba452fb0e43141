"""§5.4 dropout's CPU keep mask (hf_vanilla_transformer/training/cpu_training.py, applied by the training step): the
mask drawn from 32-bit slices of 64-bit
draws must be dropout, checked against its definition: each element zeroed with probability p, independently of
the others (the two halves of one draw too), the rest scaled by 1 / (1 - p), the gradient the same mask, fresh masks
per call and seeded ones under torch.manual_seed; elsewhere torch's own dropout."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_vanilla_transformer.training.cpu_training import CpuDropout, dropout, prepare_for_cpu_training


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_each_element_is_dropped_with_probability_p_independently(p: float) -> None:
    torch.manual_seed(0)
    n = 2_000_000
    out = dropout(torch.ones(n), p, training=True)
    dropped = out == 0
    # Five standard deviations of a binomial share: fails for a biased threshold (a p off by 2^-16 would not show,
    # one off by 0.005 does) or a mask with fewer random bits than claimed.
    tolerance = 5 * math.sqrt(p * (1 - p) / n)
    assert abs(dropped.double().mean().item() - p) < tolerance
    assert torch.equal(out[~dropped], torch.full_like(out[~dropped], 1 / (1 - p)))
    # The two 32-bit halves of one 64-bit draw decide neighbouring elements: both dropped with probability p^2.
    pairs = dropped.view(-1, 2)
    both = (pairs[:, 0] & pairs[:, 1]).double().mean().item()
    assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / (n // 2))
    # Across rows of a 2-D input too: elements far apart are as independent as neighbours.
    grid = dropped.view(1000, -1)
    assert abs((grid[:-1] & grid[1:]).double().mean().item() - p * p) < 5 * math.sqrt(p * p / grid[1:].numel())


def test_the_gradient_is_the_same_mask_scaled() -> None:
    torch.manual_seed(1)
    x = torch.randn(7, 13, 5, requires_grad=True)  # an odd number of elements: half of the last draw is unused
    out = dropout(x, 0.25, training=True)
    out.backward(torch.ones_like(out))
    kept = out != 0
    assert torch.allclose(out[kept], x.detach()[kept] / 0.75)
    assert torch.equal(x.grad, kept.float() / 0.75)


def test_eval_mode_and_p_zero_return_the_input_itself() -> None:
    x = torch.randn(4, 6)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x


def test_masks_are_fresh_per_call_and_follow_the_seed() -> None:
    x = torch.ones(64, 64, dtype=torch.bfloat16)
    torch.manual_seed(5)
    first, second = dropout(x, 0.3, True), dropout(x, 0.3, True)
    torch.manual_seed(5)
    again = dropout(x, 0.3, True)
    assert first.dtype == torch.bfloat16 and first.shape == x.shape
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


def test_compiling_and_p_near_one_use_torch_dropout(monkeypatch) -> None:
    calls = []

    def spy(hidden_states, p, training):
        calls.append((p, training))
        return hidden_states * 0

    monkeypatch.setattr(nn.functional, "dropout", spy)
    x = torch.ones(3, 4)
    dropout(x, 1.0, True)
    # Within 2^-33 of 1, p * 2^32 rounds to 2^32: no int32 threshold keeps anything, so torch's dropout takes it.
    dropout(x, 1.0 - 2**-40, True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    dropout(x, 0.2, True)
    assert calls == [(1.0, True), (1.0 - 2**-40, True), (0.2, True)]


def test_the_model_trains_with_it(monkeypatch) -> None:
    """Once prepared, the model's residual, embedding and ReLU dropouts go through it: counted calls in one training
    forward."""
    from hf_vanilla_transformer.training import cpu_training

    from ..conftest import random_batch, tiny_model

    calls = []

    def counting(hidden_states, p, training):
        calls.append(p)
        return dropout(hidden_states, p, training)

    monkeypatch.setattr(cpu_training, "dropout", counting)
    model = prepare_for_cpu_training(tiny_model(dropout=0.1, activation_dropout=0.2).train())
    model(**random_batch()).loss.backward()
    # 2 + 2 layers: embeddings 2, encoder 2 x (attention, ReLU, FFN), decoder 2 x (self, cross, ReLU, FFN).
    assert sorted(calls) == sorted([0.1] * 2 + [0.1, 0.2, 0.1] * 2 + [0.1, 0.1, 0.2, 0.1] * 2)


def test_the_model_code_is_plain_torch_dropout_until_prepared() -> None:
    """The model (remote code) builds torch's `nn.Dropout`; the step turns each into a `CpuDropout` in place, the
    same modules and state_dict, and a second call changes nothing."""
    from ..conftest import tiny_model

    model = tiny_model(dropout=0.1, activation_dropout=0.2)
    kinds = {name: type(module) for name, module in model.named_modules() if isinstance(module, nn.Dropout)}
    assert set(kinds.values()) == {nn.Dropout} and len(kinds) == 2 + 2 * 2 + 2 * 2, kinds
    before = {name: id(module) for name, module in model.named_modules()}
    keys = list(model.state_dict())
    for _ in range(2):
        assert prepare_for_cpu_training(model) is model
        prepared = {name: type(module) for name, module in model.named_modules() if name in kinds}
        assert set(prepared.values()) == {CpuDropout}
        assert {name: id(module) for name, module in model.named_modules()} == before
        assert list(model.state_dict()) == keys


def test_the_training_step_prepares_the_model(tmp_path) -> None:
    """The trainer's training step takes the CPU step: after one update every dropout of the model is a
    `CpuDropout`."""
    from datasets import Dataset

    from hf_vanilla_transformer.training.trainer import VanillaSeq2SeqTrainer, VanillaSeq2SeqTrainingArguments

    from ..conftest import tiny_model

    model = tiny_model(dropout=0.1)
    pairs = Dataset.from_dict({"input_ids": [[5, 6, 7, 2], [8, 9, 2]] * 4, "labels": [[10, 11, 2], [12, 2]] * 4})
    args = VanillaSeq2SeqTrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True, max_steps=1, save_strategy="no"
    )
    VanillaSeq2SeqTrainer(model=model, args=args, train_dataset=pairs).train()
    kinds = {type(module) for module in model.modules() if isinstance(module, nn.Dropout)}
    assert kinds == {CpuDropout}


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_recomputes_the_same_masks(use_reentrant: bool) -> None:
    """Checkpointed layers run their forward again in the backward pass; torch restores the CPU generator's state
    for it, so the recomputed masks are the first ones and the gradients equal those of a plain backward."""
    from ..conftest import random_batch, tiny_model

    def gradients(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = prepare_for_cpu_training(tiny_model(dropout=0.3, activation_dropout=0.2).train())
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        torch.manual_seed(7)
        model(**random_batch()).loss.backward()
        return {name: param.grad for name, param in model.named_parameters() if param.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 20
    # The reentrant form sums some gradients in another order (1e-9 apart, with no dropout too); another mask would
    # move them by about 1e-2.
    worst = max((plain[name] - checkpointed[name]).abs().max().item() for name in plain)
    assert worst < 1e-6
