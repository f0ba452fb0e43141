"""§5 training: token-budget batches, eq. (3) and inverse-sqrt schedules, the Adam settings, the wall-clock budget,
time-based checkpoints, tokens/s logs and resuming, all inside Seq2SeqTrainer on a tiny model."""

import itertools
import json
import math
import random
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from safetensors.torch import load_file

from hf_vanilla_transformer.training.trainer import (
    TokenBudgetBatchSampler,
    VanillaSeq2SeqTrainer,
    VanillaSeq2SeqTrainingArguments,
    bf16_matrix_units,
    inverse_sqrt_learning_rate,
    paper_learning_rate,
    parse_duration,
    resolve_bf16,
)

from ..conftest import make_trainer, tiny_setup, write_multi30k_sample


def random_lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.randint(2, 40) for _ in range(n)], [rng.randint(2, 40) for _ in range(n)]


# ------------------------------------------------------------------------------------------- batch sampler


@pytest.mark.parametrize("max_tokens", [40, 100, 1000])
def test_batches_respect_the_token_budget_and_cover_every_pair_once(max_tokens) -> None:
    sources, targets = random_lengths(500, seed=0)
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=max_tokens, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler) == sampler.num_batches
        for batch in batches:
            padded = len(batch) * max(max(sources[i], targets[i]) for i in batch)
            assert padded <= max_tokens
        assert sorted(i for batch in batches for i in batch) == list(range(500))


def test_batches_are_filled_not_merely_bounded() -> None:
    """Greedy filling: adding the next-longer pair to a batch would break the budget."""
    sources, targets = random_lengths(500, seed=1)
    sizes = [max(s, t) for s, t in zip(sources, targets, strict=True)]
    sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=200, shuffle=False)
    batches = list(sampler)
    for batch, following in itertools.pairwise(batches):
        assert (len(batch) + 1) * sizes[following[0]] > 200


def test_shuffling_follows_seed_and_epoch() -> None:
    sources, targets = random_lengths(300, seed=2)

    def epoch_batches(seed: int, epoch: int) -> list[list[int]]:
        sampler = TokenBudgetBatchSampler(sources, targets, max_tokens=120, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert epoch_batches(seed=5, epoch=0) == epoch_batches(seed=5, epoch=0)
    assert epoch_batches(seed=5, epoch=0) != epoch_batches(seed=5, epoch=1)
    assert epoch_batches(seed=5, epoch=0) != epoch_batches(seed=6, epoch=0)
    # Same lengths, same number of batches, in every epoch (the Trainer sizes epochs with len()).
    assert len({len(epoch_batches(seed=5, epoch=epoch)) for epoch in range(5)}) == 1


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_ranks_get_disjoint_shards_of_equal_length(num_replicas) -> None:
    sources, targets = random_lengths(400, seed=4)
    single = TokenBudgetBatchSampler(sources, targets, max_tokens=150, seed=9)
    single.set_epoch(2)
    all_batches = list(single)
    shards = []
    for rank in range(num_replicas):
        sampler = TokenBudgetBatchSampler(sources, targets, 150, seed=9, num_replicas=num_replicas, rank=rank)
        sampler.set_epoch(2)
        shards.append(list(sampler))
    assert {len(shard) for shard in shards} == {math.ceil(len(all_batches) / num_replicas)}
    handed_out = [batch for step in zip(*shards, strict=True) for batch in step]  # step by step, rank by rank
    assert handed_out[: len(all_batches)] == all_batches
    assert handed_out[len(all_batches) :] == all_batches[: len(handed_out) - len(all_batches)]  # padding repeats
    counts = Counter(i for batch in handed_out for i in batch)
    assert set(counts) == set(range(400))


def test_sampler_refuses_a_budget_below_the_longest_pair() -> None:
    with pytest.raises(ValueError, match=r"`max_tokens` must be an integer of at least the longest pair \(40 tokens"):
        TokenBudgetBatchSampler([3, 40], [5, 7], max_tokens=39)
    with pytest.raises(ValueError, match="`rank` must lie in"):
        TokenBudgetBatchSampler([3], [3], max_tokens=10, num_replicas=2, rank=2)


# ------------------------------------------------------------------------------------------------ schedules


def eq3(step: int, d_model: int, warmup: int) -> float:
    """Eq. (3) written out piecewise: linear increase for `warmup` steps, then inverse square root."""
    if step <= warmup:
        return step * (1.0 / warmup) ** 1.5 / math.sqrt(d_model)
    return 1.0 / math.sqrt(step) / math.sqrt(d_model)


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (1024, 4000), (256, 400)])
def test_paper_schedule_is_eq3(d_model, warmup) -> None:
    for step in (1, 2, 100, warmup - 1, warmup, warmup + 1, 10 * warmup, 100000):
        assert paper_learning_rate(step, d_model, warmup) == pytest.approx(eq3(step, d_model, warmup), rel=1e-12)
    # The peak the paper's base model reaches: 512^-0.5 * 4000^-0.5 ≈ 7.0e-4.
    assert paper_learning_rate(4000, 512, 4000) == pytest.approx(6.988e-4, rel=1e-3)


