"""The library's workflows: train, evaluate, translate, average checkpoints, learning curves and attention maps.

Each takes one typed options dataclass and returns a typed result; `hf-vanilla-transformer COMMAND` (cli.py) maps
its command-line options onto these and prints. A problem with the options raises `WorkflowError` (a `ValueError`)
naming the option, its value and the fix, before any long work where it can be checked up front.

`train` is the main job: data (Multi30k by default, or parallel files, or a datasets folder), a joint BPE (§5.1),
the model of a `Recipe` (recipes.py) trained inside `Seq2SeqTrainer` (training.py) for its budget, the last
checkpoints averaged (§6.1), the test set scored with the paper's decoding, attention maps, a learning curve, a
model card, and `results.json`: a Hub-ready folder that `pipeline("translation", model=...)` loads.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .data import DEFAULT_MAX_LENGTH
from .recipes import DEFAULT_RECIPE, Recipe

if TYPE_CHECKING:  # torch and transformers load with the workflow that needs them
    import torch
    from datasets import Dataset

DEFAULT_OUTPUT_DIR = "outputs/multi30k-en-de"
CHECKPOINTS = "checkpoints"
RESULTS_FILE = "results.json"
ATTENTION_DIR = "attention"
# The budget options: a recipe's budget applies as a whole unless one of them is given.
BUDGET = ("max_time", "max_steps", "epochs")


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


def existing_file(path: str | os.PathLike | None, option: str) -> Path | None:
    """`path` as a Path (None stays None) after checking that it is a file; `option` names it in the error."""
    if path is not None and not Path(path).is_file():
        raise WorkflowError(f"`{option}` {path} does not exist or is not a file. Check the path.")
    return Path(path) if path is not None else None


def model_folder(path: str | os.PathLike) -> Path:
    """`path` as a Path after checking that it is a saved model folder."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise WorkflowError(
            f"`model_dir` {path} is not a saved model folder (no config.json). Pass the --output-dir of `train` "
            "or a folder written by save_pretrained."
        )
    return folder


def trained_languages(model_dir: Path) -> tuple[str, str]:
    """The (source, target) languages a folder written by `train` records in results.json; ("en", "de") otherwise."""
    results_file = model_dir / RESULTS_FILE
    trained = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else {}
    src_lang, tgt_lang = trained.get("languages", ["en", "de"])
    return src_lang, tgt_lang


