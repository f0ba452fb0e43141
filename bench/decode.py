"""The decoding table of `python -m bench.bench --sections decode` (`make bench`): tiny and base, greedy and beam 4,
batch 1 and 16, fp32 / bf16 / int8; ours against Marian interleaved in one process, against CTranslate2 (at both of
its CPU settings, each in its own process) as ratios of medians; then the targets each row is held to."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bench import common
from bench.generate import ct2_generation, ct2_tokens, ctranslate2_translators
from hf_vanilla_transformer.inference.quantization import quantize_int8

DECODE_DTYPES = ("fp32", "bf16", "int8")
# CTranslate2's compute type for each of our dtypes.
CT2_COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8"}
# CTranslate2's two CPU backends, chosen by CT2_USE_MKL when it loads: Intel's MKL (its default on Intel CPUs) or
# oneDNN and its own kernels (its default elsewhere). The decoding table runs both, each in its own process, and
# compares every row with the faster one: CTranslate2 "with its best settings for the host". MKL is x86 only.
CT2_SETTINGS = {"mkl_off": "0", "mkl_on": "1"}


def int8_models(models: dict[str, nn.Module]) -> dict[str, nn.Module]:
    """int8 linear layers on both sides: ours through `quantize_int8` (the project's int8 path), Marian through
    PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`, int8 weights and per-batch int8
    activations: what a MarianMTModel user has in PyTorch itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        marian = torch.ao.quantization.quantize_dynamic(models["marian"], {nn.Linear}, dtype=torch.qint8)
    return {"ours": quantize_int8(models["ours"]), "marian": marian}


def decode_models(size: dict[str, int], dtype: str) -> dict[str, nn.Module]:
    """The models timed for one dtype: ours and Marian (fp32 weights; under bf16 both run in bf16 autocast), plus,
    for bf16, ours with bf16 weights (`model.to(torch.bfloat16)`, no autocast)."""
    models = common.build_models(size)
    if dtype == "bf16":
        bf16_weights = common.build_models(size)["ours"].to(torch.bfloat16)
        models["ours_bf16_weights"] = bf16_weights
    elif dtype == "int8":
        models = int8_models(models)
    return models


def ct2_decode_worker(configs: list[str], reps: int, warmup: int) -> dict[str, Any]:
    """In a fresh process: CTranslate2 on every case of the decoding table, its compute types interleaved; seconds
    per call, or a string saying why a compute type is missing on this CPU."""
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types("cpu")
    result: dict[str, Any] = {}
    for config in configs:
        size = common.CONFIGS[config]
        wanted = tuple(CT2_COMPUTE_TYPES[dtype] for dtype in DECODE_DTYPES)
        with tempfile.TemporaryDirectory() as folder:
            types = tuple(t for t in wanted if t in supported)
            translators = ctranslate2_translators(common.build_models(size)["ours"], Path(folder), types)
            for suffix, ids, mask, beams in common.generation_cases(size):
                tokens = ct2_tokens(ids, mask)
                fns = {name: ct2_generation(translator, tokens, beams) for name, translator in translators.items()}
                times = common.interleaved(fns, reps, warmup)[0]
                for dtype, compute_type in CT2_COMPUTE_TYPES.items():
                    result[f"{config}/{dtype}/{suffix}"] = times.get(
                        f"ct2_{compute_type}",
                        f"n/a (CTranslate2 has no {compute_type} on this CPU: {sorted(supported)})",
                    )
    return result


def section_decode(configs: list[str], reps: int, warmup: int) -> dict[str, Any]:
    """The decoding table: for each configuration, dtype and generation case (`generation_cases`), ours and Marian
    (and ours with bf16 weights) interleaved rep by rep, ratios the medians of per-rep ratios; then CTranslate2 on
    the same weights in its own process (`ct2_decode_worker`), ratios of medians. Exactly NEW_TOKENS new tokens."""
    result: dict[str, Any] = {}
    dtypes = [dtype for dtype in DECODE_DTYPES if dtype != "bf16" or "bf16" in common.SETTINGS.dtypes]
    for config in configs:
        size = common.CONFIGS[config]
        for dtype in dtypes:
            models = common.for_inference(decode_models(size, dtype))
            for suffix, ids, mask, beams in common.generation_cases(size):
                key = f"{config}/{dtype}/{suffix}"
                # bf16 weights need no autocast; the fp32-weight models run under it for bf16.
                fns = {
                    name: common.generation(model, ids, mask, beams, "fp32" if name == "ours_bf16_weights" else dtype)
                    for name, model in models.items()
                }
                times, _, _ = common.interleaved(fns, reps, warmup)
                row: dict[str, Any] = {}
                for name, seconds in times.items():
                    row[name] = {"seconds": common.summary(seconds)}
                for name in ("ours", "ours_bf16_weights"):
                    if name in times:
                        row[f"ratio_{name}_over_marian"] = common.paired_ratio(times["marian"], times[name])
                result[key] = row
                print(
                    f"  {key:28s} " + "  ".join(f"{n} {1e3 * statistics.median(t):.0f} ms" for n, t in times.items())
                )
    if common.SETTINGS.device.type == "cpu":
        command = [sys.executable, "-m", "bench.bench", "--threads", str(torch.get_num_threads())]
        command += ["--reps", str(reps), "--warmup", str(warmup), "--decode-configs", *configs, "--ct2-decode-worker"]
        settings = CT2_SETTINGS if platform.machine().lower() in ("x86_64", "amd64") else {"mkl_off": "0"}
        for setting, use_mkl in settings.items():
            environment = {**os.environ, "CT2_USE_MKL": use_mkl}
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=environment).stdout
            for key, times in json.loads(output.strip().splitlines()[-1]).items():
                if key in result:
                    add_ct2_times(result[key], f"ct2_{setting}", times)
        for row in result.values():
            add_best_ct2_ratios(row)
    return result


def add_ct2_times(row: dict[str, Any], column: str, times: list[float] | str) -> None:
    """CTranslate2's seconds per call (or why there are none) under `column` of a decoding-table row, and ours over
    them as ratios of medians (> 1: ours faster)."""
    if isinstance(times, str):
        row[column] = times
        return
    row[column] = {"seconds": common.summary(times)}
    for name in ("ours", "ours_bf16_weights"):
        if isinstance(row.get(name), dict):
            row[f"ratio_{name}_over_{column}"] = statistics.median(times) / row[name]["seconds"]["median"]


def add_best_ct2_ratios(row: dict[str, Any]) -> None:
    """Ours against CTranslate2's faster setting in this row (the smaller of the per-setting ratios), where there
    is one."""
    for name in ("ours", "ours_bf16_weights"):
        ratios = [row[key] for key in (f"ratio_{name}_over_ct2_{setting}" for setting in CT2_SETTINGS) if key in row]
        if ratios:
            row[f"ratio_{name}_over_ct2_best"] = min(ratios)


@dataclass(frozen=True)
class DecodeTarget:
    """A decoding target: our `variants` ("ours", "ours_bf16_weights") in `dtypes` and `cases` (None: every case),
    each at least `threshold` times as fast as `against` ("marian", or "ct2_best": CTranslate2's faster setting)."""

    description: str
    variants: tuple[str, ...]
    dtypes: tuple[str, ...]
    cases: tuple[str, ...] | None
    against: str
    threshold: float


BATCH16 = ("greedy/batch16", "beam4/batch16")
BATCH1 = ("greedy/batch1", "beam4/batch1")
DECODE_TARGETS = (
    DecodeTarget(
        "ours >= 1.5x Marian in every row", ("ours", "ours_bf16_weights"), DECODE_DTYPES, None, "marian", 1.5
    ),
    DecodeTarget("int8 >= 1.0x CTranslate2 int8 at batch 16", ("ours",), ("int8",), BATCH16, "ct2_best", 1.0),
    DecodeTarget("int8 >= 0.8x CTranslate2 int8 at batch 1", ("ours",), ("int8",), BATCH1, "ct2_best", 0.8),
    DecodeTarget("fp32 >= 1.0x CTranslate2 float32 (its faster setting)", ("ours",), ("fp32",), None, "ct2_best", 1.0),
    DecodeTarget("bf16 autocast >= 1.3x Marian under the same autocast", ("ours",), ("bf16",), None, "marian", 1.3),
    DecodeTarget("bf16 weights >= 1.3x Marian under autocast", ("ours_bf16_weights",), ("bf16",), None, "marian", 1.3),
)


def decode_targets(decode: dict[str, Any], cpu_flags: str = "") -> list[dict[str, Any]]:
    """Each of DECODE_TARGETS with the rows it covers ("config case dtype", ratio) and how many reach it. Rows
    without the ratio (a dtype not measured, CTranslate2 without that compute type) are left out. The bf16 targets
    say whether this CPU has bf16 matrix units (AMX), the CPUs they are set for."""
    targets = []
    for target in DECODE_TARGETS:
        rows = []
        for key, row in decode.items():
            config, dtype, case = key.split("/", 2)
            if dtype not in target.dtypes or (target.cases is not None and case not in target.cases):
                continue
            for name in target.variants:
                value = row.get(f"ratio_{name}_over_{target.against}")
                if isinstance(value, dict):  # ours/Marian: the summary of per-rep ratios
                    value = value["median"]
                if value is not None:
                    rows.append((f"{config} {case} {'bf16 weights' if name == 'ours_bf16_weights' else dtype}", value))
        description = target.description
        if target.dtypes == ("bf16",):
            description += " (this CPU has AMX)" if "amx_bf16" in cpu_flags else " (this CPU has no AMX)"
        met = sum(value >= target.threshold for _, value in rows)
        targets.append({"target": description, "threshold": target.threshold, "rows": rows, "met": met})
    return targets
