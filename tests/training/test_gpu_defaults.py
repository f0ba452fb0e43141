"""What `train` picks on a GPU, each by a fixed rule: checked on the CPU with torch.cuda's queries monkeypatched."""

import logging

import pytest
import torch

from hf_vanilla_transformer.model.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.training import devices
from hf_vanilla_transformer.training.compiling import LAUNCH_BOUND_FLOPS, graphs_win
from hf_vanilla_transformer.training.devices import (
    LoopRateCallback,
    describe_device,
    resolve_cuda_graphs,
    resolve_tf32,
)
from hf_vanilla_transformer.training.options import TrainOptions
from hf_vanilla_transformer.training.recipes import MULTI30K, MULTI30K_GPU, PAPER_BASE, RECIPES
from hf_vanilla_transformer.training.trainer import bf16_matrix_units, resolve_bf16

CUDA = torch.device("cuda")
# (compute capability, has bf16 units): V100, T4 (emulated bf16, no TF32), A100, H100/H200.
GPUS = {"V100": ((7, 0), False), "T4": ((7, 5), False), "A100": ((8, 0), True), "H200": ((9, 0), True)}


def _gpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    capability, units = GPUS[name]
    # torch's own answer: with emulation counted (its default), every CUDA GPU says yes.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: units or including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"NVIDIA {name}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize(("name", "bf16"), [("V100", False), ("T4", False), ("A100", True), ("H200", True)])
def test_bf16_auto_takes_bf16_only_on_gpus_with_bf16_units(monkeypatch, name, bf16) -> None:
    _gpu(monkeypatch, name)
    chosen, line = resolve_bf16("auto", CUDA)
    assert chosen is bf16
    assert (bf16_matrix_units(CUDA) is None) is not bf16
    if bf16:
        assert f"compute capability {GPUS[name][0][0]}.{GPUS[name][0][1]}" in line
    else:
        assert line.startswith("fp32 (`bf16=auto` chose fp32")


@pytest.mark.parametrize(("name", "tf32"), [("V100", None), ("T4", None), ("A100", True), ("H200", True)])
def test_tf32_is_on_from_compute_capability_8(monkeypatch, name, tf32) -> None:
    _gpu(monkeypatch, name)
    chosen, line = resolve_tf32(CUDA, None)
    assert chosen is tf32
    assert line.startswith("on for fp32 matrix products" if tf32 else "off (compute capability 7.")


def test_tf32_given_wins_and_the_cpu_leaves_it_alone(monkeypatch) -> None:
    _gpu(monkeypatch, "H200")
    assert resolve_tf32(CUDA, False) == (False, "off (the `tf32` Trainer argument)")
    assert resolve_tf32(torch.device("cpu"), None) == (None, "not applicable (a CPU)")


def test_the_device_line_names_the_gpu(monkeypatch) -> None:
    _gpu(monkeypatch, "H200")
    assert describe_device(CUDA) == "cuda:0 (NVIDIA H200, compute capability 9.0, 1 GPU(s) visible)"


@pytest.mark.parametrize(
    ("choice", "compiled", "device", "flops", "graphs"),
    [
        ("auto", True, CUDA, LAUNCH_BOUND_FLOPS / 2, True),
        ("auto", True, CUDA, LAUNCH_BOUND_FLOPS * 2, False),
        ("yes", True, CUDA, LAUNCH_BOUND_FLOPS / 2, False),  # yes: dynamic shapes, as before
        ("graphs", True, CUDA, LAUNCH_BOUND_FLOPS * 2, True),
        ("graphs", True, torch.device("cpu"), 0.0, False),  # CUDA graphs need CUDA
        ("auto", False, CUDA, 0.0, False),  # not compiled (e.g. inductor cannot work here)
    ],
)
def test_cuda_graph_rule(choice, compiled, device, flops, graphs) -> None:
    assert graphs_win(choice, compiled, device, flops)[0] is graphs


def test_auto_graphs_the_multi30k_model_not_the_paper_base_one() -> None:
    def arguments(recipe):
        config = VanillaTransformerConfig.from_preset(recipe.preset, vocab_size=recipe.vocab_size)
        return resolve_cuda_graphs(recipe.torch_compile, True, CUDA, config, recipe.max_tokens)

    graphed, line = arguments(MULTI30K_GPU)
    assert graphed == {"torch_compile_mode": "reduce-overhead", "length_buckets": 8}, line
    assert arguments(PAPER_BASE)[0] == {}  # 63M parameters x 25k tokens: arithmetic-bound


def test_every_recipe_picks_precision_and_compiling_by_the_device_rules() -> None:
    assert {(recipe.bf16, recipe.torch_compile) for recipe in RECIPES.values()} == {("auto", "auto")}


def test_the_gpu_recipe_warns_on_a_cpu_in_one_line_and_keeps_explicit_trainer_arguments(monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        options = TrainOptions.from_recipe(MULTI30K_GPU, trainer_args={"save_strategy": "epoch", "tf32": False})
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0] and "sized for a GPU" in warnings[0]
    assert options.trainer_args == {"save_strategy": "epoch", "tf32": False}
    assert TrainOptions.from_recipe(MULTI30K_GPU).trainer_args == {"save_strategy": "no"}
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        TrainOptions.from_recipe(MULTI30K)
    assert not caplog.records


def test_the_loop_rate_leaves_out_the_first_logs(monkeypatch) -> None:
    callback = LoopRateCallback()
    clock = iter([0.0, 30.0, 31.0, 32.0, 33.0])  # the first interval compiles
    monkeypatch.setattr(devices.time, "perf_counter", lambda: next(clock))
    state = type("State", (), {"global_step": 0})()
    for step, rate in zip((1, 50, 100, 150, 200), (100.0, 200.0, 9000.0, 10000.0, 11000.0), strict=True):
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss": 1.0, "tgt_tokens_per_second": rate})
    assert callback.rates() == (50.0, 10500.0)  # 50 updates a second between logs 3-5; their tok/s after the third
