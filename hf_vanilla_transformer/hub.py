"""Uploading a model folder to the Hugging Face Hub (`push(PushOptions(...))`, the `push` command and `train`'s
`push_to_hub`), and the token it needs (`hub_token`), checked before a long run: exactly the model's files
(`hub_files`: weights, configs, every tokenizer file, the code files config.json names, the card, the figures,
results.json) in one commit through huggingface_hub (`push_folder_to_hub`). The card itself is rendered by
model_card."""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import (
    CommitInfo,
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    ModelCard,
    constants,
    get_token,
)
from huggingface_hub.errors import HfHubHTTPError
from transformers.dynamic_module_utils import get_relative_import_files

from .errors import OptionError
from .files import MODEL_DIR, MODEL_FILES, RESULTS_FILE, TARGET_TOKENIZER, TOKENIZER_FILES
from .inference.attention_maps import ATTENTION_DIR
from .inference.loading import model_folder
from .option_fields import option

# What a Hub repository of this model holds besides its code files (`code_files`); patterns match paths relative to
# the folder, one level per "/". No pickle (pytorch_model.bin) and no top-level *.py: only the code config.json
# names is uploaded.
HUB_FILES = (
    *MODEL_FILES,
    *TOKENIZER_FILES,
    *(f"{TARGET_TOKENIZER}/{name}" for name in TOKENIZER_FILES),
    f"{ATTENTION_DIR}/*.png",
    "learning_curve.png",
    # The scores and test translations of `train` (the card's model-index comes from them).
    RESULTS_FILE,
)


class RepositoryNotEmptyError(ValueError):
    """The repository holds files that are not the model's (`others`); `push_folder_to_hub(..., replace=True)`
    deletes them in the upload's commit."""

    def __init__(self, repo_id: str, others: Sequence[str]) -> None:
        self.repo_id, self.others = repo_id, list(others)
        super().__init__(f"{repo_id} holds files that are not this model's: {', '.join(self.others)}")


def code_files(output_dir: str | Path) -> list[str]:
    """The model's code files in the folder, as transformers copies them for remote code: the modules that
    config.json's `auto_map` and `custom_pipelines` name, and the modules they import relatively, transitively
    (transformers' own `get_relative_import_files`). Computed, so a helper module the model code imports is
    included and a stray `secrets_config.py` beside them is not. Raises ValueError when config.json has no
    auto_map or a named or imported module is missing."""
    output_dir = Path(output_dir)
    config = json.loads((output_dir / "config.json").read_text(encoding="utf-8"))
    if "auto_map" not in config:
        raise ValueError(
            f"{output_dir / 'config.json'} has no auto_map, so the Hub copy would not load with trust_remote_code. "
            "Save the model with hf_vanilla_transformer imported."
        )
    references = [task["impl"] for task in config.get("custom_pipelines", {}).values()]
    for value in config["auto_map"].values():
        # "module.Class", "repo--module.Class", or a [slow, fast] pair for tokenizers
        references += [item for item in (value if isinstance(value, list) else [value]) if item]
    modules = set()
    for reference in references:
        module = output_dir / (reference.split("--")[-1].rsplit(".", 1)[0] + ".py")
        if not module.is_file():
            raise ValueError(f"config.json refers to {reference} but {module} is missing. Save again.")
        try:
            modules |= {module, *(Path(path) for path in get_relative_import_files(module))}
        except FileNotFoundError as error:
            raise ValueError(f"{module} imports a module the folder lacks ({error.filename}). Save again.") from error
    return sorted(path.relative_to(output_dir).as_posix() for path in modules)


def hub_files(output_dir: str | Path, patterns: Sequence[str] = HUB_FILES) -> list[str]:
    """The folder's files to upload (relative POSIX paths, sorted): those matching `patterns`, each pattern at its
    own depth, so checkpoints/, runs/ and training_args.bin stay local, plus exactly the model's `code_files`.
    Checks the folder is a complete model whose files lie in it: a symbolic link to a file or folder outside it is
    refused (ValueError naming the link and its target), never followed."""
    output_dir = Path(output_dir)
    found = sorted(path.relative_to(output_dir).as_posix() for path in output_dir.rglob("*") if path.is_file())
    selected = [
        name
        for name in found
        if any(fnmatch.fnmatchcase(name, pattern) and name.count("/") == pattern.count("/") for pattern in patterns)
    ]
    for required, fix in (
        ("config.json", "save the model with save_pretrained"),
        ("README.md", "write the model card with model_card.write_model_card"),
    ):
        if required not in selected:
            raise ValueError(f"{output_dir} has no {required}; {fix} first.")
    if not any(name.endswith(".safetensors") for name in selected):
        raise ValueError(f"{output_dir} has no safetensors weights; save the model with save_pretrained first.")
    files = sorted({*selected, *code_files(output_dir)})
    folders = {pattern.rsplit("/", 1)[0] for pattern in patterns if "/" in pattern}  # rglob leaves linked ones out
    _refuse_links_out(output_dir, [*files, *sorted(folders)])
    return files


