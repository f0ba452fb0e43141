"""`hf-vanilla-transformer` (also `python -m hf_vanilla_transformer`): train, evaluate, translate, average.

`hf-vanilla-transformer train` with no options is the main job: Multi30k EN→DE, a joint 8k BPE, the
`transformer-multi30k` preset trained inside `Seq2SeqTrainer` for a wall-clock budget, the last checkpoints
averaged (§6.1), test_2016 BLEU with the paper's decoding and example translations printed, and a Hub-ready folder
(`outputs/multi30k-en-de`) that `pipeline("translation", model=...)` loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads lazily: `--help` and argument errors come back at once
    import torch

# The main job's recipe. Deviations from the paper's base recipe (§5), chosen on Multi30k val for a budget of
# minutes on two CPU cores (quality_anchor.md has the longer runs behind them):
# - the transformer-multi30k preset (3+3 layers, d_model 256, d_ff 1024, 4 heads, P_drop 0.3): 29k pairs overfit
#   the base model, which is also 3-4x slower per token;
# - inverse_sqrt with a peak of 2e-3 reached after 400 steps instead of eq. (3) with warmup 4000: the paper's
#   warmup (sized for 25k-token batches and 100k steps) would last 30 epochs of Multi30k; a peak of 2e-3 scored
#   1.3-2 val BLEU above 1e-3 after 1,900 updates (one hour here), 1e-3 and 3e-3 both lower (docs/runs/sweep.md);
# - a joint BPE of 8,000 instead of 37,000: 29k pairs; 8k and 10k are within val noise (docs/runs/sweep.md);
# - batches of 4096 tokens per side instead of 25k: one epoch is ~127 updates instead of ~18;
# - checkpoints every minute, the last 5 averaged, instead of every 10 minutes (the run is ~14 minutes long).
DEFAULT_OUTPUT_DIR = "outputs/multi30k-en-de"
DEFAULT_PRESET = "transformer-multi30k"
DEFAULT_MAX_TIME = "14m"
DEFAULT_SCHEDULE = "inverse_sqrt"
DEFAULT_PEAK_LR = 2e-3
DEFAULT_WARMUP = 400
DEFAULT_MAX_TOKENS = 4096
DEFAULT_SAVE_EVERY = "1m"
DEFAULT_AVERAGE_LAST = 5
CHECKPOINTS = "checkpoints"
CURVE_DIR = "curve"
RESULTS_FILE = "results.json"


class CommandError(Exception):
    """A problem with the command line's values; printed as `error: ...` with exit status 2."""


