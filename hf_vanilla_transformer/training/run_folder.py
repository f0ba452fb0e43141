"""The run folder of `train` (its `output_dir`): one run at a time, and `resume` only for the same run.

- The layout: RUN/checkpoints (`CHECKPOINTS`), RUN/curve (learning_curve.CURVE_DIR), run_settings.json,
  run_config.json and trainer_arguments.json, and the model folder RUN/model (files.MODEL_DIR); `RUN_LAYOUT` says
  which entries are the run's (files.py's output rule: a manifest lists them; checkpoints/ and curve/ hold only what
  the Trainer and the curve's snapshots write there). `check_output_dir` reads what the folder holds before a run
  (checkpoints to resume from, or to overwrite; a fresh run refuses a folder with anything else in it);
  `clear_for_run` makes the folder the run's and removes what the run replaces, and nothing else.

- `exclusive_run`: an exclusive lock (files.exclusive_lock: `flock` on `.NAME.lock` beside the folder), held for
  the whole run, with the holder's PID in it. The operating system drops the lock when the holder dies, however it
  dies, so a killed run never blocks its `resume`. Beside the folder, not inside it: a model folder is swapped in whole
  (files.replaced_folder; RUN/model now, the run folder itself in runs of older versions), and a lock file inside
  the swapped folder would become another file (a copy where hard links are missing, or at the old folder's path
  after the swap); beside it, it stays one file for the run's whole life. It is never
  deleted: deleting a lock file lets a waiting process lock the deleted file while a third locks a new one.
- `run_settings` / `check_same_run`: the settings that define a run (data, tokenizer, model, optimization,
  precision), written to `run_settings.json` when it starts; `resume` with any of them changed is refused,
  naming each setting and both values, before anything on disk changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OptionError
from ..files import (
    MODEL_DIR,
    MODEL_LAYOUT,
    RESULTS_FILE,
    Layout,
    check_output_folder,
    claim_folder,
    exclusive_lock,
    refuse_if_locked,
    refuse_inputs,
    remove_own,
)
from ..inference.attention_maps import ATTENTION_DIR
from ..option_fields import with_role
from .averaging import checkpoint_step, last_checkpoints
from .learning_curve import CURVE_DIR, CURVE_JSON, CURVE_PNG
from .mapped_pages import PageReleaser
from .options import TrainOptions, run_config

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import TrainingArguments

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
SETTINGS_FILE = "run_settings.json"
RUN_CONFIG_FILE = "run_config.json"
TRAINER_ARGUMENTS_FILE = "trainer_arguments.json"

# What a run writes at its folder's top level (the `curve` command adds learning_curve.json).
RUN_ENTRIES = (CHECKPOINTS, CURVE_DIR, MODEL_DIR, SETTINGS_FILE, RUN_CONFIG_FILE, TRAINER_ARGUMENTS_FILE, CURVE_JSON)
# What `train` (and `curve`) write into RUN/model after its model is averaged there: the model folder's manifest
# lists them from the start (write_averaged_model's `claims`).
MODEL_RUN_ENTRIES = ("README.md", RESULTS_FILE, ATTENTION_DIR, CURVE_PNG)


def _earlier_run_folder(folder: Path) -> bool:
    """A run folder of a version before manifests: its settings, or its Trainer checkpoints."""
    return (folder / SETTINGS_FILE).is_file() or any((folder / CHECKPOINTS).glob("checkpoint-*"))


# checkpoints/ holds the Trainer's checkpoint-N folders (and TensorBoard's runs/); curve/ the step-N snapshots.
CHECKPOINTS_LAYOUT = Layout("checkpoints", earlier=("checkpoint-*", "runs"), recognize=lambda folder: True)
CURVE_LAYOUT = Layout(
    "curve",
    earlier=("step-*",),
    recognize=lambda folder: True,
    temporary=(*MODEL_LAYOUT.temporary, ".step-*.partial"),
)
# A run folder; one of an earlier version may hold its model at the top level (the layout before RUN/model).
RUN_LAYOUT = Layout(
    "run",
    earlier=(*RUN_ENTRIES, *MODEL_LAYOUT.earlier),
    recognize=_earlier_run_folder,
    temporary=(*MODEL_LAYOUT.temporary, f".{SETTINGS_FILE}.*"),
    inside={CHECKPOINTS: CHECKPOINTS_LAYOUT, CURVE_DIR: CURVE_LAYOUT, MODEL_DIR: MODEL_LAYOUT},
)


def refuse_if_in_use(output_dir: Path) -> None:
    """Refuse (OptionError, naming the holder's PID) a run folder that another run holds (files.refuse_if_locked),
    changing nothing on disk. Checked before what the folder holds."""
    refuse_if_locked(output_dir, "output_dir", "training run")


def exclusive_run(output_dir: Path) -> AbstractContextManager[None]:
    """Hold the run folder's lock (files.exclusive_lock) for the body; a second holder is refused with its PID."""
    return exclusive_lock(output_dir, "output_dir", "training run")


def data_fingerprint(pairs: Dataset) -> str:
    """ "N pairs, sha256 X" of the training pairs (`source` / `target` columns), as text: the same data under
    another path is the same data. Streamed in batches: a corpus of any size is hashed without being held."""
    digest = hashlib.sha256()
    releaser = PageReleaser(pairs)  # the corpus is read once: its pages need not stay resident
    for batch in pairs.select_columns(["source", "target"]).iter(batch_size=10_000):
        digest.update("".join(f"{s}\t{t}\n" for s, t in zip(batch["source"], batch["target"], strict=True)).encode())
        releaser.read(len(batch["source"]))
    return f"{len(pairs)} pairs, sha256 {digest.hexdigest()[:16]}"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """ "vocabulary sha256 X" of a tokenizer: its tokens and ids, and its special tokens."""
    vocabulary = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens])
    return f"vocabulary sha256 {hashlib.sha256(vocabulary.encode()).hexdigest()[:16]}"


