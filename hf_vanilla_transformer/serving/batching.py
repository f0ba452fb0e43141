"""Dynamic batching: the sentences of requests from concurrent clients decoded together, one `decode` call per batch,
on one worker thread that owns the model.

A request is a list of items (key, source, token count). Items of the same key (the same decoding options) are
decoded together: the worker takes the oldest waiting item, waits at most `max_wait` seconds from that item's arrival
for more of its key, and decodes as many of them, oldest first, as fit in `max_batch_tokens` (source tokens with
padding: sentences × the longest). The other keys wait for the next batches, in arrival order. A request is answered
once all its items are decoded; `together` keeps the items of one request and key in one call whatever the budget
(seeded sampling, whose draws depend on what else is in the batch, is reproducible only alone).

Model-free: `decode(key, sources)` returns one result per source; the serving app passes the model's.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any


class QueueFullError(RuntimeError):
    """The batcher already holds `max_queue` requests."""


class ShuttingDownError(RuntimeError):
    """The batcher is closing: it takes no new requests."""


@dataclass(frozen=True)
class Item:
    """One sentence of a request: its decoding `key` (hashable; equal keys decode together), `source` and its
    number of source tokens (as the model will see them: cut to the decoding's limit)."""

    key: Hashable
    source: str
    tokens: int


@dataclass(eq=False)
class _Request:
    future: Future
    results: list[Any]
    remaining: int


@dataclass(eq=False)
class _Unit:
    """What the worker takes whole: one sentence, a request's sentences of one key (`together`), or a call."""

    request: _Request
    arrived: float
    key: Hashable = None
    indices: list[int] = field(default_factory=list)  # positions in the request's results
    sources: list[str] = field(default_factory=list)
    longest: int = 0
    call: Callable[[], Any] | None = None


class DynamicBatcher:
    """Batches `submit`ted requests into `decode(key, sources)` calls on one worker thread (module docstring).

    `max_queue`: requests admitted and not yet answered; one more raises QueueFullError. `run_exclusive(fn)` runs
    `fn` on the worker between batches (model work that must not overlap a decoding). `close()` answers every
    admitted request, then stops the worker."""

    def __init__(
        self,
        decode: Callable[[Hashable, list[str]], Sequence[Any]],
        max_batch_tokens: int,
        max_wait: float,
        max_queue: int,
    ) -> None:
        for name, value in (("max_batch_tokens", max_batch_tokens), ("max_queue", max_queue)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if not max_wait >= 0:
            raise ValueError(f"`max_wait` must be a number of seconds >= 0, got {max_wait!r}.")
        self.decode, self.max_batch_tokens, self.max_wait, self.max_queue = (
            decode,
            max_batch_tokens,
            max_wait,
            max_queue,
        )
        self._pending: deque[_Unit] = deque()
        self._admitted = 0  # requests not yet answered (waiting or being decoded)
        self._closing = False
        self._condition = threading.Condition()
        self._worker = threading.Thread(target=self._work, name="dynamic-batcher", daemon=True)

    def start(self) -> None:
        self._worker.start()

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet answered."""
        with self._condition:
            return self._admitted

    def submit(self, items: Sequence[Item], together: bool = False) -> Future:
        """A future of the request's results, one per item in order. Raises QueueFullError or ShuttingDownError."""
        if not items:
            raise ValueError("A request needs at least one item.")
        request = _Request(Future(), [None] * len(items), len(items))
        now = time.monotonic()
        units: list[_Unit] = []
        by_key: dict[Hashable, _Unit] = {}
        for index, item in enumerate(items):
            unit = by_key.get(item.key) if together else None
            if unit is None:
                unit = _Unit(request, now, item.key)
                units.append(unit)
                by_key[item.key] = unit
            unit.indices.append(index)
            unit.sources.append(item.source)
            unit.longest = max(unit.longest, item.tokens)
        return self._admit(request, units)

    def run_exclusive(self, fn: Callable[[], Any]) -> Future:
        """A future of `fn()`, run on the worker thread between batches. Raises QueueFullError or ShuttingDownError."""
        request = _Request(Future(), [None], 1)
        return self._admit(request, [_Unit(request, time.monotonic(), call=fn)])

    def close(self, timeout: float | None = None) -> None:
        """Stop taking requests, decode every admitted one (without waiting for more), then stop the worker."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout)

    def _admit(self, request: _Request, units: list[_Unit]) -> Future:
        with self._condition:
            if self._closing:
                raise ShuttingDownError("The server is shutting down and takes no new requests.")
            if self._admitted >= self.max_queue:
                raise QueueFullError(
                    f"{self._admitted} requests are waiting or being translated (the limit, max_queue)."
                )
            self._admitted += 1
            self._pending.extend(units)
            self._condition.notify_all()
        return request.future

    # ------------------------------------------------------------------------------------------------ the worker

    def _plan(self) -> tuple[list[_Unit], bool]:
        """The next batch (the oldest unit and the later ones of its key that fit in the budget, oldest first) and
        whether it is full (a unit of the key waits that does not fit). Called with the lock held."""
        head = self._pending[0]
        if head.call is not None:
            return [head], True
        batch, rows, longest = [head], len(head.sources), head.longest
        for unit in list(self._pending)[1:]:
            if unit.call is not None or unit.key != head.key:
                continue
            if (rows + len(unit.sources)) * max(longest, unit.longest) > self.max_batch_tokens:
                return batch, True
            batch.append(unit)
            rows, longest = rows + len(unit.sources), max(longest, unit.longest)
        return batch, False

    def _next_batch(self) -> list[_Unit] | None:
        """Wait for a batch to be due (full, its oldest unit waited `max_wait`, or closing); None once closed and
        empty."""
        with self._condition:
            while True:
                while not self._pending:
                    if self._closing:
                        return None
                    self._condition.wait()
                batch, full = self._plan()
                wait = batch[0].arrived + self.max_wait - time.monotonic()
                if full or wait <= 0 or self._closing:
                    for unit in batch:
                        self._pending.remove(unit)
                    return batch
                self._condition.wait(wait)

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            # A request whose client went away (its future cancelled) is not decoded.
            live = [unit for unit in batch if not unit.request.future.cancelled()]
            for unit in batch:
                if unit not in live:
                    self._finish(unit)
            if not live:
                continue
            try:
                if live[0].call is not None:
                    results = [[live[0].call()]]
                else:
                    decoded = list(self.decode(live[0].key, [source for unit in live for source in unit.sources]))
                    ends = list(itertools.accumulate(len(unit.sources) for unit in live))
                    results = [decoded[end - len(unit.sources) : end] for unit, end in zip(live, ends, strict=True)]
            except Exception as error:  # answered to the batch's requests; the worker goes on
                for unit in live:
                    self._finish(unit, error=error)
                continue
            for unit, unit_results in zip(live, results, strict=True):
                self._finish(unit, results=unit_results)

    def _finish(self, unit: _Unit, results: list[Any] | None = None, error: BaseException | None = None) -> None:
        """Record a unit's results (or error); answer its request when it was the last unit."""
        request = unit.request
        with self._condition:
            if results is not None:
                for index, result in zip(unit.indices or [0], results, strict=True):
                    request.results[index] = result
            request.remaining -= len(unit.indices) if unit.call is None else 1
            done = request.remaining == 0 or error is not None
            if request.remaining == 0:
                self._admitted -= 1
        if error is not None or done:
            try:
                if error is not None:
                    request.future.set_exception(error)
                else:
                    request.future.set_result(request.results if unit.call is None else request.results[0])
            except InvalidStateError:  # cancelled (the client went away), or failed by an earlier unit
                pass


__all__ = ["DynamicBatcher", "Item", "QueueFullError", "ShuttingDownError"]
