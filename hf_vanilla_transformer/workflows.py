"""The library's workflows: train, evaluate, translate, average checkpoints, learning curves and attention maps.

Each takes one typed options dataclass and returns a typed result; `hf-vanilla-transformer COMMAND` (cli.py) maps
its command-line options onto these and prints. A problem with the options raises `WorkflowError` (a `ValueError`)
naming the option, its value and the fix, before any long work where it can be checked up front.

`train` is the main job: data (Multi30k by default, or parallel files, or a datasets folder), a joint BPE (§5.1),
the model of a `Recipe` (recipes.py) trained inside `Seq2SeqTrainer` (training.py) for its budget, the last
checkpoints averaged (§6.1), the test set scored with the paper's decoding, attention maps, a learning curve, a
model card, and `results.json`. The run folder (`--output-dir RUN`) keeps what training needs (RUN/checkpoints,
RUN/curve, run_settings.json, learning_curve.json); the model goes to RUN/model, which holds exactly the files of
its Hub repository (`push` uploads it) and which `pipeline("translation", model=...)` loads.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .training.data import DEFAULT_MAX_LENGTH, DEFAULT_TOKENIZER_SAMPLE
from .training.recipes import DEFAULT_RECIPE, Recipe

if TYPE_CHECKING:  # torch and transformers load with the workflow that needs them
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from .inference.evaluation import Hypothesis
    from .model.configuration_vanilla_transformer import VanillaTransformerConfig
    from .training.trainer import VanillaSeq2SeqTrainingArguments

DEFAULT_OUTPUT_DIR = "outputs/multi30k-en-de"
CHECKPOINTS = "checkpoints"
# The model folder inside a run folder: the Hub repository's files and nothing else.
MODEL_DIR = "model"
RESULTS_FILE = "results.json"
ATTENTION_DIR = "attention"
# The budget options: a recipe's budget applies as a whole unless one of them is given.
BUDGET = ("max_time", "max_steps", "epochs")
# Where `translate` decodes: "auto" is the GPU when torch sees one, else the CPU.
DEVICES = ("auto", "cpu", "cuda")
# The options that `--init-from`'s folder replaces (its config and tokenizer).
INIT_FROM_REPLACES = ("preset", "vocab_size", "tokenizer")
# The `VanillaSeq2SeqTrainingArguments` fields that `train` sets from its own options (named here as on the command
# line): `trainer_args` may set any other field, but not these, which would contradict the option.
TRAINER_ARGUMENTS_OF_OPTIONS = {
    "output_dir": "--output-dir",
    "lr_schedule": "--schedule",
    "learning_rate": "--lr",
    "warmup_steps": "--warmup-steps",
    "label_smoothing_factor": "--label-smoothing",
    "decoder_start_embedding": "--decoder-start-embedding",
    "max_tokens": "--max-tokens",
    "gradient_accumulation_steps": "--grad-accum",
    "num_train_epochs": "--epochs",
    "max_steps": "--max-steps",
    "max_time": "--max-time",
    "save_every": "--save-every",
    "bf16": "--bf16",
    "seed": "--seed",
    "logging_steps": "--logging-steps",
    "disable_tqdm": "--no-progress",
    "resume_from_checkpoint": "--resume",
    "push_to_hub": "--push-to-hub",
    "hub_model_id": "--push-to-hub",
    # Validation during training, and the checkpoints that averaging and --keep-best need kept.
    "report_to": "--report-to",
    "eval_every": "--eval-every",
    "generation_num_beams": "--eval-num-beams",
    "per_device_eval_batch_size": "--eval-batch-size",
    "metric_for_best_model": "--keep-best",
    "early_stopping_patience": "--early-stopping-patience",
    "save_total_limit": "--average-last",
}
# What the resolved configuration (RUN/run_config.json) leaves out: the record of the command line and what concerns
# the run folder rather than the run.
NOT_IN_RUN_CONFIG = ("command", "resume", "overwrite", "trainer_args")
RUN_CONFIG_FILE = "run_config.json"
TRAINER_ARGUMENTS_FILE = "trainer_arguments.json"


class WorkflowError(ValueError):
    """A problem with a workflow's options (a missing file, contradicting options, an unwritable folder)."""


