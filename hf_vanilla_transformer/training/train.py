"""`train(options)`: data (Multi30k by default, or parallel files, or a dataset), a joint BPE (§5.1), the model of a
`Recipe` (recipes.py) trained inside `Seq2SeqTrainer` (trainer.py) for its budget, the last checkpoints averaged
(§6.1), the test set scored with the paper's decoding, attention maps, a learning curve, a model card, and
`results.json`. The run folder (`output_dir`, run_folder.py) keeps what training needs; the model goes to RUN/model,
which holds exactly the files of its Hub repository (`hub.push` uploads it) and which `pipeline("translation",
model=...)` loads. Progress is logged (logger "hf_vanilla_transformer", INFO); the command line prints it.

The run goes in five named steps, each handing the next a small dataclass:
1. `check_options`: every option alone and the Trainer arguments, before any data is read or any folder touched;
2. `prepare_data`: what the run folder holds (a resume, an earlier run), the data, the tokenizer, the tokenized
   training and dev sets;
3. the model: `plan_model` (its config, the settings that define the run, a resume checked against them), then,
   once the run folder is this run's (`_claim_run_folder`, under its lock), `build_model`;
4. `fit`: the Trainer and its callbacks train for the budget;
5. `finalize`: average the checkpoints, score the test set, write the model folder's card and results, push.
An option is refused (`OptionError`, naming its field and value) before the run folder changes: in `check_options`,
`prepare_data` or `plan_model`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import time
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerBase, TrainerState
from transformers.integrations import is_tensorboard_available, is_wandb_available

from ..errors import OptionError, close_matches
from ..files import MODEL_DIR, writable_folder
from ..hub import PushOptions, hub_token, push
from ..inference.attention_maps import ATTENTION_DIR, AttentionOptions, plot_attention_maps
from ..inference.evaluation import OUT_OF_DOMAIN, out_of_domain_translation
from ..inference.loading import load_model, load_tokenizer, model_folder
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.generation_vanilla_transformer import paper_generation_config
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..option_fields import options_of
from .averaging import (
    AVERAGE_MODES,
    AverageSpan,
    CheckpointInfo,
    checkpoint_infos,
    select_checkpoints,
    selectable_checkpoints,
    write_averaged_model,
)
from .compiling import CompileReportCallback, resolve_torch_compile
from .data import DEFAULT_TOKENIZER_SAMPLE, prepare_pairs, tokenizer_sample
from .devices import LoopRateCallback, describe_device, resolve_cuda_graphs, resolve_tf32
from .evaluation_budget import EvaluationClock, Skipped, evaluation_seconds, prefix_scorer, score_within
from .learning_curve import (
    CURVE_DIR,
    CURVE_PNG,
    CurveOptions,
    learning_curve,
    load_comparison_curves,
    snapshot_folders,
    write_dev_curve,
)
from .mapped_pages import ReleaseCorpusPagesCallback
from .options import (
    BUDGET,
    EVAL_AT_SAVES,
    INIT_FROM_REPLACES,
    TRAINER_ARGUMENTS_OF_OPTIONS,
    TrainOptions,
    TrainResult,
    check_report_values,
    parse_eval_every,
    public_command_line,
    recorded_command,
)
from .run_data import TrainingData, check_dev_set, check_training_pairs, dev_dataset, load_training_data
from .run_folder import (
    CHECKPOINTS,
    MODEL_RUN_ENTRIES,
    SETTINGS_FILE,
    bpe_identity,
    check_output_dir,
    check_same_run,
    clear_for_run,
    exclusive_run,
    refuse_if_in_use,
    run_settings,
    tokenizer_fingerprint,
    trained_steps,
    write_run_config,
    write_settings,
)
from .static_shapes import CudaGraphStepCallback
from .tokenization import BYTE_TOKENS, SPECIAL_TOKENS, special_token_ids, train_bpe_tokenizer
from .trainer import (
    CheckpointRetentionCallback,
    LearningCurveCallback,
    VanillaSeq2SeqTrainer,
    VanillaSeq2SeqTrainingArguments,
    resolve_bf16,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedOptions:
    """What `check_options` makes of the options: the Trainer's arguments, bf16 and torch.compile as resolved on
    this device, and the model folder `init_from` names (None: a new model)."""

    training_args: VanillaSeq2SeqTrainingArguments
    bf16: bool
    init_dir: Path | None
    torch_compile: bool = False


@dataclass(frozen=True)
class PreparedData:
    """What `prepare_data` hands on: the run folder's checkpoint folder and the checkpoint a resume starts from, the
    data, the tokenizer (and what identifies it in the run's settings), the tokenized training and dev sets."""

    checkpoint_dir: Path
    resume_from: Path | None
    data: TrainingData
    tokenizer: PreTrainedTokenizerBase
    tokenizer_identity: str
    train_dataset: Dataset
    valid_dataset: Dataset | None


@dataclass(frozen=True)
class ModelPlan:
    """What `plan_model` decides: the model's config, the settings that define the run (run_folder.run_settings),
    and whether a resumed run is `finished` already (its checkpoint is at `max_steps`)."""

    config: VanillaTransformerConfig
    settings: dict[str, Any]
    finished: bool


def train(options: TrainOptions) -> TrainResult | None:
    """Train, average, evaluate and write the model folder (see the module docstring).

    Returns None on the processes other than the main one of a distributed run (torchrun, accelerate launch),
    where the main process alone writes the results."""
    started = time.perf_counter()
    checked = check_options(options)
    prepared = prepare_data(options, checked)
    plan = plan_model(options, checked, prepared)
    output_dir = Path(options.output_dir)
    main_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, the main process owns the run folder
    if main_process and (output_dir / "config.json").is_file():  # a run folder of the layout before RUN/model
        logger.info(
            f"{output_dir} holds a model at its top level (a run of an older version); this run writes its model "
            f"to {output_dir / MODEL_DIR}, and the top-level model files can be deleted."
        )
    # Every option is checked: from here on the folder changes, by one run at a time.
    output_dir = writable_folder(output_dir, "output_dir")
    with exclusive_run(output_dir) if main_process else contextlib.nullcontext():
        if main_process:
            _claim_run_folder(options, checked, prepared, plan)
        model = build_model(options, checked, plan)
        trainer = fit(options, checked, prepared, plan, model)
        if not trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes the results
            return None
        return finalize(options, prepared, trainer, started)


# ---------------------------------------------------------------------------------------------------- 1. check


def check_options(options: TrainOptions) -> CheckedOptions:
    """Every option that can be checked alone, before any data is read or any folder touched; the Trainer's
    arguments (which check the optimization options) built from them."""
    _check_values(options)
    report_to = _check_eval_options(options)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    logger.info(f"Device: {describe_device(device)}")
    bf16, precision = resolve_bf16(options.bf16, device)
    logger.info(f"Precision: {precision}")
    tf32, tf32_line = resolve_tf32(device, options.trainer_args.get("tf32"))
    logger.info(f"TF32: {tf32_line}")
    compiled, compiling = resolve_torch_compile(options.torch_compile, device)
    logger.info(f"Compile: {compiling}")
    init_dir = _init_folder(options) if options.init_from is not None else None
    config = (
        VanillaTransformerConfig.from_pretrained(init_dir)
        if init_dir is not None
        else VanillaTransformerConfig.from_preset(options.preset, vocab_size=options.vocab_size)
    )
    graphs, graphs_line = resolve_cuda_graphs(options.torch_compile, compiled, device, config, options.max_tokens)
    logger.info(f"CUDA graphs: {graphs_line}")
    arguments = {"tf32": tf32, **graphs, **_trainer_arguments(options, bf16, report_to)}
    training_args = VanillaSeq2SeqTrainingArguments(**arguments, torch_compile=compiled)
    return CheckedOptions(training_args, bf16, init_dir, compiled)


def _check_values(options: TrainOptions) -> None:
    """The values that are wrong whatever the data: ranges, a tokenizer folder, a comparison curve, a Hub token."""
    if not 0 <= options.seed < 2**32:
        raise OptionError(f"`seed={options.seed}` must lie in [0, 2**32 - 1] (numpy's seed range). Pass e.g. 1.")
    if options.max_length < 2:
        raise OptionError(f"`max_length={options.max_length}` must be at least 2 (a token and </s>).")
    if options.max_length_ratio is not None and not options.max_length_ratio >= 1:
        raise OptionError(
            f"`max_length_ratio={options.max_length_ratio}` must be at least 1 (longer side / shorter side, in "
            "tokens). Pass e.g. 1.5 to 9 (Moses' clean-corpus-n uses 9), or leave it out to keep every ratio."
        )
    if options.preprocessing_workers < 1:
        raise OptionError(
            f"`preprocessing_workers={options.preprocessing_workers}` must be at least 1. Pass e.g. the number of "
            "CPU cores."
        )
    if options.tokenizer_sample < 2:
        raise OptionError(
            f"`tokenizer_sample={options.tokenizer_sample}` must be at least 2 (one pair's two sentences). Pass "
            f"e.g. {DEFAULT_TOKENIZER_SAMPLE:,} (the default)."
        )
    smallest_vocab = len(SPECIAL_TOKENS) + len(BYTE_TOKENS) + 1
    if options.tokenizer is None and options.vocab_size < smallest_vocab:
        raise OptionError(
            f"`vocab_size={options.vocab_size}` is below the smallest BPE, {smallest_vocab} (4 special and 256 "
            "byte tokens, one merge). Pass a larger `vocab_size` (the Multi30k recipe: 8000)."
        )
    if options.tokenizer is not None and not Path(options.tokenizer).is_dir():
        raise OptionError(f"`tokenizer` {options.tokenizer} is not a folder. Pass a folder saved by save_pretrained.")
    if options.compare_curve is not None:  # checked now, not after hours of training
        if options.curve_every is None:
            raise OptionError(
                f"`compare_curve` {options.compare_curve} is drawn beside the learning curve, which needs "
                "`curve_every`. Pass `curve_every` too, or drop `compare_curve`."
            )
        load_comparison_curves(options.compare_curve)
    if options.push_to_hub is not None and int(os.environ.get("RANK", "0")) == 0:
        hub_token("push_to_hub")  # now, not after hours of training
    check_report_values(options)  # the card's languages and license, the test decoding's caps


def _check_eval_options(options: TrainOptions) -> list[str]:
    """Check the options of validation during training and averaging up front; the integrations for `report_to`."""
    if options.average not in AVERAGE_MODES:
        raise OptionError(f"`average={options.average}` is not one of {', '.join(AVERAGE_MODES)}. Pick one.")
    try:  # their errors name the option and its value
        AverageSpan.parse(options.average_span)
        parse_eval_every(options.eval_every)
    except ValueError as error:
        raise OptionError(str(error)) from None
    report_to = [name.strip() for name in options.report_to.split(",") if name.strip() and name.strip() != "none"]
    installed = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}
    for name in report_to:
        if name in installed and not installed[name]():
            raise OptionError(f"`report_to={name}`: {name} is not installed. Run `pip install {name}`.")
    return report_to


