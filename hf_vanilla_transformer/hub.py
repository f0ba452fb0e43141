"""Uploading a model folder to the Hugging Face Hub (`push(PushOptions(...))`, the `push` command and `train`'s
`push_to_hub`), and the token it needs (`hub_token`), checked before a long run."""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, get_token
from huggingface_hub.errors import HfHubHTTPError

from .errors import OptionError
from .files import MODEL_DIR, RESULTS_FILE
from .inference.loading import model_folder


@dataclass(frozen=True)
class PushOptions:
    """Upload the model folder `model_dir` (RUN/model of `train`, or a converted folder) to the Hub repository
    `repo_id`, created (`private` if asked) when missing; `revision`: a branch, created when missing; `force`:
    replace a repository that holds other files (they are deleted in the same commit)."""

    model_dir: str | os.PathLike
    repo_id: str
    private: bool = False
    revision: str | None = None
    force: bool = False


@dataclass(frozen=True)
class PushResult:
    """The files uploaded (relative to the model folder) and the commit's URL."""

    files: list[str]
    url: str


def hub_token(option: str) -> str:
    """The Hugging Face token huggingface_hub would use (HF_TOKEN, `hf auth login`'s file), after checking that
    the machine is not set offline; `option` (the field or command that uploads) names it in the errors."""
    if constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise OptionError(
            f"`{option}`: this machine is set offline (HF_HUB_OFFLINE=1), so nothing can be uploaded. Unset "
            "HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) on a machine with a connection."
        )
    token = get_token()
    if not token:
        raise OptionError(
            f"`{option}`: no Hugging Face token found. Run `hf auth login`, or set HF_TOKEN to a token with write "
            "access."
        )
    return token


def _connection_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a Hub request that got no answer: the transport errors of the HTTP library huggingface_hub
    uses (httpx2 in huggingface_hub 2, httpx in 1) and ConnectionError (not every OSError: a local file that
    cannot be read is no connection problem)."""
    errors: list[type[BaseException]] = [ConnectionError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(name).TransportError)
    return tuple(errors)


def push(options: PushOptions) -> PushResult:
    """Upload exactly the model's files (model_card.hub_files: weights, configs, every tokenizer file, the code
    files, the card, the figures, results.json) in one commit; the card's examples are pointed at `repo_id` first
    (a `train` folder's card rendered again from results.json and config.json, a converted folder's rewritten), so
    they load the repository."""
    # Here, not at the top: model_card renders with jinja2, an optional dependency that only uploads need.
    from model_card import RepositoryNotEmptyError, card_for_repository, hub_files, push_folder_to_hub

    folder = Path(options.model_dir)
    if not (folder / "config.json").is_file() and (folder / MODEL_DIR / "config.json").is_file():
        raise OptionError(
            f"`model_dir` {folder} is a run folder of `train`; pass its model folder, {folder / MODEL_DIR}."
        )
    model_dir = model_folder(folder, None, tokenizer=False)
    try:
        files = hub_files(model_dir)
    except ValueError as error:
        raise OptionError(f"`model_dir` {model_dir}: {error}") from None
    token = hub_token("push")
    try:
        card = card_for_repository(model_dir, options.repo_id)
    except (ValueError, KeyError, TypeError) as error:  # not JSON, or not the results `train` writes
        raise OptionError(
            f"{model_dir / RESULTS_FILE} is damaged ({type(error).__name__}: {error}); the card is rendered from it. "
            "Restore it from the run, or delete it to upload the folder's README.md as it is."
        ) from None
    try:
        commit = push_folder_to_hub(
            model_dir,
            options.repo_id,
            private=options.private,
            token=token,
            revision=options.revision,
            card=card,
            replace=options.force,
        )
    except RepositoryNotEmptyError as error:
        shown = ", ".join(error.others[:5]) + (f" and {len(error.others) - 5} more" if len(error.others) > 5 else "")
        raise OptionError(
            f"Hub repository {options.repo_id} already holds files that are not this model's ({shown}); uploading "
            "would mix two models. Pass `force` to replace its content (those files are deleted in the same "
            "commit), or choose another `repo_id`."
        ) from None
    except _connection_errors() as error:  # connection refused, DNS failure, timeout: no answer from the Hub
        raise OptionError(
            f"cannot reach the Hub at {constants.ENDPOINT} ({type(error).__name__}: {error}); this machine looks "
            "offline. Push from a machine with a connection (or check HF_ENDPOINT and proxies)."
        ) from None
    except HfHubHTTPError as error:  # the Hub answered with an error: a rejected token, a name taken by another user
        first_line = str(error).splitlines()[0]
        raise OptionError(f"the Hub refused the upload to {options.repo_id}: {first_line}") from None
    return PushResult(files, commit.commit_url)


__all__ = ["PushOptions", "PushResult", "hub_token", "push"]
