"""An option declared once: a dataclass field whose `metadata` (`option`) holds its help, how its text is read and
what else it takes part in, as fairseq's dataclass options and transformers' HfArgumentParser do. The command line
(cli.py) makes its flags from these fields, the `--config` files and the recorded configurations are keyed by the
fields' names, and the readers below turn an option written as text (a flag's value, a string in a YAML file) into
its value, or a ValueError that says what the option must be."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    group: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Collection[str] | None = None,
    flags: Sequence[str] = (),
    metavar: str | None = None,
    nargs: str | None = None,
    const: str | None = None,
    negated: str | None = None,
    **roles: Any,
) -> Any:
    """A dataclass field that is an option: `help` (one phrase; what None means where None is allowed), the
    command-line `group` it is listed under, `parse` (text to value, of each value of a list; None: the text as it
    is), `choices`, more `flags` beside --NAME-WITH-DASHES, a `metavar`, `nargs` for a list ("+": one value or
    more), a `const` for a flag that may come without a value (`--bf16` = `--bf16 yes`), and `negated`, the flag of
    a bool field that is True by default (`--no-eval` sets `evaluate` False). A field without a default is a
    required flag. `roles` are what else the field takes part in, read by the modules that use them
    (training/options.py: `setting`, `card`, `trainer`, ...)."""
    metadata = {
        "help": help,
        "group": group,
        "parse": parse,
        "choices": choices,
        "flags": tuple(flags),
        "metavar": metavar,
        "nargs": nargs,
        "const": const,
        "negated": negated,
        **roles,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def options_of(cls: type) -> Iterator[dataclasses.Field[Any]]:
    """The fields of `cls` that are options (declared with `option`), in their order."""
    return (item for item in dataclasses.fields(cls) if "help" in item.metadata)


def with_role(cls: type, role: str) -> tuple[str, ...]:
    """The names of the options of `cls` that take part in `role` (a truthy `roles` value of `option`)."""
    return tuple(item.name for item in options_of(cls) if item.metadata.get(role))


def flag_of(item: dataclasses.Field[Any]) -> str:
    """The option's flag: `negated`'s, or --NAME-WITH-DASHES."""
    return item.metadata["negated"] or "--" + item.name.replace("_", "-")


def read(item: dataclasses.Field[Any], text: str) -> Any:
    """The value of `item` written as `text` (its `parse`, else the text); a ValueError says what it must be."""
    value = item.metadata["parse"](text) if item.metadata["parse"] is not None else text
    choices = item.metadata["choices"]
    if choices is not None and value not in choices:
        raise ValueError(f"invalid choice: {value!r} (choose from {', '.join(map(repr, choices))})")
    return value


def _checked(convert: Callable[[str], Any], accepts: Callable[[Any], bool], wording: str) -> Callable[[str], Any]:
    """A reader: `convert(text)` if it converts and `accepts` it, else the ValueError "must be WORDING, got
    'TEXT'"."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise ValueError(f"must be {wording}, got {text!r}")
        return value

    return parse


def _share_value(text: str) -> float:
    text = text.strip()
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


positive_int = _checked(int, lambda value: value >= 1, "a positive integer")
non_negative_int = _checked(int, lambda value: value >= 0, "a non-negative integer")
probability = _checked(float, lambda value: 0.0 <= value < 1.0, "a number in [0, 1)")
non_negative_float = _checked(float, lambda value: 0 <= value < float("inf"), "a number >= 0")
positive_float = _checked(float, lambda value: value > 0, "a positive number")
finite_float = _checked(float, lambda value: abs(value) < float("inf"), "a finite number")  # NaN fails too
share = _checked(_share_value, lambda value: 0 < value <= 1, "a share in (0, 1], as 0.3 or 30%")
top_p = _checked(float, lambda value: 0.0 < value <= 1.0, "a number in (0, 1]")
milliseconds = _checked(float, lambda value: 0 <= value < float("inf"), "a number of milliseconds >= 0")

__all__ = [
    "finite_float",
    "flag_of",
    "milliseconds",
    "non_negative_float",
    "non_negative_int",
    "option",
    "options_of",
    "positive_float",
    "positive_int",
    "probability",
    "read",
    "share",
    "top_p",
    "with_role",
]
