"""The options of a training run (`TrainOptions`, from a recipe), what a run returns (`TrainResult`), the constants
that go with them, and the parsing of the options written as text (durations, the dev-evaluation schedule)."""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ..errors import OptionError, check_decoding
from ..files import MODEL_DIR, RESULTS_FILE
from ..hub_metadata import check_language, check_license, public_command
from .data import DEFAULT_MAX_LENGTH, DEFAULT_TOKENIZER_SAMPLE
from .recipes import DEFAULT_RECIPE, Recipe

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_DIR = "outputs/multi30k-en-de"
# The budget options: a recipe's budget applies as a whole unless one of them is given.
BUDGET = ("max_time", "max_steps", "epochs")
# The options that `init_from`'s folder replaces (its config and tokenizer).
INIT_FROM_REPLACES = ("preset", "vocab_size", "tokenizer")
# The `VanillaSeq2SeqTrainingArguments` fields that `train` sets from its own options, with the option that sets each
# (its field, or field=value): `trainer_args` may set any other field, but not these, which would contradict the
# option.
TRAINER_ARGUMENTS_OF_OPTIONS = {
    "output_dir": "output_dir",
    "lr_schedule": "schedule",
    "learning_rate": "lr",
    "warmup_steps": "warmup_steps",
    "lr_cooldown": "lr_cooldown",
    "label_smoothing_factor": "label_smoothing",
    "decoder_start_embedding": "decoder_start_embedding",
    "max_tokens": "max_tokens",
    "gradient_accumulation_steps": "grad_accum",
    "num_train_epochs": "epochs",
    "max_steps": "max_steps",
    "max_time": "max_time",
    "save_every": "save_every",
    "bf16": "bf16",
    "torch_compile": "torch_compile",
    "seed": "seed",
    "logging_steps": "logging_steps",
    "disable_tqdm": "progress=False",
    "resume_from_checkpoint": "resume",
    "push_to_hub": "push_to_hub",
    "hub_model_id": "push_to_hub",
    # Validation during training, and the checkpoints that averaging and `keep_best` need kept.
    "report_to": "report_to",
    "eval_every": "eval_every",
    "generation_num_beams": "eval_num_beams",
    "per_device_eval_batch_size": "eval_batch_size",
    "metric_for_best_model": "keep_best",
    "early_stopping_patience": "early_stopping_patience",
    "save_total_limit": "average_last",
}
# What the resolved configuration (RUN/run_config.json) leaves out: the record of the command line and what concerns
# the run folder rather than the run.
NOT_IN_RUN_CONFIG = ("command", "resume", "overwrite", "trainer_args")
# `eval_every` for a dev evaluation at each checkpoint save.
EVAL_AT_SAVES = "save"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([hms])")