def _duration(text: str) -> float:
    from .training import parse_duration

    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _writable_folder(path: Path, option: str) -> Path:
    """Create `path` if needed and check that files can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"  # one per process: torchrun's processes all check the folder
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise CommandError(
            f"`{option}` {path} is not a writable folder ({error.strerror or error}). Choose a folder you can "
            "write to."
        ) from None
    return path


def _existing_file(path: str | None, option: str) -> Path | None:
    if path is not None and not Path(path).is_file():
        raise CommandError(f"`{option}` {path} does not exist or is not a file. Check the path.")
    return Path(path) if path is not None else None


# ---------------------------------------------------------------------------------------------------- train


def _add_train_parser(subparsers: Any) -> None:
    from .configuration_vanilla_transformer import PRESETS
    from .data import DEFAULT_MAX_LENGTH, MULTI30K_LANGUAGES
    from .tokenization import DEFAULT_VOCAB_SIZE
    from .training import LR_SCHEDULES

    parser = subparsers.add_parser(
        "train",
        help="train a model (default: the Multi30k EN-DE main job, ~20 minutes on 2 CPU cores)",
        description=(
            "Train a translation model inside transformers' Seq2SeqTrainer, average the last checkpoints (§6.1), "
            "evaluate on the test set and write a Hub-ready folder. With no options: Multi30k EN->DE, preset "
            f"{DEFAULT_PRESET}, a {DEFAULT_MAX_TIME} training budget, into {DEFAULT_OUTPUT_DIR}."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = parser.add_argument_group("data (default: the bundled Multi30k)")
    data.add_argument(
        "--src-lang", default="en", help=f"source language; Multi30k has {', '.join(MULTI30K_LANGUAGES)}"
    )
    data.add_argument("--tgt-lang", default="de", help="target language")
    data.add_argument("--train-src", help="training source file, one sentence per line (.gz allowed)")
    data.add_argument("--train-tgt", help="training target file, line-aligned with --train-src")
    data.add_argument("--test-src", help="test source file (default with Multi30k: test_2016_flickr)")
    data.add_argument("--test-tgt", help="test reference file")
    data.add_argument(
        "--dataset", help="a datasets folder (save_to_disk) with a train split (and optionally test) instead"
    )
    data.add_argument(
        "--max-length",
        type=_positive_int,
        default=DEFAULT_MAX_LENGTH,
        help="drop training pairs with more tokens than this on a side (</s> included)",
    )
    data.add_argument("--max-train-pairs", type=_positive_int, help="use only the first N training pairs")

    model = parser.add_argument_group("model and tokenizer")
    model.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS), help="model size (Table 3 names)")
    model.add_argument("--dropout", type=_probability, help="P_drop (§5.4); default: the preset's")
    model.add_argument("--vocab-size", type=_positive_int, default=DEFAULT_VOCAB_SIZE, help="joint BPE size (§5.1)")
    model.add_argument("--tokenizer", help="an existing tokenizer folder instead of training a BPE")

    optim = parser.add_argument_group("optimization (§5.3, §5.4)")
    optim.add_argument(
        "--schedule",
        default=DEFAULT_SCHEDULE,
        choices=LR_SCHEDULES,
        help="'paper' = eq. (3); 'inverse_sqrt' = deviation: linear warmup to --lr, then 1/sqrt(step) (fairseq)",
    )
    optim.add_argument(
        "--lr",
        type=_positive_float,
        help=f"peak learning rate for inverse_sqrt (default {DEFAULT_PEAK_LR}); factor on eq. (3) for paper "
        "(default 1.0 = the paper)",
    )
    optim.add_argument("--warmup-steps", type=_positive_int, default=DEFAULT_WARMUP, help="the paper: 4000")
    optim.add_argument("--label-smoothing", type=_probability, default=0.1, help="epsilon_ls (§5.4)")
    optim.add_argument(
        "--max-tokens", type=_positive_int, default=DEFAULT_MAX_TOKENS, help="padded tokens per side and batch"
    )
    optim.add_argument("--grad-accum", type=_positive_int, default=1, help="batches per update")
    optim.add_argument("--seed", type=int, default=1)
    optim.add_argument(
        "--bf16",
        nargs="?",
        const="yes",
        default="no",
        choices=("auto", "yes", "no"),
        help="bf16 autocast: --bf16 (= yes), --bf16 auto (bf16 where this device multiplies bf16 at least 2x as fast "
        "as fp32, measured at start: CPUs with AVX512-BF16/AMX, GPUs; fp32 on AVX2-only CPUs, which emulate bf16 "
        "~100x slower) or --bf16 no (the default)",
    )
    optim.add_argument(
        "--attn-implementation",
        choices=("eager", "sdpa"),
        help="attention kernels for training (the same function): default eager on the CPU (PyTorch's fused CPU "
        "attention has a slow bf16 backward at these lengths: 1.5x slower steps, bench/README.md), sdpa on a GPU",
    )

    budget = parser.add_argument_group("budget and checkpoints")
    budget.add_argument(
        "--max-time",
        type=_duration,
        help=f"wall-clock training budget, e.g. 1h, 20m, 1h30m (default {DEFAULT_MAX_TIME} unless --epochs or "
        "--max-steps is given)",
    )
    budget.add_argument("--epochs", type=_positive_int, help="number of epochs")
    budget.add_argument("--max-steps", type=_positive_int, help="number of updates")
    budget.add_argument(
        "--save-every",
        type=_duration,
        default=_duration(DEFAULT_SAVE_EVERY),
        help="checkpoint interval in seconds or as 10m (the paper: 10m); checkpoints are also written each epoch",
    )
    budget.add_argument(
        "--average-last", type=_positive_int, default=DEFAULT_AVERAGE_LAST, help="checkpoints averaged (1 = last)"
    )
    budget.add_argument(
        "--curve-every",
        type=_duration,
        help="save the weights every this many seconds of training (e.g. 5m) into OUTPUT_DIR/curve and, after "
        "training, plot validation BLEU against training minutes (learning_curve.png)",
    )
    budget.add_argument("--resume", action="store_true", help="continue from the last checkpoint in the folder")
    budget.add_argument(
        "--overwrite", action="store_true", help="delete the folder's old checkpoints and start afresh"
    )

    output = parser.add_argument_group("output and evaluation")
    output.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR, help="the model folder")
    output.add_argument("--no-eval", action="store_true", help="skip the test-set evaluation")
    output.add_argument("--eval-batch-size", type=_positive_int, default=64)
    output.add_argument("--examples", type=int, default=5, help="example translations to print")
    output.add_argument("--logging-steps", type=_positive_int, default=50)
    output.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_train)


def _load_training_data(args: argparse.Namespace) -> tuple[Any, Any | None, str]:
    """(train Dataset, test Dataset or None, a name for the data) from the options, checked before any work."""
    from datasets import DatasetDict, load_from_disk

    from .data import check_language_pair, from_dataset, load_multi30k, load_parallel_files

    if (args.train_src is None) != (args.train_tgt is None):
        raise CommandError("`--train-src` and `--train-tgt` go together; pass both files or neither.")
    if (args.test_src is None) != (args.test_tgt is None):
        raise CommandError("`--test-src` and `--test-tgt` go together; pass both files or neither.")
    if args.dataset is not None and args.train_src is not None:
        raise CommandError("Pass either `--dataset` or `--train-src/--train-tgt`, not both.")
    for option in ("train_src", "train_tgt", "test_src", "test_tgt"):
        _existing_file(getattr(args, option), f"--{option.replace('_', '-')}")
    test = None
    if args.test_src is not None:
        test = load_parallel_files(args.test_src, args.test_tgt)
    if args.train_src is not None:
        train, name = load_parallel_files(args.train_src, args.train_tgt), Path(args.train_src).stem
    elif args.dataset is not None:
        if not Path(args.dataset).is_dir():
            raise CommandError(f"`--dataset` {args.dataset} is not a folder. Pass a folder written by save_to_disk.")
        loaded = load_from_disk(args.dataset)
        if isinstance(loaded, DatasetDict):
            if "train" not in loaded:
                raise CommandError(f"`--dataset` {args.dataset} has no train split (splits: {list(loaded)}).")
            if test is None and "test" in loaded:
                test = from_dataset(loaded["test"], args.src_lang, args.tgt_lang)
            loaded = loaded["train"]
        train, name = from_dataset(loaded, args.src_lang, args.tgt_lang), Path(args.dataset).name
    else:
        check_language_pair(args.src_lang, args.tgt_lang)
        multi30k = load_multi30k(args.src_lang, args.tgt_lang, splits=("train", "test"))
        train, name = multi30k["train"], "multi30k"
        test = multi30k["test"] if test is None else test
    if args.max_train_pairs is not None:
        train = train.select(range(min(args.max_train_pairs, len(train))))
    return train, test, name


def _prepare_output_dir(args: argparse.Namespace) -> tuple[Path, Path, str | None]:
    """(output folder, checkpoint folder, checkpoint to resume from) after checking what the folder holds."""
    from .averaging import checkpoint_step, last_checkpoints

    output_dir = _writable_folder(Path(args.output_dir), "--output-dir")
    checkpoint_dir = output_dir / CHECKPOINTS
    existing = sorted(checkpoint_dir.glob("checkpoint-*")) if checkpoint_dir.is_dir() else []
    if args.resume and args.overwrite:
        raise CommandError("`--resume` and `--overwrite` contradict each other; pass one.")
    if args.resume:
        if not existing:
            raise CommandError(f"`--resume` found no checkpoint in {checkpoint_dir}. Drop --resume to start afresh.")
        try:
            resume_from = last_checkpoints(checkpoint_dir, 1, complete_only=True)[0]
        except ValueError:
            raise CommandError(
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
    if existing and not args.overwrite:
        raise CommandError(
            f"`--output-dir` {output_dir} already holds checkpoints of an earlier run ({len(existing)} in "
            f"{checkpoint_dir}). Pass --resume to continue it, --overwrite to start afresh, or another --output-dir."
        )
    if existing:
        shutil.rmtree(checkpoint_dir)
        shutil.rmtree(output_dir / CURVE_DIR, ignore_errors=True)  # the old run's learning-curve snapshots
    return output_dir, checkpoint_dir, None


def run_train(args: argparse.Namespace) -> int:
    """The `train` subcommand; see the module docstring."""
    import torch
    from transformers import AutoTokenizer

    from . import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
    from .averaging import last_checkpoints, write_averaged_model
    from .data import tokenize_pairs
    from .generation_vanilla_transformer import paper_generation_config
    from .tokenization import special_token_ids, train_bpe_tokenizer
    from .training import (
        LearningCurveCallback,
        VanillaSeq2SeqTrainer,
        VanillaSeq2SeqTrainingArguments,
        resolve_bf16,
    )

    started = time.perf_counter()
    if args.tokenizer is not None and not Path(args.tokenizer).is_dir():
        raise CommandError(f"`--tokenizer` {args.tokenizer} is not a folder. Pass a folder saved by save_pretrained.")
    max_time = args.max_time
    if max_time is None and args.epochs is None and args.max_steps is None:
        max_time = _duration(DEFAULT_MAX_TIME)
    lr = args.lr if args.lr is not None else (1.0 if args.schedule == "paper" else DEFAULT_PEAK_LR)
    bf16, precision = resolve_bf16(args.bf16, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"Precision: {precision}", flush=True)
    # Built first: it checks the optimization options before any data is read or any folder touched.
    training_args = VanillaSeq2SeqTrainingArguments(
        output_dir=str(Path(args.output_dir) / CHECKPOINTS),
        lr_schedule=args.schedule,
        learning_rate=lr,
        warmup_steps=args.warmup_steps,
        label_smoothing_factor=args.label_smoothing,
        max_tokens=args.max_tokens,
        gradient_accumulation_steps=args.grad_accum,
        num_train_epochs=args.epochs if args.epochs is not None else 1000,
        max_steps=args.max_steps if args.max_steps is not None else -1,
        max_time=max_time,
        save_every=args.save_every,
        save_strategy="epoch",
        save_total_limit=max(args.average_last, 1) + 1,
        bf16=bf16,
        # Without a GPU, transformers needs to be told that the CPU is meant: for bf16 (CPU autocast), and under
        # torchrun for the processes to join a gloo group (else each trains alone and all write the same files).
        use_cpu=not torch.cuda.is_available() and (bf16 or int(os.environ.get("WORLD_SIZE", "1")) > 1),
        seed=args.seed,
        logging_steps=args.logging_steps,
        logging_first_step=True,
        disable_tqdm=args.no_progress,
        report_to=[],
    )
    train_pairs, test_pairs, data_name = _load_training_data(args)
    output_dir, checkpoint_dir, resume_from = _prepare_output_dir(args)

    print(f"Training pairs: {len(train_pairs):,} ({data_name}, {args.src_lang} -> {args.tgt_lang})", flush=True)
    if resume_from is not None:
        tokenizer = AutoTokenizer.from_pretrained(resume_from)
    elif args.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        texts = list(train_pairs["source"]) + list(train_pairs["target"])
        tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab_size)
        print(f"Trained a joint BPE of {len(tokenizer):,} tokens", flush=True)
    train_dataset = tokenize_pairs(train_pairs, tokenizer, max_length=args.max_length)

    overrides: dict[str, Any] = {"vocab_size": len(tokenizer), **special_token_ids(tokenizer)}
    if args.dropout is not None:
        overrides["P_drop"] = args.dropout
    config = VanillaTransformerConfig.from_preset(args.preset, **overrides)
    torch.manual_seed(args.seed)
    model = VanillaTransformerForConditionalGeneration(config)
    model.set_attn_implementation(args.attn_implementation or _training_attention(training_args.device))
    # §6.1 decoding, set before training: Seq2SeqTrainer's generation-based evaluation would otherwise fill the
    # global defaults (max_length 20) into it.
    model.generation_config = paper_generation_config(config)
    budget = f"at most {max_time / 60:.1f} minutes" if max_time is not None else "no time limit"
    print(
        f"Model: {args.preset}, {sum(p.numel() for p in model.parameters()):,} parameters; training with {budget}"
        f", {args.schedule} schedule (lr {lr:g}, warmup {args.warmup_steps}), batches of <= {args.max_tokens} "
        f"tokens per side",
        flush=True,
    )
    trainer = VanillaSeq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer
    )
    if args.curve_every is not None:
        trainer.add_callback(LearningCurveCallback(trainer, output_dir / CURVE_DIR, args.curve_every))
    trainer.train(resume_from_checkpoint=resume_from)
    if not trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes the results
        return 0

    step = trainer.state.global_step
    available = len(list(checkpoint_dir.glob("checkpoint-*")))
    to_average = last_checkpoints(checkpoint_dir, min(args.average_last, available))
    write_averaged_model(to_average, output_dir)
    print(
        f"Trained {step} updates ({trainer.state.epoch:.2f} epochs); model folder {output_dir} = average of "
        f"{', '.join(path.name for path in to_average)}",
        flush=True,
    )

    summary: dict[str, Any] = {
        "command": shlex.join(["hf-vanilla-transformer", *args.argv]),
        "languages": [args.src_lang, args.tgt_lang],
        "data": data_name,
        "preset": args.preset,
        "updates": step,
        "epochs": trainer.state.epoch,
        "averaged_checkpoints": [path.name for path in to_average],
        "train": {key: value for log in trainer.state.log_history for key, value in log.items() if "train_" in key},
    }
    if test_pairs is not None and not args.no_eval:
        sources, references = list(test_pairs["source"]), list(test_pairs["target"])
        summary["test"] = _evaluate_folder(output_dir, sources, references, args)
        _print_examples(test_pairs, summary["test"]["hypotheses"], args.examples)
        if len(to_average) > 1:  # what averaging (§6.1) brought: the last checkpoint alone, same decoding
            print(f"Last checkpoint alone ({to_average[-1].name}):", flush=True)
            summary["test_last_checkpoint"] = _evaluate_folder(to_average[-1], sources, references, args)
        _plot_attention(output_dir, sources[0])
        if args.curve_every is not None and data_name == "multi30k":
            summary["learning_curve"] = _learning_curve(output_dir, args)
        _write_model_card(output_dir, summary, args, data_name)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    (output_dir / RESULTS_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"Done in {summary['seconds'] / 60:.1f} minutes. Results: {output_dir / RESULTS_FILE}", flush=True)
    return 0


def _load_model(model_dir: Path) -> Any:
    """A saved model for decoding, on the GPU when there is one (evaluation is mostly beam search)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    return model.to("cuda") if torch.cuda.is_available() else model


