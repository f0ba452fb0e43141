"""What a model folder shows on the Hub, checked before anything is written: the model card's language tags and
license as the Hub takes them (`check_language`, `check_license`), Hub repository ids (`check_repo_id`), and the
command lines and paths of the machine that trained, cut to file names (`public_path`, `public_command`), since the
folder with its card and results.json is what `push` uploads.

Training checks its languages and license here before any data is read; the model card (model_card/) and the
converters check what they write with the same functions. Only the standard library and huggingface_hub: these checks
need no optional dependency, so they are never skipped."""

from __future__ import annotations

import difflib
import re
import shlex
from pathlib import PurePath, PureWindowsPath

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

# The license identifiers the Hub takes in a card's `license:` field: the table of
# https://huggingface.co/docs/hub/repositories-licenses (hub-docs, docs/hub/repositories-licenses.md, at commit
# 008d54d08fd9d5d05ed2840bebb0b61111326a15), in its order. `other` goes with a `license_name`.
HUB_LICENSES = (
    *("apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m", "bigscience-bloom-rail-1.0"),
    *("bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause"),
    *("bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0"),
    *("cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0"),
    *("cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0"),
    *("cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0"),
    *("etalab-2.0", "eupl-1.1", "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0"),
    *("isc", "lppl-1.3c", "ms-pl", "mpl-2.0", "odc-by", "odbl", "openrail++", "osl-3.0", "postgresql", "ofl-1.1"),
    *("ncsa", "unlicense", "zlib", "pddl", "lgpl-lr", "deepfloyd-if-license", "llama2", "gemma", "unknown"),
    "other",
)
# A language tag as the Hub takes it: BCP-47 (RFC 5646) in its canonical case, an ISO 639 language (2 or 3 letters:
# en, de, eng), then optionally a script (Hant), a region (BR, 419) and variants. The card's `language:` gets the
# ISO 639 part, which is what the Hub's `language` field accepts; a tag with more goes to `language_bcp47` as well.
LANGUAGE_TAG = re.compile(r"[a-z]{2,3}(?:-[A-Z][a-z]{3})?(?:-(?:[A-Z]{2}|\d{3}))?(?:-(?:[a-z\d]{5,8}|\d[a-z\d]{3}))*")
# The values other than a language that the Hub's `language` field takes (a source card may carry them).
HUB_LANGUAGE_WORDS = ("multilingual", "code")
# A `license_name` for `license: other`: a short kebab-case id (multi30k-non-commercial-research).
LICENSE_NAME = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*")


def _shown(value: object) -> str:
    """A value as an error shows it: repr (a line break reads \\n), cut where it is long."""
    text = repr(value)
    if len(text) > 60:
        text = f"{text[:40]}... ({len(str(value)):,} characters)"
    return text


def _canonical_case(tag: str) -> str:
    """`tag` in BCP-47's canonical case: language lower, script title, region upper (EN-us -> en-US)."""
    parts = tag.split("-")
    cased = [parts[0].lower()]
    for part in parts[1:]:
        if len(part) == 4 and part.isalpha():
            cased.append(part.title())
        elif (len(part) == 2 and part.isalpha()) or (len(part) == 3 and part.isdigit()):
            cased.append(part.upper())
        else:
            cased.append(part.lower())
    return "-".join(cased)


def check_language(tag: object, field: str = "languages") -> str:
    """`tag` if it is a language tag the Hub takes (`LANGUAGE_TAG`: en, de, eng, pt-BR, zh-Hant), else ValueError
    naming `field`, the value and the fix: line breaks, markup, a phrase or a 5,000-character string never reach a
    card."""
    if isinstance(tag, str) and LANGUAGE_TAG.fullmatch(tag):
        return tag
    fix = "Pass a BCP-47 language tag: an ISO 639 code (en, de, fr, eng), with a script or region where it matters "
    fix += "(pt-BR, zh-Hant)."
    if isinstance(tag, str) and LANGUAGE_TAG.fullmatch(_canonical_case(tag)):
        fix = f"Write it {_canonical_case(tag)} (BCP-47's case: language lower, script Title, region UPPER)."
    raise ValueError(f"`{field}` {_shown(tag)} is not a language tag the Hub accepts. {fix}")