def writable_folder(path: str | os.PathLike, option: str) -> Path:
    """Create `path` if needed and check that files can be written in it; `option` names it in the error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"  # one per process: torchrun's processes all check the folder
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise WorkflowError(
            f"`{option}` {path} is not a writable folder ({error.strerror or error}). Choose a folder you can "
            "write to."
        ) from None
    return path


def writable_file(path: str | os.PathLike, option: str, kind: str, example: str) -> Path:
    """`path` as a Path after checking that it is no folder and that its folder (created if needed) is writable;
    `option` names it in the error, `kind` says what it holds ("JSON"), `example` is a file name to suggest."""
    path = Path(path)
    if path.is_dir():
        raise WorkflowError(
            f"`{option}` {path} is a folder; it names the {kind} file to write. Pass a file name, e.g. "
            f"{path / example}."
        )
    writable_folder(path.parent, option)
    return path


def existing_file(path: str | os.PathLike | None, option: str) -> Path | None:
    """`path` as a Path (None stays None) after checking that it is a file; `option` names it in the error."""
    if path is not None and not Path(path).is_file():
        raise WorkflowError(f"`{option}` {path} does not exist or is not a file. Check the path.")
    return Path(path) if path is not None else None


def model_folder(
    path: str | os.PathLike,
    trust_remote_code: bool | None = False,
    *,
    name: str = "`model_dir`",
    tokenizer: bool = True,
) -> Path:
    """`path` as a Path after the checks every command that loads a model folder makes first, so that a wrong folder
    is one clear error (naming it as `name`) rather than a traceback from transformers: config.json is there and is
    a JSON object; the model is this package's (whose code is installed), with its tokenizer.json when `tokenizer`;
    or, only with `trust_remote_code`, one whose config's auto_map names code in the folder, which would run.
    `trust_remote_code` None: the command takes only this package's folders (average, curve), so no flag helps."""
    from .model.configuration_vanilla_transformer import VanillaTransformerConfig

    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise WorkflowError(
            f"{name} {path} is not a saved model folder (no config.json). Pass the --output-dir of `train` or a "
            "folder written by save_pretrained."
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise WorkflowError(
            f"{config_file} is not valid JSON ({error}): the folder is damaged. Save or download the model again."
        ) from None
    if not isinstance(config, dict):
        raise WorkflowError(f"{config_file} is not a JSON object: the folder is damaged. Save or download it again.")
    ours = VanillaTransformerConfig.model_type
    model_type = config.get("model_type")
    if model_type == ours:
        if tokenizer and not (folder / "tokenizer.json").is_file():
            raise WorkflowError(
                f"{name} {path} has no tokenizer (no tokenizer.json). Save the tokenizer into the folder "
                "(tokenizer.save_pretrained), or copy tokenizer.json and tokenizer_config.json from the run that "
                "trained the model."
            )
    elif "auto_map" in config and trust_remote_code is not None:
        if not trust_remote_code:
            raise WorkflowError(
                f"{name} {path} holds a model of type {model_type!r} whose code comes with the folder (auto_map in "
                "config.json); loading it would run that code. Pass --trust-remote-code if you trust the folder."
            )
    else:
        raise WorkflowError(
            f"{name} {path} holds a model of type {model_type!r}, not {ours!r}. Pass a folder written by `train` "
            "or by `python -m conversion` (which converts Marian and other formats)."
        )
    return folder


def trained_languages(model_dir: Path, src_lang: str | None = None, tgt_lang: str | None = None) -> tuple[str, str]:
    """(`src_lang`, `tgt_lang`); where one is None, the language a folder written by `train` records in
    results.json, else en / de. A damaged results.json is named (when it is needed at all)."""
    results_file = model_dir / RESULTS_FILE
    if (src_lang is not None and tgt_lang is not None) or not results_file.is_file():
        return src_lang or "en", tgt_lang or "de"
    try:
        trained_src, trained_tgt = json.loads(results_file.read_text(encoding="utf-8")).get("languages", ["en", "de"])
    except (ValueError, AttributeError, TypeError) as error:  # not JSON, not an object, not a pair of languages
        raise WorkflowError(
            f"{results_file} is damaged ({error}); it should hold the run's results as JSON. Pass --src-lang and "
            "--tgt-lang, or delete the file."
        ) from None
    return src_lang or trained_src, tgt_lang or trained_tgt


def check_precisions(bf16: bool, int8: bool, bf16_weights: bool) -> None:
    """At most one of bf16 autocast, int8 products and bf16 weights: int8 products take float32 activations, which
    autocast or bf16 weights would hand them in bf16, and autocast over bf16 weights is bf16 weights."""
    precisions = [name for name, on in (("--bf16", bf16), ("--int8", int8), ("--bf16-weights", bf16_weights)) if on]
    if len(precisions) > 1:
        raise WorkflowError(f"`{'` and `'.join(precisions)}` are precisions for the same products; pass one of them.")


def load_model(
    model_dir: str | os.PathLike,
    trust_remote_code: bool = False,
    device: str = "auto",
    int8: bool = False,
    bf16_weights: bool = False,
    **kwargs: Any,
) -> Any:
    """A saved model for decoding on `device` (one of DEVICES): "auto" is the GPU when there is one (evaluation is
    mostly beam search). Code that comes with the folder runs only with `trust_remote_code` (transformers would
    otherwise ask on the terminal). `int8`: on the CPU with int8 linear layers (quantization.quantize_int8);
    `bf16_weights`: the weights cast to bf16. On the CPU the attention is eager unless `attn_implementation` is
    passed (`decoding_attention`)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    if device not in DEVICES:
        raise WorkflowError(f"`--device` must be one of {', '.join(DEVICES)}, got {device!r}.")
    on_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    kwargs.setdefault("attn_implementation", decoding_attention(torch.device("cuda" if on_gpu else "cpu")))
    if device == "cuda" and not torch.cuda.is_available():
        raise WorkflowError("`--device cuda`: torch sees no CUDA GPU here. Pass --device cpu (or auto).")
    check_precisions(False, int8, bf16_weights)
    if int8:  # before loading: no int8 kernels in this torch is an error naming the fix
        from .inference.quantization import int8_engine, quantize_int8

        if device == "cuda":
            raise WorkflowError("`--int8` runs on the CPU (int8 CPU kernels); drop --int8 or pass --device cpu.")
        try:
            int8_engine()
        except RuntimeError as error:
            raise WorkflowError(f"`--int8`: {error}") from None
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=trust_remote_code, **kwargs)
    if int8:
        return quantize_int8(model)
    if bf16_weights:
        model = model.to(torch.bfloat16)
    return model.to("cuda") if on_gpu else model


def decoding_attention(device: torch.device) -> str:
    """eager on the CPU, where PyTorch's fused attention is slow for a decoding step's single query in bf16 (the
    1-hour Multi30k model's test set, the paper's decoding: 1.43x faster with bf16 weights; float32 the same
    translations, within the run-to-run noise; docs/translation.md); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


def load_tokenizer(model_dir: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved in `model_dir`; code that comes with the folder runs only with `trust_remote_code`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def _generation_kwargs(num_beams: int | None) -> dict[str, Any] | None:
    return {"num_beams": num_beams} if num_beams is not None else None


# ---------------------------------------------------------------------------------------------------- train


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
    `lr`: None is 1.0 (the paper's eq. (3)) for schedule "paper" and the main job's peak for "inverse_sqrt".
    `compare_curve`: a JSON file of curves plotted beside the learning curve (see learning_curve.py).
    `command`: the command line that started the run, recorded in results.json and the model card.
    `license`: the Hub license id of the model card; None: the training data's own terms (Multi30k's), else none.
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
    refuses them given explicitly, `train` refuses `tokenizer`), `dropout` overrides the folder's P_drop.
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
    vocab_size: int = DEFAULT_RECIPE.vocab_size
    tokenizer: str | os.PathLike | None = None
    schedule: str = DEFAULT_RECIPE.schedule
    lr: float | None = None
    warmup_steps: int = DEFAULT_RECIPE.warmup_steps
    label_smoothing: float = DEFAULT_RECIPE.label_smoothing
    max_tokens: int = DEFAULT_RECIPE.max_tokens
    grad_accum: int = 1
    seed: int = 1
    bf16: str = DEFAULT_RECIPE.bf16
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
    examples: int = 5
    logging_steps: int = 50
    progress: bool = True
    command: str | None = None
    license: str | None = None
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
            raise WorkflowError(
                f"Unknown training options {unknown}. Pick from the TrainOptions fields: {sorted(names)}."
            )
        if options.get("init_from") is not None:
            given = [f"--{name.replace('_', '-')}" for name in INIT_FROM_REPLACES if options.get(name) is not None]
            if given:
                raise WorkflowError(
                    f"`--init-from` {options['init_from']} brings its own config and tokenizer, so {', '.join(given)} "
                    "cannot apply; drop them (`--dropout` still overrides the folder's P_drop)."
                )
        elif recipe.fine_tuning:
            raise WorkflowError(
                f"`--recipe {recipe.name}` fine-tunes an existing model: pass `--init-from MODEL_DIR` (a folder "
                "written by `train` or by `python -m conversion`), or pick another recipe to train from scratch."
            )
        settings = {name: getattr(recipe, name) for name in names & {item.name for item in fields(Recipe)}}
        if any(options.get(name) is not None for name in BUDGET):
            settings.update(dict.fromkeys(BUDGET))
        if options.get("schedule", recipe.schedule) != recipe.schedule:
            settings["lr"] = None
        return cls(**{**settings, **options})

    def learning_rate(self) -> float:
        """`lr`, or its default for the schedule: 1.0 (eq. (3) as is) for "paper", the main job's peak otherwise."""
        if self.lr is not None:
            return self.lr
        return 1.0 if self.schedule == "paper" else DEFAULT_RECIPE.lr


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


@dataclass(frozen=True)
class TrainingData:
    """The data of a run, each with `source` / `target` columns: `train`, the validation (dev) set scored during
    training (`valid`, None without one), the test set scored at the end (`test`), and a `name` for logs and cards."""

    train: Dataset
    valid: Dataset | None
    test: Dataset | None
    name: str


def _load_training_data(options: TrainOptions) -> TrainingData:
    """The run's data from the options, checked before any work."""
    from .training.data import check_language_pair, load_dataset_pairs, load_multi30k, load_parallel_files

    for kind in ("train", "valid", "test"):
        if (getattr(options, f"{kind}_src") is None) != (getattr(options, f"{kind}_tgt") is None):
            raise WorkflowError(f"`--{kind}-src` and `--{kind}-tgt` go together; pass both files or neither.")
    if options.dataset is not None and options.train_src is not None:
        raise WorkflowError("Pass either `--dataset` or `--train-src/--train-tgt`, not both.")
    dataset_options = ("dataset_config", "src_column", "tgt_column", "train_split", "valid_split", "test_split")
    for name in dataset_options:
        if options.dataset is None and getattr(options, name) is not None:
            raise WorkflowError(
                f"`--{name.replace('_', '-')} {getattr(options, name)}` applies to `--dataset`, which is not given. "
                "Pass --dataset, or drop the option."
            )
    for kind in ("valid", "test"):
        if getattr(options, f"{kind}_split") is not None and getattr(options, f"{kind}_src") is not None:
            raise WorkflowError(
                f"`--{kind}-split` and `--{kind}-src/--{kind}-tgt` both give the {kind} set; pass one of them."
            )
    for name in ("train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt"):
        existing_file(getattr(options, name), f"--{name.replace('_', '-')}")
    valid = test = None
    if options.valid_src is not None:
        valid = load_parallel_files(options.valid_src, options.valid_tgt)
    if options.test_src is not None:
        test = load_parallel_files(options.test_src, options.test_tgt)
    if options.train_src is not None:
        train, name = load_parallel_files(options.train_src, options.train_tgt), Path(options.train_src).stem
    elif options.dataset is not None:
        # The dataset's validation and test splits serve unless files replace them; the default names are optional.
        splits = {"train": options.train_split or "train"}
        if valid is None:
            splits["valid"] = options.valid_split or "validation"
        if test is None:
            splits["test"] = options.test_split or "test"
        optional = tuple(kind for kind in ("valid", "test") if getattr(options, f"{kind}_split") is None)
        pairs = load_dataset_pairs(
            options.dataset,
            options.src_lang,
            options.tgt_lang,
            splits,
            optional=optional,
            config=options.dataset_config,
            src_column=options.src_column,
            tgt_column=options.tgt_column,
            progress=options.progress,
        )
        train, valid, test = pairs["train"], pairs.get("valid", valid), pairs.get("test", test)
        name = Path(options.dataset).name if Path(options.dataset).exists() else str(options.dataset)
        if options.dataset_config is not None:
            name = f"{name} ({options.dataset_config})"
    else:
        check_language_pair(options.src_lang, options.tgt_lang)
        multi30k = load_multi30k(options.src_lang, options.tgt_lang, splits=("train", "test"))
        train, name = multi30k["train"], "multi30k"
        test = multi30k["test"] if test is None else test
    if options.max_train_pairs is not None:
        train = train.select(range(min(options.max_train_pairs, len(train))))
    return TrainingData(train, valid, test, name)


def _check_training_pairs(train_pairs: Dataset, data_name: str, options: TrainOptions) -> None:
    """Refuse training data without a single pair that has text on both sides (tokenize_pairs drops the others).
    Streams the pairs in batches, stopping at the first good one: the corpus is never held whole."""
    batches = train_pairs.select_columns(["source", "target"]).iter(batch_size=10_000)
    if not any(
        source.strip() and target.strip()
        for batch in batches
        for source, target in zip(batch["source"], batch["target"], strict=True)
    ):
        where = (
            f"`--train-src` {options.train_src} / `--train-tgt` {options.train_tgt}"
            if options.train_src is not None
            else f"the training data ({data_name})"
        )
        raise WorkflowError(
            f"{where}: none of the {len(train_pairs):,} pairs has text on both sides (all blank on a side). Check "
            "that the files are the right ones and line-aligned."
        )


def _check_output_dir(options: TrainOptions) -> tuple[Path, Path | None]:
    """(checkpoint folder, checkpoint to resume from) after checking what `--output-dir` holds. Reads only: the
    folder is created, and old checkpoints removed, once every option has been checked (`_clear_for_run`)."""
    from .training.averaging import last_checkpoints

    output_dir = Path(options.output_dir)
    # The folder and the one around it: the run's lock and the model folder's next version are written beside it.
    for folder in (output_dir, output_dir.parent):
        nearest = next(path for path in (folder, *folder.parents) if path.exists())
        if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
            problem = "not a folder" if not nearest.is_dir() else "not writable"
            raise WorkflowError(
                f"`--output-dir` {output_dir} is not a writable folder ({nearest} is {problem}). Choose a folder "
                "you can write to."
            )
    checkpoint_dir = output_dir / CHECKPOINTS
    existing = sorted(checkpoint_dir.glob("checkpoint-*")) if checkpoint_dir.is_dir() else []
    if options.resume and options.overwrite:
        raise WorkflowError("`--resume` and `--overwrite` contradict each other; pass one.")
    if options.resume:
        if not existing:
            raise WorkflowError(f"`--resume` found no checkpoint in {checkpoint_dir}. Drop --resume to start afresh.")
        try:
            return checkpoint_dir, last_checkpoints(checkpoint_dir, 1, complete_only=True)[0]
        except ValueError:
            raise WorkflowError(
                f"`--resume` found no complete checkpoint in {checkpoint_dir} (none has a readable trainer_state.json,"
                " which the Trainer writes last). Pass --overwrite instead to start afresh."
            ) from None
    if existing and not options.overwrite:
        raise WorkflowError(
            f"`--output-dir` {output_dir} already holds checkpoints of an earlier run ({len(existing)} in "
            f"{checkpoint_dir}). Pass --resume to continue it, --overwrite to start afresh, or another --output-dir."
        )
    return checkpoint_dir, None


def _clear_for_run(output_dir: Path, checkpoint_dir: Path, resume_from: Path | None) -> None:
    """What a run removes before it starts (the main process, holding the lock): with --resume the checkpoints
    after `resume_from`, whose save was interrupted; else an earlier run's checkpoints (--overwrite) and
    learning-curve snapshots, which would join this run's curve."""
    from .training.averaging import checkpoint_step
    from .training.learning_curve import CURVE_DIR

    if resume_from is None:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        shutil.rmtree(output_dir / CURVE_DIR, ignore_errors=True)  # the old run's learning-curve snapshots
        return
    # A kill during a save leaves checkpoint-N without trainer_state.json (the Trainer writes checkpoints in
    # place, that file last); the resumed run writes checkpoint-N again.
    for path in sorted(checkpoint_dir.glob("checkpoint-*")):
        step = checkpoint_step(path)
        if step is not None and step > checkpoint_step(resume_from):
            print(f"Removing incomplete {path.name} (its save was interrupted); resuming from {resume_from.name}.")
            shutil.rmtree(path)


def _trained_steps(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]


def _run_settings(options: TrainOptions, train_pairs: Dataset, tokenizer: str, dropout: float, bf16: bool) -> dict:
    """The settings that define a run (`run_folder.SETTINGS_FILE`), by command-line option: `--resume` must find
    them unchanged. The budget (--max-time, --max-steps, --epochs), checkpointing, evaluation and attention
    kernels are not among them: a resume may extend or cut the budget."""
    from .training.run_folder import data_fingerprint

    return {
        "--src-lang": options.src_lang,
        "--tgt-lang": options.tgt_lang,
        "training data": data_fingerprint(train_pairs),
        "--max-length": options.max_length,
        "--max-length-ratio": options.max_length_ratio,
        "--tokenizer": tokenizer,
        "--preset": options.preset,
        "--dropout": dropout,
        "--schedule": options.schedule,
        "--lr": options.learning_rate(),
        "--warmup-steps": options.warmup_steps,
        "--label-smoothing": options.label_smoothing,
        "--max-tokens": options.max_tokens,
        "--grad-accum": options.grad_accum,
        "--seed": options.seed,
        "--bf16": "bf16" if bf16 else "fp32",
        "processes": int(os.environ.get("WORLD_SIZE", "1")),
    }


def _check_eval_options(options: TrainOptions) -> list[str]:
    """Check the options of validation during training and averaging up front; the integrations for `report_to`."""
    from transformers.integrations import is_tensorboard_available, is_wandb_available

    from .training.averaging import AVERAGE_MODES, AverageSpan
    from .training.trainer import parse_eval_every

    if options.average not in AVERAGE_MODES:
        raise WorkflowError(f"`--average {options.average}` is not one of {', '.join(AVERAGE_MODES)}. Pick one.")
    checks = (
        ("--average-span", options.average_span, AverageSpan.parse),
        ("--eval-every", options.eval_every, parse_eval_every),
    )
    for option, value, check in checks:
        try:
            check(value)
        except ValueError as error:
            raise WorkflowError(f"`{option} {value}`: {error}") from None
    report_to = [name.strip() for name in options.report_to.split(",") if name.strip() and name.strip() != "none"]
    installed = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available}
    for name in report_to:
        if name in installed and not installed[name]():
            raise WorkflowError(f"`--report-to {name}`: {name} is not installed. Run `pip install {name}`.")
    return report_to