def test_inverse_sqrt_peaks_at_the_given_rate() -> None:
    assert inverse_sqrt_learning_rate(400, 1e-3, 400) == pytest.approx(1e-3)
    assert inverse_sqrt_learning_rate(100, 1e-3, 400) == pytest.approx(2.5e-4)
    assert inverse_sqrt_learning_rate(1600, 1e-3, 400) == pytest.approx(5e-4)
    # With the paper's peak it is eq. (3).
    peak = 512**-0.5 * 4000**-0.5
    for step in (1, 3999, 4000, 9000):
        assert inverse_sqrt_learning_rate(step, peak, 4000) == pytest.approx(eq3(step, 512, 4000))


@pytest.mark.parametrize(("text", "seconds"), [("1h", 3600), ("20m", 1200), ("90s", 90), ("1h30m", 5400), ("45", 45)])
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "", "-3", "1h junk", "0"])
def test_parse_duration_refuses_garbage(text) -> None:
    with pytest.raises(ValueError, match="Durations must"):
        parse_duration(text)


# ------------------------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    ("choice", "units", "bf16", "says"),
    [
        ("auto", None, False, "no bf16 matrix units"),  # AVX2-only CPU: emulated bf16
        ("auto", "AVX512-BF16", True, "AVX512-BF16"),
        ("auto", "AMX", True, "AMX"),
        ("auto", "a GPU with bf16", True, "a GPU with bf16"),
        ("yes", None, True, "emulated and slow"),
        ("yes", "AMX", True, "bf16 autocast"),
    ],
)
def test_bf16_auto_takes_bf16_where_the_hardware_has_bf16_units(monkeypatch, choice, units, bf16, says):
    monkeypatch.setattr("hf_vanilla_transformer.training.trainer.bf16_matrix_units", lambda device: units)
    taken, line = resolve_bf16(choice, torch.device("cpu"))
    assert taken is bf16 and says in line


def test_bf16_auto_is_the_same_under_load(monkeypatch) -> None:
    """Load makes whatever a timing rule measures look slower or faster than it is (a timed bf16 GEMM chose fp32 on
    bf16 CPUs under load). Every clock is skewed here so that each interval it measures is 1000x the one before, then
    1/1000 of it: whichever of two timings comes later looks 1000x slower, then 1000x faster. The choice and its
    line must be those of the true clocks both times."""
    import time
    import timeit

    quiet = resolve_bf16("auto", torch.device("cpu"))
    for growth in (1000.0, 0.001):
        clock = _skewed_clock(growth)
        for name in ("perf_counter", "monotonic", "time", "process_time", "thread_time"):
            monkeypatch.setattr(time, name, clock)
            monkeypatch.setattr(time, f"{name}_ns", lambda clock=clock: int(clock() * 1e9))
        monkeypatch.setattr(timeit, "default_timer", clock)  # torch.utils.benchmark's
        assert resolve_bf16("auto", torch.device("cpu")) == quiet, growth


def _skewed_clock(growth: float) -> Callable[[], float]:
    """A clock whose n-th interval lasts growth**n seconds (for 100 readings; then it stops)."""
    readings = itertools.count()
    return lambda: sum(growth**index for index in range(min(next(readings), 100)))


def test_bf16_matrix_units_follow_torch_capabilities(monkeypatch) -> None:
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    for amx, avx512_bf16, expected in [(True, True, "AMX"), (False, True, "AVX512-BF16"), (False, False, None)]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        assert bf16_matrix_units(torch.device("cpu")) == expected


