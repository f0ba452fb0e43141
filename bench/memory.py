"""The memory section of `python -m bench.bench`: the peak memory of training steps, each model and dtype in a fresh
process on the CPU (resident set), the allocator's peak on a GPU."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from typing import Any

import torch

from bench.common import (
    CONFIGS,
    MODELS,
    SETTINGS,
    Batch,
    bench_batches,
    build_marian,
    build_models,
    build_ours,
    prepare,
    summary,
)
from bench.training import train_steps


def memory_worker(config: str, name: str, dtype: str) -> dict[str, float]:
    """In a fresh process: peak resident memory of training steps of one model (see bench/README.md)."""
    size = CONFIGS[config]
    batches = bench_batches(size["vocab_size"])
    torch.manual_seed(0)
    model = prepare(build_ours(size) if name.startswith("ours") else build_marian(size))
    step = train_steps(torch.compile(model) if name.endswith("_compiled") else model, batches, dtype)
    step()  # warm-up: optimizer state, allocator pools, lazily built tables, compiling
    rss_before = _status_kb("VmRSS")
    reset = _reset_peak_rss()
    step()
    peak = _status_kb("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_rss_mb": peak / 1024,
        "rss_before_steps_mb": rss_before / 1024,
        "step_peak_increase_mb": (peak - rss_before) / 1024,
        "peak_was_reset": reset,
    }


def _status_kb(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return float(line.split()[1])
    return float("nan")


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to /proc/self/clear_refs resets the peak resident set size (VmHWM) to the current one."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def section_gpu_memory(size: dict[str, int], batches: list[Batch]) -> dict[str, Any]:
    """On a GPU: the allocator's peak during one training step (after a warm-up step), per model and dtype."""
    result: dict[str, Any] = {}
    for dtype in SETTINGS.dtypes:
        for name, model in build_models(size).items():
            step = train_steps(model, batches, dtype)
            step()
            torch.cuda.reset_peak_memory_stats()
            step()
            result[f"{name}/{dtype}"] = {"peak_rss_mb": summary([torch.cuda.max_memory_allocated() / 2**20])}
            del model, step
            torch.cuda.empty_cache()
        result[f"ratio_ours_over_marian/{dtype}"] = (
            result[f"ours/{dtype}"]["peak_rss_mb"]["median"] / result[f"marian/{dtype}"]["peak_rss_mb"]["median"]
        )
    return result


def section_memory(config: str, rounds: int) -> dict[str, Any]:
    """Each (model, dtype) in its own fresh subprocess, `rounds` times, alternating the order. glibc is told to
    give every freed block of 64 KiB or more back to the system at once, so that the resident peak follows the
    live tensors rather than what the allocator happened to keep cached."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", MALLOC_TOP_PAD_="0")
    runs: dict[str, list[dict[str, float]]] = {}
    for round_ in range(rounds):
        names = [*MODELS, *(f"{name}_compiled" for name in MODELS if "compiled" in SETTINGS.modes)]
        jobs = [(name, dtype) for dtype in SETTINGS.dtypes for name in names]
        for name, dtype in jobs if round_ % 2 == 0 else reversed(jobs):
            command = [sys.executable, "-m", "bench.bench", "--config", config]
            command += ["--attn-implementation", SETTINGS.attention]
            command += ["--memory-worker", name, dtype]
            output = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
            runs.setdefault(f"{name}/{dtype}", []).append(json.loads(output.strip().splitlines()[-1]))
    result: dict[str, Any] = {}
    for key, values in runs.items():
        result[key] = {field: summary([v[field] for v in values]) for field in values[0] if field != "peak_was_reset"}
        result[key]["peak_was_reset"] = all(v["peak_was_reset"] for v in values)
    for dtype in SETTINGS.dtypes:
        for suffix in ("", "_compiled") if "compiled" in SETTINGS.modes else ("",):
            result[f"ratio_ours{suffix}_over_marian{suffix}/{dtype}"] = (
                result[f"ours{suffix}/{dtype}"]["peak_rss_mb"]["median"]
                / result[f"marian{suffix}/{dtype}"]["peak_rss_mb"]["median"]
            )
    return result
