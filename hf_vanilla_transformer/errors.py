"""The error the library raises for a problem with the options of a command (`train`, `translate`, ...).

Messages speak Python: an option is named by its field in backticks (`max_length`), with its value as a keyword
argument where the value matters (`max_length=1`), and the advice names fields the same way ("Pass `device=cpu`").
The command line (cli.py) words each such field as its flag (`--max-length 1`, "Pass `--device cpu`"), so one
message serves both.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import re
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence

# A field in backticks, with its value where one follows `=`: `max_length`, `max_length=1`.
FIELD = re.compile(r"`([A-Za-z_]\w*)(?:=([^`]*))?`")


class OptionError(ValueError):
    """A problem with a command's options (a missing file, contradicting options, an unwritable folder), named by
    field and value (see the module docstring), raised before any long work where it can be checked up front."""


def close_matches(name: str, names: Sequence[str]) -> str:
    """A parenthesis naming the closest of `names` for an error message ("did you mean ...?"), or "" if none."""
    matches = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(matches)}?)" if matches else ""


def is_finite_number(value: object) -> bool:
    """Whether `value` is an int or float (not a bool) that is finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_length_penalty(penalty: object) -> None:
    """`length_penalty` (α; train's, translate's and evaluate's): None (the model's) or a finite number."""
    if penalty is not None and not is_finite_number(penalty):
        raise OptionError(f"`length_penalty` must be a finite number (the paper's is 0.6), got {penalty!r}.")


def flag_wording(
    message: str, flags: Mapping[str, str], quoted: bool = True, negated: Mapping[str, str] | None = None
) -> str:
    """`message` in a command line's words: each field in backticks that `flags` maps becomes its flag (`max_length`
    -> `--max-length`, `max_length=1` -> `--max-length 1`; a field `negated` maps, given `=False`, becomes that
    field's flag: `evaluate=False` -> `--no-eval`), the backticks kept where `quoted` (errors) and dropped otherwise
    (progress lines). Backticked text that is no mapped field stays as it is."""
    negated = negated or {}

    def word(match: re.Match[str]) -> str:
        name, value = match.groups()
        if name in negated and value == "False" and negated[name] in flags:
            text = flags[negated[name]]
        elif name in flags:
            text = flags[name] if value is None else f"{flags[name]} {value}"
        else:
            return match.group(0)
        return f"`{text}`" if quoted else text

    return FIELD.sub(word, message)


class Terminated(BaseException):
    """SIGTERM (a `kill`, a scheduler's stop, `docker stop`) raised in the main thread, as Ctrl-C raises
    KeyboardInterrupt: the command unwinds the same way (`finally` blocks, the atomic folder writes' clean-up) and
    says where things stand, instead of dying without a word. A BaseException, so that no `except Exception` stops
    it."""


@contextlib.contextmanager
def sigterm_raises_terminated() -> Iterator[None]:
    """For the body: SIGTERM raises `Terminated` in this process, the previous handler afterwards. Processes forked
    inside the body (data loaders, `datasets` workers) inherit the handler but not the job: there SIGTERM ends them
    as it would have. Only the main thread can set a handler; elsewhere the body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def terminate(signum: int, frame: object) -> None:
        if os.getpid() != owner:  # a forked worker: the default action, as without this handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "FIELD",
    "OptionError",
    "Terminated",
    "close_matches",
    "flag_wording",
    "is_finite_number",
    "sigterm_raises_terminated",
]
