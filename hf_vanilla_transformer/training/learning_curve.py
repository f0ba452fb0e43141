"""Learning curves: validation BLEU against training minutes, from the dev evaluations during training (any run
with a validation set: `dev_curve_points` of the Trainer's log history, `write_dev_curve`), or from the snapshots a
run saved (`train` with `curve_every`, e.g. 5 minutes; Multi30k validation scored after the run:
`learning_curve(CurveOptions(...))`, the `curve` command).

The snapshots are scored after training, so the curve costs no training time; their decoding is greedy unless told
otherwise. The plot shows the run's own curve; other curves (another run's `learning_curve.json`, or reference
curves such as docs/runs/marian_learning_curves.json) join it only from a file passed as `compare`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import AutoModelForSeq2SeqLM

from ..files import MODEL_DIR, SNAPSHOT_FILE
from ..inference.loading import load_tokenizer, model_folder, trained_languages
from ..option_fields import option, positive_int
from ..parallel_text import load_multi30k
from .evaluation_budget import EvaluationClock, prefix_scorer, score_within
from .options import compare_curve_option

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

CURVE_JSON = "learning_curve.json"
CURVE_PNG = "learning_curve.png"
CURVE_DIR = "curve"


def load_comparison_curves(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The curves in a comparison file, by label; each a list of points with "minutes" and "bleu".

    The file is either a run's `learning_curve.json` (a list of points; its label is the run's folder name) or
    `{"curves": {label: [points, ...]}}` (optionally with a "description"), as docs/runs/marian_learning_curves.json.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"`compare_curve` {path} is not a readable JSON file ({error}). Pass a learning_curve.json."
        ) from None
    if isinstance(data, list):  # a run's learning_curve.json
        curves = {path.resolve().parent.name: data}
    else:
        curves = data.get("curves") if isinstance(data, dict) else None
    if not isinstance(curves, dict) or not curves:
        raise ValueError(
            f'`compare_curve` {path} holds neither a list of points nor {{"curves": {{label: points}}}} with a '
            "curve. Pass a run's learning_curve.json or a file shaped as docs/runs/marian_learning_curves.json."
        )
    for label, points in curves.items():
        if not isinstance(points, list) or not all(
            isinstance(point, dict) and {"minutes", "bleu"} <= point.keys() for point in points
        ):
            raise ValueError(
                f'`compare_curve` {path}: curve {label!r} is not a list of points with "minutes" and "bleu".'
            )
    return curves


def snapshot_folders(folder: str | Path) -> list[Path]:
    """The `step-N` snapshot folders under `folder`, in training order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"{folder} does not exist: a learning curve needs the snapshots that `train` saves with `curve_every`."
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
    clock: EvaluationClock | None = None,
) -> list[dict[str, Any]]:
    """Score the snapshots under `folder` in training order (greedy unless `generation_kwargs` say otherwise); one
    dict per snapshot with step, training seconds and minutes, target tokens and the scores. With `clock`, each one
    only while a first batch says it fits before the deadline (`score_within`): the scoring stops at the first one
    that does not, and the points cover the snapshots before it."""
    kwargs = {"num_beams": 1, **(generation_kwargs or {})}
    clock = clock or EvaluationClock(None)
    points = []
    for path in snapshot_folders(folder):
        info = json.loads((path / SNAPSHOT_FILE).read_text(encoding="utf-8"))
        model = AutoModelForSeq2SeqLM.from_pretrained(path, trust_remote_code=False)  # snapshots of this package
        score = prefix_scorer(model, tokenizer, sources, references, batch_size, kwargs, progress)
        scores = score_within(clock, score, len(sources), cut=False)
        if scores is None:
            break
        points.append(
            {
                **info,
                "minutes": round(info["seconds"] / 60, 2),
                **{key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf")},
                "decoding": scores["generation"],
            }
        )
        logger.info(f"{path.name}: {info['seconds'] / 60:.1f} min, BLEU {scores['bleu']:.2f}")
    return points


def dev_curve_points(log_history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per dev evaluation of a Trainer's `log_history` (training.DevEvaluationCallback): updates, epoch,
    wall-clock seconds and minutes of the run (evaluations included, as `max_time` counts them), dev loss, BLEU,
    chrF and the evaluation's seconds."""
    return [
        {
            "step": log["step"],
            "epoch": log.get("epoch"),
            "seconds": log.get("elapsed_seconds"),
            "minutes": round(log.get("elapsed_seconds", 0.0) / 60, 2),
            "loss": log.get("eval_loss"),
            "bleu": log["eval_bleu"],
            "chrf": log.get("eval_chrf"),
            "eval_seconds": log.get("eval_runtime"),
        }
        for log in log_history
        if "eval_bleu" in log
    ]


def write_dev_curve(
    run_dir: str | Path,
    log_history: Sequence[dict[str, Any]],
    png: str | Path,
    compare: str | Path | None = None,
    decoding: str = "greedy",
) -> list[dict[str, Any]]:
    """`dev_curve_points` into `run_dir/learning_curve.json` and their plot (beside the `compare` file's curves, if
    given) at `png`; nothing where the history holds no dev evaluation. Returns the points."""
    points = dev_curve_points(log_history)
    if points:
        (Path(run_dir) / CURVE_JSON).write_text(json.dumps(points, indent=2) + "\n", encoding="utf-8")
        comparison = load_comparison_curves(compare) if compare is not None else None
        learning_curve_figure(points, compare=comparison, ylabel=f"dev sacreBLEU ({decoding})").savefig(png, dpi=120)
    return points


def learning_curve_figure(
    points: Sequence[dict[str, Any]],
    label: str = "this run",
    compare: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    ylabel: str = "validation sacreBLEU (greedy)",
) -> Figure:
    """Validation BLEU against training minutes: the run's `points`, and the `compare` curves (by label) if given."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), layout="tight")
    axes = figure.subplots()
    axes.plot([p["minutes"] for p in points], [p["bleu"] for p in points], "o-", label=label, color="C0")
    for index, (name, curve) in enumerate((compare or {}).items(), start=1):
        minutes, bleu = [p["minutes"] for p in curve], [p["bleu"] for p in curve]
        axes.plot(minutes, bleu, "s--", label=name, color=f"C{index}", alpha=0.8)
    axes.set_xlabel("training wall-clock minutes")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    return figure


def plot_learning_curve(
    points: Sequence[dict[str, Any]],
    path: str | Path,
    label: str = "this run",
    compare: Mapping[str, Sequence[dict[str, Any]]] | None = None,
) -> Path:
    """Write `learning_curve_figure(points, label, compare)` as a PNG at `path`."""
    path = Path(path)
    learning_curve_figure(points, label, compare).savefig(path, dpi=120)
    return path


def write_learning_curve(
    model_dir: str | Path,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    snapshots: str | Path | None = None,
    batch_size: int = 64,
    progress: bool = True,
    compare: str | Path | None = None,
    png: str | Path | None = None,
    clock: EvaluationClock | None = None,
) -> list[dict[str, Any]]:
    """Score the snapshots (default `model_dir/curve`; with `clock`, those that fit before its deadline, see
    `evaluate_snapshots`) and write `learning_curve.json` into `model_dir` and the plot to `png` (default
    `model_dir/learning_curve.png`; `train` puts it into the model folder, the JSON stays in the run folder); the
    plot adds the curves of the `compare` file (see `load_comparison_curves`) if given. No snapshot scored: no
    files."""
    model_dir = Path(model_dir)
    comparison = load_comparison_curves(compare) if compare is not None else None  # checked before the scoring
    points = evaluate_snapshots(
        snapshots or model_dir / CURVE_DIR, tokenizer, sources, references, None, batch_size, progress, clock
    )
    if not points:
        return points
    (model_dir / CURVE_JSON).write_text(json.dumps(points, indent=2) + "\n", encoding="utf-8")
    plot_learning_curve(points, png or model_dir / CURVE_PNG, compare=comparison)
    return points


@dataclass(frozen=True)
class CurveOptions:
    """Score the snapshots of a `train` run with `curve_every` (RUN/curve, `run_dir` is the run's `output_dir`) on
    Multi30k validation (languages: the options', else the run's, else en-de; the first `limit` sentences if given)
    and plot them, beside the curves of the `compare_curve` file if given."""

    run_dir: str | os.PathLike
    src_lang: str | None = option(None, help="default: the run's (results.json) or en")
    tgt_lang: str | None = option(None, help="default: the run's or de")
    batch_size: int = option(64, help="sentences per batch", parse=positive_int)
    limit: int | None = option(None, help="score only the first N validation sentences", parse=positive_int)
    compare_curve: str | os.PathLike | None = compare_curve_option()
    progress: bool = option(True, help="no progress bars", negated="--no-progress")
    # `train`'s evaluation budget: the snapshots scored while they fit before its deadline (None: all of them).
    clock: EvaluationClock | None = None


@dataclass(frozen=True)
class CurveResult:
    """The scored snapshots and the files written: RUN/learning_curve.json and the plot (none where no snapshot
    was scored); `skipped`: the snapshots that `clock` left out, by folder name."""

    points: list[dict[str, Any]]
    json: Path
    png: Path
    skipped: list[str]


def learning_curve(options: CurveOptions) -> CurveResult:
    """Validation BLEU (greedy) of the run's snapshots into RUN/learning_curve.json, and learning_curve.png into the
    model folder RUN/model (the card shows it). A run folder of the layout before RUN/model (the model at RUN's
    top level) gets both at its top level."""
    run_dir = Path(options.run_dir)
    model_dir = run_dir / MODEL_DIR if (run_dir / MODEL_DIR).is_dir() else run_dir
    model_dir = model_folder(model_dir, None, name="`run_dir`")  # a run of `train`: this package's model
    src_lang, tgt_lang = trained_languages(model_dir, options.src_lang, options.tgt_lang)
    pairs = load_multi30k(src_lang, tgt_lang, splits=("validation",))["validation"]
    if options.limit is not None:
        pairs = pairs.select(range(min(options.limit, len(pairs))))
    logger.info("Learning curve: validation BLEU (greedy) of each snapshot")
    points = write_learning_curve(
        run_dir,
        load_tokenizer(model_dir),
        list(pairs["source"]),
        list(pairs["target"]),
        batch_size=options.batch_size,
        progress=options.progress,
        compare=options.compare_curve,
        png=model_dir / CURVE_PNG,
        clock=options.clock,
    )
    skipped = [path.name for path in snapshot_folders(run_dir / CURVE_DIR)[len(points) :]]
    return CurveResult(points, run_dir / CURVE_JSON, model_dir / CURVE_PNG, skipped)


__all__ = [
    "CURVE_DIR",
    "CURVE_JSON",
    "CURVE_PNG",
    "CurveOptions",
    "CurveResult",
    "dev_curve_points",
    "evaluate_snapshots",
    "learning_curve",
    "learning_curve_figure",
    "load_comparison_curves",
    "plot_learning_curve",
    "snapshot_folders",
    "write_dev_curve",
    "write_learning_curve",
]