def load_model(model_dir: str | os.PathLike, **kwargs: Any) -> Any:
    """A saved model for decoding, on the GPU when there is one (evaluation is mostly beam search)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, **kwargs)
    return model.to("cuda") if torch.cuda.is_available() else model


def _generation_kwargs(num_beams: int | None) -> dict[str, Any] | None:
    return {"num_beams": num_beams} if num_beams is not None else None


# ---------------------------------------------------------------------------------------------------- train


@dataclass(frozen=True)
class TrainOptions:
    """Everything a training run needs. The defaults are the main job (recipes.MULTI30K) on the bundled Multi30k
    EN->DE; `from_recipe` starts from another recipe. Durations are in seconds.

    Data: Multi30k in `src_lang`/`tgt_lang`, or `train_src`/`train_tgt` files (one sentence per line, .gz allowed),
    or a `dataset` folder (save_to_disk) with a train split; `test_src`/`test_tgt` replace the test set.
    `lr`: None is 1.0 (the paper's eq. (3)) for schedule "paper" and the main job's peak for "inverse_sqrt".
    `compare_curve`: a JSON file of curves plotted beside the learning curve (see learning_curve.py).
    `command`: the command line that started the run, recorded in results.json and the model card.
    `decoder_start_embedding`: "zero" keeps the decoder start token's embedding row at zero (so `to-marian` exports
    run in CTranslate2, see start_embedding.py); "train" trains it. A model initialised from a folder whose row is
    not zero (fine-tuning) has it zeroed at the start under "zero" (the model changes slightly, training adapts it)
    and keeps it, with the source model's function at the start, under "train" (not exportable to CTranslate2).
    """

    output_dir: str | os.PathLike = DEFAULT_OUTPUT_DIR
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_src: str | os.PathLike | None = None
    train_tgt: str | os.PathLike | None = None
    test_src: str | os.PathLike | None = None
    test_tgt: str | os.PathLike | None = None
    dataset: str | os.PathLike | None = None
    max_length: int = DEFAULT_MAX_LENGTH
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
    decoder_start_embedding: str = "zero"

    @classmethod
    def from_recipe(cls, recipe: Recipe = DEFAULT_RECIPE, **options: Any) -> TrainOptions:
        """The recipe's settings, overridden by `options` (TrainOptions fields). The recipe's budget (`max_time`,
        `max_steps`, `epochs`) applies as a whole unless `options` sets one of them; its learning rate only with
        its own schedule."""
        names = {field.name for field in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise WorkflowError(
                f"Unknown training options {unknown}. Pick from the TrainOptions fields: {sorted(names)}."
            )
        settings = {name: getattr(recipe, name) for name in names & {field.name for field in fields(Recipe)}}
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
    """What `train` wrote: the model folder and its results.json contents (`summary`)."""

    output_dir: Path
    summary: dict[str, Any]

    @property
    def results_file(self) -> Path:
        return self.output_dir / RESULTS_FILE


def _load_training_data(options: TrainOptions) -> tuple[Dataset, Dataset | None, str]:
    """(train Dataset, test Dataset or None, a name for the data) from the options, checked before any work."""
    from datasets import DatasetDict, load_from_disk

    from .data import check_language_pair, from_dataset, load_multi30k, load_parallel_files

    if (options.train_src is None) != (options.train_tgt is None):
        raise WorkflowError("`--train-src` and `--train-tgt` go together; pass both files or neither.")
    if (options.test_src is None) != (options.test_tgt is None):
        raise WorkflowError("`--test-src` and `--test-tgt` go together; pass both files or neither.")
    if options.dataset is not None and options.train_src is not None:
        raise WorkflowError("Pass either `--dataset` or `--train-src/--train-tgt`, not both.")
    for name in ("train_src", "train_tgt", "test_src", "test_tgt"):
        existing_file(getattr(options, name), f"--{name.replace('_', '-')}")
    test = None
    if options.test_src is not None:
        test = load_parallel_files(options.test_src, options.test_tgt)
    if options.train_src is not None:
        train, name = load_parallel_files(options.train_src, options.train_tgt), Path(options.train_src).stem
    elif options.dataset is not None:
        if not Path(options.dataset).is_dir():
            raise WorkflowError(
                f"`--dataset` {options.dataset} is not a folder. Pass a folder written by save_to_disk."
            )
        loaded = load_from_disk(str(options.dataset))
        if isinstance(loaded, DatasetDict):
            if "train" not in loaded:
                raise WorkflowError(f"`--dataset` {options.dataset} has no train split (splits: {list(loaded)}).")
            if test is None and "test" in loaded:
                test = from_dataset(loaded["test"], options.src_lang, options.tgt_lang)
            loaded = loaded["train"]
        train, name = from_dataset(loaded, options.src_lang, options.tgt_lang), Path(options.dataset).name
    else:
        check_language_pair(options.src_lang, options.tgt_lang)
        multi30k = load_multi30k(options.src_lang, options.tgt_lang, splits=("train", "test"))
        train, name = multi30k["train"], "multi30k"
        test = multi30k["test"] if test is None else test
    if options.max_train_pairs is not None:
        train = train.select(range(min(options.max_train_pairs, len(train))))
    return train, test, name


def _prepare_output_dir(options: TrainOptions) -> tuple[Path, Path, str | None]:
    """(output folder, checkpoint folder, checkpoint to resume from) after checking what the folder holds."""
    from .averaging import checkpoint_step, last_checkpoints
    from .learning_curve import CURVE_DIR

    output_dir = writable_folder(options.output_dir, "--output-dir")
    checkpoint_dir = output_dir / CHECKPOINTS
    existing = sorted(checkpoint_dir.glob("checkpoint-*")) if checkpoint_dir.is_dir() else []
    if options.resume and options.overwrite:
        raise WorkflowError("`--resume` and `--overwrite` contradict each other; pass one.")
    if options.resume:
        if not existing:
            raise WorkflowError(f"`--resume` found no checkpoint in {checkpoint_dir}. Drop --resume to start afresh.")
        try:
            resume_from = last_checkpoints(checkpoint_dir, 1, complete_only=True)[0]
        except ValueError:
            raise WorkflowError(
                f"`--resume` found no complete checkpoint in {checkpoint_dir} (none has a readable trainer_state.json,"
                " which the Trainer writes last). Pass --overwrite instead to start afresh."
            ) from None
        # A kill during a save leaves checkpoint-N without trainer_state.json (the Trainer writes checkpoints in
        # place, that file last); the resumed run writes checkpoint-N again.
        for path in existing:
            step = checkpoint_step(path)
            if step is not None and step > checkpoint_step(resume_from):
                print(f"Removing incomplete {path.name} (its save was interrupted); resuming from {resume_from.name}.")
                shutil.rmtree(path, ignore_errors=True)  # every torchrun process runs this
        return output_dir, checkpoint_dir, str(resume_from)
    if existing and not options.overwrite:
        raise WorkflowError(
            f"`--output-dir` {output_dir} already holds checkpoints of an earlier run ({len(existing)} in "
            f"{checkpoint_dir}). Pass --resume to continue it, --overwrite to start afresh, or another --output-dir."
        )
    if existing:
        shutil.rmtree(checkpoint_dir)
        shutil.rmtree(output_dir / CURVE_DIR, ignore_errors=True)  # the old run's learning-curve snapshots
    return output_dir, checkpoint_dir, None


def training_attention(device: torch.device) -> str:
    """eager on the CPU, where it matches sdpa in fp32 and is 1.5x faster in bf16 training (PyTorch's fused CPU
    attention backward in bf16 is slow for sentence-length sequences); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