def _check_dev_set(options: TrainOptions, has_dev_set: bool) -> None:
    """The options that need a validation set are refused without one, naming how to give it."""
    needs = [
        option
        for option, given in (
            ("--average best", options.average == "best"),
            ("--keep-best", options.keep_best),
            (f"--early-stopping-patience {options.early_stopping_patience}", options.early_stopping_patience),
            (f"--eval-every {options.eval_every}", options.eval_every is not None),
            (f"--eval-num-beams {options.eval_num_beams}", options.eval_num_beams is not None),
        )
        if given
    ]
    if needs and not has_dev_set:
        raise WorkflowError(
            f"`{needs[0]}` needs a validation set, which this run has none of. Pass --valid-src/--valid-tgt (or a "
            "dataset with a validation split)."
        )


def _dev_dataset(pairs: Dataset, tokenizer: PreTrainedTokenizerBase, options: TrainOptions) -> Dataset:
    """The first `eval_max_sentences` dev pairs, tokenized (pairs over --max-length dropped: the model has no
    positions for them), longest first so that generation batches carry little padding and a batch too large for
    memory fails at the first evaluation."""
    from .training.data import pair_lengths, tokenize_pairs

    pairs = pairs.select(range(min(options.eval_max_sentences, len(pairs))))
    dataset = tokenize_pairs(pairs, tokenizer, max_length=options.max_length)
    lengths, _ = pair_lengths(dataset)  # the length column tokenize_pairs wrote, not the token lists
    dataset = dataset.select(sorted(range(len(dataset)), key=lambda index: -lengths[index]))
    dropped = len(pairs) - len(dataset)
    print(
        f"Dev set: {len(dataset):,} pairs scored during training"
        + (f" ({dropped} empty or over --max-length {options.max_length} left out)" if dropped else ""),
        flush=True,
    )
    return dataset


def training_attention(device: torch.device) -> str:
    """eager on the CPU, where it matches sdpa in fp32 and is 1.5x faster in bf16 training (PyTorch's fused CPU
    attention backward in bf16 is slow for sentence-length sequences); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


def _init_folder(options: TrainOptions) -> Path:
    """The model folder `--init-from` names (a run folder stands for its RUN/model), after the checks that make a
    wrong folder one line before any data is read: this package's model type, a tokenizer beside it, no
    `--tokenizer`, and a decoder start token that `--decoder-start-embedding zero` can keep at zero."""
    folder = Path(options.init_from)
    if not (folder / "config.json").is_file() and (folder / MODEL_DIR / "config.json").is_file():
        folder = folder / MODEL_DIR  # `train`'s run folder: its model folder
    model_folder(folder, None, name="`--init-from`", tokenizer=False)
    if options.tokenizer is not None:
        raise WorkflowError(
            f"`--tokenizer` {options.tokenizer} cannot apply with `--init-from` {options.init_from}, whose model was "
            "trained with its own tokenizer; drop --tokenizer."
        )
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        raise WorkflowError(
            f"`--init-from` {options.init_from} has no tokenizer (no tokenizer.json or tokenizer_config.json). Save "
            "the model's tokenizer into the folder (tokenizer.save_pretrained)."
        )
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    start, pad = config.get("decoder_start_token_id"), config.get("pad_token_id")
    if options.decoder_start_embedding == "zero" and start != pad:
        raise WorkflowError(
            f"`--init-from` {options.init_from} starts the decoder from token {start}, not <pad> ({pad}), so "
            "`--decoder-start-embedding zero` cannot keep its row at zero (it is a label's row). Pass "
            "--decoder-start-embedding train."
        )
    return folder


def _init_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The tokenizer of an `--init-from` folder, checked against the model's vocabulary."""
    from .model.configuration_vanilla_transformer import VanillaTransformerConfig

    try:
        tokenizer = load_tokenizer(folder)
    except (OSError, ValueError, TypeError) as error:
        raise WorkflowError(
            f"`--init-from` {folder}: its tokenizer does not load ({error}). Save it again with save_pretrained."
        ) from None
    vocab_size = VanillaTransformerConfig.from_pretrained(folder).vocab_size
    if len(tokenizer) > vocab_size:
        raise WorkflowError(
            f"`--init-from` {folder}: its tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size "
            f"{vocab_size}. The folder mixes a model and another model's tokenizer; rebuild it."
        )
    return tokenizer