def _init_folder(options: TrainOptions) -> Path:
    """The model folder `init_from` names (a run folder stands for its RUN/model), after the checks that make a
    wrong folder one line before any data is read: this package's model type, a tokenizer beside it, no
    `tokenizer`, and a decoder start token that `decoder_start_embedding="zero"` can keep at zero."""
    folder = Path(options.init_from)
    if not (folder / "config.json").is_file() and (folder / MODEL_DIR / "config.json").is_file():
        folder = folder / MODEL_DIR  # `train`'s run folder: its model folder
    model_folder(folder, None, name="`init_from`", tokenizer=False)
    if options.tokenizer is not None:
        raise OptionError(
            f"`tokenizer` {options.tokenizer} cannot apply with `init_from` {options.init_from}, whose model was "
            "trained with its own tokenizer; drop `tokenizer`."
        )
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise OptionError(
            f"`init_from` {options.init_from} has no tokenizer (no tokenizer.json or tokenizer_config.json). Save "
            "the model's tokenizer into the folder (tokenizer.save_pretrained)."
        )
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    start, pad = config.get("decoder_start_token_id"), config.get("pad_token_id")
    if options.decoder_start_embedding == "zero" and start != pad:
        raise OptionError(
            f"`init_from` {options.init_from} starts the decoder from token {start}, not <pad> ({pad}), so "
            "`decoder_start_embedding=zero` cannot keep its row at zero (it is a label's row). Pass "
            "`decoder_start_embedding=train`."
        )
    return folder