def _evaluate_folder(model_dir: Path, sources: list[str], references: list[str], options: TrainOptions) -> dict:
    """Load the saved folder the way users will and score it with its own (§6.1) decoding."""
    from transformers import AutoTokenizer

    from .evaluation import evaluate_translations

    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = evaluate_translations(
        model, tokenizer, sources, references, batch_size=options.eval_batch_size, progress=options.progress
    )
    print(
        f"BLEU {results['bleu']:.2f} (sacreBLEU, cased, 13a), lowercased BLEU {results['bleu_lowercase']:.2f}, "
        f"chrF {results['chrf']:.2f} on {results['n']} sentences, decoded in {results['seconds']:.0f} s",
        flush=True,
    )
    return results


def _print_examples(pairs: Dataset, hypotheses: list[str], count: int) -> None:
    for index in range(min(count, len(hypotheses))):
        print(f"\nSRC: {pairs[index]['source']}\nREF: {pairs[index]['target']}\nHYP: {hypotheses[index]}")
    if count:
        print(flush=True)


def _write_model_card(output_dir: Path, summary: dict, options: TrainOptions, data_name: str) -> None:
    try:
        from model_card import write_model_card
    except ImportError as error:  # the card is a by-product: a missing extra must not cost the trained model
        print(f"Model card not written ({error}); install the package with its model_card module.", flush=True)
        return

    results = dict(summary["test"], dataset=data_name)
    if data_name == "multi30k":
        results.update(
            dataset_name="Multi30k", dataset_config=f"{options.src_lang}-{options.tgt_lang}", split="test_2016"
        )
    notes = []
    if "test_last_checkpoint" in summary:
        last = summary["test_last_checkpoint"]
        notes.append(
            f"The weights are the average of the last {len(summary['averaged_checkpoints'])} checkpoints (§6.1); the "
            f"last checkpoint alone scores BLEU {last['bleu']:.2f} (lowercased {last['bleu_lowercase']:.2f}) with "
            "the same decoding."
        )
    if "learning_curve" in summary:
        notes.append(f"## Learning curve\n\n![validation BLEU against training minutes]({summary['learning_curve']})")
    write_model_card(
        output_dir,
        results=results,
        languages=[options.src_lang, options.tgt_lang],
        datasets=[data_name],
        command=summary["command"],
        extra="\n\n".join(notes) or None,
    )