def read_settings(output_dir: Path) -> dict[str, Any] | None:
    """The recorded settings, None for a run from before they were recorded."""
    path = output_dir / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OptionError(
            f"`resume`: {path} is damaged ({error}); it records the run's settings. Restore it, or start afresh "
            "with `overwrite`."
        ) from None
    if not isinstance(settings, dict):
        raise OptionError(f"`resume`: {path} is not a JSON object. Restore it, or start afresh with `overwrite`.")
    # Runs of earlier versions keyed their options by flag ("--src-lang"): read as the option's name.
    return {_option_name(key): value for key, value in settings.items()}


def _option_name(key: str) -> str:
    return key[2:].replace("-", "_") if key.startswith("--") else key


def check_same_run(output_dir: Path, settings: dict[str, Any]) -> bool:
    """Refuse (OptionError) a resume whose `settings` differ from the run's; False where the run recorded none."""
    recorded = read_settings(output_dir)
    if recorded is None:
        return False
    differing = [
        f"{_named(name)} {_shown(settings.get(name))} now, {_shown(recorded.get(name))} in the run"
        for name in dict.fromkeys([*recorded, *settings])
        if settings.get(name) != recorded.get(name)
    ]
    if differing:
        raise OptionError(
            f"`resume`: the run in {output_dir} was started with other settings ({SETTINGS_FILE}): "
            f"{'; '.join(differing)}. Resume with the run's settings, or start afresh with `overwrite` or another "
            "`output_dir`."
        )
    return True


def _named(name: str) -> str:
    """An option by its name in backticks (the command line words it as its flag); other settings as they are."""
    return f"`{name}`" if name in with_role(TrainOptions, "setting") else name


def _shown(value: Any) -> str:
    return "(not set)" if value is None else str(value)


def write_settings(output_dir: Path, settings: dict[str, Any]) -> None:
    """Write run_settings.json whole: a kill leaves the old file or the new one."""
    partial = output_dir / f".{SETTINGS_FILE}.{os.getpid()}"
    partial.write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, output_dir / SETTINGS_FILE)


def run_settings(
    options: TrainOptions, train_pairs: Dataset, tokenizer: str, dropout: float, bf16: bool
) -> dict[str, Any]:
    """The settings that define a run (`SETTINGS_FILE`): a resume must find them unchanged. They are the options
    whose role is `setting` (the budget, checkpointing, evaluation and attention kernels are not: a resume may extend
    or cut the budget), keyed by their names, as resolved: `tokenizer` says which tokenizer (`tokenizer_fingerprint`,
    or the BPE's settings), `dropout` is the model's P_drop, `lr` the schedule's, `bf16` the precision; then the
    training data and the processes. An option left unset (None) is not recorded, as in runs from before it
    existed: unset, the attention dropouts are the preset's or the `init_from` folder's, which the file records."""
    resolved = {
        "tokenizer": tokenizer,
        "dropout": dropout,
        "lr": options.learning_rate(),
        "bf16": "bf16" if bf16 else "fp32",
    }
    settings = {
        name: value
        for name in with_role(TrainOptions, "setting")
        if (value := resolved.get(name, getattr(options, name))) is not None
    }
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    return {**settings, "training data": data_fingerprint(train_pairs), "processes": processes}


def bpe_identity(options: TrainOptions, pairs: int) -> str:
    """The `tokenizer` setting of a run that trains its BPE on `pairs` pairs, in the settings file's words (its
    format, like the keys: a resume compares it with what earlier versions recorded)."""
    identity = f"a joint BPE of --vocab-size {options.vocab_size}"
    if 2 * pairs > options.tokenizer_sample:  # (the whole corpus, as before samples: no mention)
        identity += f" on --tokenizer-sample {options.tokenizer_sample} (--seed {options.seed})"
    return identity


def _inputs(options: TrainOptions) -> list[tuple[str, Any]]:
    """The files and folders a run reads, which its `output_dir` must be apart from."""
    return [(name, getattr(options, name)) for name in with_role(TrainOptions, "reads")]