def _trainer_arguments(options: TrainOptions, bf16: bool, report_to: list[str]) -> dict[str, Any]:
    """The Trainer's arguments: those of the options, then the user's other ones (`trainer_args`) over them."""
    # The options that pass their value as it is (their `trainer` role), then those the Trainer takes otherwise.
    passed = {item.metadata["trainer"]: getattr(options, item.name) for item in _passed_to_trainer()}
    arguments: dict[str, Any] = dict(
        output_dir=str(Path(options.output_dir) / CHECKPOINTS),
        learning_rate=options.learning_rate(),
        num_train_epochs=options.epochs if options.epochs is not None else 1000,
        max_steps=options.max_steps if options.max_steps is not None else -1,
        save_strategy="epoch",
        # average "last": the Trainer keeps the last k (+1: a save cut short leaves k complete); best/spread keep
        # what they may still pick (CheckpointRetentionCallback). Either keeps best_model_checkpoint (`keep_best`).
        save_total_limit=max(options.average_last, 1) + 1 if options.average == "last" else None,
        # Validation during training (with a dev set only; docs/training.md "Validation during training").
        eval_every=options.eval_every or EVAL_AT_SAVES,
        predict_with_generate=True,
        generation_num_beams=options.eval_num_beams or 1,
        dataloader_pin_memory=torch.cuda.is_available(),  # the dev batches; pinning warns on a CPU
        metric_for_best_model="bleu" if options.keep_best else None,
        greater_is_better=True,
        bf16=bf16,
        # Without a GPU, transformers needs to be told that the CPU is meant: for bf16 (CPU autocast), and under
        # torchrun for the processes to join a gloo group (else each trains alone and all write the same files).
        use_cpu=not torch.cuda.is_available() and (bf16 or int(os.environ.get("WORLD_SIZE", "1")) > 1),
        logging_first_step=True,
        disable_tqdm=not options.progress,
        report_to=report_to,
    )
    return {**passed, **arguments, **_trainer_overrides(options.trainer_args)}


def _passed_to_trainer() -> list[Field[Any]]:
    """The options whose value is a Trainer argument as it is (their `trainer` role names it)."""
    return [item for item in options_of(TrainOptions) if item.metadata.get("trainer")]


def trainer_argument_names() -> list[str]:
    """The fields of `VanillaSeq2SeqTrainingArguments` (Seq2SeqTrainingArguments' and ours) that can be set."""
    return [item.name for item in fields(VanillaSeq2SeqTrainingArguments) if item.init]


def _trainer_overrides(trainer_args: Mapping[str, Any]) -> dict[str, Any]:
    """`trainer_args` after checking each is a field of the Trainer arguments that no option of `train` sets."""
    names = trainer_argument_names()
    for name in trainer_args:
        if name in TRAINER_ARGUMENTS_OF_OPTIONS:
            option = TRAINER_ARGUMENTS_OF_OPTIONS[name]
            raise OptionError(f"Trainer argument '{name}' is what `{option}` sets; pass `{option}` instead.")
        if name not in names:
            raise OptionError(
                f"Unknown Trainer argument '{name}'{close_matches(name, names)}: the fields of "
                "Seq2SeqTrainingArguments and VanillaSeq2SeqTrainingArguments can be set."
            )
    return dict(trainer_args)


# ---------------------------------------------------------------------------------------------------- 2. data


def prepare_data(options: TrainOptions, checked: CheckedOptions) -> PreparedData:
    """What the run folder holds (read only), the data, the tokenizer and the tokenized training and dev sets, with
    the options that need the data checked against it."""
    if int(os.environ.get("RANK", "0")) == 0:
        refuse_if_in_use(Path(options.output_dir))
    checkpoint_dir, resume_from = check_output_dir(options)
    data = load_training_data(options)
    check_training_pairs(data, options)
    check_dev_set(options, data.valid is not None)
    if options.push_to_hub is not None and (data.test is None or not options.evaluate):
        raise OptionError(
            f"`push_to_hub={options.push_to_hub}` uploads the model with its card, which the test-set evaluation "
            "writes; drop `evaluate=False` (and give a test set, `test_src`/`test_tgt`, where the data has none)."
        )
    logger.info(f"Training pairs: {len(data.train):,} ({data.name}, {options.src_lang} -> {options.tgt_lang})")
    tokenizer, identity = _tokenizer(options, checked, data.train, resume_from)
    train_dataset = _tokenized_pairs(options, data, tokenizer)
    valid_dataset = dev_dataset(data.valid, tokenizer, options) if data.valid is not None else None
    return PreparedData(checkpoint_dir, resume_from, data, tokenizer, identity, train_dataset, valid_dataset)


