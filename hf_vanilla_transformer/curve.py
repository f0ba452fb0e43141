"""Learning curves: validation BLEU of the snapshots a run saved (`train --curve-every 5m`) against training minutes,
plotted beside the peer's curves (transformers' `MarianMTModel` trained with the paper's recipe on the same data and
a machine like this one, measured in the project's quality_anchor.md).

The snapshots are scored after training, so the curve costs no training time; their decoding is greedy (as the
peer's curves) unless told otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .evaluation import evaluate_translations
from .training import SNAPSHOT_FILE

CURVE_JSON = "learning_curve.json"
CURVE_PNG = "learning_curve.png"

# quality_anchor.md (measured 2026-11-22): the peer's validation greedy sacreBLEU against target tokens seen
# (millions), and its training throughput (target tokens per second) on 2 CPU cores, which turns tokens into
# minutes on this kind of machine.
PEER_CURVES: dict[str, tuple[float, list[tuple[float, float]]]] = {
    "MarianMTModel d256 3+3, P_drop 0.3, inverse_sqrt (bf16, 1,657 tok/s)": (
        1657,
        [(1.8, 3.8), (3.6, 21.2), (5.3, 30.9), (7.1, 33.9), (8.0, 35.5), (8.9, 36.3), (10.7, 37.4), (12.5, 38.1),
         (17.8, 38.4), (25.0, 39.5)],
    ),
    "MarianMTModel d128 4+4, P_drop 0.3, inverse_sqrt (fp32, 2,866 tok/s)": (
        2866,
        [(1.8, 9.1), (3.6, 25.0), (5.3, 31.3), (7.1, 32.6), (8.0, 33.8), (8.9, 34.2), (10.7, 36.0)],
    ),
}  # fmt: skip


def snapshot_folders(folder: str | Path) -> list[Path]:
    """The `step-N` snapshot folders under `folder`, in training order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"{folder} does not exist: a learning curve needs the snapshots of `train --curve-every ...`."
        )
    found = [path for path in folder.glob("step-*") if (path / SNAPSHOT_FILE).is_file()]
    if not found:
        raise ValueError(f"{folder} holds no snapshots (step-N folders with {SNAPSHOT_FILE}).")
    return sorted(found, key=lambda path: int(path.name.split("-")[1]))


def evaluate_snapshots(
    folder: str | Path,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    generation_kwargs: dict[str, Any] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Score every snapshot under `folder` (greedy unless `generation_kwargs` say otherwise); one dict per snapshot
    with step, training seconds and minutes, target tokens and the scores."""
    from transformers import AutoModelForSeq2SeqLM

    kwargs = {"num_beams": 1, **(generation_kwargs or {})}
    points = []
    for path in snapshot_folders(folder):
        info = json.loads((path / SNAPSHOT_FILE).read_text(encoding="utf-8"))
        model = AutoModelForSeq2SeqLM.from_pretrained(path)
        scores = evaluate_translations(model, tokenizer, sources, references, batch_size, kwargs, progress=progress)
        points.append(
            {
                **info,
                "minutes": round(info["seconds"] / 60, 2),
                **{key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf")},
                "decoding": scores["generation"],
            }
        )
        print(f"{path.name}: {info['seconds'] / 60:.1f} min, BLEU {scores['bleu']:.2f}", flush=True)
    return points


def plot_learning_curve(
    points: Sequence[dict[str, Any]], path: str | Path, label: str = "this run", peer: bool = True
) -> Path:
    """Validation BLEU against training minutes (PNG at `path`), with the peer's curves unless `peer=False`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.plot([p["minutes"] for p in points], [p["bleu"] for p in points], "o-", label=label, color="C0")
    if peer:
        for (name, (tokens_per_second, curve)), color in zip(PEER_CURVES.items(), ("C1", "C2"), strict=True):
            minutes = [millions * 1e6 / tokens_per_second / 60 for millions, _ in curve]
            axes.plot(minutes, [bleu for _, bleu in curve], "s--", label=f"peer: {name}", color=color, alpha=0.8)
    axes.set_xlabel("training wall-clock minutes (2 CPU cores)")
    axes.set_ylabel("validation sacreBLEU (greedy)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_learning_curve(
    model_dir: str | Path,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    snapshots: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Score the snapshots (default `model_dir/curve`) and write `learning_curve.json` and `learning_curve.png`
    into `model_dir`."""
    model_dir = Path(model_dir)
    points = evaluate_snapshots(
        snapshots or model_dir / "curve", tokenizer, sources, references, batch_size=batch_size, progress=progress
    )
    (model_dir / CURVE_JSON).write_text(json.dumps(points, indent=2) + "\n", encoding="utf-8")
    plot_learning_curve(points, model_dir / CURVE_PNG)
    return points


__all__ = ["PEER_CURVES", "evaluate_snapshots", "plot_learning_curve", "snapshot_folders", "write_learning_curve"]