def test_bf16_no_does_not_measure_and_bad_choices_are_refused(monkeypatch) -> None:
    def fail(device):
        raise AssertionError("asked the hardware")

    monkeypatch.setattr("hf_vanilla_transformer.training.trainer.bf16_matrix_units", fail)
    assert resolve_bf16("no", torch.device("cpu")) == (False, "fp32 (`bf16=no`)")
    with pytest.raises(ValueError, match="`bf16` is 'maybe'; pass 'auto', 'yes' or 'no'"):
        resolve_bf16("maybe", torch.device("cpu"))


# ------------------------------------------------------------------------------------------- the Trainer


def test_the_trainer_batches_from_the_length_arrays(tmp_path) -> None:
    """The sampler takes the `source_length` / `target_length` columns that tokenization wrote (numpy arrays), not
    the token lists: lengths changed in those columns alone change the batches, which stay within the budget."""
    tokenizer, dataset, model = tiny_setup()
    wide = [16] * len(dataset)  # every pair as wide as 16 tokens: 4 pairs per 64-token batch
    dataset = dataset.remove_columns("source_length").add_column("source_length", wide)
    trainer = make_trainer(tmp_path, model, tokenizer, dataset)
    batches = list(trainer.get_train_dataloader().batch_sampler)
    assert trainer.train_batch_sampler.sizes.tolist() == wide
    assert sorted(len(batch) for batch in batches) == [4] * (len(dataset) // 4)


def test_defaults_are_the_paper_recipe(tmp_path) -> None:
    args = VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path))
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)  # §5.3
    assert (args.lr_schedule, args.learning_rate, args.warmup_steps) == ("paper", 1.0, 4000)  # eq. (3)
    assert args.label_smoothing_factor == 0.1  # §5.4
    assert (args.weight_decay, args.max_grad_norm) == (0.0, 0.0)  # plain Adam, no clipping


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(lr_schedule="cosine"), "`lr_schedule` must be one of"),
        (dict(lr_schedule="inverse_sqrt", learning_rate=1.0), "`learning_rate` is the peak learning rate"),
        (dict(warmup_steps=0.5), "`warmup_steps` must be a whole number"),
        (dict(max_time=-1.0), "`max_time` must be a positive number"),
    ],
)
def test_bad_training_arguments_are_refused(tmp_path, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path), **overrides)


def test_trainer_needs_its_arguments(tmp_path) -> None:
    from transformers import Seq2SeqTrainingArguments

    tokenizer, dataset, model = tiny_setup()
    with pytest.raises(ValueError, match="`args` must be VanillaSeq2SeqTrainingArguments"):
        VanillaSeq2SeqTrainer(
            model=model,
            args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[]),
            train_dataset=dataset,
            processing_class=tokenizer,
        )


@pytest.mark.parametrize("schedule", ["paper", "inverse_sqrt"])
def test_optimizer_and_schedule_inside_the_trainer(tmp_path, schedule) -> None:
    tokenizer, dataset, model = tiny_setup()
    lr = 1.0 if schedule == "paper" else 2e-3
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, lr_schedule=schedule, learning_rate=lr)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    group = trainer.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
    for update in range(1, 12):  # the k-th update uses step_num = k
        expected = eq3(update, 16, 4) if schedule == "paper" else inverse_sqrt_learning_rate(update, 2e-3, 4)
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()


def test_warmup_init_lr_starts_the_inverse_sqrt_warmup_there(tmp_path) -> None:
    """fairseq's --warmup-init-lr: the warmup rises linearly from it (at step 0) to the peak, then 1/sqrt(step) as
    without it; with eq. (3), or at or above the peak, it is refused."""
    assert inverse_sqrt_learning_rate(1, 1e-3, 400, 1e-7) == pytest.approx(1e-7 + (1e-3 - 1e-7) / 400)
    assert inverse_sqrt_learning_rate(200, 1e-3, 400, 1e-7) == pytest.approx((1e-7 + 1e-3) / 2)
    assert inverse_sqrt_learning_rate(400, 1e-3, 400, 1e-7) == pytest.approx(1e-3)
    assert inverse_sqrt_learning_rate(1600, 1e-3, 400, 1e-7) == inverse_sqrt_learning_rate(1600, 1e-3, 400)
    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(
        tmp_path, model, tokenizer, dataset, lr_schedule="inverse_sqrt", learning_rate=2e-3, warmup_init_lr=1e-4
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    for update in range(1, 12):  # the k-th update uses step_num = k; the warmup is 4 updates
        expected = inverse_sqrt_learning_rate(update, 2e-3, 4, 1e-4)
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    for overrides in (dict(lr_schedule="paper"), dict(lr_schedule="inverse_sqrt", learning_rate=1e-4)):
        with pytest.raises(ValueError, match=r"`warmup_init_lr=0.0001` is where the inverse_sqrt warmup starts"):
            VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path), warmup_init_lr=1e-4, **overrides)


