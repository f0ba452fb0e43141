"""Damaged copies of a state dict, for the converters' refusal tests."""

from collections.abc import Callable

import torch

Edit = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


def added(key: str, tensor: torch.Tensor) -> Edit:
    return lambda weights: {**weights, key: tensor}


def without(unwanted: Callable[[str], bool]) -> Edit:
    return lambda weights: {key: value for key, value in weights.items() if not unwanted(key)}