def _weights_fingerprint(folder: Path) -> str:
    """A SHA-256 over the folder's weight files, so that a resume checks it starts from the same weights."""
    digest = hashlib.sha256()
    for path in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
    return f"weights sha256 {digest.hexdigest()[:16]}"


def trainer_argument_names() -> list[str]:
    """The fields of `VanillaSeq2SeqTrainingArguments` (Seq2SeqTrainingArguments' and ours) that can be set."""
    from .training.trainer import VanillaSeq2SeqTrainingArguments

    return [item.name for item in fields(VanillaSeq2SeqTrainingArguments) if item.init]


def close_matches(name: str, names: Sequence[str]) -> str:
    """A parenthesis naming the closest of `names` for an error message ("did you mean ...?"), or "" if none."""
    matches = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(matches)}?)" if matches else ""


def _trainer_overrides(trainer_args: Mapping[str, Any]) -> dict[str, Any]:
    """`trainer_args` after checking each is a field of the Trainer arguments that no option of `train` sets."""
    names = trainer_argument_names()
    for name in trainer_args:
        if name in TRAINER_ARGUMENTS_OF_OPTIONS:
            option = TRAINER_ARGUMENTS_OF_OPTIONS[name]
            raise WorkflowError(
                f"Trainer argument `{name}` is what `{option}` sets; pass {option} instead (in a --config file: the "
                "option's TrainOptions name, e.g. lr, warmup_steps)."
            )
        if name not in names:
            raise WorkflowError(
                f"Unknown Trainer argument `{name}`{close_matches(name, names)}: the fields of "
                "Seq2SeqTrainingArguments and VanillaSeq2SeqTrainingArguments can be set."
            )
    return dict(trainer_args)


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


