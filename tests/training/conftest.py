"""Helpers of the training room's tests."""

import pytest

import hf_vanilla_transformer.training.train as train_module
from hf_vanilla_transformer import cli
from hf_vanilla_transformer.training.options import TrainOptions


def cli_train_options(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> TrainOptions:
    """The TrainOptions that `hf-vanilla-transformer train ARGV` hands to `train` (nothing is trained)."""
    seen: list[TrainOptions] = []
    monkeypatch.setattr(train_module, "train", lambda options: seen.append(options))
    assert cli.main(["train", *argv]) == 0
    return seen[0]