def parse_duration(text: str | float | int) -> float:
    """Seconds in a duration such as "1h", "20m", "90s", "1h30m" or a plain number of seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        value = str(text).strip().lower()
        try:
            seconds = float(value)
        except ValueError:
            parts = _DURATION.findall(value)
            if not parts or _DURATION.sub("", value).strip():
                raise ValueError(
                    f"Durations must look like '1h', '20m', '90s', '1h30m' or a number of seconds, got {text!r}."
                ) from None
            seconds = sum(float(number) * {"h": 3600, "m": 60, "s": 1}[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"Durations must be positive, got {text!r}.")
    return seconds


@dataclass(frozen=True)
class EvalSchedule:
    """When the dev set is scored: every `steps` updates, every `seconds` of training (wall clock), or, with
    neither, at each checkpoint save."""

    steps: int | None = None
    seconds: float | None = None

    def describe(self) -> str:
        if self.steps is not None:
            return f"every {self.steps} updates"
        if self.seconds is not None:
            return f"every {self.seconds:g} s of training"
        return "at each checkpoint save"


def parse_eval_every(text: str | None) -> EvalSchedule:
    """`eval_every`: "save" (or None) = at each checkpoint save; a whole number = every that many updates ("500");
    a duration with its unit = every that much training time ("10m", "90s", "1h30m")."""
    value = EVAL_AT_SAVES if text is None else str(text).strip().lower()
    if value == EVAL_AT_SAVES:
        return EvalSchedule()
    if value.isdigit():
        if int(value) < 1:
            raise ValueError(f"`eval_every` {text!r} must be at least 1 update.")
        return EvalSchedule(steps=int(value))
    if not _DURATION.search(value):
        raise ValueError(
            f"`eval_every` {text!r} is neither 'save', a whole number of updates (e.g. 500) nor a duration with its "
            "unit (e.g. 10m, 90s)."
        )
    return EvalSchedule(seconds=parse_duration(value))


@dataclass(frozen=True)
class TrainOptions:
    """Everything a training run needs. The defaults are the main job (recipes.MULTI30K) on the bundled Multi30k
    EN->DE; `from_recipe` starts from another recipe. Durations are in seconds.

    Data: Multi30k in `src_lang`/`tgt_lang`, or `train_src`/`train_tgt` files (one sentence per line, .gz allowed),
    or a `dataset` (data.load_dataset_pairs: a Hub name with `dataset_config`, a save_to_disk folder, a local
    json/jsonl/csv/parquet file) whose `train_split` (None: "train") trains, `valid_split` / `test_split` (None:
    "validation" / "test" where the dataset has them) validate and test, with a `translation` column of {lang: text}
    dicts or the `src_column` / `tgt_column` text columns (None: the language codes); `valid_src`/`valid_tgt` give
    a validation (dev) set, `test_src`/`test_tgt` replace the test set (a dataset's too).
    Preprocessing (data.prepare_pairs): pairs with an empty side, over `max_length` tokens on a side or (unless None)
    over `max_length_ratio` (longer side / shorter side, in tokens) are dropped and counted; `preprocessing_workers`
    processes tokenize into a cached Arrow file; a BPE is trained on `tokenizer_sample` sentences at most (a seeded
    sample of the pairs, data.tokenizer_sample).
    Model: `dropout` is P_drop (§5.4); `attention_dropout` and `activation_dropout` (deviations: §5.4 has neither)
    drop attention weights and the FFN's ReLU outputs. None: the preset's (or the `init_from` folder's).
    `lr`: None is 1.0 (the paper's eq. (3)) for schedule "paper" and the main job's peak for "inverse_sqrt".
    `lr_cooldown` (deviation): the share of the budget (`max_time`, else `max_steps`) over whose end the learning rate
    falls linearly to 0; None: the schedule runs to the end as it is.
    `compare_curve`: a JSON file of curves plotted beside the learning curve (see learning_curve.py).
    `command`: the command line that started the run, recorded in results.json and the model card with file names
    for local paths (hub_metadata.public_command: both are uploaded).
    `license`: the Hub license id of the model card (hub_metadata.HUB_LICENSES); None: the training data's own terms
    (Multi30k's), else none; "other" with `license_name`, the terms' kebab-case name. `src_lang`/`tgt_lang` are
    BCP-47 language tags as the Hub takes them (en, de, pt-BR, zh-Hant, eng). `check_report_values` checks them.
    The test set is scored at the end on its first `test_max_sentences` pairs (None: all) with `test_num_beams`
    beams (None: the model's own decoding, §6.1); the card says when either is set. With `max_time`, the whole
    command ends by `evaluation_time` seconds after the training budget (None: 10% of `max_time`), the evaluation
    after training keeping to what fits (evaluation_budget.py).
    `num_beams` and `length_penalty` (GNMT α) set the saved model's decoding, its generation_config.json, which the
    test scoring, `generate()` and the pipeline use; None keeps §6.1's (4 and 0.6), or the `init_from` folder's.
    `push_to_hub`: a Hub repository id the model folder is uploaded to at the end (`push`), `private` creating it
    private; the token and the connection are checked before training.
    Validation during training (with a dev set; docs/training.md): `eval_every` ("save" = at each checkpoint save,
    None likewise; "500" = every 500 updates; "10m" = every 10 minutes), greedy unless `eval_num_beams`, on the
    first `eval_max_sentences` pairs; `report_to` ("none", "tensorboard", "wandb", comma-separated);
    `early_stopping_patience`; `keep_best`; the final model averages `average_last` checkpoints picked by `average`
    ("last", "best", "spread" over `average_span`: "50%" of the run or a duration such as "30m").
    `decoder_start_embedding`: "zero" keeps the decoder start token's embedding row at zero (so `to-marian` exports
    run in CTranslate2, see start_embedding.py); "train" trains it. A model initialised from a folder whose row is
    not zero (fine-tuning) has it zeroed at the start under "zero" (the model changes slightly, training adapts it)
    and keeps it, with the source model's function at the start, under "train" (not exportable to CTranslate2).
    `init_from`: fine-tuning: a model folder (`train`'s RUN/model, or one `python -m conversion` wrote) whose config,
    weights and tokenizer the run starts from; `preset`, `vocab_size` and `tokenizer` then do not apply (`from_recipe`
    refuses them given explicitly, `train` refuses `tokenizer`), the dropouts override the folder's.
    `trainer_args`: any other `VanillaSeq2SeqTrainingArguments` fields (optim, max_grad_norm, weight_decay, fp16,
    deepspeed, ...), applied over the ones these options set; a field one of these options sets is refused, naming
    the option (`TRAINER_ARGUMENTS_OF_OPTIONS`).
    """

    output_dir: str | os.PathLike = DEFAULT_OUTPUT_DIR
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_src: str | os.PathLike | None = None
    train_tgt: str | os.PathLike | None = None
    valid_src: str | os.PathLike | None = None
    valid_tgt: str | os.PathLike | None = None
    test_src: str | os.PathLike | None = None
    test_tgt: str | os.PathLike | None = None
    dataset: str | os.PathLike | None = None
    dataset_config: str | None = None
    src_column: str | None = None
    tgt_column: str | None = None
    train_split: str | None = None
    valid_split: str | None = None
    test_split: str | None = None
    max_length: int = DEFAULT_MAX_LENGTH
    max_length_ratio: float | None = None
    preprocessing_workers: int = 1
    tokenizer_sample: int = DEFAULT_TOKENIZER_SAMPLE
    max_train_pairs: int | None = None
    preset: str = DEFAULT_RECIPE.preset
    dropout: float | None = DEFAULT_RECIPE.dropout
    attention_dropout: float | None = DEFAULT_RECIPE.attention_dropout
    activation_dropout: float | None = DEFAULT_RECIPE.activation_dropout
    vocab_size: int = DEFAULT_RECIPE.vocab_size
    tokenizer: str | os.PathLike | None = None
    schedule: str = DEFAULT_RECIPE.schedule
    lr: float | None = None
    warmup_steps: int = DEFAULT_RECIPE.warmup_steps
    lr_cooldown: float | None = DEFAULT_RECIPE.lr_cooldown
    label_smoothing: float = DEFAULT_RECIPE.label_smoothing
    max_tokens: int = DEFAULT_RECIPE.max_tokens
    grad_accum: int = 1
    seed: int = 1
    bf16: str = DEFAULT_RECIPE.bf16
    torch_compile: str = DEFAULT_RECIPE.torch_compile
    attn_implementation: str | None = None
    max_time: float | None = DEFAULT_RECIPE.max_time
    epochs: int | None = DEFAULT_RECIPE.epochs
    max_steps: int | None = DEFAULT_RECIPE.max_steps
    save_every: float = DEFAULT_RECIPE.save_every
    average_last: int = DEFAULT_RECIPE.average_last
    average: str = DEFAULT_RECIPE.average
    average_span: str = DEFAULT_RECIPE.average_span
    eval_every: str | None = None
    eval_num_beams: int | None = None
    eval_max_sentences: int = 1000
    report_to: str = "none"
    early_stopping_patience: int | None = None
    keep_best: bool = False
    curve_every: float | None = DEFAULT_RECIPE.curve_every
    compare_curve: str | os.PathLike | None = None
    resume: bool = False
    overwrite: bool = False
    evaluate: bool = True
    eval_batch_size: int = 64
    test_max_sentences: int | None = None
    test_num_beams: int | None = None
    evaluation_time: float | None = None
    num_beams: int | None = DEFAULT_RECIPE.num_beams
    length_penalty: float | None = DEFAULT_RECIPE.length_penalty
    examples: int = 5
    logging_steps: int = 50
    progress: bool = True
    command: str | None = None
    license: str | None = None
    license_name: str | None = None
    decoder_start_embedding: str = "zero"
    push_to_hub: str | None = None
    private: bool = False
    init_from: str | os.PathLike | None = None
    trainer_args: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_recipe(cls, recipe: Recipe = DEFAULT_RECIPE, **options: Any) -> TrainOptions:
        """The recipe's settings, overridden by `options` (TrainOptions fields). The recipe's budget (`max_time`,
        `max_steps`, `epochs`) applies as a whole unless `options` sets one of them; its learning rate only with
        its own schedule."""
        names = {item.name for item in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise OptionError(
                f"Unknown training options {unknown}. Pick from the TrainOptions fields: {sorted(names)}."
            )
        if options.get("init_from") is not None:
            given = [f"`{name}`" for name in INIT_FROM_REPLACES if options.get(name) is not None]
            if given:
                raise OptionError(
                    f"`init_from` {options['init_from']} brings its own config and tokenizer, so {', '.join(given)} "
                    "cannot apply; drop them (`dropout` still overrides the folder's P_drop)."
                )
        elif recipe.fine_tuning:
            raise OptionError(
                f"`recipe={recipe.name}` fine-tunes an existing model: pass `init_from=MODEL_DIR` (a folder written "
                "by `train` or by `python -m conversion`), or pick another recipe to train from scratch."
            )
        settings = {name: getattr(recipe, name) for name in names & {item.name for item in fields(Recipe)}}
        if any(options.get(name) is not None for name in BUDGET):
            settings.update(dict.fromkeys(BUDGET))
        if options.get("schedule", recipe.schedule) != recipe.schedule:
            settings["lr"] = None
        if recipe.gpu and not torch.cuda.is_available():
            logger.warning(
                f"`recipe={recipe.name}` is sized for a GPU and this machine has none: it runs, far slower, and its "
                "budget will not reach the recipe's result."
            )
        trainer_args = {**recipe.trainer_args, **options.pop("trainer_args", {})}  # explicit Trainer arguments win
        return cls(**{**settings, **options, "trainer_args": trainer_args})

    def learning_rate(self) -> float:
        """`lr`, or its default for the schedule: 1.0 (eq. (3) as is) for "paper", the main job's peak otherwise."""
        if self.lr is not None:
            return self.lr
        return 1.0 if self.schedule == "paper" else DEFAULT_RECIPE.lr


def check_report_values(options: TrainOptions) -> None:
    """The values of what the run reports, checked before any data is read: the test decoding's caps, the saved
    model's decoding, and the languages and license that the model card writes, as the Hub takes them (hub_metadata's
    checks, always made: a language tag such as en or pt-BR, a Hub license id; never a line break, markup or a
    5,000-character string in a card or results.json)."""
    for name in ("test_max_sentences", "test_num_beams", "num_beams"):
        value = getattr(options, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            fallback = "§6.1's 4" if name == "num_beams" else "no cut"
            raise OptionError(f"`{name}={value}` must be a positive whole number, or None for {fallback}.")
    check_decoding(
        num_beams=options.num_beams,
        test_num_beams=options.test_num_beams,
        eval_num_beams=options.eval_num_beams,
        length_penalty=options.length_penalty,
    )
    try:
        check_language(options.src_lang, "src_lang")
        check_language(options.tgt_lang, "tgt_lang")
        if options.license is not None or options.license_name is not None:
            check_license(options.license, options.license_name)
    except ValueError as error:
        raise OptionError(str(error)) from None


def recorded_command(options: TrainOptions) -> str | None:
    """`command` as results.json records it (`public_command_line`)."""
    return None if options.command is None else public_command_line(options.command)


def public_command_line(command: str) -> str:
    """A command line as results.json records it: local paths cut to file names (`hub_metadata.public_command`),
    since the model folder, results.json with it, is what `push` uploads."""
    return public_command(command)


def run_config(options: TrainOptions) -> dict[str, Any]:
    """The resolved configuration of a run as `train --config` reads it: every TrainOptions field that defines the
    run, then the Trainer arguments given (`trainer_args`), as one JSON object."""
    values = {item.name: getattr(options, item.name) for item in fields(options) if item.name not in NOT_IN_RUN_CONFIG}
    # None values stay: a key set to null means the option unset, whatever the recipe of the rerun says.
    config = {name: os.fspath(value) if isinstance(value, os.PathLike) else value for name, value in values.items()}
    if options.init_from is not None:  # the folder's config and tokenizer replace these (from_recipe refuses them)
        for name in INIT_FROM_REPLACES:
            config.pop(name)
    return {**config, **options.trainer_args}


@dataclass(frozen=True)
class TrainResult:
    """What `train` wrote: the run folder (`output_dir`), its model folder and results.json contents (`summary`)."""

    output_dir: Path
    summary: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.output_dir / MODEL_DIR

    @property
    def results_file(self) -> Path:
        return self.model_dir / RESULTS_FILE


__all__ = [
    "BUDGET",
    "DEFAULT_OUTPUT_DIR",
    "EVAL_AT_SAVES",
    "INIT_FROM_REPLACES",
    "NOT_IN_RUN_CONFIG",
    "TRAINER_ARGUMENTS_OF_OPTIONS",
    "EvalSchedule",
    "TrainOptions",
    "TrainResult",
    "check_report_values",
    "parse_duration",
    "parse_eval_every",
    "public_command_line",
    "recorded_command",
    "run_config",
]