def _refuse_links_out(output_dir: Path, names: Sequence[str]) -> None:
    """Raise ValueError for the first of `names` (relative paths in `output_dir`) that is a symbolic link to a path
    outside the folder, naming the link and its target: the upload would send that file's content (a link's own
    content is its target's), which the folder only points at. Links inside the folder are its own files."""
    root = output_dir.resolve()
    for name in names:
        path = output_dir / name
        target = path.resolve()
        if path.is_symlink() and not target.is_relative_to(root):
            raise ValueError(
                f"{path} is a symbolic link to {target}, outside the folder; the upload would send that file without "
                "a word. Copy the file into the folder in place of the link (or remove the link) to upload it."
            )


def push_folder_to_hub(
    output_dir: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str = "Upload Vanilla Transformer",
    revision: str | None = None,
    create_pr: bool = False,
    patterns: Sequence[str] = HUB_FILES,
    card: ModelCard | None = None,
    replace: bool = False,
) -> CommitInfo:
    """Create `repo_id` if needed and upload the folder's `hub_files` in one commit (weights, config with auto_map
    and custom_pipelines, generation config, tokenizer, code files, README.md card, attention maps).

    Unlike `model.push_to_hub`, which writes a generic README.md when the repository has none, the folder's own
    card is uploaded, or `card` in its place (`card_from_results` with the repository's id). `revision`: a branch,
    created from main when missing. A repository (at `revision`) that holds files other than the model's raises
    `RepositoryNotEmptyError` before anything is uploaded, so that two models never mix in one repository; with
    `replace` those files are deleted in the upload's commit. Files of the model's names are simply updated.
    """
    files = hub_files(output_dir, patterns)
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    # .gitattributes: the Hub writes it into every new repository (the LFS rules).
    others = sorted(set(api.list_repo_files(repo_id, revision=revision)) - {*files, ".gitattributes"})
    if others and not replace:
        raise RepositoryNotEmptyError(repo_id, others)
    operations: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(
            path_in_repo=name,
            path_or_fileobj=str(card).encode()
            if name == "README.md" and card is not None
            else str(Path(output_dir) / name),
        )
        for name in files
    ]
    operations += [CommitOperationDelete(path_in_repo=name) for name in others]
    return api.create_commit(
        repo_id=repo_id, operations=operations, commit_message=commit_message, revision=revision, create_pr=create_pr
    )


@dataclass(frozen=True)
class PushOptions:
    """Upload the model folder `model_dir` (RUN/model of `train`, or a converted folder) to the Hub repository
    `repo_id`, created (`private` if asked) when missing; `revision`: a branch, created when missing; `force`:
    replace a repository that holds other files (they are deleted in the same commit)."""

    model_dir: str | os.PathLike
    repo_id: str
    private: bool = option(False, help="create the repository private")
    revision: str | None = option(None, help="upload to this branch (created from main if missing)")
    force: bool = option(
        False,
        help="replace the content of a repository that holds other files (they are deleted in the same commit)",
    )


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
    """Upload exactly the model's files (`hub_files`: weights, configs, every tokenizer file, the code files, the
    card, the figures, results.json) in one commit; the card's examples are pointed at `repo_id` first
    (a `train` folder's card rendered again from results.json and config.json, a converted folder's rewritten), so
    they load the repository."""
    # Here, not at the top: model_card renders with jinja2, an optional dependency that only uploads need.
    from model_card import card_for_repository

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


__all__ = [
    "HUB_FILES",
    "PushOptions",
    "PushResult",
    "RepositoryNotEmptyError",
    "code_files",
    "hub_files",
    "hub_token",
    "push",
    "push_folder_to_hub",
]
