"""The data of a training run from its options: the training, dev and test pairs (`load_training_data`: Multi30k,
parallel files or a dataset), checked before any work (`check_training_pairs`, `check_dev_set`), and the dev set
scored during training (`dev_dataset`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from ..errors import OptionError
from ..files import existing_file
from .data import (
    check_language_pair,
    load_dataset_pairs,
    load_multi30k,
    load_parallel_files,
    pair_lengths,
    tokenize_pairs,
)
from .options import TrainOptions

logger = logging.getLogger(__name__)

# The options that choose a dataset's configuration, columns and splits: they apply to `dataset` only.
_DATASET_OPTIONS = ("dataset_config", "src_column", "tgt_column", "train_split", "valid_split", "test_split")


@dataclass(frozen=True)
class TrainingData:
    """The data of a run, each with `source` / `target` columns: `train`, the validation (dev) set scored during
    training (`valid`, None without one), the test set scored at the end (`test`), and a `name` for logs and cards."""

    train: Dataset
    valid: Dataset | None
    test: Dataset | None
    name: str


def _check_data_options(options: TrainOptions) -> None:
    """The data options that go together, or exclude each other, and the files they name."""
    for kind in ("train", "valid", "test"):
        if (getattr(options, f"{kind}_src") is None) != (getattr(options, f"{kind}_tgt") is None):
            raise OptionError(f"`{kind}_src` and `{kind}_tgt` go together; pass both files or neither.")
    if options.dataset is not None and options.train_src is not None:
        raise OptionError("Pass either `dataset` or `train_src`/`train_tgt`, not both.")
    for name in _DATASET_OPTIONS:
        if options.dataset is None and getattr(options, name) is not None:
            raise OptionError(
                f"`{name}={getattr(options, name)}` applies to `dataset`, which is not given. Pass `dataset`, or "
                "drop the option."
            )
    for kind in ("valid", "test"):
        if getattr(options, f"{kind}_split") is not None and getattr(options, f"{kind}_src") is not None:
            raise OptionError(
                f"`{kind}_split` and `{kind}_src`/`{kind}_tgt` both give the {kind} set; pass one of them."
            )
    for name in ("train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt"):
        existing_file(getattr(options, name), name, regular=True)


def load_training_data(options: TrainOptions) -> TrainingData:
    """The run's data from the options, checked before any work."""
    _check_data_options(options)
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


def check_training_pairs(data: TrainingData, options: TrainOptions) -> None:
    """Refuse training data without a single pair that has text on both sides (tokenize_pairs drops the others).
    Streams the pairs in batches, stopping at the first good one: the corpus is never held whole."""
    batches = data.train.select_columns(["source", "target"]).iter(batch_size=10_000)
    if not any(
        source.strip() and target.strip()
        for batch in batches
        for source, target in zip(batch["source"], batch["target"], strict=True)
    ):
        where = (
            f"`train_src` {options.train_src} / `train_tgt` {options.train_tgt}"
            if options.train_src is not None
            else f"the training data ({data.name})"
        )
        raise OptionError(
            f"{where}: none of the {len(data.train):,} pairs has text on both sides (all blank on a side). Check "
            "that the files are the right ones and line-aligned."
        )


def check_dev_set(options: TrainOptions, has_dev_set: bool) -> None:
    """The options that need a validation set are refused without one, naming how to give it."""
    needs = [
        option
        for option, given in (
            ("average=best", options.average == "best"),
            ("keep_best", options.keep_best),
            (f"early_stopping_patience={options.early_stopping_patience}", options.early_stopping_patience),
            (f"eval_every={options.eval_every}", options.eval_every is not None),
            (f"eval_num_beams={options.eval_num_beams}", options.eval_num_beams is not None),
        )
        if given
    ]
    if needs and not has_dev_set:
        raise OptionError(
            f"`{needs[0]}` needs a validation set, which this run has none of. Pass `valid_src`/`valid_tgt` (or a "
            "dataset with a validation split)."
        )


def dev_dataset(pairs: Dataset, tokenizer: PreTrainedTokenizerBase, options: TrainOptions) -> Dataset:
    """The first `eval_max_sentences` dev pairs, tokenized (pairs over `max_length` dropped: the model has no
    positions for them), longest first so that generation batches carry little padding and a batch too large for
    memory fails at the first evaluation."""
    pairs = pairs.select(range(min(options.eval_max_sentences, len(pairs))))
    dataset = tokenize_pairs(pairs, tokenizer, max_length=options.max_length)
    lengths, _ = pair_lengths(dataset)  # the length column tokenize_pairs wrote, not the token lists
    dataset = dataset.select(sorted(range(len(dataset)), key=lambda index: -lengths[index]))
    dropped = len(pairs) - len(dataset)
    logger.info(
        f"Dev set: {len(dataset):,} pairs scored during training"
        + (f" ({dropped} empty or over `max_length={options.max_length}` left out)" if dropped else "")
    )
    return dataset


__all__ = ["TrainingData", "check_dev_set", "check_training_pairs", "dev_dataset", "load_training_data"]
