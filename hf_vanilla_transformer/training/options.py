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
from ..model.configuration_vanilla_transformer import PRESETS
from ..option_fields import (
    finite_float,
    non_negative_float,
    option,
    options_of,
    positive_float,
    positive_int,
    probability,
    share,
    with_role,
)
from ..parallel_text import MULTI30K_LANGUAGES
from .compiling import TORCH_COMPILE_CHOICES
from .recipes import DEFAULT_RECIPE, Recipe
from .start_embedding import START_EMBEDDING_CHOICES

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_DIR = "outputs/multi30k-en-de"
# Longest side kept for training, in tokens with </s>. Multi30k's longest sentence is far shorter (under 100 tokens
# with the 8k BPE: 54), so the default drops nothing there; it guards memory on other corpora.
DEFAULT_MAX_LENGTH = 256
# Sentences a BPE is trained on by default: tokenizer training on this many stays under a minute on 2 cores, and
# all of Multi30k (2 x 29,000 training sentences) fits, so its tokenizer is trained on the whole corpus.
DEFAULT_TOKENIZER_SAMPLE = 1_000_000
LR_SCHEDULES = ("paper", "inverse_sqrt")
AVERAGE_MODES = ("last", "best", "spread")
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


def compare_curve_option(**roles: Any) -> Any:
    """The `compare_curve` option of `train` and `curve`, taking part in `roles` (option_fields.option)."""
    return option(
        None,
        help="draw the curves of this file beside the run's learning curve: another run's learning_curve.json or "
        '{"curves": {label: [{"minutes": ..., "bleu": ...}, ...]}} (e.g. docs/runs/marian_learning_curves.json)',
        metavar="FILE.json",
        **roles,
    )


# The command-line groups the options are listed under.
DATA = "data (default: the bundled Multi30k)"
MODEL = "model and tokenizer"
OPTIMIZATION = "optimization (§5.3, §5.4)"
BUDGET_AND_CHECKPOINTS = "budget and checkpoints"
VALIDATION = "validation during training (with --valid-src/--valid-tgt)"
OUTPUT = "output and evaluation"
GROUPS = (DATA, MODEL, OPTIMIZATION, BUDGET_AND_CHECKPOINTS, VALIDATION, OUTPUT)
_PATH = str | os.PathLike


