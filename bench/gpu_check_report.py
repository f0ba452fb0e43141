"""The report of bench/gpu_check.sh: (a)-(d) from the files it wrote in OUT_DIR, one line each (and the `train` log
lines that say what the GPU recipe ran with). A step that left no numbers (a failure, its time limit) says so.

Usage: python -m bench.gpu_check_report OUT_DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

PAPER_STEPS = 100_000  # §5.2: the base models' 100,000 steps, 12 hours on 8 P100 GPUs
PAPER_HOURS = 12.0
LOOP_GOAL = 0.9  # the loop's target tok/s over the model step's
_LOOP = re.compile(r"Loop: ([\d.]+) updates/s, ([\d,]+) target tok/s")
_COMPILING = re.compile(r"torch\.compile: .*?(\d+) s compiling in (all|\d+ updates)")
_STATED = ("Device: ", "Precision: ", "TF32: ", "Compile: ", "CUDA graphs: ", "Static batch shapes: ")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def loop_rate(log: str) -> tuple[float, float] | None:
    """(updates/s, target tok/s) of a `train` log's "Loop:" line, or None."""
    match = _LOOP.search(log)
    return (float(match[1]), float(match[2].replace(",", ""))) if match else None


def _rows(bench: dict[str, Any] | None) -> dict[str, Any] | None:
    """The train section's rows of one precision (bf16 where measured, else fp32)."""
    train = (bench or {}).get("train") or {}
    return train.get("bf16") or train.get("fp32")


def _rate(rows: dict[str, Any], name: str) -> float | None:
    row = rows.get(name)
    return row["target_tokens_per_s"]["median"] if row else None


def base_step(out: Path) -> str:
    rows = _rows(_json(out / "base_step.json")) or _rows(_json(out / "base_step_eager.json"))  # compiled, else eager
    if rows is None:
        return "(a) base model step: not measured (see base_step.log)"
    cells = [
        f"{name} {rate:,.0f}"
        for name in ("ours", "marian", "ours_compiled", "marian_compiled")
        if (rate := _rate(rows, name)) is not None
    ]
    ratios = [
        f"{name.removeprefix('ratio_')} {rows[name]['median']:.2f}x"
        for name in ("ratio_ours_over_marian", "ratio_ours_compiled_over_marian_compiled")
        if name in rows
    ]
    return f"(a) base model step, target tok/s: {', '.join(cells)}; {', '.join(ratios)}"


def loop_over_step(out: Path) -> str:
    loop = loop_rate(_text(out / "train_gpu.log"))
    rows = _rows(_json(out / "gpu_recipe_step.json"))
    step = _rate(rows, "ours") if rows else None
    if loop is None or step is None:
        return f"(b) loop over model step: not measured (loop {loop}, model step {step})"
    ratio = loop[1] / step
    verdict = "meets" if ratio >= LOOP_GOAL else "misses"
    return (
        f"(b) loop over model step: {loop[1]:,.0f} / {step:,.0f} target tok/s = {ratio:.2f} ({verdict} the goal of "
        f"{LOOP_GOAL}); {loop[0]:.1f} updates/s"
    )


def gpu_recipe(out: Path) -> list[str]:
    log = _text(out / "train_gpu.log")
    stated = [line.strip() for line in log.splitlines() if line.strip().startswith(_STATED)]
    results = _json(out / "train-gpu" / "model" / "results.json")
    if results is None:
        return [*stated, "(c) multi30k-gpu: no results.json (see train_gpu.log)"]
    compiling = _COMPILING.findall(log)
    compile_text = f"{compiling[-1][0]} s compiling" if compiling else "no compile reported"
    train = results.get("train", {})
    test = results.get("test")
    score = f"test_2016 BLEU {test['bleu']:.2f} (goal >= 40.0)" if test else "test_2016 not scored (--no-eval)"
    return [
        *stated,
        f"(c) multi30k-gpu: {score}, "
        f"{train.get('train_runtime', float('nan')):.0f} s of training ({compile_text}) for {results['updates']} "
        f"updates, {results.get('seconds', float('nan')):.0f} s for the whole command",
    ]


def paper_base_hours(out: Path) -> str:
    loop = loop_rate(_text(out / "paper_base.log"))
    if loop is None:
        return "(d) paper-base: no loop rate (see paper_base.log)"
    hours = PAPER_STEPS / loop[0] / 3600
    return (
        f"(d) paper-base: {loop[0]:.2f} updates/s -> {hours:.1f} h for {PAPER_STEPS:,} steps on this one device (the "
        f"paper: {PAPER_HOURS:g} h on 8 P100)"
    )


def report(out: Path) -> list[str]:
    return [base_step(out), loop_over_step(out), *gpu_recipe(out), paper_base_hours(out)]


if __name__ == "__main__":
    print("\n".join(report(Path(sys.argv[1]))))