def train(options: TrainOptions) -> TrainResult | None:
    """Train, average, evaluate and write the model folder (see the module docstring); progress is printed.

    Returns None on the processes other than the main one of a distributed run (torchrun, accelerate launch),
    where the main process alone writes the results."""
    import torch
    from transformers import AutoTokenizer

    from . import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from .averaging import last_checkpoints, write_averaged_model
    from .data import tokenize_pairs
    from .generation_vanilla_transformer import paper_generation_config
    from .learning_curve import CURVE_DIR, load_comparison_curves
    from .tokenization import special_token_ids, train_bpe_tokenizer
    from .training import (
        LearningCurveCallback,
        VanillaSeq2SeqTrainer,
        VanillaSeq2SeqTrainingArguments,
        resolve_bf16,
    )

    started = time.perf_counter()
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
    lr = options.learning_rate()
    bf16, precision = resolve_bf16(options.bf16, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"Precision: {precision}", flush=True)
    # Built first: it checks the optimization options before any data is read or any folder touched.
    training_args = VanillaSeq2SeqTrainingArguments(
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
        save_total_limit=max(options.average_last, 1) + 1,
        bf16=bf16,
        # Without a GPU, transformers needs to be told that the CPU is meant: for bf16 (CPU autocast), and under
        # torchrun for the processes to join a gloo group (else each trains alone and all write the same files).
        use_cpu=not torch.cuda.is_available() and (bf16 or int(os.environ.get("WORLD_SIZE", "1")) > 1),
        seed=options.seed,
        logging_steps=options.logging_steps,
        logging_first_step=True,
        disable_tqdm=not options.progress,
        report_to=[],
    )
    train_pairs, test_pairs, data_name = _load_training_data(options)
    output_dir, checkpoint_dir, resume_from = _prepare_output_dir(options)

    print(f"Training pairs: {len(train_pairs):,} ({data_name}, {options.src_lang} -> {options.tgt_lang})", flush=True)
    if resume_from is not None:
        tokenizer = AutoTokenizer.from_pretrained(resume_from)
    elif options.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(options.tokenizer)
    else:
        texts = list(train_pairs["source"]) + list(train_pairs["target"])
        tokenizer = train_bpe_tokenizer(texts, vocab_size=options.vocab_size)
        print(f"Trained a joint BPE of {len(tokenizer):,} tokens", flush=True)
    train_dataset = tokenize_pairs(train_pairs, tokenizer, max_length=options.max_length)

    overrides: dict[str, Any] = {"vocab_size": len(tokenizer), **special_token_ids(tokenizer)}
    if options.dropout is not None:
        overrides["P_drop"] = options.dropout
    config = VanillaTransformerConfig.from_preset(options.preset, **overrides)
    torch.manual_seed(options.seed)
    model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(options.attn_implementation or training_attention(training_args.device))
    # §6.1 decoding, set before training: Seq2SeqTrainer's generation-based evaluation would otherwise fill the
    # global defaults (max_length 20) into it.
    model.generation_config = paper_generation_config(config)
    budget = f"at most {options.max_time / 60:.1f} minutes" if options.max_time is not None else "no time limit"
    print(
        f"Model: {options.preset}, {sum(p.numel() for p in model.parameters()):,} parameters; training with "
        f"{budget}, {options.schedule} schedule (lr {lr:g}, warmup {options.warmup_steps}), batches of <= "
        f"{options.max_tokens} tokens per side",
        flush=True,
    )
    trainer = VanillaSeq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer
    )
    if options.curve_every is not None:
        trainer.add_callback(LearningCurveCallback(trainer, output_dir / CURVE_DIR, options.curve_every))
    trainer.train(resume_from_checkpoint=resume_from)
    if not trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes the results
        return None

    step = trainer.state.global_step
    available = len(list(checkpoint_dir.glob("checkpoint-*")))
    to_average = last_checkpoints(checkpoint_dir, min(options.average_last, available))
    write_averaged_model(to_average, output_dir)
    print(
        f"Trained {step} updates ({trainer.state.epoch:.2f} epochs); model folder {output_dir} = average of "
        f"{', '.join(path.name for path in to_average)}",
        flush=True,
    )

    summary: dict[str, Any] = {
        "command": options.command,
        "languages": [options.src_lang, options.tgt_lang],
        "data": data_name,
        "preset": options.preset,
        "updates": step,
        "epochs": trainer.state.epoch,
        "averaged_checkpoints": [path.name for path in to_average],
        "train": {key: value for log in trainer.state.log_history for key, value in log.items() if "train_" in key},
    }
    if test_pairs is not None and options.evaluate:
        sources, references = list(test_pairs["source"]), list(test_pairs["target"])
        summary["test"] = _evaluate_folder(output_dir, sources, references, options)
        _print_examples(test_pairs, summary["test"]["hypotheses"], options.examples)
        if len(to_average) > 1:  # what averaging (§6.1) brought: the last checkpoint alone, same decoding
            print(f"Last checkpoint alone ({to_average[-1].name}):", flush=True)
            summary["test_last_checkpoint"] = _evaluate_folder(to_average[-1], sources, references, options)
        # Attention maps of the first test sentence, shown by the model card.
        plot_attention_maps(AttentionOptions(output_dir, sources[0], out=output_dir / ATTENTION_DIR))
        if options.curve_every is not None and data_name == "multi30k":
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
        _write_model_card(output_dir, summary, options, data_name)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    result = TrainResult(output_dir, summary)
    result.results_file.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
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