def remaining_share_factor(remaining: float, cooldown: float) -> float:
    """The cooldown's factor written out: 1 before the last `cooldown` share of the budget, then the share of the
    cooldown left."""
    if remaining >= cooldown:
        return 1.0
    return max(remaining, 0.0) / cooldown


@pytest.mark.parametrize("schedule", ["paper", "inverse_sqrt"])
def test_cooldown_over_the_last_share_of_max_steps(tmp_path, schedule) -> None:
    tokenizer, dataset, model = tiny_setup()
    lr = 1.0 if schedule == "paper" else 2e-3
    trainer = make_trainer(
        tmp_path, model, tokenizer, dataset, lr_schedule=schedule, learning_rate=lr, max_steps=20, lr_cooldown=0.25
    )
    trainer.create_optimizer_and_scheduler(num_training_steps=20)
    rates = []
    for update in range(1, 21):
        base = eq3(update, 16, 4) if schedule == "paper" else inverse_sqrt_learning_rate(update, 2e-3, 4)
        # Before update k, (20 - k + 1) of the 20 updates are left; the last 5 (25%) are scaled by 5/5, 4/5, ..., 1/5.
        factor = 1.0 if update <= 15 else (21 - update) / 5
        rates.append(trainer.optimizer.param_groups[0]["lr"])
        assert rates[-1] == pytest.approx(base * factor, rel=1e-9)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()


def test_cooldown_follows_the_wall_clock_of_max_time(tmp_path) -> None:
    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_time=100.0, lr_cooldown=0.3)
    trainer.create_optimizer_and_scheduler(num_training_steps=1000)
    for update, elapsed in enumerate((0.0, 50.0, 70.0, 79.0, 85.0, 97.0, 100.0, 120.0), start=2):
        trainer.clock.last_elapsed = elapsed  # what the clock callback sets after each update
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        expected = inverse_sqrt_learning_rate(update, 1e-3, 4) * remaining_share_factor(1 - elapsed / 100, 0.3)
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0


def test_cooldown_ends_with_a_small_learning_rate_in_a_real_run(tmp_path) -> None:
    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_steps=12, lr_cooldown=0.5, logging_steps=1)
    trainer.train()
    rates = [log["learning_rate"] for log in trainer.state.log_history if "learning_rate" in log]
    assert len(rates) == 12
    # The Trainer logs the rate each update used: (12 - k + 1) of the 12 updates are left before update k.
    for update, rate in enumerate(rates, start=1):
        expected = inverse_sqrt_learning_rate(update, 1e-3, 4) * remaining_share_factor((13 - update) / 12, 0.5)
        assert rate == pytest.approx(expected, rel=1e-6)
    assert rates[-1] == pytest.approx(inverse_sqrt_learning_rate(12, 1e-3, 4) / 6, rel=1e-6)  # 1/12 left of 1/2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lr_cooldown": 0.0, "max_steps": 10}, "`lr_cooldown` is a share of the training budget in \\(0, 1\\]"),
        ({"lr_cooldown": 1.5, "max_steps": 10}, "got 1.5"),
        ({"lr_cooldown": 0.3}, "set `max_time` or `max_steps`, or drop `lr_cooldown`"),
    ],
)
def test_cooldown_refuses_bad_values(tmp_path, overrides, message) -> None:
    with pytest.raises(ValueError, match=message):
        VanillaSeq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], **overrides)