def _tokenizer(
    options: TrainOptions, checked: CheckedOptions, train_pairs: Dataset, resume_from: Path | None
) -> tuple[PreTrainedTokenizerBase, str]:
    """The run's tokenizer and what identifies it in the run's settings: an `init_from` folder's (whatever it is:
    BPE, SentencePiece) or `tokenizer`'s, else a joint BPE trained on a sample of the pairs; a resume takes the run's
    own, which the options' must match (run_folder.check_same_run)."""
    if checked.init_dir is not None:
        given = _init_tokenizer(checked.init_dir)
    elif options.tokenizer is not None:
        given = load_tokenizer(options.tokenizer)
    else:
        given = None
    identity = tokenizer_fingerprint(given) if given is not None else bpe_identity(options, len(train_pairs))
    if resume_from is not None:
        return load_tokenizer(resume_from), identity
    if given is not None:
        return given, identity
    sentences = min(2 * len(train_pairs), options.tokenizer_sample)
    texts = tokenizer_sample(train_pairs, options.tokenizer_sample, seed=options.seed)
    tokenizer = train_bpe_tokenizer(texts, vocab_size=options.vocab_size)
    logger.info(f"Trained a joint BPE of {len(tokenizer):,} tokens on {sentences:,} sentences")
    return tokenizer, identity


def _init_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of an `init_from` folder, checked against the model's vocabulary."""
    try:
        tokenizer = load_tokenizer(folder)
    except (OSError, ValueError, TypeError) as error:
        raise OptionError(
            f"`init_from` {folder}: its tokenizer does not load ({error}). Save it again with save_pretrained."
        ) from None
    vocab_size = VanillaTransformerConfig.from_pretrained(folder).vocab_size
    if len(tokenizer) > vocab_size:
        raise OptionError(
            f"`init_from` {folder}: its tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
            f"{vocab_size}. The folder mixes a model and another model's tokenizer; rebuild it."
        )
    return tokenizer