def evaluate(options: EvaluateOptions) -> dict[str, Any]:
    """Translate the test set with the model's own decoding (§6.1 unless `num_beams`) and score it; returns
    `evaluation.evaluate_translations`' results (BLEU, lowercased BLEU, chrF, the signature, the hypotheses)."""
    from transformers import AutoTokenizer

    from .data import load_multi30k, read_lines
    from .evaluation import evaluate_translations, write_results_json

    model_dir = model_folder(options.model_dir)
    if (options.src is None) != (options.ref is None):
        raise WorkflowError("`--src` and `--ref` go together; pass both files or neither.")
    if options.src is not None:
        sources = read_lines(existing_file(options.src, "--src"))
        references = read_lines(existing_file(options.ref, "--ref"))
    else:
        src_lang, tgt_lang = trained_languages(model_dir)
        src_lang, tgt_lang = options.src_lang or src_lang, options.tgt_lang or tgt_lang
        pairs = load_multi30k(src_lang, tgt_lang, splits=(options.split,))[options.split]
        sources, references = list(pairs["source"]), list(pairs["target"])
    if options.output is not None:
        writable_folder(Path(options.output).parent, "--output")
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = evaluate_translations(
        model,
        tokenizer,
        sources,
        references,
        options.batch_size,
        _generation_kwargs(options.num_beams),
        progress=options.progress,
    )
    if options.output is not None:
        write_results_json(options.output, results)
    return results


# ---------------------------------------------------------------------------------------------------- translate


@dataclass(frozen=True)
class TranslateOptions:
    """Translate `sentences` with the model in `model_dir` and its own decoding (§6.1 unless `num_beams`)."""

    model_dir: str | os.PathLike
    sentences: Sequence[str]
    batch_size: int = 32
    num_beams: int | None = None


def translate(options: TranslateOptions) -> list[str]:
    """One translation per sentence, in input order."""
    from transformers import AutoTokenizer

    from .evaluation import translate as translate_batches

    model_dir = model_folder(options.model_dir)
    if not options.sentences:
        raise WorkflowError("Nothing to translate: pass sentences as arguments or on stdin.")
    model = load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generation_kwargs = _generation_kwargs(options.num_beams)
    return translate_batches(
        model, tokenizer, list(options.sentences), options.batch_size, generation_kwargs, progress=False
    )


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
    from .averaging import last_checkpoints, write_averaged_model

    if options.last is not None:
        if len(options.checkpoints) != 1:
            raise WorkflowError(f"`--last` takes one folder of checkpoints, got {len(options.checkpoints)} paths.")
        paths = last_checkpoints(options.checkpoints[0], options.last, complete_only=True)  # skips interrupted saves
    else:
        paths = [Path(path) for path in options.checkpoints]
        for path in paths:
            if not path.exists():
                raise WorkflowError(f"Checkpoint {path} does not exist. Check the path.")
    output = writable_folder(options.output, "--output")
    write_averaged_model(paths, output)
    return AverageResult(paths, output)


# ---------------------------------------------------------------------------------------------------- curve


@dataclass(frozen=True)
class CurveOptions:
    """Score the snapshots of a `train` run with `curve_every` (MODEL_DIR/curve) on Multi30k validation (languages:
    the options', else the run's, else en-de; the first `limit` sentences if given) and plot them, beside the
    curves of the `compare_curve` file if given."""

    model_dir: str | os.PathLike
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
    """Validation BLEU (greedy) of the run's snapshots into MODEL_DIR/learning_curve.json and learning_curve.png."""
    from transformers import AutoTokenizer

    from .data import load_multi30k
    from .learning_curve import CURVE_JSON, CURVE_PNG, write_learning_curve

    model_dir = model_folder(options.model_dir)
    src_lang, tgt_lang = trained_languages(model_dir)
    src_lang, tgt_lang = options.src_lang or src_lang, options.tgt_lang or tgt_lang
    pairs = load_multi30k(src_lang, tgt_lang, splits=("validation",))["validation"]
    if options.limit is not None:
        pairs = pairs.select(range(min(options.limit, len(pairs))))
    print("Learning curve: validation BLEU (greedy) of each snapshot", flush=True)
    points = write_learning_curve(
        model_dir,
        AutoTokenizer.from_pretrained(model_dir),
        list(pairs["source"]),
        list(pairs["target"]),
        batch_size=options.batch_size,
        progress=options.progress,
        compare=options.compare_curve,
    )
    return CurveResult(points, model_dir / CURVE_JSON, model_dir / CURVE_PNG)


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


def plot_attention_maps(options: AttentionOptions) -> list[Path]:
    """Encoder self-, decoder self- and encoder-decoder attention grids as PNGs; returns their paths."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from .attention_maps import plot_attention

    model = AutoModelForSeq2SeqLM.from_pretrained(options.model_dir, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
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
    "TrainOptions",
    "TrainResult",
    "TranslateOptions",
    "WorkflowError",
    "average",
    "evaluate",
    "existing_file",
    "learning_curve",
    "model_folder",
    "plot_attention_maps",
    "train",
    "trained_languages",
    "translate",
    "writable_folder",
]