@dataclass(frozen=True)
class TrainOptions:
    """Everything a training run needs, each option declared once (option_fields.option): its `help` is the
    command line's, and its roles say what else it is part of: `setting`, the settings that define a run
    (run_folder.run_settings: a resume must find them unchanged); `card`, the label of its row in the model card's
    training table; `trainer`, the VanillaSeq2SeqTrainingArguments fields it sets (`trainer_args` may not set them);
    `budget`, the training budget (a recipe's applies as a whole unless one of them is given); `reads`, the files and
    folders the run reads (its `output_dir` must be apart from them); `from_folder`, what an
    `init_from` folder replaces; `recorded=False`, what the resolved configuration (RUN/run_config.json) leaves out.
    The defaults are the main job (recipes.MULTI30K) on the bundled Multi30k EN->DE; `from_recipe` starts from
    another recipe. Durations are in seconds.
    """

    output_dir: _PATH = option(
        DEFAULT_OUTPUT_DIR,
        help="the run folder (new, empty or a run's): checkpoints/, curve/, run_settings.json, and the model folder "
        "OUTPUT_DIR/model",
        group=OUTPUT,
        sets=("output_dir",),
    )
    src_lang: str = option(
        "en",
        help="source language, a BCP-47 tag as the Hub takes it (en, de, pt-BR, zh-Hant, eng); Multi30k has "
        f"{', '.join(MULTI30K_LANGUAGES)}",
        group=DATA,
        setting=True,
    )
    tgt_lang: str = option("de", help="target language, a BCP-47 tag (de, fr, pt-BR, ...)", group=DATA, setting=True)
    train_src: _PATH | None = option(
        None, help="training source file, one sentence per line (.gz allowed)", group=DATA, reads=True
    )
    train_tgt: _PATH | None = option(
        None, help="training target file, line-aligned with --train-src", group=DATA, reads=True
    )
    valid_src: _PATH | None = option(
        None, help="validation (dev) source file, scored during training", group=DATA, reads=True
    )
    valid_tgt: _PATH | None = option(None, help="validation reference file", group=DATA, reads=True)
    test_src: _PATH | None = option(
        None,
        help="test source file (default with Multi30k: test_2016_flickr; it replaces a dataset's too)",
        group=DATA,
        reads=True,
    )
    test_tgt: _PATH | None = option(None, help="test reference file", group=DATA, reads=True)
    dataset: _PATH | None = option(
        None,
        help="train on a dataset instead (data.load_dataset_pairs): a Hub name, a save_to_disk folder, or a local "
        "json/jsonl/csv/parquet file (its split: train); a `translation` column of {lang: text} dicts or two text "
        "columns (--src-column/--tgt-column)",
        group=DATA,
        metavar="NAME_OR_PATH",
        reads=True,
    )
    dataset_config: str | None = option(None, help="the Hub dataset's configuration, e.g. de-en for wmt14", group=DATA)
    src_column: str | None = option(
        None, help="--dataset's source text column (unset: --src-lang, or the `translation` column)", group=DATA
    )
    tgt_column: str | None = option(None, help="--dataset's target text column (unset: --tgt-lang)", group=DATA)
    train_split: str | None = option(None, help="--dataset's split to train on (unset: train)", group=DATA)
    valid_split: str | None = option(
        None, help="--dataset's validation split (unset: validation, where the dataset has one)", group=DATA
    )
    test_split: str | None = option(
        None, help="--dataset's test split (unset: test, where the dataset has one)", group=DATA
    )
    max_length: int = option(
        DEFAULT_MAX_LENGTH,
        help="drop training pairs with more tokens than this on a side (</s> included)",
        group=DATA,
        parse=positive_int,
        setting=True,
        card="Maximum sentence length (tokens)",
    )
    max_length_ratio: float | None = option(
        None,
        help="drop training pairs whose longer side has more than this times the tokens of the shorter (e.g. 1.5 "
        "to 9, as Moses' clean-corpus-n); unset: keep every ratio",
        group=DATA,
        parse=positive_float,
        setting=True,
    )
    preprocessing_workers: int = option(
        1,
        help="processes that tokenize the training data (into a cached Arrow file, reused by the next run)",
        group=DATA,
        parse=positive_int,
    )
    tokenizer_sample: int = option(
        DEFAULT_TOKENIZER_SAMPLE,
        help="train the BPE on at most this many sentences (a seeded sample of the pairs; all of Multi30k fits)",
        group=DATA,
        parse=positive_int,
    )
    max_train_pairs: int | None = option(
        None, help="use only the first N training pairs", group=DATA, parse=positive_int
    )
    preset: str = option(
        DEFAULT_RECIPE.values["preset"],
        help="model size (Table 3 names)",
        group=MODEL,
        choices=PRESETS,  # the mapping itself: presets registered later count
        setting=True,
        from_folder=True,
        card="Preset",
    )
    init_from: _PATH | None = option(
        None,
        help="fine-tune: start from this model folder (a run's RUN/model, or one written by `python -m conversion`) "
        "with its config, weights and tokenizer, instead of a new --preset model (see --recipe finetune); --preset, "
        "--vocab-size and --tokenizer then do not apply, the dropouts override the folder's",
        group=MODEL,
        metavar="MODEL_DIR",
        setting=True,
        card="Fine-tuned from",
        reads=True,
    )
    dropout: float | None = option(
        None,
        help="P_drop (§5.4); unset: the preset's",
        group=MODEL,
        parse=probability,
        setting=True,
        card="Dropout P_drop",
    )
    attention_dropout: float | None = option(
        None,
        help="dropout on the attention weights (OpenNMT-py's and fairseq's --attention-dropout; a deviation: §5.4 "
        "has none); unset: the preset's, 0",
        group=MODEL,
        parse=probability,
        setting=True,
        card="Attention dropout (deviation)",
    )
    activation_dropout: float | None = option(
        None,
        help="dropout after the FFN's ReLU (fairseq's --activation-dropout; a deviation: §5.4 has none); unset: the "
        "preset's, 0",
        group=MODEL,
        parse=probability,
        setting=True,
        card="ReLU dropout (deviation)",
    )
    vocab_size: int = option(
        DEFAULT_RECIPE.values["vocab_size"],
        help="joint BPE size (§5.1)",
        group=MODEL,
        parse=positive_int,
        from_folder=True,
        card="Joint BPE vocabulary (§5.1)",
    )
    tokenizer: _PATH | None = option(
        None,
        help="an existing tokenizer folder instead of training a BPE",
        group=MODEL,
        setting=True,
        from_folder=True,
        card="Tokenizer",
        reads=True,
    )
    decoder_start_embedding: str = option(
        "zero",
        help="'zero': keep the decoder start token's embedding at zero, as CTranslate2 decodes (a model initialised "
        "from a folder whose row is not zero has it zeroed at the start); 'train': train it (needed with --init-from "
        "for models whose decoder starts from another token than <pad>; not exportable to CTranslate2)",
        group=MODEL,
        choices=START_EMBEDDING_CHOICES,
        trainer="decoder_start_embedding",
    )
    schedule: str = option(
        DEFAULT_RECIPE.values["schedule"],
        help="'paper' = eq. (3); 'inverse_sqrt' = deviation: linear warmup to --lr, then 1/sqrt(step) (fairseq)",
        group=OPTIMIZATION,
        choices=LR_SCHEDULES,
        setting=True,
        card="Learning-rate schedule",
        trainer="lr_schedule",
    )
    lr: float | None = option(
        None,
        help="peak learning rate for inverse_sqrt; factor on eq. (3) for paper (1.0 = the paper); unset: the "
        "schedule's (the main job's peak, or 1.0)",
        group=OPTIMIZATION,
        parse=positive_float,
        setting=True,
        card="Learning rate",
        sets=("learning_rate",),
    )
    warmup_steps: int = option(
        DEFAULT_RECIPE.values["warmup_steps"],
        help="updates of warmup (the paper: 4000)",
        group=OPTIMIZATION,
        parse=positive_int,
        setting=True,
        card="Warmup steps",
        trainer="warmup_steps",
    )
    warmup_init_lr: float | None = option(
        None,
        help="deviation (fairseq's --warmup-init-lr): with inverse_sqrt, the warmup rises linearly from this learning "
        "rate to --lr (it starts from 0 otherwise); e.g. 1e-7",
        group=OPTIMIZATION,
        parse=non_negative_float,
        setting=True,
        card="Warmup's initial learning rate (deviation)",
        trainer="warmup_init_lr",
    )
    lr_cooldown: float | None = option(
        None,
        help="deviation: scale the learning rate linearly down to 0 over this last share of the budget (--max-time, "
        "else --max-steps), e.g. 30%; unset: none (the paper has none)",
        group=OPTIMIZATION,
        parse=share,
        card="Learning-rate cooldown (share of the budget)",
        trainer="lr_cooldown",
    )
    label_smoothing: float = option(
        0.1,
        help="epsilon_ls (§5.4)",
        group=OPTIMIZATION,
        parse=probability,
        setting=True,
        card="Label smoothing ε_ls",
        trainer="label_smoothing_factor",
    )
    max_tokens: int = option(
        DEFAULT_RECIPE.values["max_tokens"],
        help="padded tokens per side and batch",
        group=OPTIMIZATION,
        parse=positive_int,
        setting=True,
        card="Tokens per batch and side",
        trainer="max_tokens",
    )
    grad_accum: int = option(
        1,
        help="batches per update",
        group=OPTIMIZATION,
        parse=positive_int,
        setting=True,
        card="Gradient accumulation",
        trainer="gradient_accumulation_steps",
    )
    seed: int = option(
        1,
        help="the seed of the model's initialisation, the batches and the BPE's sample",
        group=OPTIMIZATION,
        parse=int,
        setting=True,
        card="Seed",
        trainer="seed",
    )
    bf16: str = option(
        "auto",
        help="bf16 autocast: --bf16 (= yes), --bf16 auto (bf16 where the device has bf16 matrix units, as torch "
        "reports them: CPUs with AMX or AVX512-BF16, GPUs of compute capability 8.0+; fp32 elsewhere, e.g. AVX2-only "
        "CPUs, V100 and T4 GPUs, which emulate bf16) or --bf16 no",
        group=OPTIMIZATION,
        choices=("auto", "yes", "no"),
        const="yes",
        setting=True,
        card="bf16",
        sets=("bf16",),
    )
    torch_compile: str = option(
        "auto",
        help="compile the training step with torch.compile (inductor; C++/OpenMP kernels on a CPU, Triton on a GPU): "
        "--torch-compile (= yes), --torch-compile auto (on a GPU only, as CUDA graphs where an update is "
        "launch-bound: compiling.graphs_win), graphs (CUDA graphs over 8 fixed batch shapes) or no; where compiling "
        "cannot work, one line says so and training goes on eagerly",
        group=OPTIMIZATION,
        choices=TORCH_COMPILE_CHOICES,
        const="yes",
        sets=("torch_compile",),
        flags=("--torch_compile",),  # as run_translation.py spells transformers' switch
    )
    attn_implementation: str | None = option(
        None,
        help="attention kernels for training (the same function); unset: eager on the CPU (PyTorch's fused CPU "
        "attention has a slow bf16 backward at these lengths: 1.5x slower steps, bench/README.md), sdpa on a GPU",
        group=OPTIMIZATION,
        choices=("eager", "sdpa"),
    )
    max_time: float | None = option(
        DEFAULT_RECIPE.values["max_time"],
        help="wall-clock training budget, e.g. 1h, 20m, 1h30m (the recipe's budget applies unless --epochs or "
        "--max-steps is given); the whole command, the evaluation after training included, ends within 10% more, "
        "what did not fit listed with its command (docs/training.md)",
        group=BUDGET_AND_CHECKPOINTS,
        parse=parse_duration,
        budget=True,
        trainer="max_time",
    )
    evaluation_time: float | None = option(
        None,
        help="with --max-time, how long the evaluation after training may take, e.g. 5m (unset: 10% of --max-time); "
        "less scores the test set's first sentences that fit",
        group=BUDGET_AND_CHECKPOINTS,
        parse=parse_duration,
    )
    epochs: int | None = option(
        None,
        help="number of epochs",
        group=BUDGET_AND_CHECKPOINTS,
        parse=positive_int,
        budget=True,
        sets=("num_train_epochs",),
    )
    max_steps: int | None = option(
        None,
        help="number of updates",
        group=BUDGET_AND_CHECKPOINTS,
        parse=positive_int,
        budget=True,
        sets=("max_steps",),
    )
    save_every: float = option(
        DEFAULT_RECIPE.values["save_every"],
        help="checkpoint interval in seconds or as 10m (the paper: 10m); checkpoints are also written each epoch",
        group=BUDGET_AND_CHECKPOINTS,
        parse=parse_duration,
        trainer="save_every",
    )
    average_last: int = option(
        DEFAULT_RECIPE.values["average_last"],
        help="k, the number of checkpoints averaged into the final model (1 = one checkpoint)",
        group=BUDGET_AND_CHECKPOINTS,
        parse=positive_int,
        flags=("--average-checkpoints",),
        sets=("save_total_limit",),
    )
    average: str = option(
        "last",
        help="which k checkpoints: the last ones (§6.1), the best by dev BLEU (needs a dev set), or spread evenly "
        "over --average-span at the end of the run (the paper's 10-minute intervals)",
        group=BUDGET_AND_CHECKPOINTS,
        choices=AVERAGE_MODES,
    )
    average_span: str = option(
        "50%",
        help="with --average spread: the end of the run the k checkpoints are spread over, as a share of its "
        "training time (50%) or a duration (30m)",
        group=BUDGET_AND_CHECKPOINTS,
    )
    curve_every: float | None = option(
        None,
        help="save the weights every this many seconds of training (e.g. 5m) into OUTPUT_DIR/curve and, after "
        "training, plot validation BLEU against training minutes (learning_curve.png)",
        group=BUDGET_AND_CHECKPOINTS,
        parse=parse_duration,
    )
    compare_curve: _PATH | None = compare_curve_option(group=BUDGET_AND_CHECKPOINTS, reads=True)
    resume: bool = option(
        False,
        help="continue from the last checkpoint in the folder",
        group=BUDGET_AND_CHECKPOINTS,
        recorded=False,
        sets=("resume_from_checkpoint",),
    )
    overwrite: bool = option(
        False,
        help="start afresh in a run folder of an earlier run: its checkpoints are deleted (never others' files)",
        group=BUDGET_AND_CHECKPOINTS,
        recorded=False,
    )
    eval_every: str | None = option(
        None,
        help="score the dev set: 'save' = at each checkpoint save (unset likewise), N = every N updates (500), or a "
        "duration with its unit = every so much training time (10m, 90s); each evaluation saves a checkpoint",
        group=VALIDATION,
        sets=("eval_every",),
    )
    eval_num_beams: int | None = option(
        None,
        help="beam size of the dev decoding (unset: greedy; the paper: 4)",
        group=VALIDATION,
        parse=positive_int,
        sets=("generation_num_beams",),
    )
    eval_max_sentences: int = option(
        1000, help="score at most the first N dev pairs", group=VALIDATION, parse=positive_int
    )
    report_to: str = option(
        "none",
        help="send the logs (loss, dev BLEU, chrF) to these integrations, comma-separated: tensorboard (event files "
        "in OUTPUT_DIR/checkpoints/runs), wandb, ...; 'none' = the printed log only",
        group=VALIDATION,
        sets=("report_to",),
    )
    early_stopping_patience: int | None = option(
        None,
        help="stop after N evaluations in a row without a better dev BLEU",
        group=VALIDATION,
        parse=positive_int,
        trainer="early_stopping_patience",
    )
    keep_best: bool = option(
        False,
        help="keep the checkpoint with the best dev BLEU, whatever the checkpoint limit removes",
        group=VALIDATION,
        sets=("metric_for_best_model",),
    )
    evaluate: bool = option(True, help="skip the test-set evaluation", group=OUTPUT, negated="--no-eval")
    eval_batch_size: int = option(
        64,
        help="sentences per batch of the evaluations",
        group=OUTPUT,
        parse=positive_int,
        trainer="per_device_eval_batch_size",
    )
    test_max_sentences: int | None = option(
        None,
        help="score only the first N test sentences (a trial; the card says so); unset: all",
        group=OUTPUT,
        parse=positive_int,
    )
    test_num_beams: int | None = option(
        None,
        help="decode the test set with this many beams (1: greedy, quick; the card says so); unset: the model's, "
        "§6.1: 4",
        group=OUTPUT,
        parse=positive_int,
    )
    num_beams: int | None = option(
        None,
        help="the saved model's beam size (its generation_config.json: generate(), the pipeline, the test scoring); "
        "unset: §6.1's 4, or the --init-from folder's",
        group=OUTPUT,
        parse=positive_int,
    )
    length_penalty: float | None = option(
        None,
        help="the saved model's length penalty α (GNMT's); unset: §6.1's 0.6, or the --init-from folder's",
        group=OUTPUT,
        parse=finite_float,
    )
    examples: int = option(5, help="example translations to print", group=OUTPUT, parse=int)
    logging_steps: int = option(
        50, help="updates between log lines", group=OUTPUT, parse=positive_int, trainer="logging_steps"
    )
    progress: bool = option(
        True, help="no progress bars", group=OUTPUT, negated="--no-progress", sets=("disable_tqdm",)
    )
    license: str | None = option(
        None,
        help="the model card's Hub license id: apache-2.0, mit, cc-by-4.0, cc-by-nc-4.0, ... "
        "(https://huggingface.co/docs/hub/repositories-licenses), or other with --license-name (unset: the "
        "training data's own terms: Multi30k's non-commercial research terms as `license: other`; none for other "
        "data)",
        group=OUTPUT,
    )
    license_name: str | None = option(
        None, help="with --license other: the terms' name, kebab-case (my-terms-1.0)", group=OUTPUT
    )
    push_to_hub: str | None = option(
        None,
        help="upload the model folder to this Hub repository at the end (see `push`); the token is checked first",
        group=OUTPUT,
        metavar="REPO_ID",
        sets=("push_to_hub", "hub_model_id"),
    )
    private: bool = option(False, help="with --push-to-hub: create the repository private", group=OUTPUT)
    # Not options of the command line: the command line that started the run, recorded in results.json and the
    # model card with file names for local paths (hub_metadata.public_command: both are uploaded); and any other
    # VanillaSeq2SeqTrainingArguments fields (optim, max_grad_norm, weight_decay, fp16, deepspeed, ...), applied
    # over the ones these options set (a field one of them sets is refused, naming the option).
    command: str | None = None
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
        # The recipe's budget is the one it names (the defaults' is the main job's).
        settings = {**dict.fromkeys(BUDGET), **recipe.values}
        if all(settings[name] is None for name in BUDGET):
            raise OptionError(f"Recipe {recipe.name!r} has no budget: set one of {', '.join(BUDGET)} in its values.")
        if any(options.get(name) is not None for name in BUDGET):
            settings.update(dict.fromkeys(BUDGET))
        if options.get("schedule", recipe.schedule) != recipe.schedule:
            settings["lr"] = None
        if recipe.gpu and not torch.cuda.is_available():
            logger.warning(
                f"`recipe={recipe.name}` is sized for a GPU and this machine has none: it runs, far slower, and its "
                "budget will not reach the recipe's result."
            )
        trainer_args = {**settings.pop("trainer_args", {}), **options.pop("trainer_args", {})}  # explicit ones win
        return cls(**{**settings, **options, "trainer_args": trainer_args})

    def learning_rate(self) -> float:
        """`lr`, or its default for the schedule: 1.0 (eq. (3) as is) for "paper", the main job's peak otherwise."""
        if self.lr is not None:
            return self.lr
        return 1.0 if self.schedule == "paper" else DEFAULT_RECIPE.lr