def test_training_uses_token_budget_batches_and_logs_tokens_per_second(tmp_path) -> None:
    tokenizer, dataset, model = tiny_setup()
    seen: list[list[int]] = []
    collator = VanillaSeq2SeqTrainer(
        model=model, args=make_trainer(tmp_path, model, tokenizer, dataset).args, processing_class=tokenizer
    ).data_collator

    def recording_collator(features):
        seen.append([feature["input_ids"] for feature in features])
        return collator(features)

    args = make_trainer(tmp_path, model, tokenizer, dataset, num_train_epochs=2, gradient_accumulation_steps=2).args
    trainer = VanillaSeq2SeqTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, data_collator=recording_collator
    )
    trainer.train()
    sampler = trainer.train_batch_sampler
    assert trainer.state.global_step == 2 * math.ceil(sampler.num_batches / 2)  # GA 2: half as many updates
    assert len(seen) == 2 * sampler.num_batches
    for batch in seen:  # padded source width times rows within the budget (targets are as long here)
        assert len(batch) * max(len(ids) for ids in batch) <= 64
    first_epoch = Counter(tuple(ids) for batch in seen[: sampler.num_batches] for ids in batch)
    assert first_epoch == Counter(tuple(ids) for ids in dataset["input_ids"])  # every pair once per epoch
    assert seen[: sampler.num_batches] != seen[sampler.num_batches :]  # reshuffled for epoch 2
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert logs and all(log["tgt_tokens_per_second"] > 0 for log in logs)
    total = sum(len(ids) for ids in dataset["labels"]) * 2
    assert logs[-1]["tgt_tokens"] <= total
    summary = trainer.state.log_history[-1]
    assert summary["train_tgt_tokens"] == total and summary["train_tgt_tokens_per_second"] > 0


def test_trainer_loss_is_the_label_smoother_loss_fused_in_training(tmp_path, monkeypatch) -> None:
    """The model computes §5.4 itself (fused when training): the loss and gradients of the Trainer's LabelSmoother."""
    from transformers.trainer_pt_utils import LabelSmoother

    from hf_vanilla_transformer.model import modeling_vanilla_transformer

    fused_calls = []
    fused = modeling_vanilla_transformer.linear_label_smoothed_cross_entropy
    monkeypatch.setattr(
        modeling_vanilla_transformer,
        "linear_label_smoothed_cross_entropy",
        lambda *args, **kwargs: fused_calls.append(args[-1]) or fused(*args, **kwargs),
    )

    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(tmp_path, model, tokenizer, dataset)
    assert isinstance(trainer.label_smoother, LabelSmoother) and trainer.label_smoother.epsilon == 0.1
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["labels"].eq(-100).any()  # padded targets are ignored
    model.train()
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    expected = LabelSmoother(epsilon=0.1)({"logits": logits}, batch["labels"])
    expected_grads = torch.autograd.grad(expected, list(model.parameters()))
    loss = trainer.compute_loss(model, dict(batch))
    assert fused_calls == [0.1]
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)
    for a, b in zip(expected_grads, torch.autograd.grad(loss, list(model.parameters())), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert trainer.label_smoother is not None  # restored for the Trainer's own evaluation paths
    model.eval()
    loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=True)  # evaluation keeps the logits
    torch.testing.assert_close(outputs.logits, logits.detach(), rtol=0, atol=0)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=0)
    assert fused_calls == [0.1]


def test_wall_clock_budget_stops_training_with_a_checkpoint(tmp_path) -> None:
    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, num_train_epochs=10000, max_time=1.0)
    trainer.train()
    steps_per_epoch = trainer.train_batch_sampler.num_batches
    assert 0 < trainer.state.global_step < 10000 * steps_per_epoch
    checkpoint = tmp_path / f"checkpoint-{trainer.state.global_step}"
    assert (checkpoint / "model.safetensors").is_file()
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["stateful_callbacks"]["WallClockCallback"]["attributes"]["elapsed_before"] >= 1.0