def _write_run_config(output_dir: Path, options: TrainOptions, training_args: VanillaSeq2SeqTrainingArguments) -> None:
    """RUN/run_config.json (`train --config RUN/run_config.json` repeats the run) and, for reading, every Trainer
    argument the run uses (RUN/trainer_arguments.json)."""
    (output_dir / RUN_CONFIG_FILE).write_text(
        json.dumps(run_config(options), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (output_dir / TRAINER_ARGUMENTS_FILE).write_text(training_args.to_json_string() + "\n", encoding="utf-8")


def _evaluate_folder(
    model_dir: Path, sources: list[str], references: list[str], options: TrainOptions
) -> tuple[dict, Any, Any]:
    """Load the saved folder the way users will and score it with its own (§6.1) decoding; the scores, and the model
    and tokenizer loaded."""
    from .inference.evaluation import evaluate_translations

    model = load_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    results = evaluate_translations(
        model, tokenizer, sources, references, batch_size=options.eval_batch_size, progress=options.progress
    )
    print(
        f"BLEU {results['bleu']:.2f} (sacreBLEU, cased, 13a), lowercased BLEU {results['bleu_lowercase']:.2f}, "
        f"chrF {results['chrf']:.2f} on {results['n']} sentences, decoded in {results['seconds']:.0f} s",
        flush=True,
    )
    return results, model, tokenizer


def _print_examples(pairs: Dataset, hypotheses: list[str], count: int) -> None:
    for index in range(min(count, len(hypotheses))):
        print(f"\nSRC: {pairs[index]['source']}\nREF: {pairs[index]['target']}\nHYP: {hypotheses[index]}")
    if count:
        print(flush=True)


def _card_inputs(
    output_dir: Path, summary: dict, options: TrainOptions, data_name: str, example_text: str | None
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
    if "learning_curve" in summary:
        notes.append(f"## Learning curve\n\n![validation BLEU against training minutes]({summary['learning_curve']})")
    budget = {"max_time": options.max_time, "max_steps": options.max_steps, "epochs": options.epochs}
    training = {
        "Preset": options.preset if options.init_from is None else None,
        "Fine-tuned from": None if options.init_from is None else os.fspath(options.init_from),
        "Joint BPE vocabulary (§5.1)": options.vocab_size
        if options.tokenizer is None and not options.init_from
        else None,
        "Tokenizer": str(options.tokenizer) if options.tokenizer is not None else None,
        "Maximum sentence length (tokens)": options.max_length,
        "Dropout P_drop": options.dropout,
        "Learning-rate schedule": options.schedule,
        "Learning rate": options.learning_rate(),
        "Warmup steps": options.warmup_steps,
        "Label smoothing ε_ls": options.label_smoothing,
        "Tokens per batch and side": options.max_tokens,
        "Gradient accumulation": options.grad_accum,
        "bf16": options.bf16,
        "Seed": options.seed,
        "Budget": ", ".join(f"{name} {value:g}" for name, value in budget.items() if value is not None) or None,
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
        "example_text": None if multi30k else example_text,
        "training": training,
        "data_note": None if multi30k else f"`{data_name}`: the user's own parallel data, not on the Hub.",
    }


def _write_model_card(model_dir: Path, summary: dict, repo_id: str | None) -> None:
    """README.md from the summary's card inputs; `repo_id` (--push-to-hub): the examples load that repository, so
    that the folder's card is the one uploaded."""
    try:
        from model_card import card_from_results
    except ImportError as error:  # the card is a by-product: a missing extra must not cost the trained model
        print(f"Model card not written ({error}); install the package with its model_card module.", flush=True)
        return
    card_from_results(model_dir, summary, repo_id=repo_id).save(model_dir / "README.md")


def train(options: TrainOptions) -> TrainResult | None:
    """Train, average, evaluate and write the model folder (see the module docstring); progress is printed.

    Returns None on the processes other than the main one of a distributed run (torchrun, accelerate launch),
    where the main process alone writes the results."""
    import torch

    from . import VanillaTransformerConfig
    from .training.data import prepare_pairs, tokenizer_sample
    from .training.learning_curve import load_comparison_curves
    from .training.run_folder import (
        SETTINGS_FILE,
        check_same_run,
        exclusive_run,
        refuse_if_in_use,
        tokenizer_fingerprint,
        write_settings,
    )
    from .training.tokenization import BYTE_TOKENS, SPECIAL_TOKENS, special_token_ids, train_bpe_tokenizer
    from .training.trainer import EVAL_AT_SAVES, VanillaSeq2SeqTrainingArguments, resolve_bf16

    started = time.perf_counter()
    # Each option is checked before any work (and before the run folder changes), in the command line's terms.
    if not 0 <= options.seed < 2**32:
        raise WorkflowError(f"`--seed {options.seed}` must lie in [0, 2**32 - 1] (numpy's seed range). Pass e.g. 1.")
    if options.max_length < 2:
        raise WorkflowError(f"`--max-length {options.max_length}` must be at least 2 (a token and </s>).")
    if options.max_length_ratio is not None and not options.max_length_ratio >= 1:
        raise WorkflowError(
            f"`--max-length-ratio {options.max_length_ratio}` must be at least 1 (longer side / shorter side, in "
            "tokens). Pass e.g. 1.5 to 9 (Moses' clean-corpus-n uses 9), or leave it out to keep every ratio."
        )
    if options.preprocessing_workers < 1:
        raise WorkflowError(
            f"`--preprocessing-workers {options.preprocessing_workers}` must be at least 1. Pass e.g. the number "
            "of CPU cores."
        )
    if options.tokenizer_sample < 2:
        raise WorkflowError(
            f"`--tokenizer-sample {options.tokenizer_sample}` must be at least 2 (one pair's two sentences). Pass "
            f"e.g. {DEFAULT_TOKENIZER_SAMPLE:,} (the default)."
        )
    smallest_vocab = len(SPECIAL_TOKENS) + len(BYTE_TOKENS) + 1
    if options.tokenizer is None and options.vocab_size < smallest_vocab:
        raise WorkflowError(
            f"`--vocab-size {options.vocab_size}` is below the smallest BPE, {smallest_vocab} (4 special and 256 "
            "byte tokens, one merge). Pass a larger --vocab-size (the Multi30k recipe: 8000)."
        )
    if options.tokenizer is not None and not Path(options.tokenizer).is_dir():
        raise WorkflowError(
            f"`--tokenizer` {options.tokenizer} is not a folder. Pass a folder saved by save_pretrained."
        )
    if options.compare_curve is not None:  # checked now, not after hours of training
        if options.curve_every is None:
            raise WorkflowError(
                f"`--compare-curve` {options.compare_curve} is drawn beside the learning curve, which needs "
                "--curve-every. Pass --curve-every too, or drop --compare-curve."
            )
        load_comparison_curves(options.compare_curve)
    if options.push_to_hub is not None and int(os.environ.get("RANK", "0")) == 0:
        hub_token("--push-to-hub")  # now, not after hours of training
    report_to = _check_eval_options(options)
    lr = options.learning_rate()
    bf16, precision = resolve_bf16(options.bf16, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"Precision: {precision}", flush=True)
    init_dir = _init_folder(options) if options.init_from is not None else None
    # Built first: it checks the optimization options before any data is read or any folder touched. The options'
    # arguments, then the user's other Trainer arguments (`trainer_args`) over them.
    arguments: dict[str, Any] = dict(
        output_dir=str(Path(options.output_dir) / CHECKPOINTS),
        lr_schedule=options.schedule,
        learning_rate=lr,
        warmup_steps=options.warmup_steps,
        label_smoothing_factor=options.label_smoothing,
        decoder_start_embedding=options.decoder_start_embedding,
        max_tokens=options.max_tokens,
        gradient_accumulation_steps=options.grad_accum,
        num_train_epochs=options.epochs if options.epochs is not None else 1000,
        max_steps=options.max_steps if options.max_steps is not None else -1,
        max_time=options.max_time,
        save_every=options.save_every,
        save_strategy="epoch",
        # --average last: the Trainer keeps the last k (+1: a save cut short leaves k complete); best/spread keep
        # what they may still pick (CheckpointRetentionCallback). Either keeps best_model_checkpoint (--keep-best).
        save_total_limit=max(options.average_last, 1) + 1 if options.average == "last" else None,
        # Validation during training (with a dev set only; docs/training.md "Validation during training").
        eval_every=options.eval_every or EVAL_AT_SAVES,
        predict_with_generate=True,
        generation_num_beams=options.eval_num_beams or 1,
        per_device_eval_batch_size=options.eval_batch_size,
        dataloader_pin_memory=torch.cuda.is_available(),  # the dev batches; pinning warns on a CPU
        metric_for_best_model="bleu" if options.keep_best else None,
        greater_is_better=True,
        early_stopping_patience=options.early_stopping_patience,
        bf16=bf16,
        # Without a GPU, transformers needs to be told that the CPU is meant: for bf16 (CPU autocast), and under
        # torchrun for the processes to join a gloo group (else each trains alone and all write the same files).
        use_cpu=not torch.cuda.is_available() and (bf16 or int(os.environ.get("WORLD_SIZE", "1")) > 1),
        seed=options.seed,
        logging_steps=options.logging_steps,
        logging_first_step=True,
        disable_tqdm=not options.progress,
        report_to=report_to,
    )
    arguments.update(_trainer_overrides(options.trainer_args))
    training_args = VanillaSeq2SeqTrainingArguments(**arguments)
    main_process = int(os.environ.get("RANK", "0")) == 0  # under torchrun, the main process owns the run folder
    if main_process:
        refuse_if_in_use(Path(options.output_dir))
    checkpoint_dir, resume_from = _check_output_dir(options)
    data = _load_training_data(options)
    train_pairs, test_pairs, data_name = data.train, data.test, data.name
    _check_training_pairs(train_pairs, data_name, options)
    _check_dev_set(options, data.valid is not None)
    if options.push_to_hub is not None and (test_pairs is None or not options.evaluate):
        raise WorkflowError(
            f"`--push-to-hub {options.push_to_hub}` uploads the model with its card, which the test-set evaluation "
            "writes; drop --no-eval (and give a test set, --test-src/--test-tgt, where the data has none)."
        )

    print(f"Training pairs: {len(train_pairs):,} ({data_name}, {options.src_lang} -> {options.tgt_lang})", flush=True)
    if init_dir is not None:  # fine-tuning: the folder's own tokenizer, whatever it is (BPE, SentencePiece)
        given_tokenizer = _init_tokenizer(init_dir)
        tokenizer_identity = tokenizer_fingerprint(given_tokenizer)
    elif options.tokenizer is not None:
        given_tokenizer = load_tokenizer(options.tokenizer)
        tokenizer_identity = tokenizer_fingerprint(given_tokenizer)
    else:
        tokenizer_identity = f"a joint BPE of --vocab-size {options.vocab_size}"
        if 2 * len(train_pairs) > options.tokenizer_sample:  # (the whole corpus, as before samples: no mention)
            tokenizer_identity += f" on --tokenizer-sample {options.tokenizer_sample} (--seed {options.seed})"
    if resume_from is not None:  # the run's own tokenizer; the options' must be the same (check_same_run)
        tokenizer = load_tokenizer(resume_from)
    elif init_dir is not None or options.tokenizer is not None:
        tokenizer = given_tokenizer
    else:
        sentences = min(2 * len(train_pairs), options.tokenizer_sample)
        texts = tokenizer_sample(train_pairs, options.tokenizer_sample, seed=options.seed)
        tokenizer = train_bpe_tokenizer(texts, vocab_size=options.vocab_size)
        print(f"Trained a joint BPE of {len(tokenizer):,} tokens on {sentences:,} sentences", flush=True)
    try:
        prepared = prepare_pairs(
            train_pairs,
            tokenizer,
            max_length=options.max_length,
            max_length_ratio=options.max_length_ratio,
            num_proc=options.preprocessing_workers if options.preprocessing_workers > 1 else None,
        )
    except ValueError:  # pairs with a blank side were refused above: the length limits are what dropped them all
        ratio = f" / --max-length-ratio {options.max_length_ratio}" if options.max_length_ratio is not None else ""
        raise WorkflowError(
            f"`--max-length {options.max_length}`{ratio} drops every training pair of {data_name} (each has more "
            "tokens on a side, </s> included, or too unequal sides). Raise --max-length (or --max-length-ratio)."
        ) from None
    if prepared.reused:
        print(f"Reusing tokenized cache {prepared.cache_file}", flush=True)
    print(prepared.cleaning.summary(), flush=True)
    train_dataset = prepared.dataset
    longest = int(max(prepared.source_lengths.max(), prepared.target_lengths.max()))
    if options.max_tokens < longest:
        raise WorkflowError(
            f"`--max-tokens {options.max_tokens}` is below the longest training pair ({longest} tokens on a side, "
            f"</s> included), which must fit in a batch alone. Raise --max-tokens to {longest} or more, or drop long "
            "pairs with a lower --max-length."
        )
    valid_dataset = _dev_dataset(data.valid, tokenizer, options) if data.valid is not None else None

    if init_dir is not None:  # the folder's model as it is; only P_drop (§5.4) may change for the new data
        config = VanillaTransformerConfig.from_pretrained(init_dir)
        if options.dropout is not None:
            config.dropout = options.dropout
    else:
        overrides: dict[str, Any] = {"vocab_size": len(tokenizer), **special_token_ids(tokenizer)}
        if options.dropout is not None:
            overrides["P_drop"] = options.dropout
        config = VanillaTransformerConfig.from_preset(options.preset, **overrides)
    settings = _run_settings(options, train_pairs, tokenizer_identity, config.dropout, bf16)
    if init_dir is not None:  # a resume must start from the same folder: its weights are the run's start
        settings.pop("--preset")
        settings["--init-from"] = f"{init_dir} ({_weights_fingerprint(init_dir)})"
    output_dir = Path(options.output_dir)
    finished = False
    if resume_from is not None:
        if not check_same_run(output_dir, settings):
            print(
                f"{output_dir} records no {SETTINGS_FILE} (an older version's run): its settings are not checked.",
                flush=True,
            )
        steps = _trained_steps(resume_from)
        if options.max_steps is not None and options.max_steps < steps:
            raise WorkflowError(
                f"`--max-steps {options.max_steps}` is below the {steps} updates of {resume_from.name}, the run's "
                f"last checkpoint; a run cannot go back. Pass --max-steps {steps} to finish the run without more "
                "training, a larger value to train on, or --overwrite to start afresh."
            )
        finished = options.max_steps == steps

    if main_process and (output_dir / "config.json").is_file():  # a run folder of the layout before RUN/model
        print(
            f"{output_dir} holds a model at its top level (a run of an older version); this run writes its model to "
            f"{output_dir / MODEL_DIR}, and the top-level model files can be deleted.",
            flush=True,
        )
    # Every option is checked: from here on the folder changes, by one run at a time.
    output_dir = writable_folder(output_dir, "--output-dir")
    with exclusive_run(output_dir) if main_process else contextlib.nullcontext():
        if main_process:
            if _check_output_dir(options) != (checkpoint_dir, resume_from):  # another run ended in between
                raise WorkflowError(
                    f"`--output-dir` {output_dir} changed while this run was starting (another run wrote to it). "
                    "Start again."
                )
            _clear_for_run(output_dir, checkpoint_dir, resume_from)
            write_settings(output_dir, settings)
            _write_run_config(output_dir, options, training_args)
        return _train_checked(
            options,
            training_args,
            config,
            tokenizer,
            train_dataset,
            test_pairs,
            data_name,
            resume_from,
            finished,
            started,
            valid_dataset,
        )


def _train_checked(
    options: TrainOptions,
    training_args: VanillaSeq2SeqTrainingArguments,
    config: VanillaTransformerConfig,
    tokenizer: PreTrainedTokenizerBase,
    train_dataset: Dataset,
    test_pairs: Dataset | None,
    data_name: str,
    resume_from: Path | None,
    finished: bool,
    started: float,
    valid_dataset: Dataset | None = None,
) -> TrainResult | None:
    """`train` once the options are checked and the run folder is this run's: train (unless `finished`: the
    checkpoint is at --max-steps already) scoring `valid_dataset` on the way, average, evaluate, write the results.
    `started`: when `train` began."""
    import torch
    from transformers import TrainerState

    from . import VanillaTransformerForConditionalGeneration
    from .model.generation_vanilla_transformer import paper_generation_config
    from .training.averaging import (
        AverageSpan,
        checkpoint_infos,
        select_checkpoints,
        selectable_checkpoints,
        write_averaged_model,
    )
    from .training.learning_curve import CURVE_DIR, CURVE_PNG, write_dev_curve
    from .training.mapped_pages import ReleaseCorpusPagesCallback
    from .training.trainer import (
        CheckpointRetentionCallback,
        LearningCurveCallback,
        VanillaSeq2SeqTrainer,
        parse_eval_every,
    )

    output_dir = Path(options.output_dir)
    checkpoint_dir = output_dir / CHECKPOINTS
    model_dir = output_dir / MODEL_DIR
    lr = options.learning_rate()
    torch.manual_seed(options.seed)
    if options.init_from is not None:  # fine-tuning: the folder's weights and its decoding (generation config)
        init_dir = _init_folder(options)
        model = VanillaTransformerForConditionalGeneration.from_pretrained(init_dir, config=config)
    else:
        init_dir = None
        model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(options.attn_implementation or training_attention(training_args.device))
    # §6.1 decoding, set before training: Seq2SeqTrainer's generation-based evaluation would otherwise fill the
    # global defaults (max_length 20) into it. A fine-tuned folder keeps its own where it has one.
    if init_dir is None or not (init_dir / "generation_config.json").is_file():
        model.generation_config = paper_generation_config(config)
    budget = f"at most {options.max_time / 60:.1f} minutes" if options.max_time is not None else "no time limit"
    print(
        f"Model: {options.preset if init_dir is None else f'from {init_dir}'}, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters; training with "
        f"{budget}, {options.schedule} schedule (lr {lr:g}, warmup {options.warmup_steps}), batches of <= "
        f"{options.max_tokens} tokens per side",
        flush=True,
    )
    trainer = VanillaSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=valid_dataset,
        processing_class=tokenizer,
    )
    trainer.add_callback(ReleaseCorpusPagesCallback(train_dataset))
    span = AverageSpan.parse(options.average_span)
    if valid_dataset is not None:
        decoding = f"beam {options.eval_num_beams}" if options.eval_num_beams else "greedy"
        print(
            f"Dev evaluation {parse_eval_every(training_args.eval_every).describe()}, "
            f"{decoding}; its time counts in the wall-clock budget (--max-time)",
            flush=True,
        )
    if options.average != "last":  # keep what the mode may still pick; `last` keeps by save_total_limit

        def keep(infos: list) -> list[Path]:
            return [info.path for info in selectable_checkpoints(infos, options.average, options.average_last, span)]

        trainer.add_callback(CheckpointRetentionCallback(checkpoint_dir, keep))
    if options.curve_every is not None:
        trainer.add_callback(LearningCurveCallback(trainer, output_dir / CURVE_DIR, options.curve_every))
    if finished:  # the Trainer would make one more update: it checks max_steps after each one
        print(
            f"{resume_from.name} is at --max-steps {options.max_steps} already: no training, the run is finished.",
            flush=True,
        )
        trainer.state = TrainerState.load_from_json(str(resume_from / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    if not trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes the results
        return None

    step = trainer.state.global_step
    try:
        chosen = select_checkpoints(checkpoint_infos(checkpoint_dir), options.average, options.average_last, span)
    except ValueError as error:  # --average best and no evaluation happened (a run finished before its first)
        raise WorkflowError(f"`--average {options.average}`: {error} Use --average last.") from None
    to_average = [info.path for info in chosen]
    write_averaged_model(to_average, model_dir)
    print(
        f"Trained {step} updates ({trainer.state.epoch:.2f} epochs); model folder {model_dir} = average "
        f"({options.average}) of {', '.join(path.name for path in to_average)}",
        flush=True,
    )
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

    summary: dict[str, Any] = {
        "command": options.command,
        "languages": [options.src_lang, options.tgt_lang],
        "data": data_name,
        "preset": options.preset if options.init_from is None else None,
        "init_from": None if options.init_from is None else os.fspath(options.init_from),
        "updates": step,
        "epochs": trainer.state.epoch,
        "averaged_checkpoints": [path.name for path in to_average],
        "averaging": averaging,
        "train": {key: value for log in trainer.state.log_history for key, value in log.items() if "train_" in key},
    }
    dev_points = write_dev_curve(output_dir, trainer.state.log_history, model_dir / CURVE_PNG, options.compare_curve)
    if dev_points:
        best = max(dev_points, key=lambda point: point["bleu"])
        summary["dev"] = {
            "evaluations": len(dev_points),
            "best": {"step": best["step"], "bleu": best["bleu"], "chrf": best["chrf"]},
            "best_checkpoint": Path(trainer.state.best_model_checkpoint).name
            if trainer.state.best_model_checkpoint
            else None,
            "last": dev_points[-1],
        }
        summary["learning_curve"] = CURVE_PNG
        print(
            f"Dev BLEU: best {best['bleu']:.2f} at update {best['step']}, last {dev_points[-1]['bleu']:.2f}; "
            f"learning curve {model_dir / CURVE_PNG}",
            flush=True,
        )
    if test_pairs is not None and options.evaluate:
        sources, references = list(test_pairs["source"]), list(test_pairs["target"])
        summary["test"], model, tokenizer = _evaluate_folder(model_dir, sources, references, options)
        _print_examples(test_pairs, summary["test"]["hypotheses"], options.examples)
        # For the model card's limitations: a sentence outside the training domain, translated by the model.
        from .inference.evaluation import out_of_domain_translation

        summary["out_of_domain"] = out_of_domain_translation(model, tokenizer, options.src_lang)
        if len(to_average) > 1:  # what averaging (§6.1) brought: the last checkpoint alone, same decoding
            print(f"Last checkpoint alone ({to_average[-1].name}):", flush=True)
            summary["test_last_checkpoint"] = _evaluate_folder(to_average[-1], sources, references, options)[0]
        # Attention maps of the first test sentence, shown by the model card.
        plot_attention_maps(AttentionOptions(model_dir, sources[0], out=model_dir / ATTENTION_DIR))
        if options.curve_every is not None and data_name == "multi30k" and not dev_points:  # else: the dev curve
            curve = learning_curve(
                CurveOptions(
                    output_dir,
                    options.src_lang,
                    options.tgt_lang,
                    batch_size=options.eval_batch_size,
                    compare_curve=options.compare_curve,
                    progress=options.progress,
                )
            )
            summary["learning_curve"] = curve.png.name
        # What the card is made of, kept so that `push` renders it again with the repository's id.
        summary["card"] = _card_inputs(output_dir, summary, options, data_name, example_text=sources[0])
        _write_model_card(model_dir, summary, options.push_to_hub)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    result = TrainResult(output_dir, summary)
    result.results_file.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if options.push_to_hub is not None:
        try:
            pushed = push(PushOptions(model_dir, options.push_to_hub, private=options.private))
        except WorkflowError as error:  # the model is saved: say how to upload it once the problem is solved
            raise WorkflowError(
                f"{error} The model folder {model_dir} is written; upload it with `hf-vanilla-transformer push "
                f"{model_dir} {options.push_to_hub}`."
            ) from None
        print(f"Pushed {len(pushed.files)} files of {model_dir} to {pushed.url}", flush=True)
    return result


# ---------------------------------------------------------------------------------------------------- evaluate


@dataclass(frozen=True)
class EvaluateOptions:
    """Score `model_dir` on Multi30k's `split` (languages: the options', else the folder's results.json, else
    en-de) or on the files `src` and `ref`; `output` receives the scores and hypotheses as JSON."""

    model_dir: str | os.PathLike
    src_lang: str | None = None
    tgt_lang: str | None = None
    split: str = "test"
    src: str | os.PathLike | None = None
    ref: str | os.PathLike | None = None
    batch_size: int = 64
    num_beams: int | None = None
    output: str | os.PathLike | None = None
    progress: bool = True
    max_input_tokens: int | None = None
    trust_remote_code: bool = False
    int8: bool = False  # int8 linear layers on the CPU (quantization.quantize_int8)
    bf16_weights: bool = False  # the weights cast to bf16 (as translate --bf16-weights)


def evaluate(options: EvaluateOptions) -> dict[str, Any]:
    """Translate the test set with the model's own decoding (§6.1 unless `num_beams`) and score it; returns
    `evaluation.evaluate_translations`' results (BLEU, lowercased BLEU, chrF, the signature, the hypotheses)."""
    from .inference.evaluation import evaluate_translations, write_results_json
    from .training.data import load_multi30k, read_lines

    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    if (options.src is None) != (options.ref is None):
        raise WorkflowError("`--src` and `--ref` go together; pass both files or neither.")
    if options.src is not None:
        sources = read_lines(existing_file(options.src, "--src"))
        references = read_lines(existing_file(options.ref, "--ref"))
    else:
        src_lang, tgt_lang = trained_languages(model_dir, options.src_lang, options.tgt_lang)
        pairs = load_multi30k(src_lang, tgt_lang, splits=(options.split,))[options.split]
        sources, references = list(pairs["source"]), list(pairs["target"])
    if options.output is not None:  # checked before decoding, which can take long
        writable_file(options.output, "--output", "JSON", "scores.json")
    model = load_model(model_dir, options.trust_remote_code, int8=options.int8, bf16_weights=options.bf16_weights)
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    results = evaluate_translations(
        model,
        tokenizer,
        sources,
        references,
        options.batch_size,
        _generation_kwargs(options.num_beams),
        progress=options.progress,
        max_input_tokens=options.max_input_tokens,
    )
    if options.output is not None:
        write_results_json(options.output, results)
    return results


# ---------------------------------------------------------------------------------------------------- translate


@dataclass(frozen=True)
class TranslateOptions:
    """Translate `sentences` (or the lines given to `translate_stream`) with the model in `model_dir` and its own
    decoding (§6.1: beam 4, GNMT length penalty α = 0.6, at most source length + 50 tokens), changed by the options
    that are not None: `num_beams`, `length_penalty` (α, with the model's kind of penalty), `max_new_tokens` (a cap
    on every output, EOS included, beside the paper's per-source limit).

    `batch_size`: lines per chunk; `translate_stream` yields a chunk's translations once it is decoded.
    `n_best`: None gives the best translation of each line; N gives the N best, each with its score (evaluation's
    `Hypothesis`); more than one needs at least N beams. `device`: one of DEVICES. `bf16`: decode under bf16 autocast
    (fast on GPUs and on CPUs with bf16 matrix units; CPUs without them emulate bf16 much slower than float32).
    `bf16_weights`: decode with the weights cast to bf16 (no autocast, every op in bf16): faster than autocast on a
    CPU with bf16 units (docs/results.md, the decoding table), at the same BLEU there.
    """

    model_dir: str | os.PathLike
    sentences: Sequence[str] = ()
    batch_size: int = 32
    num_beams: int | None = None
    max_input_tokens: int | None = None
    trust_remote_code: bool = False
    length_penalty: float | None = None
    max_new_tokens: int | None = None
    n_best: int | None = None
    device: str = "auto"
    bf16: bool = False
    bf16_weights: bool = False
    int8: bool = False  # int8 linear layers on the CPU (quantization.quantize_int8)


def _check_translate_options(options: TranslateOptions) -> None:
    """One-line errors for values the command line's parser would have refused (library callers)."""
    import math

    counts = (("--batch-size", options.batch_size), ("--num-beams", options.num_beams))
    counts += (("--max-new-tokens", options.max_new_tokens), ("--n-best", options.n_best))
    for option, value in counts:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise WorkflowError(f"`{option}` must be a positive integer, got {value!r}.")
    penalty = options.length_penalty
    if penalty is not None and (isinstance(penalty, bool) or not math.isfinite(penalty)):
        raise WorkflowError(f"`--length-penalty` must be a finite number (the paper's is 0.6), got {penalty!r}.")
    check_precisions(options.bf16, options.int8, options.bf16_weights)


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    """Chunks of at most `size` lines. Lines that say whether more are waiting (`ready()`: data.LineStream on a pipe)
    make a chunk of what has come as soon as nothing more waits, so a line piped in is answered at once while a burst
    of lines still fills whole batches; other iterables give chunks of `size`."""
    ready = getattr(lines, "ready", None)
    while chunk := list(itertools.islice(lines, 1 if ready is not None else size)):
        while ready is not None and len(chunk) < size and ready():
            if (line := next(lines, None)) is None:
                break
            chunk.append(line)
        yield chunk


def translate_stream(options: TranslateOptions, lines: Iterable[str] | None = None) -> Iterator[list[Hypothesis]]:
    """Translate `lines` (default: `options.sentences`), read lazily in chunks of at most `options.batch_size`
    (`_chunks`): for each line, in order, its hypotheses (one, or `n_best` best first with scores), yielded as soon
    as its chunk is decoded, so that a line read from a pipe is translated before the pipe closes. A blank (empty
    or white-space) line is not sent to the model and yields an empty list. The model loads at the first `next()`."""
    import torch
    from transformers import GenerationConfig

    from .inference.evaluation import translate_n_best

    _check_translate_options(options)
    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    n_best = options.n_best or 1
    if options.num_beams is not None:
        beams = options.num_beams
    elif (model_dir / "generation_config.json").is_file():  # read alone: checked before the model loads
        beams = GenerationConfig.from_pretrained(model_dir).num_beams or 1
    else:
        beams = 1
    if n_best > beams:
        raise WorkflowError(
            f"`--n-best` {n_best} needs at least {n_best} beams, but the decoding has {beams} (--num-beams, else the "
            f"model's generation_config.json). Pass --num-beams {n_best} or more, or a smaller --n-best."
        )
    model = load_model(model_dir, options.trust_remote_code, options.device, options.int8, options.bf16_weights)
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    bf16 = "--bf16" if options.bf16 else "--bf16-weights" if options.bf16_weights else None
    if bf16 and model.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise WorkflowError(f"`{bf16}`: this GPU has no bf16 support. Drop {bf16}.")
    generation_kwargs = {
        name: value
        for name, value in (
            ("num_beams", options.num_beams),
            ("length_penalty", options.length_penalty),
            ("max_new_tokens", options.max_new_tokens),
        )
        if value is not None
    }
    for chunk in _chunks(iter(options.sentences if lines is None else lines), options.batch_size):
        sources = [line for line in chunk if line.strip()]
        # Autocast per chunk, never across a yield: its state would leak into the caller's code between chunks.
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=options.bf16):
            translated = iter(
                translate_n_best(
                    model,
                    tokenizer,
                    sources,
                    options.batch_size,
                    generation_kwargs,
                    progress=False,
                    max_input_tokens=options.max_input_tokens,
                    n_best=n_best,
                    scores=options.n_best is not None,
                )
                if sources
                else []
            )
        for line in chunk:
            yield next(translated) if line.strip() else []


# Only "\n" (and "\r\n") end a line of the input (data.decode_lines) and "\t" separates the n-best columns.
_ONE_FIELD = str.maketrans("\t\r\n", "   ")


def translation_line(hypotheses: list[Hypothesis]) -> str:
    """One output line for one input line, as `translate` prints it: the translation; or, for hypotheses with
    scores (`n_best`), `translation<TAB>score` pairs joined by tabs, best first (so `cut -f1` gives the best
    translation); an empty line for a blank input line. Tabs and line breaks inside a translation become spaces,
    so that columns and lines stay aligned with the input."""
    texts = [hypothesis.text.translate(_ONE_FIELD) for hypothesis in hypotheses]
    if all(hypothesis.score is None for hypothesis in hypotheses):
        return texts[0] if texts else ""
    return "\t".join(f"{text}\t{hypothesis.score:.4f}" for text, hypothesis in zip(texts, hypotheses, strict=True))


def translate(options: TranslateOptions) -> list[str]:
    """The best translation of each of `options.sentences`, in input order ("" for a blank line); sources longer
    than `max_input_tokens` (default: the tokenizer's limit) are cut, with one warning per chunk that counts them."""
    model_folder(options.model_dir, options.trust_remote_code)
    if not options.sentences:
        raise WorkflowError("Nothing to translate: pass sentences as arguments, with --input or on stdin.")
    return [hypotheses[0].text if hypotheses else "" for hypotheses in translate_stream(options)]


# ---------------------------------------------------------------------------------------------------- average


@dataclass(frozen=True)
class AverageOptions:
    """Average `checkpoints` (folders), or with `last` the last N complete `checkpoint-*` folders of the one folder
    in `checkpoints`, into the model folder `output` (§6.1)."""

    checkpoints: Sequence[str | os.PathLike]
    output: str | os.PathLike
    last: int | None = None


@dataclass(frozen=True)
class AverageResult:
    checkpoints: list[Path]
    output: Path


def average(options: AverageOptions) -> AverageResult:
    """Average the checkpoints' weights (float32 accumulation) into a Hub-ready model folder."""
    from .training.averaging import last_checkpoints, write_averaged_model

    if options.last is not None:
        if len(options.checkpoints) != 1:
            raise WorkflowError(f"`--last` takes one folder of checkpoints, got {len(options.checkpoints)} paths.")
        paths = last_checkpoints(options.checkpoints[0], options.last, complete_only=True)  # skips interrupted saves
    else:
        paths = [Path(path) for path in options.checkpoints]
        for path in paths:
            if not path.exists():
                raise WorkflowError(f"Checkpoint {path} does not exist. Check the path.")
            if path.is_dir():  # a folder of this package's model; a .safetensors file is averaged as it is
                model_folder(path, None, name="Checkpoint", tokenizer=False)
    output = writable_folder(options.output, "--output")
    write_averaged_model(paths, output)
    return AverageResult(paths, output)


# ---------------------------------------------------------------------------------------------------- push


@dataclass(frozen=True)
class PushOptions:
    """Upload the model folder `model_dir` (RUN/model of `train`, or a converted folder) to the Hub repository
    `repo_id`, created (`private` if asked) when missing; `revision`: a branch, created when missing; `force`:
    replace a repository that holds other files (they are deleted in the same commit)."""

    model_dir: str | os.PathLike
    repo_id: str
    private: bool = False
    revision: str | None = None
    force: bool = False


@dataclass(frozen=True)
class PushResult:
    files: list[str]
    url: str


def hub_token(option: str) -> str:
    """The Hugging Face token huggingface_hub would use (HF_TOKEN, `hf auth login`'s file), after checking that
    the machine is not set offline; `option` names the command in the errors."""
    from huggingface_hub import constants, get_token

    if constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise WorkflowError(
            f"`{option}`: this machine is set offline (HF_HUB_OFFLINE=1), so nothing can be uploaded. Unset "
            "HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) on a machine with a connection."
        )
    token = get_token()
    if not token:
        raise WorkflowError(
            f"`{option}`: no Hugging Face token found. Run `hf auth login`, or set HF_TOKEN to a token with write "
            "access."
        )
    return token


def _connection_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a Hub request that got no answer: the transport errors of the HTTP library huggingface_hub
    uses (httpx2 in huggingface_hub 2, httpx in 1) and ConnectionError (not every OSError: a local file that
    cannot be read is no connection problem)."""
    import importlib

    errors: list[type[BaseException]] = [ConnectionError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(name).TransportError)
    return tuple(errors)


def push(options: PushOptions) -> PushResult:
    """Upload exactly the model's files (model_card.hub_files: weights, configs, every tokenizer file, the code
    files, the card, the figures, results.json) in one commit; the card's examples are pointed at `repo_id` first
    (a `train` folder's card rendered again from results.json and config.json, a converted folder's rewritten), so
    they load the repository."""
    from huggingface_hub.errors import HfHubHTTPError

    from model_card import RepositoryNotEmptyError, card_for_repository, hub_files, push_folder_to_hub

    folder = Path(options.model_dir)
    if not (folder / "config.json").is_file() and (folder / MODEL_DIR / "config.json").is_file():
        raise WorkflowError(
            f"`model_dir` {folder} is a run folder of `train`; pass its model folder, {folder / MODEL_DIR}."
        )
    model_dir = model_folder(folder, None, tokenizer=False)
    try:
        files = hub_files(model_dir)
    except ValueError as error:
        raise WorkflowError(f"`model_dir` {model_dir}: {error}") from None
    token = hub_token("push")
    try:
        card = card_for_repository(model_dir, options.repo_id)
    except (ValueError, KeyError, TypeError) as error:  # not JSON, or not the results `train` writes
        raise WorkflowError(
            f"{model_dir / RESULTS_FILE} is damaged ({type(error).__name__}: {error}); the card is rendered from it. "
            "Restore it from the run, or delete it to upload the folder's README.md as it is."
        ) from None
    try:
        commit = push_folder_to_hub(
            model_dir,
            options.repo_id,
            private=options.private,
            token=token,
            revision=options.revision,
            card=card,
            replace=options.force,
        )
    except RepositoryNotEmptyError as error:
        shown = ", ".join(error.others[:5]) + (f" and {len(error.others) - 5} more" if len(error.others) > 5 else "")
        raise WorkflowError(
            f"Hub repository {options.repo_id} already holds files that are not this model's ({shown}); uploading "
            "would mix two models. Pass --force to replace its content (those files are deleted in the same "
            "commit), or choose another REPO_ID."
        ) from None
    except _connection_errors() as error:  # connection refused, DNS failure, timeout: no answer from the Hub
        from huggingface_hub import constants

        raise WorkflowError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({type(error).__name__}: {error}); this machine looks "
            "offline. Push from a machine with a connection (or check HF_ENDPOINT and proxies)."
        ) from None
    except HfHubHTTPError as error:  # the Hub answered with an error: a rejected token, a name taken by another user
        first_line = str(error).splitlines()[0]
        raise WorkflowError(f"the Hub refused the upload to {options.repo_id}: {first_line}") from None
    return PushResult(files, commit.commit_url)


# ---------------------------------------------------------------------------------------------------- curve


@dataclass(frozen=True)
class CurveOptions:
    """Score the snapshots of a `train` run with `curve_every` (RUN/curve, `run_dir` is the run's --output-dir) on
    Multi30k validation (languages: the options', else the run's, else en-de; the first `limit` sentences if given)
    and plot them, beside the curves of the `compare_curve` file if given."""

    run_dir: str | os.PathLike
    src_lang: str | None = None
    tgt_lang: str | None = None
    batch_size: int = 64
    limit: int | None = None
    compare_curve: str | os.PathLike | None = None
    progress: bool = True


@dataclass(frozen=True)
class CurveResult:
    points: list[dict[str, Any]]
    json: Path
    png: Path


def learning_curve(options: CurveOptions) -> CurveResult:
    """Validation BLEU (greedy) of the run's snapshots into RUN/learning_curve.json, and learning_curve.png into the
    model folder RUN/model (the card shows it). A run folder of the layout before RUN/model (the model at RUN's
    top level) gets both at its top level."""
    from .training.data import load_multi30k
    from .training.learning_curve import CURVE_JSON, CURVE_PNG, write_learning_curve

    run_dir = Path(options.run_dir)
    model_dir = run_dir / MODEL_DIR if (run_dir / MODEL_DIR).is_dir() else run_dir
    model_dir = model_folder(model_dir, None, name="`run_dir`")  # a run of `train`: this package's model
    src_lang, tgt_lang = trained_languages(model_dir, options.src_lang, options.tgt_lang)
    pairs = load_multi30k(src_lang, tgt_lang, splits=("validation",))["validation"]
    if options.limit is not None:
        pairs = pairs.select(range(min(options.limit, len(pairs))))
    print("Learning curve: validation BLEU (greedy) of each snapshot", flush=True)
    points = write_learning_curve(
        run_dir,
        load_tokenizer(model_dir),
        list(pairs["source"]),
        list(pairs["target"]),
        batch_size=options.batch_size,
        progress=options.progress,
        compare=options.compare_curve,
        png=model_dir / CURVE_PNG,
    )
    return CurveResult(points, run_dir / CURVE_JSON, model_dir / CURVE_PNG)


# ---------------------------------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionOptions:
    """Plot the attention maps of `sentence` (teacher-forced on `target`, else the model's own translation) into
    `out`; `layers` / `heads` (0-based) select the rows / columns of the grids (all by default)."""

    model_dir: str | os.PathLike
    sentence: str
    target: str | None = None
    out: str | os.PathLike = ATTENTION_DIR
    layers: list[int] | None = None
    heads: list[int] | None = None
    dpi: int = 120
    trust_remote_code: bool = False


def plot_attention_maps(options: AttentionOptions) -> list[Path]:
    """Encoder self-, decoder self- and encoder-decoder attention grids as PNGs; returns their paths."""
    from transformers import AutoModelForSeq2SeqLM

    from .inference.attention_maps import plot_attention

    model_dir = model_folder(options.model_dir, options.trust_remote_code)
    model = AutoModelForSeq2SeqLM.from_pretrained(
        model_dir, attn_implementation="eager", trust_remote_code=options.trust_remote_code
    )
    tokenizer = load_tokenizer(model_dir, options.trust_remote_code)
    return plot_attention(
        model,
        tokenizer,
        options.sentence,
        options.target,
        options.out,
        layers=options.layers,
        heads=options.heads,
        dpi=options.dpi,
    )


__all__ = [
    "AttentionOptions",
    "AverageOptions",
    "AverageResult",
    "CurveOptions",
    "CurveResult",
    "EvaluateOptions",
    "PushOptions",
    "PushResult",
    "TrainOptions",
    "TrainResult",
    "TranslateOptions",
    "WorkflowError",
    "average",
    "evaluate",
    "existing_file",
    "learning_curve",
    "load_model",
    "load_tokenizer",
    "model_folder",
    "plot_attention_maps",
    "push",
    "train",
    "trained_languages",
    "translate",
    "translate_stream",
    "translation_line",
    "writable_file",
    "writable_folder",
]