# The budget options: a recipe's budget applies as a whole unless one of them is given.
BUDGET = with_role(TrainOptions, "budget")
# The options that `init_from`'s folder replaces (its config and tokenizer).
INIT_FROM_REPLACES = with_role(TrainOptions, "from_folder")
# The `VanillaSeq2SeqTrainingArguments` fields that `train` sets from its options, with the option that sets each:
# `trainer_args` may set any other field, but not these, which would contradict the option.
TRAINER_ARGUMENTS_OF_OPTIONS = {
    name: item.name
    for item in options_of(TrainOptions)
    for name in (*item.metadata.get("sets", ()), *filter(None, [item.metadata.get("trainer")]))
}


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
    """The resolved configuration of a run as `train --config` reads it: every option that defines the run (all but
    those `recorded=False`), then the Trainer arguments given (`trainer_args`), as one JSON object."""
    # None values stay: a key set to null means the option unset, whatever the recipe of the rerun says.
    config = {
        item.name: os.fspath(value) if isinstance(value, os.PathLike) else value
        for item in options_of(TrainOptions)
        if item.metadata.get("recorded", True)
        and not (options.init_from is not None and item.metadata.get("from_folder"))
        for value in [getattr(options, item.name)]
    }
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
    "AVERAGE_MODES",
    "BUDGET",
    "DEFAULT_OUTPUT_DIR",
    "EVAL_AT_SAVES",
    "GROUPS",
    "INIT_FROM_REPLACES",
    "LR_SCHEDULES",
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