def _evaluate_folder(model_dir: Path, sources: list[str], references: list[str], args: argparse.Namespace) -> dict:
    """Load the saved folder the way users will and score it with its own (§6.1) decoding."""
    from transformers import AutoTokenizer

    from .evaluation import evaluate_translations

    model = _load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = evaluate_translations(
        model, tokenizer, sources, references, batch_size=args.eval_batch_size, progress=not args.no_progress
    )
    print(
        f"BLEU {results['bleu']:.2f} (sacreBLEU, cased, 13a), lowercased BLEU {results['bleu_lowercase']:.2f}, "
        f"chrF {results['chrf']:.2f} on {results['n']} sentences, decoded in {results['seconds']:.0f} s",
        flush=True,
    )
    return results


def _training_attention(device: torch.device) -> str:
    """eager on the CPU, where it matches sdpa in fp32 and is 1.5x faster in bf16 training (PyTorch's fused CPU
    attention backward in bf16 is slow for sentence-length sequences); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


def _plot_attention(model_dir: Path, sentence: str) -> None:
    """Attention maps of one test sentence into `model_dir/attention`, shown by the model card."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from .attention import plot_attention

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    plot_attention(model, tokenizer, sentence, out_dir=model_dir / "attention")


def _learning_curve(model_dir: Path, args: argparse.Namespace) -> str:
    """Validation BLEU of the run's snapshots (greedy) into learning_curve.json/png; returns the PNG's name."""
    from transformers import AutoTokenizer

    from .curve import CURVE_PNG, write_learning_curve
    from .data import load_multi30k

    pairs = load_multi30k(args.src_lang, args.tgt_lang, splits=("validation",))["validation"]
    if getattr(args, "limit", None) is not None:
        pairs = pairs.select(range(min(args.limit, len(pairs))))
    print("Learning curve: validation BLEU (greedy) of each snapshot", flush=True)
    write_learning_curve(
        model_dir,
        AutoTokenizer.from_pretrained(model_dir),
        list(pairs["source"]),
        list(pairs["target"]),
        batch_size=args.eval_batch_size,
        progress=not args.no_progress,
    )
    return CURVE_PNG


