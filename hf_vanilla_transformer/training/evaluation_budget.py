"""The evaluation after training on the run's clock: with `max_time` T, the whole `train` command, evaluation
included, ends by T + 10% of T after it started (plus, at most, one first batch decoded past that point).

The rule (docs/training.md, "The evaluation after training"):
- The deadline is the command's start + T x (1 + `EVALUATION_SHARE`); without `max_time` (a budget of updates or
  epochs) there is none, and everything is evaluated as before.
- In order of importance: (1) the averaged model's test score, always computed: on the whole test set when the rate
  of a first batch says it ends before the deadline, else on the test set's first sentences that fit (at least that
  batch; past the deadline already, the first `LEAST_SENTENCES`), which the card and results.json say; (2) the
  attention maps of the card (one sentence), and its out-of-domain sentence while time is left; (3) the extras, each
  whole or not at all: the last checkpoint alone on the same sentences, then the learning-curve snapshots in
  training order, each while a first batch says it fits.
- What is skipped is logged and listed in results.json (`skipped`), each with the command that computes it later.

Why a first batch: decoding time depends on the model more than on the data. A trained model stops at its sentence's
end; an untrained one writes to §6.1's limit (source + 50 tokens, which the recipes keep): on 2 shared CPU cores,
an untrained Multi30k-sized model decoded 0.72 s per sentence greedily (65 words each) and 1.8 s with beam 8, so
test_2016 would take 30 minutes after a 1-minute run, while the 1-hour model decodes it in 12 s. A first batch of
`PROBE_SENTENCES` in the set's own order (not sorted by length, so a sample of it) measures the rate; the whole set
is then decoded in one pass, so a score is the one `evaluate` gives for the same sentences.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..inference.evaluation import evaluate_translations

logger = logging.getLogger(__name__)

# The evaluation after training ends by max_time x (1 + EVALUATION_SHARE) after the command started.
EVALUATION_SHARE = 0.1
# The first batch that measures a decoding's rate: small, since an untrained model with beam 8 takes seconds per
# sentence, and in the set's order, so that its sentences are a sample of the set's lengths.
PROBE_SENTENCES = 16
# Past the deadline, the averaged model's score (which the card needs) is of the set's first LEAST_SENTENCES: no rate
# to measure then, and a quarter of a first batch's time over the deadline.
LEAST_SENTENCES = 4


def evaluation_seconds(max_time: float, evaluation_time: float | None) -> float:
    """The seconds after `max_time` that the command may take: `evaluation_time`, else `EVALUATION_SHARE` of it."""
    return max_time * EVALUATION_SHARE if evaluation_time is None else evaluation_time


@dataclass(frozen=True)
class EvaluationClock:
    """The deadline of the evaluation after training (`clock()` time; None: no limit) and the clock it is read on."""

    deadline: float | None
    clock: Callable[[], float] = time.perf_counter

    @classmethod
    def of_run(
        cls,
        started: float,
        max_time: float | None,
        evaluation_time: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> EvaluationClock:
        """The clock of a run that began at `started` (on `clock`) with `max_time` seconds of training and
        `evaluation_time` seconds after them (None: `EVALUATION_SHARE` of `max_time`)."""
        if max_time is None:
            return cls(None, clock)
        return cls(started + max_time + evaluation_seconds(max_time, evaluation_time), clock)

    def left(self) -> float:
        """Seconds left before the deadline (negative past it; infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - self.clock()


@dataclass(frozen=True)
class Skipped:
    """Something the evaluation left out for the deadline, and the command that computes it later."""

    what: str
    command: str

    @classmethod
    def note(cls, what: str, command: str) -> Skipped:
        """The skipped item, logged as it is skipped."""
        logger.info(f"Not evaluated within the run's evaluation budget: {what}. Later: {command}")
        return cls(what, command)


def score_within(
    clock: EvaluationClock, score: Callable[[int], dict[str, Any]], total: int, cut: bool
) -> dict[str, Any] | None:
    """`score(k)` (the scores of the set's first k sentences, decoded in one pass) of as much of the set as the
    deadline allows: all of it when a first batch's rate says it fits; otherwise, with `cut`, the first sentences
    that fit (at least the first batch: a score always comes back; past the deadline, of the first
    `LEAST_SENTENCES`), without `cut` None (nothing decoded at all once the deadline is past)."""
    if clock.deadline is None:
        return score(total)
    if clock.left() <= 0:
        return score(min(LEAST_SENTENCES, total)) if cut else None
    probe = min(PROBE_SENTENCES, total)
    started = clock.clock()
    first = score(probe)
    per_sentence = (clock.clock() - started) / probe
    left = clock.left()
    if probe == total:
        return first
    if per_sentence * total <= left:
        return score(total)
    if not cut:
        return None
    fit = min(total, math.floor(left / per_sentence)) if per_sentence > 0 else total
    return score(fit) if fit > probe else first


def prefix_scorer(
    model: Any,
    tokenizer: Any,
    sources: list[str],
    references: list[str],
    batch_size: int,
    generation_kwargs: dict[str, Any] | None,
    progress: bool,
) -> Callable[[int], dict[str, Any]]:
    """`score(k)` for `score_within`: `evaluate_translations` of the first k sources against their references."""

    def score(count: int) -> dict[str, Any]:
        return evaluate_translations(
            model, tokenizer, sources[:count], references[:count], batch_size, generation_kwargs, progress
        )

    return score


__all__ = [
    "EVALUATION_SHARE",
    "LEAST_SENTENCES",
    "PROBE_SENTENCES",
    "EvaluationClock",
    "Skipped",
    "evaluation_seconds",
    "prefix_scorer",
    "score_within",
]