def test_time_budget_progress_bar_counts_training_seconds(tmp_path) -> None:
    """With a time budget the progress bar runs over seconds of training, not over an unknowable update count."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import ProgressCallback

    tokenizer, dataset, model = tiny_setup()
    options = dict(num_train_epochs=10000, max_time=1.0, disable_tqdm=False)
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, **options)
    bars = [callback for callback in trainer.callback_handler.callbacks if isinstance(callback, ProgressCallback)]
    assert [type(callback).__name__ for callback in bars] == ["WallClockProgressCallback"]
    seen = []

    class Spy(TrainerCallback):  # runs after the bar's own on_step_end; the Trainer drops the bar at the end
        def on_step_end(self, args, state, control, **kwargs) -> None:
            bar = bars[0].training_bar
            seen.append((bar.n, bar.total, bar.postfix, state.global_step))

    trainer.add_callback(Spy())
    trainer.train()
    assert all(n <= total == 1.0 for n, total, _, _ in seen) and seen[-1][0] == 1.0  # seconds, up to the budget
    assert [n for n, *_ in seen] == sorted(n for n, *_ in seen)
    assert all(postfix == f"update {step}" for _, _, postfix, step in seen)


def test_checkpoints_by_time(tmp_path, monkeypatch) -> None:
    """With save_every=5 s and a clock that advances one second per update, checkpoints come at updates 5 and 10,
    and at the last update (12)."""
    import time
    import types

    from transformers import TrainerCallback

    import hf_vanilla_transformer.training.trainer as training

    now = [0.0]
    monkeypatch.setattr(
        training, "time", types.SimpleNamespace(monotonic=lambda: now[0], perf_counter=time.perf_counter)
    )

    class OneSecondPerUpdate(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            now[0] += 1.0

    tokenizer, dataset, model = tiny_setup()
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_steps=12, save_every=5.0)
    trainer.add_callback(OneSecondPerUpdate())
    trainer.train()
    assert sorted(int(path.name.split("-")[1]) for path in tmp_path.glob("checkpoint-*")) == [5, 10, 12]


def test_resume_after_a_kill_continues_exactly(tmp_path) -> None:
    """Training 4 updates, stopping, and resuming to 9 gives the weights of 9 updates in one go (same batches,
    same order, same schedule)."""
    tokenizer, dataset, model = tiny_setup()
    straight = make_trainer(tmp_path / "straight", model, tokenizer, dataset, max_steps=9)
    straight.train()
    reference = {key: value.clone() for key, value in straight.model.state_dict().items()}

    tokenizer, dataset, model = tiny_setup()
    first = make_trainer(tmp_path / "resumed", model, tokenizer, dataset, max_steps=4, save_strategy="steps")
    first.args.save_steps = 4
    first.train()
    tokenizer, dataset, model = tiny_setup(model_seed=1)  # other initial weights: the checkpoint must replace them
    second = make_trainer(tmp_path / "resumed", model, tokenizer, dataset, max_steps=9)
    second.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))
    assert second.state.global_step == 9
    for key, value in second.model.state_dict().items():
        torch.testing.assert_close(value, reference[key], rtol=1e-5, atol=1e-6, msg=key)


def test_generation_config_is_restored_before_saving(tmp_path) -> None:
    from transformers import GenerationConfig

    tokenizer, dataset, model = tiny_setup()
    model.generation_config = GenerationConfig(num_beams=4, length_penalty=0.6, max_new_tokens=60, eos_token_id=2)
    trainer = make_trainer(tmp_path, model, tokenizer, dataset, max_steps=1)
    trainer.train()
    model.generation_config.max_length = 20  # what predict_with_generate leaves behind
    model.generation_config.num_beams = 1
    trainer.save_model(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "generation_config.json").read_text())
    assert saved["num_beams"] == 4 and saved["max_new_tokens"] == 60 and "max_length" not in saved
    assert set(load_file(tmp_path / "saved" / "model.safetensors")) == {
        key
        for key in model.state_dict()
        if key.startswith("model.shared") or ("embed" not in key and "lm_head" not in key)
    }


# ------------------------------------------------------------------------------------------- issue 34


@pytest.mark.parametrize("units", [None, "AVX512-BF16"], ids=["no-bf16-units", "bf16-units"])
def test_the_printed_precision_line_is_the_decision_and_its_reason(monkeypatch, caplog, tmp_path, units) -> None:
    """`train` prints "Precision: ..." from the call that sets the Trainer's bf16: the line says bf16 exactly when
    the Trainer gets bf16, names the hardware fact the rule read, and holds no timing (a GEMM rate printed beside
    the choice read as its reason: "bf16 autocast (...; measured bf16 GEMM 0.083x fp32 here)")."""
    import logging
    import re

    from hf_vanilla_transformer.training.options import TrainOptions
    from hf_vanilla_transformer.training.train import check_options

    monkeypatch.setattr("hf_vanilla_transformer.training.trainer.bf16_matrix_units", lambda device: units)
    with caplog.at_level(logging.INFO, logger="hf_vanilla_transformer"):
        checked = check_options(TrainOptions(bf16="auto", output_dir=tmp_path))
    (line,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Precision: ")]
    assert checked.bf16 is checked.training_args.bf16 is (units is not None)
    assert line.startswith("Precision: bf16 autocast" if checked.bf16 else "Precision: fp32"), line
    assert ("`bf16=auto` chose bf16" if checked.bf16 else "`bf16=auto` chose fp32") in line, line
    assert (f"bf16 matrix units, {units}" if units else "no bf16 matrix units") in line, line
    assert not re.search(r"GEMM|measured|\d+(\.\d+)?x\b", line), line


# SIGTERM from outside, as a scheduler or `kill` sends it: real subprocesses of `hf-vanilla-transformer train`
# (tests/train_script.py: the CLI unchanged, with hooks that pause it at a known point).
SIGTERM_STEPS = 12  # with --save-steps 5: checkpoints 5, 10 (the epoch's end) and 12
_SLOW_BPE = """
import sys, time
from pathlib import Path
import hf_vanilla_transformer.training.train as train_module
from hf_vanilla_transformer.cli import main

