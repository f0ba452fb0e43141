"""The error the library raises for a problem with the options of a command (`train`, `translate`, ...).

Messages speak Python: an option is named by its field in backticks (`max_length`), with its value as a keyword
argument where the value matters (`max_length=1`), and the advice names fields the same way ("Pass `device=cpu`").
The command line (cli.py) words each such field as its flag (`--max-length 1`, "Pass `--device cpu`"), so one
message serves both.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence


class OptionError(ValueError):
    """A problem with a command's options (a missing file, contradicting options, an unwritable folder), named by
    field and value (see the module docstring), raised before any long work where it can be checked up front."""


def close_matches(name: str, names: Sequence[str]) -> str:
    """A parenthesis naming the closest of `names` for an error message ("did you mean ...?"), or "" if none."""
    matches = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(matches)}?)" if matches else ""


__all__ = ["OptionError", "close_matches"]