def _print_examples(pairs: Any, hypotheses: list[str], count: int) -> None:
    for index in range(min(count, len(hypotheses))):
        print(f"\nSRC: {pairs[index]['source']}\nREF: {pairs[index]['target']}\nHYP: {hypotheses[index]}")
    if count:
        print(flush=True)


def _write_model_card(output_dir: Path, summary: dict, args: argparse.Namespace, data_name: str) -> None:
    try:
        from model_card import write_model_card
    except ImportError as error:  # the card is a by-product: a missing extra must not cost the trained model
        print(f"Model card not written ({error}); install the package with its model_card module.", flush=True)
        return

    results = dict(summary["test"], dataset=data_name)
    if data_name == "multi30k":
        results.update(dataset_name="Multi30k", dataset_config=f"{args.src_lang}-{args.tgt_lang}", split="test_2016")
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
        languages=[args.src_lang, args.tgt_lang],
        datasets=[data_name],
        command=summary["command"],
        extra="\n\n".join(notes) or None,
    )


# ---------------------------------------------------------------------------------------------------- evaluate


def _add_evaluate_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="score a model folder on a test set (sacreBLEU, lowercased BLEU, chrF)",
        description="Translate a test set with the model's own decoding (§6.1 by default) and score it.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("model_dir", help="a saved model folder with its tokenizer")
    parser.add_argument("--src-lang", help="Multi30k source language (default: the model's, from results.json, or en)")
    parser.add_argument("--tgt-lang", help="Multi30k target language (default: the model's, or de)")
    parser.add_argument("--split", default="test", choices=("test", "validation"), help="Multi30k split")
    parser.add_argument("--src", help="a source file instead of Multi30k (one sentence per line)")
    parser.add_argument("--ref", help="its reference file")
    parser.add_argument("--batch-size", type=_positive_int, default=64)
    parser.add_argument("--num-beams", type=_positive_int, help="override the model's beam size")
    parser.add_argument("--output", help="write the scores and hypotheses to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run_evaluate)


def _check_model_dir(path: str) -> Path:
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise CommandError(
            f"`model_dir` {path} is not a saved model folder (no config.json). Pass the --output-dir of `train` "
            "or a folder written by save_pretrained."
        )
    return folder


def run_evaluate(args: argparse.Namespace) -> int:
    """The `evaluate` subcommand."""
    from transformers import AutoTokenizer

    from .data import load_multi30k, read_lines
    from .evaluation import evaluate_translations, write_results_json

    model_dir = _check_model_dir(args.model_dir)
    if (args.src is None) != (args.ref is None):
        raise CommandError("`--src` and `--ref` go together; pass both files or neither.")
    if args.src is not None:
        sources = read_lines(_existing_file(args.src, "--src"))
        references = read_lines(_existing_file(args.ref, "--ref"))
    else:
        # A folder written by `train` records its languages in results.json.
        results_file = model_dir / RESULTS_FILE
        trained = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else {}
        src_lang, tgt_lang = trained.get("languages", ["en", "de"])
        src_lang, tgt_lang = args.src_lang or src_lang, args.tgt_lang or tgt_lang
        pairs = load_multi30k(src_lang, tgt_lang, splits=(args.split,))[args.split]
        sources, references = list(pairs["source"]), list(pairs["target"])
    if args.output is not None:
        _writable_folder(Path(args.output).parent, "--output")
    model = _load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generation_kwargs = {"num_beams": args.num_beams} if args.num_beams is not None else None
    results = evaluate_translations(
        model, tokenizer, sources, references, args.batch_size, generation_kwargs, progress=not args.no_progress
    )
    print(
        f"BLEU {results['bleu']:.2f} ({results['bleu_signature']})\n"
        f"lowercased BLEU {results['bleu_lowercase']:.2f}\nchrF {results['chrf']:.2f}\n"
        f"{results['n']} sentences in {results['seconds']:.1f} s"
    )
    if args.output is not None:
        write_results_json(args.output, results)
    return 0


# ---------------------------------------------------------------------------------------------------- translate


def _add_translate_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "translate",
        help="translate sentences (arguments, or one per line on stdin)",
        description="Translate with a saved model and its own decoding (§6.1: beam 4, alpha 0.6, source + 50).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("model_dir", help="a saved model folder with its tokenizer")
    parser.add_argument("text", nargs="*", help="sentences to translate; none: read lines from stdin")
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument("--num-beams", type=_positive_int, help="override the model's beam size")
    parser.set_defaults(func=run_translate)


def run_translate(args: argparse.Namespace) -> int:
    """The `translate` subcommand: one translation per line, in input order."""
    from transformers import AutoTokenizer

    from .evaluation import translate

    model_dir = _check_model_dir(args.model_dir)
    sources = args.text or [line.rstrip("\n") for line in sys.stdin]
    if not sources:
        raise CommandError("Nothing to translate: pass sentences as arguments or on stdin.")
    model = _load_model(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    generation_kwargs = {"num_beams": args.num_beams} if args.num_beams is not None else None
    for line in translate(model, tokenizer, sources, args.batch_size, generation_kwargs, progress=False):
        print(line)
    return 0


# ---------------------------------------------------------------------------------------------------- average


def _add_average_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "average",
        help="average checkpoints into one model folder (§6.1)",
        description=(
            "Average the weights of checkpoints (float32 accumulation) into a Hub-ready model folder. Pass the "
            "checkpoint folders, or one folder of Trainer checkpoints with --last N."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "checkpoints", nargs="+", help="checkpoint folders (or one folder of checkpoint-* with --last)"
    )
    parser.add_argument("--last", type=_positive_int, help="average the last N checkpoint-* folders of one folder")
    parser.add_argument("-o", "--output", required=True, help="the averaged model folder")
    parser.set_defaults(func=run_average)


def run_average(args: argparse.Namespace) -> int:
    """The `average` subcommand."""
    from .averaging import last_checkpoints, write_averaged_model

    if args.last is not None:
        if len(args.checkpoints) != 1:
            raise CommandError(f"`--last` takes one folder of checkpoints, got {len(args.checkpoints)} paths.")
        paths = last_checkpoints(args.checkpoints[0], args.last, complete_only=True)  # skips interrupted saves
    else:
        paths = [Path(path) for path in args.checkpoints]
        for path in paths:
            if not path.exists():
                raise CommandError(f"Checkpoint {path} does not exist. Check the path.")
    output = _writable_folder(Path(args.output), "--output")
    write_averaged_model(paths, output)
    print(f"Averaged {len(paths)} checkpoints ({', '.join(path.name for path in paths)}) into {output}")
    return 0


# ---------------------------------------------------------------------------------------------------- curve


def _add_curve_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "curve",
        help="plot validation BLEU of a run's snapshots against training minutes",
        description="Score the snapshots of `train --curve-every` (MODEL_DIR/curve) on Multi30k validation with "
        "greedy decoding; write MODEL_DIR/learning_curve.json and learning_curve.png (with the peer's curves).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("model_dir", help="the --output-dir of a `train --curve-every ...` run")
    parser.add_argument("--src-lang", help="default: the run's (results.json) or en")
    parser.add_argument("--tgt-lang", help="default: the run's or de")
    parser.add_argument("--batch-size", type=_positive_int, default=64)
    parser.add_argument("--limit", type=_positive_int, help="score only the first N validation sentences")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_curve)


def run_curve(args: argparse.Namespace) -> int:
    """The `curve` subcommand."""
    model_dir = _check_model_dir(args.model_dir)
    results_file = model_dir / RESULTS_FILE
    trained = json.loads(results_file.read_text(encoding="utf-8")) if results_file.is_file() else {}
    src_lang, tgt_lang = trained.get("languages", ["en", "de"])
    args.src_lang, args.tgt_lang = args.src_lang or src_lang, args.tgt_lang or tgt_lang
    args.eval_batch_size = args.batch_size
    print(f"Wrote {model_dir / _learning_curve(model_dir, args)}")
    return 0


# ---------------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-vanilla-transformer",
        description="The Transformer of 'Attention Is All You Need' as a Hugging Face model: train, evaluate, "
        "translate, average checkpoints, plot attention.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(subparsers)
    _add_evaluate_parser(subparsers)
    _add_translate_parser(subparsers)
    _add_average_parser(subparsers)
    _add_curve_parser(subparsers)
    from .attention import add_attention_subcommand

    add_attention_subcommand(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console script entry point; returns the exit status (2 for bad values, as argparse)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        return args.func(args)
    except (CommandError, ValueError, FileNotFoundError) as error:
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")


__all__ = ["build_parser", "main"]