def _tokenized_pairs(options: TrainOptions, data: TrainingData, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """The training pairs tokenized and cleaned (data.prepare_pairs), each short enough for a batch alone."""
    try:
        prepared = prepare_pairs(
            data.train,
            tokenizer,
            max_length=options.max_length,
            max_length_ratio=options.max_length_ratio,
            num_proc=options.preprocessing_workers if options.preprocessing_workers > 1 else None,
        )
    except ValueError:  # pairs with a blank side were refused before: the length limits are what dropped them all
        ratio = f" / `max_length_ratio={options.max_length_ratio}`" if options.max_length_ratio is not None else ""
        raise OptionError(
            f"`max_length={options.max_length}`{ratio} drops every training pair of {data.name} (each has more "
            "tokens on a side, </s> included, or too unequal sides). Raise `max_length` (or `max_length_ratio`)."
        ) from None
    logger.info(prepared.cleaning.summary())  # (data.prepare_pairs logs the reuse of a tokenized cache itself)
    longest = int(max(prepared.source_lengths.max(), prepared.target_lengths.max()))
    if options.max_tokens < longest:
        raise OptionError(
            f"`max_tokens={options.max_tokens}` is below the longest training pair ({longest} tokens on a side, "
            f"</s> included), which must fit in a batch alone. Raise `max_tokens` to {longest} or more, or drop long "
            "pairs with a lower `max_length`."
        )
    return prepared.dataset


# ---------------------------------------------------------------------------------------------------- 3. model


def plan_model(options: TrainOptions, checked: CheckedOptions, prepared: PreparedData) -> ModelPlan:
    """The model's config (an `init_from` folder's, only the dropouts changed; else `preset`'s for the tokenizer),
    the run's settings, and on a resume the checks that it is the same run and can go on to `max_steps`."""
    # The deviations' names are the config's own; P_drop is `dropout` in the config and P_drop in `from_preset`.
    deviations = {
        name: value
        for name in ("attention_dropout", "activation_dropout")
        if (value := getattr(options, name)) is not None
    }
    if checked.init_dir is not None:  # the folder's model as it is; only dropout (§5.4) may change for the new data
        config = VanillaTransformerConfig.from_pretrained(checked.init_dir)
        for name, value in {"dropout": options.dropout, **deviations}.items():
            if value is not None:
                setattr(config, name, value)
        config.validate()
    else:
        tokenizer = prepared.tokenizer
        overrides: dict[str, Any] = {"vocab_size": len(tokenizer), **special_token_ids(tokenizer), **deviations}
        if options.dropout is not None:
            overrides["P_drop"] = options.dropout
        config = VanillaTransformerConfig.from_preset(options.preset, **overrides)
    train_pairs = prepared.data.train
    settings = run_settings(options, train_pairs, prepared.tokenizer_identity, config.dropout, checked.bf16)
    if checked.init_dir is not None:  # a resume must start from the same folder: its weights are the run's start
        settings.pop("preset")
        settings["init_from"] = f"{checked.init_dir} ({_weights_fingerprint(checked.init_dir)})"
    resume_from = prepared.resume_from
    if resume_from is None:
        return ModelPlan(config, settings, finished=False)
    if not check_same_run(Path(options.output_dir), settings):
        logger.info(
            f"{Path(options.output_dir)} records no {SETTINGS_FILE} (an older version's run): its settings are not "
            "checked."
        )
    steps = trained_steps(resume_from)
    if options.max_steps is not None and options.max_steps < steps:
        raise OptionError(
            f"`max_steps={options.max_steps}` is below the {steps} updates of {resume_from.name}, the run's last "
            f"checkpoint; a run cannot go back. Pass `max_steps={steps}` to finish the run without more training, a "
            "larger value to train on, or `overwrite` to start afresh."
        )
    return ModelPlan(config, settings, finished=options.max_steps == steps)


def _weights_fingerprint(folder: Path) -> str:
    """A SHA-256 over the folder's weight files, so that a resume checks it starts from the same weights."""
    digest = hashlib.sha256()
    for path in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return f"weights sha256 {digest.hexdigest()[:16]}"


def _claim_run_folder(options: TrainOptions, checked: CheckedOptions, prepared: PreparedData, plan: ModelPlan) -> None:
    """The run folder becomes this run's (the main process, holding its lock): what the run replaces removed, its
    settings and configuration written."""
    output_dir = Path(options.output_dir)
    if check_output_dir(options) != (prepared.checkpoint_dir, prepared.resume_from):  # another run ended in between
        raise OptionError(
            f"`output_dir` {output_dir} changed while this run was starting (another run wrote to it). Start again."
        )
    clear_for_run(output_dir, prepared.checkpoint_dir, prepared.resume_from)
    write_settings(output_dir, plan.settings)
    write_run_config(output_dir, options, checked.training_args)


def build_model(
    options: TrainOptions, checked: CheckedOptions, plan: ModelPlan
) -> VanillaTransformerForConditionalGeneration:
    """The model to train: a new one of the planned config (seeded), or the `init_from` folder's weights; attention
    kernels for training, and the §6.1 decoding for the dev evaluations and the saved folders."""
    torch.manual_seed(options.seed)
    init_dir = checked.init_dir
    if init_dir is not None:  # fine-tuning: the folder's weights and its decoding (generation config)
        model = VanillaTransformerForConditionalGeneration.from_pretrained(init_dir, config=plan.config)
    else:
        model = VanillaTransformerForConditionalGeneration(plan.config)
    model.set_attn_implementation(options.attn_implementation or training_attention(checked.training_args.device))
    # §6.1 decoding, set before training: Seq2SeqTrainer's generation-based evaluation would otherwise fill the
    # global defaults (max_length 20) into it. A fine-tuned folder keeps its own where it has one.
    if init_dir is None or not (init_dir / "generation_config.json").is_file():
        model.generation_config = paper_generation_config(plan.config)
    decoding = {"num_beams": options.num_beams, "length_penalty": options.length_penalty}
    given = {name: value for name, value in decoding.items() if value is not None}
    if given:
        model.generation_config.update(**given)  # a decoding chosen on validation, as §6.1 chose its own
        beams, alpha = model.generation_config.num_beams, model.generation_config.length_penalty
        logger.info(f"The saved model decodes with beam {beams}, length penalty α {alpha:g} (§6.1: beam 4, α 0.6)")
    budget = f"at most {options.max_time / 60:.1f} minutes" if options.max_time is not None else "no time limit"
    cooldown = f", cooldown over the last {options.lr_cooldown:.0%} of the budget" if options.lr_cooldown else ""
    config = plan.config
    dropouts = f"P_drop {config.dropout:g}" + "".join(
        f", {words} {value:g}"
        for words, value in [
            ("attention dropout", config.attention_dropout),
            ("ReLU dropout", config.activation_dropout),
        ]
        if value
    )
    logger.info(
        f"Model: {options.preset if init_dir is None else f'from {init_dir}'}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters, {dropouts}; training with {budget}, "
        f"{options.schedule} schedule (lr {options.learning_rate():g}, warmup {options.warmup_steps}{cooldown}), "
        f"batches of <= {options.max_tokens} tokens per side"
    )
    return model


def training_attention(device: torch.device) -> str:
    """eager on the CPU, where it matches sdpa in fp32 and is 1.5x faster in bf16 training (PyTorch's fused CPU
    attention backward in bf16 is slow for sentence-length sequences); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


# ---------------------------------------------------------------------------------------------------- 4. fit


def fit(
    options: TrainOptions,
    checked: CheckedOptions,
    prepared: PreparedData,
    plan: ModelPlan,
    model: VanillaTransformerForConditionalGeneration,
) -> VanillaSeq2SeqTrainer:
    """Train `model` inside the Trainer for the budget (unless the run is `finished`), scoring the dev set on the
    way; the checkpoints that averaging may pick are kept, and snapshots for the learning curve saved."""
    training_args = checked.training_args
    trainer = VanillaSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.valid_dataset,
        processing_class=prepared.tokenizer,
    )
    trainer.add_callback(ReleaseCorpusPagesCallback(prepared.train_dataset))
    if checked.torch_compile:
        trainer.add_callback(CompileReportCallback())
    if options.max_time is not None and options.evaluate:
        evaluation = evaluation_seconds(options.max_time, options.evaluation_time)
        logger.info(
            f"After training, the evaluation gets {evaluation:.0f} s (`evaluation_time`; the command ends by "
            f"{(options.max_time + evaluation) / 60:.1f} minutes after it started): the averaged model's test "
            "score first (cut to the test set's first sentences that fit), then the last checkpoint alone and the "
            "learning-curve snapshots while they fit; what does not is listed with the command that computes it"
        )
    if training_args.length_buckets:
        trainer.add_callback(CudaGraphStepCallback())
    trainer.add_callback(LoopRateCallback())
    if prepared.valid_dataset is not None:
        decoding = f"beam {options.eval_num_beams}" if options.eval_num_beams else "greedy"
        logger.info(
            f"Dev evaluation {parse_eval_every(training_args.eval_every).describe()}, {decoding}; its time counts in "
            "the wall-clock budget (`max_time`)"
        )
    if options.average != "last":  # keep what the mode may still pick; "last" keeps by save_total_limit
        span = AverageSpan.parse(options.average_span)

        def keep(infos: list[CheckpointInfo]) -> list[Path]:
            return [info.path for info in selectable_checkpoints(infos, options.average, options.average_last, span)]

        trainer.add_callback(CheckpointRetentionCallback(prepared.checkpoint_dir, keep))
    if options.curve_every is not None:
        curve_dir = Path(options.output_dir) / CURVE_DIR
        trainer.add_callback(LearningCurveCallback(trainer, curve_dir, options.curve_every))
    resume_from = prepared.resume_from
    if plan.finished:  # the Trainer would make one more update: it checks max_steps after each one
        logger.info(
            f"{resume_from.name} is at `max_steps={options.max_steps}` already: no training, the run is finished."
        )
        trainer.state = TrainerState.load_from_json(str(resume_from / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    return trainer


# ---------------------------------------------------------------------------------------------------- 5. finalize


def finalize(
    options: TrainOptions, prepared: PreparedData, trainer: VanillaSeq2SeqTrainer, started: float
) -> TrainResult:
    """Average the checkpoints into RUN/model, record the run (results.json), score the test set with the model
    folder as users load it (unless `evaluate` is off), and push it where `push_to_hub` says. `started`: when
    `train` began."""
    output_dir = Path(options.output_dir)
    model_dir = output_dir / MODEL_DIR
    to_average, averaging = _average(options, prepared.checkpoint_dir, model_dir)
    state = trainer.state
    logger.info(
        f"Trained {state.global_step} updates ({state.epoch:.2f} epochs); model folder {model_dir} = average "
        f"({options.average}) of {', '.join(path.name for path in to_average)}"
    )
    summary: dict[str, Any] = {
        "command": recorded_command(options),  # results.json is uploaded with the model: file names only
        "languages": [options.src_lang, options.tgt_lang],
        "data": prepared.data.name,
        "preset": options.preset if options.init_from is None else None,
        "init_from": None if options.init_from is None else Path(options.init_from).name,
        "updates": state.global_step,
        "epochs": state.epoch,
        "averaged_checkpoints": [path.name for path in to_average],
        "averaging": averaging,
        "train": {key: value for log in state.log_history for key, value in log.items() if "train_" in key},
    }
    dev_points = _dev_summary(options, state, model_dir, summary)
    test_pairs = prepared.data.test
    if test_pairs is not None and options.evaluate:
        clock = EvaluationClock.of_run(started, options.max_time, options.evaluation_time)
        _test_summary(options, test_pairs, prepared.data.name, to_average, dev_points, summary, clock)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    result = TrainResult(output_dir, summary)
    result.results_file.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if options.push_to_hub is not None:
        try:
            pushed = push(PushOptions(model_dir, options.push_to_hub, private=options.private))
        except OptionError as error:  # the model is saved: say how to upload it once the problem is solved
            raise OptionError(
                f"{error} The model folder {model_dir} is written; upload it with `hf-vanilla-transformer push "
                f"{model_dir} {options.push_to_hub}`."
            ) from None
        logger.info(f"Pushed {len(pushed.files)} files of {model_dir} to {pushed.url}")
    return result


def _average(options: TrainOptions, checkpoint_dir: Path, model_dir: Path) -> tuple[list[Path], dict[str, Any]]:
    """Average the checkpoints `average` picks into `model_dir`; the checkpoints and the record of the choice."""
    span = AverageSpan.parse(options.average_span)
    try:
        chosen = select_checkpoints(checkpoint_infos(checkpoint_dir), options.average, options.average_last, span)
    except ValueError as error:  # average "best" and no evaluation happened (a run finished before its first)
        raise OptionError(f"`average={options.average}`: {error} Use `average=last`.") from None
    to_average = [info.path for info in chosen]
    write_averaged_model(to_average, model_dir, claims=MODEL_RUN_ENTRIES)  # what finalize writes there after
    averaging = {
        "mode": options.average,
        "k": options.average_last,
        **({"span": str(span)} if options.average == "spread" else {}),
        "checkpoints": [
            {
                "name": info.path.name,
                "step": info.step,
                "minutes": round(info.seconds / 60, 2) if info.seconds is not None else None,
                "dev_bleu": info.bleu,
            }
            for info in chosen
        ],
    }
    return to_average, averaging


def _dev_summary(
    options: TrainOptions, state: TrainerState, model_dir: Path, summary: dict[str, Any]
) -> list[dict[str, Any]]:
    """The dev evaluations of the run into `summary` and its learning curve (with a dev set); their points."""
    output_dir = Path(options.output_dir)
    dev_points = write_dev_curve(output_dir, state.log_history, model_dir / CURVE_PNG, options.compare_curve)
    if dev_points:
        best = max(dev_points, key=lambda point: point["bleu"])
        summary["dev"] = {
            "evaluations": len(dev_points),
            "best": {"step": best["step"], "bleu": best["bleu"], "chrf": best["chrf"]},
            "best_checkpoint": Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None,
            "last": dev_points[-1],
        }
        summary["learning_curve"] = CURVE_PNG
        logger.info(
            f"Dev BLEU: best {best['bleu']:.2f} at update {best['step']}, last {dev_points[-1]['bleu']:.2f}; "
            f"learning curve {model_dir / CURVE_PNG}"
        )
    return dev_points


def _test_summary(
    options: TrainOptions,
    test_pairs: Dataset,
    data_name: str,
    to_average: list[Path],
    dev_points: list[dict[str, Any]],
    summary: dict[str, Any],
    clock: EvaluationClock,
) -> None:
    """Score the model folder on the test set into `summary` (and the last checkpoint alone, where several were
    averaged), with examples, attention maps, the snapshots' learning curve, and the model card; before `clock`'s
    deadline, in the order of evaluation_budget's rule, what is skipped listed with the command that computes it."""
    output_dir = Path(options.output_dir)
    model_dir = output_dir / MODEL_DIR
    sources, references = list(test_pairs["source"]), list(test_pairs["target"])
    sources, references = sources[: options.test_max_sentences], references[: options.test_max_sentences]
    skipped: list[Skipped] = []
    test, model, tokenizer = _evaluate_folder(model_dir, sources, references, options, clock, cut=True)
    summary["test"] = test
    if test["n"] < len(sources):  # the deadline cut it: the sentences the extras are scored on, too
        skipped.append(
            Skipped.note(
                f"the whole test set ({len(sources)} sentences; its first {test['n']} are scored)",
                _evaluate_command(model_dir, options, data_name, sentences=options.test_max_sentences),
            )
        )
        sources, references = sources[: test["n"]], references[: test["n"]]
    for index in range(min(options.examples, len(sources))):
        logger.info(f"\nSRC: {sources[index]}\nREF: {references[index]}\nHYP: {test['hypotheses'][index]}")
    if options.examples:
        logger.info("")
    skipped += _card_examples(options, model, tokenizer, sources[0], clock, summary)
    if len(to_average) > 1:  # what averaging (§6.1) brought: the last checkpoint alone, same decoding
        logger.info(f"Last checkpoint alone ({to_average[-1].name}):")
        last = _evaluate_folder(to_average[-1], sources, references, options, clock, cut=False)[0]
        if last is not None:
            summary["test_last_checkpoint"] = last
        else:
            command = _evaluate_command(to_average[-1], options, data_name, sentences=len(sources))
            skipped.append(Skipped.note(f"the last checkpoint alone ({to_average[-1].name})", command))
    if options.curve_every is not None and data_name == "multi30k" and not dev_points:  # else: the dev curve
        skipped += _snapshot_curve(options, clock, summary)
    if clock.deadline is not None:
        summary["skipped"] = [{"what": item.what, "command": public_command_line(item.command)} for item in skipped]
    # What the card is made of, kept so that `push` renders it again with the repository's id.
    summary["card"] = _card_inputs(output_dir, summary, options, data_name, example_text=sources[0])
    _write_model_card(model_dir, summary, options.push_to_hub)


def _card_examples(
    options: TrainOptions, model: Any, tokenizer: Any, sentence: str, clock: EvaluationClock, summary: dict[str, Any]
) -> list[Skipped]:
    """The card's examples while time is left: a sentence outside the training domain translated by the model (for
    its limitations, into `summary`) and the attention maps of the first test sentence, `sentence`. Past the
    deadline, neither (an untrained model writes both to its length limit): the commands that make them."""
    model_dir = Path(options.output_dir) / MODEL_DIR
    out_of_domain = OUT_OF_DOMAIN.get(options.src_lang)
    if clock.left() > 0:
        summary["out_of_domain"] = out_of_domain_translation(model, tokenizer, options.src_lang)
        plot_attention_maps(AttentionOptions(model_dir, sentence, out=model_dir / ATTENTION_DIR))
        return []
    summary["out_of_domain"] = None
    attention = ["attention", str(model_dir), sentence, "--out", str(model_dir / ATTENTION_DIR)]
    skipped = [Skipped.note("the card's attention maps", shlex.join(["hf-vanilla-transformer", *attention]))]
    if out_of_domain is not None:
        command = shlex.join(["hf-vanilla-transformer", "translate", str(model_dir), out_of_domain])
        skipped.append(Skipped.note("the card's out-of-domain example", command))
    return skipped


def _evaluate_folder(
    model_dir: Path,
    sources: list[str],
    references: list[str],
    options: TrainOptions,
    clock: EvaluationClock,
    cut: bool,
) -> tuple[dict[str, Any] | None, Any, Any]:
    """Load the saved folder the way users will and score it with its own (§6.1) decoding within `clock`'s deadline
    (`score_within`: `cut`, the first sentences that fit; else all or None); the scores, and the model and
    tokenizer loaded."""
    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    beams = {"num_beams": options.test_num_beams} if options.test_num_beams is not None else None
    score = prefix_scorer(model, tokenizer, sources, references, options.eval_batch_size, beams, options.progress)
    results = score_within(clock, score, len(sources), cut)
    if results is not None:
        logger.info(
            f"BLEU {results['bleu']:.2f} (sacreBLEU, cased, 13a), lowercased BLEU {results['bleu_lowercase']:.2f}, "
            f"chrF {results['chrf']:.2f} on {results['n']} sentences, decoded in {results['seconds']:.0f} s"
        )
    return results, model, tokenizer


def _evaluate_command(folder: Path, options: TrainOptions, data_name: str, sentences: int | None = None) -> str:
    """The `evaluate` command that scores `folder` on the run's test set (its first `sentences`, when cut) with the
    run's test decoding."""
    words = ["hf-vanilla-transformer", "evaluate", str(folder)]
    if options.test_src is not None:
        words += ["--src", str(options.test_src), "--ref", str(options.test_tgt)]
    elif data_name == "multi30k":
        words += ["--src-lang", options.src_lang, "--tgt-lang", options.tgt_lang]
    else:  # a dataset's test split: `evaluate` reads files
        words += ["--src", "TEST_SOURCES", "--ref", "TEST_REFERENCES"]
    if options.test_num_beams is not None:
        words += ["--num-beams", str(options.test_num_beams)]
    if sentences is not None:
        words += ["--max-sentences", str(sentences)]
    return shlex.join(words)


def _snapshot_curve(options: TrainOptions, clock: EvaluationClock, summary: dict[str, Any]) -> list[Skipped]:
    """The learning curve of the run's snapshots (Multi30k validation, greedy) into `summary`, with the snapshots
    that fit before the deadline; one line where the run saved none (it was shorter than `curve_every`). The
    snapshots skipped."""
    output_dir = Path(options.output_dir)
    try:
        snapshot_folders(output_dir / CURVE_DIR)
    except ValueError:
        logger.info(
            f"No learning curve: the run saved no snapshot (one every {options.curve_every / 60:g} minutes of "
            "training, `curve_every`)."
        )
        return []
    curve = learning_curve(
        CurveOptions(
            output_dir,
            options.src_lang,
            options.tgt_lang,
            batch_size=options.eval_batch_size,
            compare_curve=options.compare_curve,
            progress=options.progress,
            clock=clock,
        )
    )
    if curve.points:
        summary["learning_curve"] = curve.png.name
    if not curve.skipped:
        return []
    compare = ["--compare-curve", str(options.compare_curve)] if options.compare_curve is not None else []
    command = shlex.join(["hf-vanilla-transformer", "curve", str(output_dir), *compare])
    return [Skipped.note(f"the learning-curve snapshots {', '.join(curve.skipped)}", command)]


def _card_inputs(
    output_dir: Path, summary: dict[str, Any], options: TrainOptions, data_name: str, example_text: str | None
) -> dict[str, Any]:
    """The model card's inputs besides config.json and the test results (`write_model_card`'s keyword arguments,
    with `test_set` describing the test results), as JSON for results.json: `push` renders the card from them
    again with the repository's id."""
    test_set: dict[str, Any] = {"dataset": data_name}
    multi30k = data_name == "multi30k"
    if multi30k:
        test_set.update(
            dataset_name="Multi30k", dataset_config=f"{options.src_lang}-{options.tgt_lang}", split="test_2016"
        )
    notes = []
    if "test_last_checkpoint" in summary:
        last = summary["test_last_checkpoint"]
        notes.append(
            f"The weights are the average of {len(summary['averaged_checkpoints'])} checkpoints "
            f"({summary['averaging']['mode']}; §6.1 averages the last ones); the "
            f"last checkpoint alone scores BLEU {last['bleu']:.2f} (lowercased {last['bleu_lowercase']:.2f}) with "
            "the same decoding."
        )
    if options.test_max_sentences is not None or options.test_num_beams is not None:
        decoding = f"beam {options.test_num_beams}" if options.test_num_beams is not None else "its own decoding"
        notes.append(
            f"The scores above are of the test set's first {summary['test']['n']} sentences decoded with {decoding} "
            "(a trial run's cut, `--test-max-sentences` / `--test-num-beams`), not of the whole test set with the "
            "decoding below."
        )
    if summary.get("skipped"):
        notes.append(
            "Not evaluated within the run's time (`--max-time`, then `--evaluation-time` for the evaluation after "
            "training), each computed later by its command: "
            + "; ".join(f"{item['what']} (`{item['command']}`)" for item in summary["skipped"])
            + "."
        )
    if "learning_curve" in summary:
        notes.append(f"## Learning curve\n\n![validation BLEU against training minutes]({summary['learning_curve']})")
    training = {
        **_card_settings(options),
        "Budget": ", ".join(
            f"{name} {getattr(options, name):g}" for name in BUDGET if getattr(options, name) is not None
        )
        or None,
        "Updates": summary["updates"],
        "Epochs": round(summary["epochs"], 2),
        "Checkpoints averaged (§6.1)": ", ".join(summary["averaged_checkpoints"]),
    }
    return {
        "test_set": test_set,
        # The run folder's name: the model folder is always "model".
        "model_name": output_dir.resolve().name,
        "languages": [options.src_lang, options.tgt_lang],
        # Multi30k has a Hub id; other data (files, a datasets folder) is described, not listed as a Hub id.
        "datasets": ["multi30k"] if multi30k else [],
        "command": summary["command"],
        "extra": "\n\n".join(notes) or None,
        "license": options.license,
        "license_name": options.license_name,
        "example_text": None if multi30k else example_text,
        "training": training,
        "data_note": None if multi30k else f"`{data_name}`: the user's own parallel data, not on the Hub.",
    }


def _card_settings(options: TrainOptions) -> dict[str, Any]:
    """The card's rows of the options (their `card` role is the row's label), as the run resolved them: the
    learning rate of the schedule, folders by their names (the card is uploaded), the BPE's size only where the run
    trained one, and what an `init_from` folder replaces left out."""
    values = {item.name: getattr(options, item.name) for item in options_of(TrainOptions)}
    values["lr"] = options.learning_rate()
    if options.init_from is not None or options.tokenizer is not None:
        values["vocab_size"] = None
    if options.init_from is not None:  # (`tokenizer` is refused with it)
        values.update(dict.fromkeys(INIT_FROM_REPLACES))
    values.update((name, Path(values[name]).name) for name in ("init_from", "tokenizer") if values[name] is not None)
    return {item.metadata["card"]: values[item.name] for item in options_of(TrainOptions) if item.metadata.get("card")}


def _write_model_card(model_dir: Path, summary: dict[str, Any], repo_id: str | None) -> None:
    """README.md from the summary's card inputs; `repo_id` (`push_to_hub`): the examples load that repository, so
    that the folder's card is the one uploaded."""
    try:  # here, not at the top: the card is a by-product, and a missing extra must not cost the trained model
        from model_card import card_from_results, save_card
    except ImportError as error:
        logger.info(f"Model card not written ({error}); install the package with its model_card module.")
        return
    save_card(card_from_results(model_dir, summary, repo_id=repo_id), model_dir / "README.md")


__all__ = [
    "CheckedOptions",
    "ModelPlan",
    "PreparedData",
    "build_model",
    "check_options",
    "finalize",
    "fit",
    "plan_model",
    "prepare_data",
    "train",
    "trainer_argument_names",
    "training_attention",
]
