"""§5 Training, inside transformers' `Seq2SeqTrainer` (so accelerate / torchrun / DeepSpeed / FSDP carry it further).

- §5.1 batching: `TokenBudgetBatchSampler` groups sentence pairs of similar length into batches of at most
  `max_tokens` padded tokens per side (the paper: ~25,000 source and ~25,000 target tokens per batch), shuffled
  each epoch with the seed, sharded by rank.
- §5.3 optimizer: Adam, β1 = 0.9, β2 = 0.98, ε = 1e-9 (transformers' AdamW with weight decay 0, which is Adam), no
  gradient clipping (the paper mentions none); the learning rate follows eq. (3)
  lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) with warmup 4000 (`lr_schedule="paper"`), or, as a
  deviation, fairseq's `inverse_sqrt`: linear warmup to a peak learning rate, then ∝ 1/√step
  (`lr_schedule="inverse_sqrt"`), which converges sooner on small data.
- §5.4 regularization: dropout from the model config; label smoothing ε_ls = 0.1 (`label_smoothing_factor`).
- Wall clock: `max_time` stops training at a budget (saving a checkpoint), `save_every` checkpoints at time
  intervals (the paper: every 10 minutes, §6.1), and the budget survives a resume.
- Logs: Trainer's tqdm bar and logs, plus target tokens per second; a non-finite loss is named at the next log.
- The loop (docs/training.md, "The training loop"): no read-back from the device in an ordinary update (the ids
  checked on the host by `TrainingCollator`, the NaN/inf filter of the loss on the device); on a CUDA device the
  batches prepared in worker processes, pinned and copied without blocking.
- Validation during training (`eval_every`, with an `eval_dataset` and `predict_with_generate`): the dev set is
  scored (loss, sacreBLEU and chrF of the generated translations) at each checkpoint save, every N updates or every
  so many seconds; every evaluation saves a checkpoint, so each score belongs to one (for `keep_best` and
  `average` "best" / "spread"); `early_stopping_patience` stops after that many evaluations without a better dev BLEU.
- Deployment: the decoder start token's embedding row is kept at zero (`decoder_start_embedding="zero"`,
  start_embedding.py), as CTranslate2 starts decoding from a zero vector.

The defaults of `VanillaSeq2SeqTrainingArguments` are the paper's recipe.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import PartialState
from accelerate.utils import broadcast
from datasets import Dataset
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm
from transformers import (
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from transformers.trainer_callback import ExportableState, ProgressCallback

from ..files import SNAPSHOT_FILE
from ..inference.cpu_inference import prepare_for_cpu_inference
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .averaging import checkpoint_infos
from .collator import TrainingCollator
from .cpu_training import prepare_for_cpu_training
from .data import pair_lengths
from .options import LR_SCHEDULES, EvalSchedule, parse_duration, parse_eval_every
from .start_embedding import START_EMBEDDING_CHOICES, ZeroStartEmbeddingCallback
from .static_shapes import LengthBuckets, StaticShapeCollator

logger = logging.getLogger(__name__)

# Data-loader worker processes on a CUDA device (VanillaSeq2SeqTrainingArguments._resolve_loader_defaults).
LOADER_WORKERS_ON_CUDA = 2


def paper_learning_rate(step: int, d_model: int, warmup_steps: int) -> float:
    """§5.3 eq. (3): lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5), step_num ≥ 1."""
    step = max(step, 1)
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def inverse_sqrt_learning_rate(step: int, peak_lr: float, warmup_steps: int, init_lr: float = 0.0) -> float:
    """Deviation (fairseq's `inverse_sqrt`): peak_lr · min(step / warmup, √(warmup / step)), step ≥ 1. It is eq. (3)
    with the peak set directly (eq. (3) peaks at d_model^-0.5 · warmup^-0.5) instead of by d_model and warmup.
    `init_lr` (fairseq's --warmup-init-lr): the warmup rises linearly from it (at step 0) instead of from 0."""
    step = max(step, 1)
    if step < warmup_steps:
        return init_lr + (peak_lr - init_lr) * (step / warmup_steps)
    return peak_lr * (warmup_steps / step) ** 0.5


def cooldown_factor(remaining: float, cooldown: float) -> float:
    """Deviation (`lr_cooldown`, a linear cooldown as in warmup-stable-decay schedules): the factor on the learning
    rate when `remaining` of the budget is left (1 at the start, 0 at the end), 1 until the last `cooldown` share of
    the budget, then falling linearly to 0 at its end."""
    return min(1.0, max(remaining, 0.0) / cooldown)


def bf16_matrix_units(device: torch.device) -> str | None:
    """The bf16 matrix hardware this device has, as torch reports it (None where bf16 would be emulated).

    A capability, not a timing: the choice must not depend on what else the machine is doing at start (a timed
    GEMM under background load picked fp32 on bf16 CPUs most of the time)."""
    if device.type == "cuda":
        # Not torch's default `including_emulation=True`, which says yes on GPUs that emulate bf16 (V100, T4: compute
        # capability 7.x); bf16 tensor cores came with compute capability 8.0 (Ampere).
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        major, minor = torch.cuda.get_device_capability(device)
        return f"bf16 tensor cores, compute capability {major}.{minor}"
    if device.type != "cpu" or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX512-BF16"
    return None


def resolve_bf16(choice: str, device: torch.device) -> tuple[bool, str]:
    """Whether to train under bf16 autocast for `bf16` "auto", "yes" or "no", and the line that says what was
    decided and why (`train` prints it as "Precision: ...").

    "auto" has one rule: bf16 where the device has bf16 matrix units as torch reports them (`bf16_matrix_units`: AMX
    or AVX512-BF16 CPUs, GPUs with bf16), fp32 elsewhere (AVX2-only CPUs emulate bf16 about 100x slower than fp32).
    No timing enters it, and none is printed: a bf16 GEMM timed at the start read 0.083x fp32 in one run and 46x in
    another, with what else the machine ran, and printed beside the choice it read as its reason. "yes" takes bf16
    regardless, saying so where it is emulated."""
    if choice not in ("auto", "yes", "no"):
        raise ValueError(f"`bf16` is {choice!r}; pass 'auto', 'yes' or 'no'.")
    if choice == "no":
        return False, "fp32 (`bf16=no`)"
    units = bf16_matrix_units(device)
    if choice == "yes":
        why = (
            f"bf16 matrix units: {units}" if units else "no bf16 matrix units: emulated and slow here, try `bf16=auto`"
        )
        return True, f"bf16 autocast (`bf16`; {why})"
    if units:
        return True, f"bf16 autocast (`bf16=auto` chose bf16: this device has bf16 matrix units, {units})"
    return False, "fp32 (`bf16=auto` chose fp32: this device has no bf16 matrix units, so bf16 would be emulated)"


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """§5.1 "Sentence pairs were batched together by approximate sequence length": batches of similar-length pairs
    holding at most `max_tokens` padded tokens on each side, i.e. rows × max(longest source, longest target) ≤
    `max_tokens` (fairseq's `--max-tokens`; the paper's batches held ~25,000 source and ~25,000 target tokens).

    Each epoch, pairs are sorted by their longer side (ties in a random order), cut greedily into batches, and the
    batches shuffled; the randomness comes from (`seed`, epoch) only, so every process builds the same batches and
    a resumed run sees the same order. Rank r of `num_replicas` takes batches r, r + num_replicas, ...; where the
    batches do not divide evenly the first ones are repeated so every rank runs the same number of steps. The number
    of batches is the same in every epoch (it depends only on the sorted lengths), as the Trainer needs.

    Args:
        source_lengths, target_lengths: tokens of each pair's source and target, `</s>` included.
        max_tokens: the budget per side; the longest pair must fit alone.
        seed: shuffling seed; `set_epoch(epoch)` selects the epoch's order.
        shuffle: False keeps the length order and the batch order (e.g. for evaluation).
        num_replicas, rank: data-parallel processes and this process's index.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if len(source_lengths) != len(target_lengths) or not len(source_lengths):
            raise ValueError(
                f"`source_lengths` and `target_lengths` must be non-empty and of equal length, got "
                f"{len(source_lengths)} and {len(target_lengths)}."
            )
        if not isinstance(num_replicas, int) or num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"`rank` must lie in [0, num_replicas), got rank={rank}, num_replicas={num_replicas}.")
        self.sizes = np.maximum(np.asarray(source_lengths), np.asarray(target_lengths))
        longest = int(self.sizes.max())
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < longest:
            raise ValueError(
                f"`max_tokens` must be an integer of at least the longest pair ({longest} tokens), got {max_tokens!r}."
                " Raise max_tokens or filter long pairs (tokenize_pairs(max_length=...))."
            )
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.num_batches = len(self._plan()[2])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _plan(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The current epoch's batches as arrays, not lists (a corpus of millions of pairs would make millions of
        Python ints): pair indices in length order, where each batch starts in it, and the order of the batches."""
        rng = np.random.default_rng((self.seed, self.epoch))
        order = rng.permutation(len(self.sizes)) if self.shuffle else np.arange(len(self.sizes))
        order = order[np.argsort(self.sizes[order], kind="stable")]  # by length; ties keep the random order
        sizes = self.sizes[order]
        starts = [0]
        while starts[-1] < len(order):
            # Ascending sizes: a batch from `start` holding k pairs is k × sizes[start + k - 1] tokens wide, which
            # grows with k; take the most pairs that fit (at least one: the longest pair fits alone).
            start = starts[-1]
            window = sizes[start : start + self.max_tokens // int(sizes[start])]
            fits = np.arange(1, len(window) + 1) * window <= self.max_tokens
            starts.append(start + max(int(fits.sum()), 1))
        bounds = np.asarray(starts)
        batch_order = rng.permutation(len(bounds) - 1) if self.shuffle else np.arange(len(bounds) - 1)
        return order, bounds, batch_order

    def batches(self) -> list[list[int]]:
        """All batches of the current epoch (every rank's), in the order they are handed out."""
        order, bounds, batch_order = self._plan()
        return [order[bounds[i] : bounds[i + 1]].tolist() for i in batch_order]

    def __iter__(self):
        order, bounds, batch_order = self._plan()
        total = len(self) * self.num_replicas
        # Repeat the first batches so that ranks match; each batch becomes a list only when it is handed out.
        for position in range(self.rank, total, self.num_replicas):
            i = batch_order[position % len(batch_order)]
            yield order[bounds[i] : bounds[i + 1]].tolist()

    def __len__(self) -> int:
        return math.ceil(self.num_batches / self.num_replicas)


@dataclass
class VanillaSeq2SeqTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` whose defaults are the paper's recipe (§5.3, §5.4), plus token-budget batches,
    the learning-rate schedule and wall-clock controls. `per_device_train_batch_size` is unused: `max_tokens` sizes
    the training batches. The data loader's workers and copies follow the device unless given
    (`_resolve_loader_defaults`); `logging_nan_inf_filter` means what it means to transformers, and
    `VanillaSeq2SeqTrainer` applies it on the device."""

    max_tokens: int = field(
        default=4096,
        metadata={"help": "Padded tokens per side and batch (the paper: ~25000 over 8 GPUs); times GA and processes."},
    )
    lr_schedule: str = field(
        default="paper",
        metadata={
            "help": "'paper': eq. (3) times learning_rate (1.0 = the paper); 'inverse_sqrt' (deviation, fairseq): "
            "learning_rate is the peak reached after warmup_steps."
        },
    )
    warmup_init_lr: float | None = field(
        default=None,
        metadata={
            "help": "Deviation (fairseq's --warmup-init-lr): with lr_schedule='inverse_sqrt', the learning rate the "
            "warmup rises from, linearly, to learning_rate. None: 0."
        },
    )
    lr_cooldown: float | None = field(
        default=None,
        metadata={
            "help": "Deviation (the paper never decays to zero): the share of the budget (max_time, else max_steps), "
            "in (0, 1], over whose end the schedule's learning rate is scaled linearly down to 0. None: no cooldown."
        },
    )
    max_time: float | None = field(
        default=None, metadata={"help": "Wall-clock training budget in seconds; stops with a checkpoint."}
    )
    save_every: float | None = field(
        default=None, metadata={"help": "Save a checkpoint every this many seconds (the paper: 600)."}
    )
    decoder_start_embedding: str = field(
        default="zero",
        metadata={
            "help": "'zero': the decoder start token's (<pad>'s) embedding row is set to zero when training begins "
            "and kept there, so exports run in CTranslate2 (start_embedding.py); 'train': trained like every row "
            "(the export to CTranslate2 then needs --allow-nonzero-start-embedding and decodes differently)."
        },
    )
    eval_every: str | None = field(
        default=None,
        metadata={
            "help": "With an eval_dataset: score it 'save' = at each checkpoint save, 'N' = every N updates, or '10m' "
            "= every 10 minutes of training; each evaluation saves a checkpoint. None: the Trainer's eval_strategy."
        },
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={"help": "Stop after this many dev evaluations without a better eval_bleu (None: never)."},
    )
    length_buckets: int = field(
        default=0,
        metadata={
            "help": "Pad every training batch to one of at most this many fixed shapes (static_shapes.py), for CUDA "
            "graphs (torch_compile_mode='reduce-overhead'); 0: batches as long as their longest pair."
        },
    )
    dataloader_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that read and pad the batches. None: 2 on a CUDA device, 0 (the main process) "
            "elsewhere (VanillaSeq2SeqTrainingArguments)."
        },
    )
    dataloader_persistent_workers: bool | None = field(
        default=None, metadata={"help": "Keep the worker processes from epoch to epoch. None: where there are any."}
    )
    learning_rate: float = 1.0
    warmup_steps: float = 4000
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0
    label_smoothing_factor: float = 0.1

    def __post_init__(self) -> None:
        self._resolve_loader_defaults()
        super().__post_init__()
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"`lr_schedule` must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")
        if self.decoder_start_embedding not in START_EMBEDDING_CHOICES:
            raise ValueError(
                f"`decoder_start_embedding` must be one of {START_EMBEDDING_CHOICES}, got "
                f"{self.decoder_start_embedding!r}."
            )
        parse_eval_every(self.eval_every)  # raises on a bad value
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError(f"`early_stopping_patience` must be at least 1, got {self.early_stopping_patience}.")
        if self.warmup_steps < 1 or self.warmup_steps != int(self.warmup_steps):
            raise ValueError(
                f"`warmup_steps` must be a whole number of steps >= 1 for both schedules, got {self.warmup_steps}."
            )
        if self.lr_schedule == "inverse_sqrt" and self.learning_rate >= 0.1:
            raise ValueError(
                f"`learning_rate` is the peak learning rate with lr_schedule='inverse_sqrt', got {self.learning_rate}"
                ", which diverges with Adam. Use e.g. 1e-3 (or lr_schedule='paper', where 1.0 means eq. (3))."
            )
        if self.warmup_init_lr is not None and not (
            self.lr_schedule == "inverse_sqrt" and 0 <= self.warmup_init_lr < self.learning_rate
        ):
            raise ValueError(
                f"`warmup_init_lr={self.warmup_init_lr}` is where the inverse_sqrt warmup starts: it needs "
                "lr_schedule='inverse_sqrt' and a value from 0 to below the peak learning_rate "
                f"({self.learning_rate:g})."
            )
        for name in ("max_time", "save_every"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"`{name}` must be a positive number of seconds or None, got {value!r}.")
        if self.lr_cooldown is not None:
            if not 0 < self.lr_cooldown <= 1:
                raise ValueError(
                    f"`lr_cooldown` is a share of the training budget in (0, 1], e.g. 0.3, got {self.lr_cooldown!r}."
                )
            if self.max_time is None and self.max_steps <= 0:
                raise ValueError(
                    f"`lr_cooldown={self.lr_cooldown}` decays to 0 at the end of the budget, and there is none: set "
                    "`max_time` or `max_steps`, or drop `lr_cooldown`."
                )

    def _resolve_loader_defaults(self) -> None:
        """The data loader's defaults by one fixed rule, before transformers checks them: on a CUDA device, batches
        read and padded in `LOADER_WORKERS_ON_CUDA` persistent worker processes and copied without blocking (from
        pinned memory), so the host prepares and sends the next batches while the GPU computes; elsewhere in the main
        process (on a CPU the workers would take cores from the model's own threads). Values given are kept."""
        on_cuda = torch.cuda.is_available() and not self.use_cpu
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = LOADER_WORKERS_ON_CUDA if on_cuda else 0
        if self.dataloader_persistent_workers is None:
            self.dataloader_persistent_workers = self.dataloader_num_workers > 0
        if self.accelerator_config is None and on_cuda:
            self.accelerator_config = {"non_blocking": True}


class WallClockCallback(TrainerCallback, ExportableState):
    """Stops training once `max_time` seconds of training have passed and saves a checkpoint every `save_every`
    seconds, at that stop and at `max_steps`, so that every run ends with a checkpoint to average. The training
    time so far is stored in each checkpoint's trainer_state.json and counted on resume, so a killed and resumed
    run still ends at the budget. Every process acts on the main process's clock: they stop and save together."""

    def __init__(self, max_time: float | None = None, save_every: float | None = None) -> None:
        self.max_time = max_time
        self.save_every = save_every
        self.elapsed_before = 0.0
        self.last_save = 0.0
        self.last_elapsed = 0.0
        self.saved_step = -1
        self.started: float | None = None

    def elapsed(self) -> float:
        return self.elapsed_before + (time.monotonic() - self.started if self.started is not None else 0.0)

    def state(self) -> dict[str, Any]:
        return {
            "args": {"max_time": self.max_time, "save_every": self.save_every},
            "attributes": {"elapsed_before": self.elapsed()},
        }

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # A resumed run (global_step > 0) starts with the training time stored in its checkpoint.
        stored = state.stateful_callbacks.get(type(self).__name__, {}) if state.global_step > 0 else {}
        stored = stored[0] if isinstance(stored, list) else stored
        self.elapsed_before = float(stored.get("attributes", {}).get("elapsed_before", 0.0))
        self.last_save = self.last_elapsed = self.elapsed_before
        self.started = time.monotonic()

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        elapsed = self.elapsed()
        if PartialState().num_processes > 1:
            elapsed = float(broadcast(torch.tensor([elapsed], device=args.device))[0])
        self.last_elapsed = elapsed
        if self.save_every is not None and elapsed - self.last_save >= self.save_every:
            control.should_save = True
        if self.max_time is not None and elapsed >= self.max_time:
            control.should_training_stop = True
            control.should_save = True
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            control.should_save = True

    def on_epoch_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # save_strategy="epoch" saves at the end of the epoch that a stop (max_steps, max_time) cuts short: the
        # checkpoint saved at that update would be written again.
        if state.global_step == self.saved_step:
            control.should_save = False

    def on_save(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # Any save (time, epoch or step) restarts the interval; the synchronised clock keeps processes in step.
        self.last_save = self.last_elapsed
        self.saved_step = state.global_step


class WallClockProgressCallback(ProgressCallback):
    """The Trainer's progress bar, counting training seconds against the wall-clock budget: the number of updates a
    time-limited run makes is not known in advance, so a bar over updates would show a meaningless total."""

    def __init__(self, clock: WallClockCallback) -> None:
        super().__init__()
        self.clock = clock

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            bar_format = "{l_bar}{bar}| {n:.0f}/{total:.0f} s of training [{elapsed}<{remaining}{postfix}]"
            self.training_bar = tqdm(total=self.clock.max_time, dynamic_ncols=True, bar_format=bar_format)
        self.current_step = 0

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.training_bar.n = min(self.clock.last_elapsed, self.clock.max_time)
            self.training_bar.set_postfix_str(f"update {state.global_step}")


class LearningCurveCallback(TrainerCallback):
    """Every `every` seconds of training, saves the model (weights and config, no optimizer state) to
    `folder/step-N` with the training seconds and target tokens so far in `snapshot.json`, for a learning curve
    that is evaluated after training, so that evaluating costs no training time. Written to a temporary folder
    and renamed, so a kill leaves no half-written snapshot."""

    def __init__(self, trainer: VanillaSeq2SeqTrainer, folder: str | Path, every: float) -> None:
        self.trainer = trainer
        self.folder = Path(folder)
        self.every = every
        self.next_at = every

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # Resumed runs continue the schedule from the stored training time.
        self.next_at = (math.floor(self.trainer.clock.elapsed() / self.every) + 1) * self.every

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        elapsed = self.trainer.clock.last_elapsed  # synchronised across processes by WallClockCallback
        if elapsed < self.next_at:
            return
        self.next_at = (math.floor(elapsed / self.every) + 1) * self.every
        tokens = self.trainer.target_tokens()  # a collective: every process takes part
        if not state.is_world_process_zero:
            return
        target = self.folder / f"step-{state.global_step}"
        partial = self.folder / f".step-{state.global_step}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        self.trainer.accelerator.unwrap_model(self.trainer.model).save_pretrained(partial)
        info = {"step": state.global_step, "seconds": round(elapsed, 1), "tgt_tokens": tokens, "epoch": state.epoch}
        (partial / SNAPSHOT_FILE).write_text(json.dumps(info) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)


class DevEvaluationCallback(TrainerCallback):
    """Asks the Trainer to score its eval_dataset on the `schedule` (`EvalSchedule`), and to save a checkpoint with
    every evaluation, so that each dev score belongs to a checkpoint; logs one line per evaluation. Evaluation
    time is wall-clock time like the rest: it counts against `max_time`, and the line says how much it took."""

    def __init__(self, clock: WallClockCallback, schedule: EvalSchedule) -> None:
        self.clock = clock
        self.schedule = schedule
        self.evaluated_step = -1
        self.next_at = schedule.seconds or 0.0
        self.eval_seconds = 0.0

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.evaluated_step = state.global_step  # a resumed run's checkpoint was scored before it was saved
        if self.schedule.seconds is not None:
            self.next_at = (math.floor(self.clock.elapsed() / self.schedule.seconds) + 1) * self.schedule.seconds

    def _due(self, state: TrainerState, control: TrainerControl) -> bool:
        if state.global_step == self.evaluated_step:
            return False
        if self.schedule.steps is not None:
            return state.global_step % self.schedule.steps == 0
        if self.schedule.seconds is not None:
            if self.clock.last_elapsed < self.next_at:  # synchronised across processes by WallClockCallback
                return False
            self.next_at = (math.floor(self.clock.last_elapsed / self.schedule.seconds) + 1) * self.schedule.seconds
            return True
        return control.should_save

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        due = self._due(state, control)
        # The last update (the budget or `max_steps` reached) is scored too: the run's final checkpoint gets its dev
        # score, and a run shorter than one `eval_every` still has one for `average="best"` and `keep_best`.
        if due or (control.should_training_stop and state.global_step != self.evaluated_step):
            control.should_evaluate = control.should_save = True

    def on_epoch_end(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        # The epoch-end save (save_strategy="epoch") is a save like the others: scored in "at each save" mode.
        if self.schedule.steps is None and self.schedule.seconds is None and self._due(state, control):
            control.should_evaluate = True

    def on_evaluate(self, args, state: TrainerState, control: TrainerControl, metrics=None, **kwargs: Any) -> None:
        self.evaluated_step = state.global_step
        metrics = metrics or {}
        self.eval_seconds += metrics.get("eval_runtime", 0.0)
        if state.is_world_process_zero and "eval_bleu" in metrics:
            logger.info(
                f"Dev at update {state.global_step} ({self.clock.last_elapsed / 60:.1f} min): BLEU "
                f"{metrics['eval_bleu']:.2f}, chrF {metrics['eval_chrf']:.2f}, loss {metrics['eval_loss']:.4f} "
                f"({metrics.get('eval_runtime', 0.0):.0f} s, wall-clock time counted in `max_time`; "
                f"{self.eval_seconds:.0f} s of evaluation so far)"
            )


class DevBleuEarlyStoppingCallback(TrainerCallback):
    """Stops training after `patience` dev evaluations in a row without a better `eval_bleu` than the best so far
    (strictly better; the first evaluation sets the best). A resumed run counts from its log history."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best: float | None = None
        self.waited = 0

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.best, self.waited = None, 0
        for log in state.log_history:
            if "eval_bleu" in log:
                self._count(log["eval_bleu"])

    def _count(self, bleu: float) -> None:
        if self.best is None or bleu > self.best:
            self.best, self.waited = bleu, 0
        else:
            self.waited += 1

    def on_evaluate(self, args, state: TrainerState, control: TrainerControl, metrics=None, **kwargs: Any) -> None:
        if not metrics or "eval_bleu" not in metrics:
            return
        self._count(metrics["eval_bleu"])
        if self.waited >= self.patience:
            control.should_training_stop = True
            if state.is_world_process_zero:
                logger.info(
                    f"Early stopping at update {state.global_step}: {self.waited} evaluation"
                    f"{'s' if self.waited > 1 else ''} without a dev BLEU "
                    f"above {self.best:.2f} (`early_stopping_patience={self.patience}`)"
                )


class CheckpointRetentionCallback(TrainerCallback):
    """After each save, deletes the checkpoints of `folder` that `keep` (a function of the checkpoints'
    `averaging.CheckpointInfo`s, oldest first, returning the paths to keep) does not keep, besides the newest (to
    resume from) and the Trainer's best_model_checkpoint (`keep_best`). Used instead of save_total_limit where the
    checkpoints to average are not simply the last ones (`average` "best" / "spread")."""

    def __init__(self, folder: str | Path, keep: Any) -> None:
        self.folder = Path(folder)
        self.keep = keep

    def on_save(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        infos = checkpoint_infos(self.folder)
        kept = {info.path.resolve() for info in infos[-1:]} | {Path(p).resolve() for p in self.keep(infos)}
        if state.best_model_checkpoint is not None:
            kept.add(Path(state.best_model_checkpoint).resolve())
        for info in infos:
            if info.path.resolve() not in kept:
                shutil.rmtree(info.path, ignore_errors=True)


def dev_translation_metrics(tokenizer: Any) -> Any:
    """`compute_metrics` for `predict_with_generate` evaluation: sacreBLEU (cased, 13a) and chrF of the generated
    translations against the references, both decoded from ids (evaluation.score_translations)."""
    from ..inference.evaluation import score_translations

    def compute(prediction: Any) -> dict[str, float]:
        predictions, labels = prediction.predictions, prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        pad = tokenizer.pad_token_id
        predictions = np.where(predictions < 0, pad, predictions)  # the Trainer pads batches with -100
        labels = np.where(labels < 0, pad, labels)
        decode = dict(skip_special_tokens=True, clean_up_tokenization_spaces=False)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, **decode)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, **decode)]
        scores = score_translations(hypotheses, references)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"]}

    return compute


class BatchSamplerEpochCallback(TrainerCallback):
    """Sets the epoch of the token-budget sampler before each epoch, whatever wrappers accelerate put around it
    (the Trainer's own `set_epoch` does not reach through all of them when a multi-process run resumes)."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        self.sampler = sampler

    def on_epoch_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.sampler.set_epoch(int(state.epoch or 0))


class VanillaSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with the paper's training (module docstring): token-budget batches, the eq. (3) or
    inverse-sqrt schedule, wall-clock budget and time-based checkpoints, target tokens per second in the logs.

    Needs `VanillaSeq2SeqTrainingArguments`. Without a `data_collator`, uses `TrainingCollator` for this package's
    model (the batches of `DataCollatorForSeq2Seq(processing_class, model=model)`: decoder inputs made from the
    labels, labels padded with -100, which label smoothing needs; the ids checked on the host) and
    `DataCollatorForSeq2Seq` for other models. The model's `generation_config` at construction is restored before every
    save and every evaluation batch, because `predict_with_generate` evaluation rewrites it.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        model, tokenizer = kwargs.get("model"), kwargs.get("processing_class")
        if kwargs.get("data_collator") is None and isinstance(model, VanillaTransformerForConditionalGeneration):
            kwargs["data_collator"] = TrainingCollator(model.config, getattr(tokenizer, "padding_side", "right"))
        elif kwargs.get("data_collator") is None and tokenizer is not None:
            kwargs["data_collator"] = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, VanillaSeq2SeqTrainingArguments):
            raise ValueError(
                f"`args` must be VanillaSeq2SeqTrainingArguments, got {type(self.args).__name__}. Build them with "
                "VanillaSeq2SeqTrainingArguments(output_dir=..., ...)."
            )
        self.generation_config = copy.deepcopy(self.model.generation_config)
        if self.args.decoder_start_embedding == "zero":
            self.add_callback(ZeroStartEmbeddingCallback(self.model))
        self.clock = WallClockCallback(self.args.max_time, self.args.save_every)
        self.add_callback(self.clock)
        if self.args.max_time is not None and self.callback_handler.pop_callback(ProgressCallback) is not None:
            self.add_callback(WallClockProgressCallback(self.clock))  # after the clock: it reads the synced time
        if self.eval_dataset is not None and self.args.eval_every is not None:
            if self.compute_metrics is None and self.processing_class is not None:
                self.compute_metrics = dev_translation_metrics(self.processing_class)
            self.add_callback(DevEvaluationCallback(self.clock, parse_eval_every(self.args.eval_every)))
        if self.args.early_stopping_patience is not None:
            self.add_callback(DevBleuEarlyStoppingCallback(self.args.early_stopping_patience))
        self.train_batch_sampler: TokenBudgetBatchSampler | None = None
        self._target_tokens: torch.Tensor | None = None  # this run, this process; on the device: no sync per step
        self._logged_tokens = 0  # all processes' total at the previous log
        self._logged_time: float | None = None
        # Non-finite losses since the previous log, on the device (`note_nonfinite`): how many batches, the first
        # update. `logging_nan_inf_filter` is read when training starts (`train`).
        self._nonfinite: torch.Tensor | None = None
        self._nonfinite_filter = self.args.logging_nan_inf_filter

    def get_train_dataloader(self) -> DataLoader:
        """Token-budget batches (`TokenBudgetBatchSampler`), sharded by this process's rank."""
        if not isinstance(self.train_dataset, Dataset) or not {"input_ids", "labels"} <= set(
            self.train_dataset.column_names
        ):
            raise ValueError(
                "`train_dataset` must be a datasets.Dataset with `input_ids` and `labels` columns, got "
                f"{type(self.train_dataset).__name__}. Tokenize it with "
                "hf_vanilla_transformer.training.data.tokenize_pairs."
            )
        # From the length arrays (prepare_pairs' columns), never the token lists: a corpus of any size.
        source_lengths, target_lengths = pair_lengths(self.train_dataset)
        dataset = self._remove_unused_columns(self.train_dataset, description="training")
        collate = self.data_collator
        if self.args.length_buckets:  # fixed shapes: pairs planned at their bucket's length, batches padded to it
            buckets = LengthBuckets.fit(source_lengths, target_lengths, self.args.length_buckets, self.args.max_tokens)
            source_lengths = target_lengths = buckets.sizes(source_lengths, target_lengths)
            collate = StaticShapeCollator(collate, buckets, self.model.config.pad_token_id)
            logger.info(f"Static batch shapes: {buckets.describe()}")
        sampler = TokenBudgetBatchSampler(
            source_lengths,
            target_lengths,
            max_tokens=self.args.max_tokens,
            seed=self.args.data_seed if self.args.data_seed is not None else self.args.seed,
            num_replicas=self.args.world_size,
            rank=self.args.process_index,
        )
        self.callback_handler.pop_callback(BatchSamplerEpochCallback)  # from an earlier train() call
        self.add_callback(BatchSamplerEpochCallback(sampler))
        self.train_batch_sampler = sampler
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and self.args.device.type != "cpu",
            persistent_workers=self.args.dataloader_persistent_workers,
            prefetch_factor=self.args.dataloader_prefetch_factor,
        )
        loader = self.accelerator.prepare(loader)
        # The sampler shards by rank itself; accelerate's `BatchSamplerShard` would shard again (as transformers
        # does for its own rank-aware BatchRebalanceSampler, make that wrapper a passthrough).
        wrapper = getattr(loader, "batch_sampler", None)
        if wrapper is not None and getattr(wrapper, "batch_sampler", None) is sampler:
            wrapper.num_processes = 1
            wrapper.process_index = 0
        return loader

    def create_scheduler(
        self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """§5.3 eq. (3) (`lr_schedule="paper"`) or inverse-sqrt, as a factor on `learning_rate`; the k-th update
        (k = 1, 2, ...) uses step_num = k. Neither depends on `num_training_steps`, so a wall-clock budget does not
        change the schedule. `lr_cooldown` scales either down to 0 at the end of the budget: the share of
        `max_time` left on the run's clock (synchronised across processes, counted on from a resumed checkpoint)
        or of `max_steps` left, whichever is smaller."""
        if self.lr_scheduler is None:
            warmup = int(self.args.warmup_steps)
            if self.args.lr_schedule == "paper":
                d_model = self.model.config.d_model

                def schedule(step: int) -> float:
                    return paper_learning_rate(step + 1, d_model, warmup)
            else:
                start = (self.args.warmup_init_lr or 0.0) / self.args.learning_rate  # a factor on learning_rate

                def schedule(step: int) -> float:
                    return inverse_sqrt_learning_rate(step + 1, 1.0, warmup, start)

            cooldown, max_time, max_steps = self.args.lr_cooldown, self.args.max_time, self.args.max_steps

            def cooled(step: int) -> float:
                remaining = 1.0
                if max_time is not None:
                    remaining = 1.0 - self.clock.last_elapsed / max_time
                if max_steps > 0:
                    remaining = min(remaining, 1.0 - step / max_steps)
                return schedule(step) * cooldown_factor(remaining, cooldown)

            factor = schedule if cooldown is None else cooled
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, factor)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """`Seq2SeqTrainer.train`, with transformers' test of every loss for NaN or inf on the host (a host-device
        synchronisation per batch) replaced by the same filter on the device (`note_nonfinite`)."""
        self._nonfinite_filter = self.args.logging_nan_inf_filter
        with self.transformers_nan_inf_filter(False):
            return super().train(*args, **kwargs)

    @contextlib.contextmanager
    def transformers_nan_inf_filter(self, on: bool) -> Iterator[None]:
        """`args.logging_nan_inf_filter` as transformers' code reads it within the block, the user's value after."""
        before = self.args.logging_nan_inf_filter
        self.args.logging_nan_inf_filter = on
        try:
            yield
        finally:
            self.args.logging_nan_inf_filter = before

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None):
        if self._logged_time is None:
            self._logged_time = time.perf_counter()
        tokens = inputs["labels"].ne(-100).sum()
        self._target_tokens = tokens if self._target_tokens is None else self._target_tokens + tokens
        prepare_for_cpu_training(model)  # the faster dropout mask on a CPU; idempotent, a few µs
        return self.note_nonfinite(super().training_step(model, inputs, num_items_in_batch))

    def note_nonfinite(self, loss: torch.Tensor) -> torch.Tensor:
        """Counts a non-finite batch loss and keeps the first update that had one, on the device, for the next log
        (`report_nonfinite`). Under `logging_nan_inf_filter` (transformers' default) it returns what transformers'
        filter adds to the logged loss in its place: the mean of this logging interval's updates so far."""
        finite = torch.isfinite(loss)
        update = self.state.global_step + 1
        if self._nonfinite is None:
            self._nonfinite = torch.zeros(2, dtype=torch.long, device=loss.device)  # [batches, first update]
        count, first = self._nonfinite.unbind()
        first = torch.where(finite | (count > 0), first, update)
        self._nonfinite = torch.stack([count + (~finite).long(), first])
        if not self._nonfinite_filter:
            return loss
        # transformers' own expression, on its running sum of the interval's losses (kept on the device).
        previous = self._tr_loss / (1 + self.state.global_step - self._globalstep_last_logged)
        return torch.where(finite, loss, previous)

    def report_nonfinite(self, logs: dict[str, float]) -> None:
        """At a log (which reads the loss back anyway): warns which update had a non-finite loss since the previous
        log and adds `nonfinite_batches` to the logs."""
        if self._nonfinite is None:
            return
        count, first = self._nonfinite.tolist()
        self._nonfinite.zero_()
        if count:
            logs["nonfinite_batches"] = count
            treated = "left out of" if self._nonfinite_filter else "included in (logging_nan_inf_filter=False)"
            logger.warning(
                "Update %d had a non-finite loss (NaN or inf); %d batch(es) since the previous log did, %s the "
                "logged loss. Lower the learning rate or raise warmup_steps if it recurs.",
                first,
                count,
                treated,
            )

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """§5.4 label smoothing inside our model rather than by the Trainer's `LabelSmoother` on the logits: the
        same loss, and where no logits are wanted (training steps) the fused chunked projection + loss
        (`skip_logits`), which never materialises the (B, T, V) logits in fp32. Batches of `TrainingCollator`, whose
        ids were checked on the host, go in with `check_ids=False`: the model does not read them back from the
        device. Other models: the Trainer's path."""
        if not isinstance(self.accelerator.unwrap_model(model), VanillaTransformerForConditionalGeneration):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if isinstance(self.data_collator, TrainingCollator):
            inputs = {**inputs, "check_ids": False}
        smoother = self.label_smoother
        if smoother is None or self.compute_loss_func is not None or "labels" not in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs = {**inputs, "label_smoothing": smoother.epsilon, "skip_logits": not return_outputs}
        self.label_smoother = None  # so that the Trainer takes the model's loss, with its num_items_in_batch handling
        try:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        finally:
            self.label_smoother = smoother

    def target_tokens(self) -> int:
        """Target tokens trained on in this run so far, all processes together (a collective call)."""
        if self._target_tokens is None:
            return 0
        return int(self.accelerator.reduce(self._target_tokens, reduction="sum"))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Adds `tgt_tokens_per_second` (target tokens of all processes since the previous log, per second) and
        `tgt_tokens` (this run's total) to training logs, `train_tgt_tokens(_per_second)` to the summary, and
        `elapsed_seconds` (the wall clock of the run, as `max_time` counts it) to evaluation logs, and the non-finite
        losses since the previous log to training logs (`report_nonfinite`)."""
        if "eval_loss" in logs:
            logs["elapsed_seconds"] = round(self.clock.last_elapsed, 1)
        training_log = "loss" in logs or "train_runtime" in logs
        if training_log:
            self.report_nonfinite(logs)
        if training_log and self._target_tokens is not None:
            total = self.target_tokens()
            if "loss" in logs:
                now = time.perf_counter()
                logs["tgt_tokens_per_second"] = round((total - self._logged_tokens) / (now - self._logged_time), 1)
                logs["tgt_tokens"] = total
                self._logged_tokens, self._logged_time = total, now
            else:
                logs["train_tgt_tokens"] = total
                logs["train_tgt_tokens_per_second"] = round(total / max(logs["train_runtime"], 1e-9), 1)
        super().log(logs, start_time)

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """The Trainer's warning on resume, less the tied weights: safetensors stores a tied tensor once (under
        `model.shared.weight`), so the embeddings and `lm_head.weight` tied to it are "missing" from every checkpoint
        although loading the one tensor loads them all (the Trainer only excuses `_keys_to_ignore_on_save`). A
        missing key that is not tied to a loaded one is still reported."""
        model = self.accelerator.unwrap_model(self.model)
        tied = getattr(model, "all_tied_weights_keys", None) or {}  # {tied key: the key it is tied to}
        missing = [key for key in load_result.missing_keys if key not in tied or tied[key] in load_result.missing_keys]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        """`Seq2SeqTrainer.evaluation_loop`; decoding on the CPU (`predict_with_generate`), the model is first
        prepared for CPU inference (`prepare_for_cpu_inference`: packed copies of this evaluation's weights). The
        next training step's `model.train()` undoes it, so training multiplies by the plain weights and the next
        evaluation packs the weights it trained."""
        model = self.accelerator.unwrap_model(self.model)
        parameter = next(model.parameters(), None)
        if self.args.predict_with_generate and parameter is not None and parameter.device.type == "cpu":
            prepare_for_cpu_inference(model.eval())
        with self.transformers_nan_inf_filter(self._nonfinite_filter):  # the evaluation loss's filter, as given
            return super().evaluation_loop(*args, **kwargs)

    def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
        # Seq2SeqTrainer writes generate()'s global defaults (max_length 20) into the model's generation config after
        # each batch; the next batch's per-example max_new_tokens then clashes with them (a warning per batch).
        self.model.generation_config = copy.deepcopy(self.generation_config)
        return super().prediction_step(*args, **kwargs)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        self.model.generation_config = copy.deepcopy(self.generation_config)
        super().save_model(output_dir, _internal_call)


__all__ = [
    "LR_SCHEDULES",
    "BatchSamplerEpochCallback",
    "CheckpointRetentionCallback",
    "DevBleuEarlyStoppingCallback",
    "DevEvaluationCallback",
    "EvalSchedule",
    "LearningCurveCallback",
    "TokenBudgetBatchSampler",
    "VanillaSeq2SeqTrainer",
    "VanillaSeq2SeqTrainingArguments",
    "WallClockCallback",
    "cooldown_factor",
    "dev_translation_metrics",
    "inverse_sqrt_learning_rate",
    "paper_learning_rate",
    "parse_duration",
    "parse_eval_every",
]