def slow_bpe(*args, **kwargs):  # the BPE is being trained: say so, and take long enough to be stopped
    Path(sys.argv[1]).write_text("")
    time.sleep(120)
    raise AssertionError("SIGTERM did not stop the run")

train_module.train_bpe_tokenizer = slow_bpe
sys.exit(main(sys.argv[2:]))
"""


def _terminated(command: list[str], marker, cwd, env) -> tuple[int, str]:
    """Run `command` until it writes `marker`, send it SIGTERM, and return its exit status and stderr."""
    import signal
    import subprocess
    import time

    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), f"the run never reached its pause:\n{process.communicate()[1][-3000:]}"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, stderr


def test_sigterm_during_bpe_preparation_is_one_line_that_starts_the_run_again(tmp_path) -> None:
    """SIGTERM while the data is prepared (the BPE being trained): exit 143, no traceback, and a last line that
    says no checkpoint was saved and gives the command that starts the run again (the same one: --resume would
    find nothing to resume); the run folder holds no checkpoint."""
    import shlex
    import sys

    from ..train_script import REPO, environment, write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    output = tmp_path / "my run"
    args = [
        *("train", "--train-src", str(corpus / "train.src"), "--train-tgt", str(corpus / "train.tgt")),
        *("--vocab-size", "300", "--max-steps", "2", "--no-eval", "--no-progress", "--output-dir", str(output)),
    ]
    driver = tmp_path / "slow_bpe.py"
    driver.write_text(_SLOW_BPE, encoding="utf-8")
    marker = tmp_path / "in-bpe"
    code, stderr = _terminated([sys.executable, str(driver), str(marker), *args], marker, REPO, environment())
    assert code == 143, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == (
        "hf-vanilla-transformer train: terminated (SIGTERM). No checkpoint of this run was saved yet; to start it "
        f"again: {shlex.join(['hf-vanilla-transformer', *args])}"
    )
    assert not list(output.glob("checkpoints/checkpoint-*"))


def test_sigterm_during_training_then_the_printed_command_resumes_bit_identically(tmp_path) -> None:
    """SIGTERM during training (after update 7; checkpoint-5 is the last one): exit 143, no traceback, a last line
    naming checkpoint-5 and the command that continues the run; that command, run as printed, ends with the
    weights (last checkpoint and averaged model folder) and Adam's state of an uninterrupted run, bit for bit."""
    import shlex

    from safetensors.torch import load_file

    from ..train_script import REPO, command, environment, run, train_args, write_corpus

    corpus = write_corpus(tmp_path / "corpus")
    hooks = ["--save-steps", "5"]
    reference = tmp_path / "reference"
    assert run(hooks, train_args(corpus, reference, SIGTERM_STEPS)).returncode == 0

    output = tmp_path / "stopped"
    args = train_args(corpus, output, SIGTERM_STEPS)
    marker = output / "paused-at-7"
    code, stderr = _terminated(command([*hooks, "--pause-at", "7"], args), marker, REPO, environment())
    assert code == 143, stderr
    assert "Traceback" not in stderr, stderr
    line = stderr.splitlines()[-1]
    start = "hf-vanilla-transformer train: terminated (SIGTERM). The run folder keeps its checkpoints up to "
    assert line.startswith(start + "checkpoint-5; to continue from it: "), line
    again = shlex.split(line.split("to continue from it: ", 1)[1])
    assert again == ["hf-vanilla-transformer", *args, "--resume"]

    resumed = run(hooks, again[1:])
    assert resumed.returncode == 0, resumed.stdout
    assert f"Trained {SIGTERM_STEPS} updates" in resumed.stdout
    last = f"checkpoints/checkpoint-{SIGTERM_STEPS}"
    for name in (f"{last}/model.safetensors", "model/model.safetensors"):
        expected, actual = load_file(reference / name), load_file(output / name)
        assert expected.keys() == actual.keys() and all(torch.equal(actual[k], expected[k]) for k in expected), name
    adam = [torch.load(folder / last / "optimizer.pt", weights_only=True)["state"] for folder in (reference, output)]
    assert adam[0].keys() == adam[1].keys()
    for index in adam[0]:
        assert all(torch.equal(adam[1][index][key], value) for key, value in adam[0][index].items())


