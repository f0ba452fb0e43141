"""The learning-curve plot: the run's own curve alone, unless a comparison file is passed (another run's
learning_curve.json or a file of labelled curves such as docs/runs/marian_learning_curves.json)."""

import json
import re
from pathlib import Path

import pytest
from matplotlib.image import imread

from hf_vanilla_transformer.training.learning_curve import (
    learning_curve_figure,
    load_comparison_curves,
    plot_learning_curve,
)

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "runs" / "marian_learning_curves.json"
POINTS = [{"step": 10, "minutes": 5.0, "bleu": 12.5}, {"step": 20, "minutes": 10.0, "bleu": 20.0}]


def labels(figure) -> list[str]:
    return [line.get_label() for line in figure.axes[0].get_lines()]


def test_the_plot_shows_the_run_alone_without_a_comparison_file(tmp_path) -> None:
    assert labels(learning_curve_figure(POINTS)) == ["this run"]
    path = plot_learning_curve(POINTS, tmp_path / "learning_curve.png")
    assert imread(path).ndim == 3


def test_a_comparison_file_adds_its_curves(tmp_path) -> None:
    reference = load_comparison_curves(REFERENCE)
    assert len(reference) == 2 and all(label.startswith("MarianMTModel") for label in reference)
    figure = learning_curve_figure(POINTS, compare=reference)
    assert labels(figure) == ["this run", *reference]
    line = figure.axes[0].get_lines()[1]
    first = next(iter(reference.values()))
    assert list(line.get_xdata()) == [point["minutes"] for point in first]

    # Another run's learning_curve.json: one curve, named after the run's folder.
    other = tmp_path / "run-b" / "learning_curve.json"
    other.parent.mkdir()
    other.write_text(json.dumps(POINTS))
    assert labels(learning_curve_figure(POINTS, compare=load_comparison_curves(other))) == ["this run", "run-b"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not a readable JSON file"),
        ('{"curves": {}}', 'holds neither a list of points nor {"curves"'),
        ('{"curves": {"a": [{"minutes": 1}]}}', 'curve \'a\' is not a list of points with "minutes" and "bleu"'),
    ],
)
def test_a_bad_comparison_file_names_the_problem(content, message, tmp_path) -> None:
    path = tmp_path / "curves.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_comparison_curves(path)
    with pytest.raises(ValueError, match=r"`compare_curve` .*missing\.json is not a readable JSON file"):
        load_comparison_curves(tmp_path / "missing.json")