def check_output_dir(options: TrainOptions) -> tuple[Path, Path | None]:
    """(checkpoint folder, checkpoint to resume from) after checking what `output_dir` holds. Reads only: the folder
    is created, and old checkpoints removed, once every option has been checked (`clear_for_run`). `output_dir` is
    none of the run's inputs, nor inside one, nor holds one; a fresh run (with `overwrite` or not) refuses a folder
    that holds anything but a run's own entries (files.check_output_folder). A resume takes the run's folder as it
    is: it removes only the run's own interrupted checkpoints."""
    output_dir = Path(options.output_dir)
    if options.resume:
        refuse_inputs(output_dir, "output_dir", _inputs(options), "Pass another `output_dir`.")
    else:
        check_output_folder(output_dir, "output_dir", RUN_LAYOUT, _inputs(options), replaced=False)
    # The folder and the one around it: the run's lock and the model folder's next version are written beside it.
    for folder in (output_dir, output_dir.parent):
        nearest = next(path for path in (folder, *folder.parents) if path.exists())
        if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
            problem = "not a folder" if not nearest.is_dir() else "not writable"
            raise OptionError(
                f"`output_dir` {output_dir} is not a writable folder ({nearest} is {problem}). Choose a folder "
                "you can write to."
            )
    checkpoint_dir = output_dir / CHECKPOINTS
    existing = sorted(checkpoint_dir.glob("checkpoint-*")) if checkpoint_dir.is_dir() else []
    if options.resume and options.overwrite:
        raise OptionError("`resume` and `overwrite` contradict each other; pass one.")
    if options.resume:
        if not existing:
            raise OptionError(f"`resume` found no checkpoint in {checkpoint_dir}. Drop `resume` to start afresh.")
        try:
            return checkpoint_dir, last_checkpoints(checkpoint_dir, 1, complete_only=True)[0]
        except ValueError:
            raise OptionError(
                f"`resume` found no complete checkpoint in {checkpoint_dir} (none has a readable trainer_state.json,"
                " which the Trainer writes last). Pass `overwrite` instead to start afresh."
            ) from None
    if existing and not options.overwrite:
        raise OptionError(
            f"`output_dir` {output_dir} already holds checkpoints of an earlier run ({len(existing)} in "
            f"{checkpoint_dir}). Pass `resume` to continue it, `overwrite` to start afresh, or another `output_dir`."
        )
    return checkpoint_dir, None


def clear_for_run(output_dir: Path, checkpoint_dir: Path, resume_from: Path | None) -> None:
    """The folder becomes the run's (its manifest lists `RUN_ENTRIES`; a run folder of an earlier version is
    adopted), and what the run replaces is removed (the main process, holding the lock): on a resume the checkpoints
    after `resume_from`, whose save was interrupted; else an earlier run's checkpoints (`overwrite`) and
    learning-curve snapshots, which would join this run's curve. Only those: a file of someone else's that appeared
    in checkpoints/ or curve/ since the check stays, and so does its folder."""
    claim_folder(output_dir, RUN_LAYOUT, RUN_ENTRIES)
    if resume_from is None:
        remove_own(checkpoint_dir, CHECKPOINTS_LAYOUT)
        remove_own(output_dir / CURVE_DIR, CURVE_LAYOUT)  # the old run's learning-curve snapshots
        return
    # A kill during a save leaves checkpoint-N without trainer_state.json (the Trainer writes checkpoints in
    # place, that file last); the resumed run writes checkpoint-N again.
    for path in sorted(checkpoint_dir.glob("checkpoint-*")):
        step = checkpoint_step(path)
        if step is not None and step > checkpoint_step(resume_from):
            logger.info(
                f"Removing incomplete {path.name} (its save was interrupted); resuming from {resume_from.name}."
            )
            shutil.rmtree(path)


def trained_steps(checkpoint: Path) -> int:
    """The updates a complete Trainer checkpoint was saved at."""
    return json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]


def write_run_config(output_dir: Path, options: TrainOptions, training_args: TrainingArguments) -> None:
    """RUN/run_config.json (`train --config RUN/run_config.json` repeats the run) and, for reading, every Trainer
    argument the run uses (RUN/trainer_arguments.json)."""
    (output_dir / RUN_CONFIG_FILE).write_text(
        json.dumps(run_config(options), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (output_dir / TRAINER_ARGUMENTS_FILE).write_text(training_args.to_json_string() + "\n", encoding="utf-8")


__all__ = [
    "CHECKPOINTS",
    "CHECKPOINTS_LAYOUT",
    "CURVE_LAYOUT",
    "MODEL_RUN_ENTRIES",
    "RUN_CONFIG_FILE",
    "RUN_ENTRIES",
    "RUN_LAYOUT",
    "SETTINGS_FILE",
    "TRAINER_ARGUMENTS_FILE",
    "bpe_identity",
    "check_output_dir",
    "check_same_run",
    "clear_for_run",
    "data_fingerprint",
    "exclusive_run",
    "read_settings",
    "refuse_if_in_use",
    "run_settings",
    "tokenizer_fingerprint",
    "trained_steps",
    "write_run_config",
    "write_settings",
]
