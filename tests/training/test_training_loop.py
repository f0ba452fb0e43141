"""The training loop around the model: batches padded and checked on the host (`TrainingCollator`), in worker
processes on a CUDA device, and no read-back from the device in an ordinary update (no host-device synchronisation),
only at logging steps, where non-finite losses are reported."""

import collections
import functools
import logging
import math

import numpy as np
import pytest
import torch
from transformers import DataCollatorForSeq2Seq, TrainerCallback

from hf_vanilla_transformer.model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.training.collator import TrainingCollator
from hf_vanilla_transformer.training.trainer import (
    LOADER_WORKERS_ON_CUDA,
    VanillaSeq2SeqTrainer,
    VanillaSeq2SeqTrainingArguments,
)

from ..conftest import make_trainer, tiny_setup

# The calls that read a tensor's value into Python: on a GPU, each waits for the device to finish its queued work.
READ_BACKS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__")


def count_read_backs(monkeypatch) -> collections.Counter:
    """Counts every call of READ_BACKS on any tensor while the patch holds."""
    counts: collections.Counter = collections.Counter()
    for name in READ_BACKS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts


def read_backs_over(tmp_path, updates: int, attn_implementation: str, grad_accum: int) -> collections.Counter:
    """Read-backs while the Trainer runs `updates` updates, logging at the first and the last only."""
    tokenizer, dataset, model = tiny_setup(n=400)
    model.set_attn_implementation(attn_implementation)
    trainer = make_trainer(
        tmp_path / str(updates),
        model,
        tokenizer,
        dataset,
        max_steps=updates,
        logging_steps=updates,
        logging_first_step=True,
        gradient_accumulation_steps=grad_accum,
    )
    assert trainer.args.dataloader_num_workers == 0  # on a CPU the collator runs here, and is counted too
    with pytest.MonkeyPatch.context() as patch:
        counts = count_read_backs(patch)
        trainer.train()
    assert trainer.state.global_step == updates
    assert [log["step"] for log in trainer.state.log_history if "loss" in log] == [1, updates]
    return counts


@pytest.mark.parametrize(("attn_implementation", "grad_accum"), [("eager", 1), ("sdpa", 2)])
def test_an_ordinary_update_reads_nothing_back_from_the_device(tmp_path, attn_implementation, grad_accum) -> None:
    """3 or 12 updates, each logging at the first and the last update: the same read-backs, so none belongs to an
    ordinary update (forward, loss, backward, optimizer, batch, callbacks); the logging steps read the losses."""
    few = read_backs_over(tmp_path, 3, attn_implementation, grad_accum)
    many = read_backs_over(tmp_path, 12, attn_implementation, grad_accum)
    assert sum(few.values()) > 0  # the counting works: the logs read the losses back
    assert many == few


def pairs(*rows: tuple[list[int], list[int]]) -> list[dict[str, list[int]]]:
    return [{"input_ids": source, "attention_mask": [1] * len(source), "labels": target} for source, target in rows]


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_the_collator_makes_the_batches_of_transformers_collator(padding_side) -> None:
    tokenizer, dataset, model = tiny_setup()
    tokenizer.padding_side = padding_side
    features = [dataset[i] for i in range(7)]
    features = [{name: feature[name] for name in ("input_ids", "attention_mask", "labels")} for feature in features]
    ours = TrainingCollator(model.config, padding_side)(features)
    theirs = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)(features)
    assert len({len(feature["input_ids"]) for feature in features}) > 1  # padding is tested
    assert set(ours) == set(theirs) == {"input_ids", "attention_mask", "labels", "decoder_input_ids"}
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.int64
        assert torch.equal(ours[name], tensor), name
    no_mask = [{name: value for name, value in feature.items() if name != "attention_mask"} for feature in features]
    assert torch.equal(TrainingCollator(model.config, padding_side)(no_mask)["attention_mask"], ours["attention_mask"])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (([3, 70, 2], [5, 2]), "`input_ids` of a training batch holds token id 70, outside the vocabulary"),
        (([3, -100, 2], [5, 2]), "`input_ids` of a training batch holds token id -100, outside the vocabulary"),
        (([3, 2], [5, 61, 2]), "`labels` of a training batch holds token id 61, outside the vocabulary"),
        (([3, 2], [-1, 2]), "`labels` of a training batch holds token id -1, outside the vocabulary"),
    ],
)
def test_the_collator_refuses_ids_outside_the_vocabulary_on_the_host(rows, message) -> None:
    _, _, model = tiny_setup()
    assert model.config.vocab_size == 61
    collator = TrainingCollator(model.config)
    collator(pairs(([3, 60, 2], [60, 2]), ([4, 2], [0, 2])))  # the edges of the vocabulary pass
    with pytest.raises(ValueError, match=message):
        collator(pairs(([4, 2], [5, 2]), rows))


def test_the_model_keeps_its_own_check_and_the_trainer_skips_it_for_checked_batches(tmp_path, monkeypatch) -> None:
    """Direct callers of the model still get the id check; the Trainer turns it off only for its collator's
    batches, whose ids were checked on the host."""
    tokenizer, dataset, model = tiny_setup()
    ids = torch.tensor([[3, 61, 2]])
    with pytest.raises(ValueError, match="token id 61, outside the vocabulary"):
        model(input_ids=ids, decoder_input_ids=torch.tensor([[0, 5]]))
    seen = []
    forward = VanillaTransformerForConditionalGeneration.forward

    @functools.wraps(forward)  # the Trainer picks the dataset columns from the signature
    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("check_ids", True))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(VanillaTransformerForConditionalGeneration, "forward", recording)
    make_trainer(tmp_path / "ours", model, tokenizer, dataset, max_steps=2).train()
    default_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    args = make_trainer(tmp_path / "theirs", model, tokenizer, dataset, max_steps=2).args
    VanillaSeq2SeqTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, data_collator=default_collator
    ).train()
    assert seen == [False, False, True, True]