def test_the_quick_recipe_cuts_the_test_decoding_and_says_so(tmp_path, monkeypatch, capsys) -> None:
    """`--recipe quick` (`make train-quick`, which the README names): a trial whose test decoding is cut (the first
    200 sentences, greedy; `make train ARGS="--max-time 2m"` decoded all of test_2016 with beam 4, twice, which an
    untrained model makes a quarter hour). Here with the cut at 3 of 5 test sentences: both scorings decode 3,
    greedily, and the card says its scores are a trial's."""
    import re
    from dataclasses import replace
    from pathlib import Path

    import hf_vanilla_transformer.training.train as train_module
    from hf_vanilla_transformer.cli import main
    from hf_vanilla_transformer.training.recipes import RECIPES

    quick = RECIPES["quick"]
    assert (quick.test_max_sentences, quick.test_num_beams) == (200, 1) and quick.max_time <= 3 * 60
    root = Path(__file__).resolve().parents[2]
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^train-quick:.*\n\t.*hf-vanilla-transformer train --recipe quick ", makefile, re.MULTILINE)
    assert "`make train-quick`" in (root / "README.md").read_text(encoding="utf-8")

    from hf_vanilla_transformer.model.configuration_vanilla_transformer import PRESETS

    from ..train_script import TEST_PRESET

    monkeypatch.setitem(PRESETS, "transformer-test", TEST_PRESET)  # seconds, not minutes, on 2 cores
    plot = train_module.plot_attention_maps  # one layer and head: the figures are tested elsewhere
    monkeypatch.setattr(train_module, "plot_attention_maps", lambda o: plot(replace(o, layers=[0], heads=[0])))
    write_multi30k_sample(tmp_path, 300, 5)
    run = tmp_path / "run"
    argv = [
        *("train", "--recipe", "quick", "--train-src", str(tmp_path / "train.en")),
        *("--train-tgt", str(tmp_path / "train.de"), "--test-src", str(tmp_path / "test.en")),
        *("--test-tgt", str(tmp_path / "test.de"), "--vocab-size", "400", "--max-tokens", "1024"),
        *("--preset", "transformer-test"),
        *("--max-steps", "2", "--save-every", "0.001", "--test-max-sentences", "3", "--examples", "0"),
        *("--no-progress", "--output-dir", str(run)),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    results = json.loads((run / "model" / "results.json").read_text(encoding="utf-8"))
    for scoring in ("test", "test_last_checkpoint"):
        assert results[scoring]["n"] == 3 and len(results[scoring]["hypotheses"]) == 3
        assert results[scoring]["generation"]["num_beams"] == 1
    card = " ".join((run / "model" / "README.md").read_text(encoding="utf-8").split())
    assert "The scores above are of the test set's first 3 sentences decoded with beam 1" in card
