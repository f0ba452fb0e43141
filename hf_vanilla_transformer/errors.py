"""The error the library raises for a problem with the options of a command (`train`, `translate`, ...).

Messages speak Python: an option is named by its field in backticks (`max_length`), with its value as a keyword
argument where the value matters (`max_length=1`), and the advice names fields the same way ("Pass `device=cpu`").
The command line (cli.py) words each such field as its flag (`--max-length 1`, "Pass `--device cpu`"), so one
message serves both.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

# A field in backticks, with its value where one follows `=`: `max_length`, `max_length=1`.
FIELD = re.compile(r"`([A-Za-z_]\w*)(?:=([^`]*))?`")


class OptionError(ValueError):
    """A problem with a command's options (a missing file, contradicting options, an unwritable folder), named by
    field and value (see the module docstring), raised before any long work where it can be checked up front."""


def close_matches(name: str, names: Sequence[str]) -> str:
    """A parenthesis naming the closest of `names` for an error message ("did you mean ...?"), or "" if none."""
    matches = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(matches)}?)" if matches else ""


@dataclass(frozen=True)
class DecodingRange:
    """The values a decoding setting accepts: `low` to `high`, both included; whole numbers if `integer`; `usual`
    says what is usually set, for the message."""

    low: int | float
    high: int | float
    integer: bool
    usual: str

    def holds(self, value: object) -> bool:
        """Whether `value` is a number of this range (NaN is not: it fails both comparisons)."""
        kind = int if self.integer else int | float
        return isinstance(value, kind) and not isinstance(value, bool) and self.low <= value <= self.high


# The decoding settings that `translate`, `evaluate`, `serve` and `train` accept. Past these bounds a value is a slip
# (1e308 for 1.0), and the decoding would fail deep inside (an overflow, an allocation of the whole output up front)
# instead of here with the range.
DECODING_RANGES = {
    # α of GNMT's lp = ((5 + |Y|) / 6)^α or transformers' |Y|^α. GNMT tuned it in [0.2, 1.0], §6.1 uses 0.6, and
    # fairseq's and transformers' recipes go up to 2; a negative α favours short outputs. With |α| <= 5 neither lp
    # overflows float64 (where the beam searches compute it; α = 1e308 raised OverflowError) at any length, nor
    # float32 (3.4e38) for outputs up to 5e7 tokens, far past max_position_embeddings (1,024 by default).
    "length_penalty": DecodingRange(-5, 5, False, "the paper's is 0.6"),
    # Beams and outputs per sentence: BLEU falls past a few dozen beams (Koehn and Knowles, 2017, measured up to
    # 1,000). Each step scores beams × vocabulary tokens per sentence (1,000 × 37k floats: 150 MB); 10^6 beams failed
    # to allocate.
    "num_beams": DecodingRange(1, 1000, True, "the paper's is 4"),
    "n_best": DecodingRange(1, 1000, True, "at most the beams"),
    "num_return_sequences": DecodingRange(1, 1000, True, "at most the beams in beam search"),
    # Tokens per output: 16 times the default position table and far past any sentence; generate() allocates
    # batch × beams × (prompt + max_new_tokens) token ids up front, so that 10^12 asked for 32 TB.
    "max_new_tokens": DecodingRange(1, 16384, True, "§6.1 stops at source length + 50"),
    # Source tokens kept: a token and </s> at least; a million is past any source (the encoder's self-attention over
    # it alone would be 10^12 scores), and 2^70 overflowed the tokenizer's integer.
    "max_input_tokens": DecodingRange(2, 10**6, True, "a token and </s> at least"),
    # Sampling temperature: samplers use 0.1 to 2 (back-translation samples at 1); this leaves a factor of 100 either
    # way. Beyond float32's range (1e-300, 1e300) logits / T gave NaN probabilities.
    "temperature": DecodingRange(0.01, 100, False, "1: the model's distribution"),
}


def check_decoding(**values: object) -> None:
    """One-line errors for decoding settings outside DECODING_RANGES: each keyword is a setting's field (or ends with
    `_` and one: `test_num_beams`), its value None (the default) or a number in the setting's range."""
    for name, value in values.items():
        allowed = next(DECODING_RANGES[key] for key in DECODING_RANGES if name == key or name.endswith(f"_{key}"))
        if value is None or allowed.holds(value):
            continue
        what = "an integer" if allowed.integer else "a number"
        raise OptionError(
            f"`{name}` must be {what} from {allowed.low} to {allowed.high} ({allowed.usual}), got {value!r}."
        )


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
    "DECODING_RANGES",
    "FIELD",
    "DecodingRange",
    "OptionError",
    "Terminated",
    "check_decoding",
    "close_matches",
    "flag_wording",
    "sigterm_raises_terminated",
]