def test_workers_prepare_the_same_batches(tmp_path) -> None:
    """Two worker processes (the default on a CUDA device) train exactly as the main process alone."""
    runs = {}
    for workers in (None, 2):  # None: the default, none on a CPU
        tokenizer, dataset, model = tiny_setup()
        trainer = make_trainer(
            tmp_path / str(workers),
            model,
            tokenizer,
            dataset,
            max_steps=6,
            logging_steps=1,
            dataloader_num_workers=workers,
        )
        workers = workers or 0
        assert trainer.args.dataloader_num_workers == workers
        assert trainer.args.dataloader_persistent_workers == (workers > 0)
        trainer.train()
        runs[workers] = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(runs[0]) == 6 and runs[0] == runs[2]


def test_loader_defaults_follow_the_device(tmp_path, monkeypatch) -> None:
    """The fixed rule: on a CUDA device 2 persistent workers and copies without blocking; elsewhere none; values
    given are kept."""
    args = VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert (args.dataloader_num_workers, args.dataloader_persistent_workers) == (0, False)
    assert not args.accelerator_config.non_blocking
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for use_cpu, expected in (
        (False, (LOADER_WORKERS_ON_CUDA, True, {"non_blocking": True})),
        (True, (0, False, None)),
    ):
        args.use_cpu = use_cpu
        args.dataloader_num_workers = args.dataloader_persistent_workers = args.accelerator_config = None
        args._resolve_loader_defaults()
        assert (args.dataloader_num_workers, args.dataloader_persistent_workers, args.accelerator_config) == expected
    args.use_cpu, args.dataloader_num_workers, args.dataloader_persistent_workers = False, 0, None
    args._resolve_loader_defaults()
    assert (args.dataloader_num_workers, args.dataloader_persistent_workers) == (0, False)


class NonFiniteLossAt:
    """Makes the loss of `update` NaN without touching its gradients (a constant NaN added to the loss)."""

    def __init__(self, trainer, update: int) -> None:
        self.trainer, self.update = trainer, update
        self.compute_loss = trainer.compute_loss
        trainer.compute_loss = self

    def __call__(self, *args, **kwargs):
        loss = self.compute_loss(*args, **kwargs)
        if self.trainer.state.global_step + 1 == self.update:
            return loss + torch.tensor(float("nan"))
        return loss


@pytest.mark.parametrize("nan_filter", [True, False])
def test_a_non_finite_loss_is_reported_at_the_next_log(tmp_path, caplog, nan_filter) -> None:
    """A NaN loss at update 3: the log of updates 1-4 names it and counts it; under `logging_nan_inf_filter` (the
    default) the logged loss is what transformers' filter gives (the NaN replaced by the mean of the interval's
    updates before it), without it NaN. The evaluation's filter is left as given."""
    tokenizer, dataset, model = tiny_setup()
    clean = make_trainer(tmp_path / "clean", model, tokenizer, dataset, max_steps=8, logging_steps=1)
    clean.train()
    losses = {log["step"]: log["loss"] for log in clean.state.log_history if "loss" in log}

    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(
        tmp_path / "nan", model, tokenizer, dataset, max_steps=8, logging_steps=4, logging_nan_inf_filter=nan_filter
    )
    NonFiniteLossAt(trainer, update=3)
    with caplog.at_level(logging.WARNING, logger="hf_vanilla_transformer.training.trainer"):
        trainer.train()
    logs = {log["step"]: log for log in trainer.state.log_history if "loss" in log}
    assert logs[4]["nonfinite_batches"] == 1 and "nonfinite_batches" not in logs[8]
    assert "Update 3 had a non-finite loss" in caplog.text
    assert trainer.args.logging_nan_inf_filter is nan_filter  # as given, after training
    if nan_filter:
        running = losses[1] + losses[2]
        expected = (running + running / 3 + losses[4]) / 4
        assert logs[4]["loss"] == pytest.approx(expected, rel=1e-5)
        assert logs[8]["loss"] == pytest.approx(np.mean([losses[step] for step in range(5, 9)]), rel=1e-5)
    else:  # transformers' running sum stays NaN once it holds one (its reset subtracts it from itself)
        assert math.isnan(logs[4]["loss"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the host-device synchronisation check needs a CUDA GPU")
def test_updates_on_a_gpu_never_synchronise(tmp_path) -> None:
    """Updates 2 to 9 of a training run on the GPU under `torch.cuda.set_sync_debug_mode("error")`: any host-device
    synchronisation in them (a read-back, a blocking copy) raises. Batches come from worker processes, pinned."""

    class SyncDebug(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.set_sync_debug_mode("error" if 1 <= state.global_step < 9 else "default")

    tokenizer, dataset, model = tiny_setup(n=400)
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, use_cpu=False, max_steps=10, logging_steps=100)
    assert trainer.args.device.type == "cuda"
    assert (
        trainer.args.dataloader_num_workers == LOADER_WORKERS_ON_CUDA and trainer.args.accelerator_config.non_blocking
    )
    trainer.add_callback(SyncDebug())
    try:
        trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.state.global_step == 10