def check_license(
    license: object, license_name: object = None, field: str = "license", name_field: str = "license_name"
) -> dict[str, str]:
    """The card's license fields for `license` (a Hub license id, `HUB_LICENSES`) and, with `other`, `license_name`
    (a kebab-case name of the terms); ValueError naming the field, the value and the fix otherwise."""
    if license != "other" and license_name is not None:
        given = "not given" if license is None else _shown(license)
        raise ValueError(
            f"`{name_field}` {_shown(license_name)} names the terms of `{field}=other` only; `{field}` is {given}. "
            f"Drop `{name_field}`, or pass `{field}=other`."
        )
    if not isinstance(license, str) or license not in HUB_LICENSES:
        close = difflib.get_close_matches(str(license).lower(), HUB_LICENSES, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(
            f"`{field}` {_shown(license)} is not a license id of the Hub{hint}. Pass one of its ids (apache-2.0, "
            "mit, cc-by-4.0, cc-by-nc-4.0, ...: https://huggingface.co/docs/hub/repositories-licenses), or "
            f"`{field}=other` with `{name_field}` naming the terms."
        )
    if license != "other":
        return {"license": license}
    if not isinstance(license_name, str) or not LICENSE_NAME.fullmatch(license_name) or len(license_name) > 64:
        given = "none was given" if license_name is None else f"{_shown(license_name)} is not one"
        raise ValueError(
            f"`{field}=other` needs `{name_field}`, a short kebab-case name of the terms: {given}. Pass e.g. "
            f"`{name_field}=my-terms-1.0` (lowercase letters, digits, '-' and '.'; at most 64 characters)."
        )
    return {"license": "other", "license_name": license_name}


def check_repo_id(repo_id: object, field: str = "base_model") -> str:
    """`repo_id` if it is a Hub repository id (owner/name, or a bare name), else ValueError naming `field`."""
    try:
        validate_repo_id(repo_id)  # type: ignore[arg-type]
    except (HFValidationError, TypeError):
        raise ValueError(
            f"`{field}` {_shown(repo_id)} is not a Hub repository id. Pass one such as Helsinki-NLP/opus-mt-en-de."
        ) from None
    return str(repo_id)


def _is_local_path(text: str) -> bool:
    """Whether `text` names a place on this machine a card must not show: an absolute path (POSIX or Windows), one
    from the home folder, or one that climbs out of the working folder."""
    return (
        text.startswith(("/", "~"))
        or PureWindowsPath(text).is_absolute()
        or ".." in PurePath(text.replace("\\", "/")).parts
    )


def public_path(text: str) -> str:
    """`text` as a card shows it: a local path (`_is_local_path`) cut to its file name, anything else as it is."""
    if not _is_local_path(text):
        return text
    return PurePath(text.replace("\\", "/")).name or text


def public_command(command: str) -> str:
    """`command` as a card shows it: every local path in it cut to its file name (`--train-src
    /home/u/data/train.en` -> `--train-src train.en`, also `--option=/path`), so that a pushed card discloses no
    folder of the machine that trained; relative paths below the working folder and Hub ids stay as given."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: no command line this package wrote; its words as they are
        words = command.split()
    shown = []
    for word in words:
        option, equals, value = word.partition("=") if word.startswith("-") else ("", "", word)
        shown.append(option + equals + public_path(value) if equals or not option else word)
    return shlex.join(shown)


def hub_language(tag: object) -> bool:
    """Whether the Hub's `language` field takes `tag`: a language tag or one of its words (multilingual, code)."""
    return tag in HUB_LANGUAGE_WORDS or (isinstance(tag, str) and LANGUAGE_TAG.fullmatch(tag) is not None)


__all__ = [
    "HUB_LANGUAGE_WORDS",
    "HUB_LICENSES",
    "LANGUAGE_TAG",
    "check_language",
    "check_license",
    "check_repo_id",
    "hub_language",
    "public_command",
    "public_path",
]
