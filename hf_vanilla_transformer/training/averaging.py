"""§6.1 checkpoint averaging: "For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

`average_checkpoints(paths)` is the element-wise mean of the weights of several safetensors checkpoints (folders
as written by `save_pretrained` / the Trainer, or single .safetensors files), accumulated in float32 and cast back
to each tensor's dtype (fairseq's `average_checkpoints.py` semantics). Non-float tensors must be equal in every
checkpoint. Checkpoints that disagree in keys, shapes, dtypes or config.json are refused with the difference named.
`write_averaged_model` turns the mean into a Hub-ready model folder; `average(AverageOptions(...))` does so for the
`average` command.

Which checkpoints (`select_checkpoints`, `train --average`): the last k (§6.1, "last"), the k with the best dev
BLEU ("best"), or k spread evenly over the end of the run ("spread": the checkpoints nearest to the times
end, end - span/k, ..., end - (k-1)·span/k, where `AverageSpan` is a share of the run's training time or a
duration; with span = k × the checkpoint interval it is "last", the paper's 5 checkpoints 10 minutes apart).
`checkpoint_infos` reads each checkpoint's step, training time and dev BLEU from its trainer_state.json.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import AutoModelForSeq2SeqLM, GenerationConfig

from ..errors import OptionError
from ..files import MODEL_LAYOUT, check_output_folder, replaced_folder, writable_folder
from ..inference.loading import load_tokenizer, model_folder
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..option_fields import option, positive_int
from .options import AVERAGE_MODES, parse_duration

# config.json entries that differ between checkpoints of one run without changing the model.
_CONFIG_KEYS_IGNORED = ("_name_or_path", "transformers_version", "use_cache", "dtype", "torch_dtype")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _weight_files(path: Path) -> list[Path]:
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if files:
            return files
        raise ValueError(f"{path} holds no .safetensors file. Pass checkpoint folders written by save_pretrained.")
    raise ValueError(f"Checkpoint {path} does not exist. Pass checkpoint folders or .safetensors files.")


def load_safetensors_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder (every .safetensors shard in it) or of one .safetensors file."""
    state_dict: dict[str, torch.Tensor] = {}
    for file in _weight_files(Path(path)):
        try:
            shard = load_file(file)
        except SafetensorError as error:  # e.g. "header too large": a length field no real file has
            raise ValueError(
                f"{file} is damaged: not a readable safetensors file ({error}). Save or copy the checkpoint again, "
                "or leave it out of the average."
            ) from None
        repeated = sorted(set(shard) & set(state_dict))
        if repeated:
            raise ValueError(f"{file} repeats tensors of another shard of {path}: {repeated[:5]}.")
        state_dict.update(shard)
    return state_dict


def _model_config(path: Path) -> dict | None:
    config_file = path / "config.json" if path.is_dir() else path.with_name("config.json")
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    return {key: value for key, value in config.items() if key not in _CONFIG_KEYS_IGNORED}


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """§6.1: the mean of the checkpoints' weights (float32 accumulation, each tensor cast back to its dtype).

    Raises ValueError when fewer than one checkpoint is given, when the checkpoints differ in their tensor names,
    shapes or dtypes, in a non-float tensor, or in config.json (where the folders have one).
    """
    if not paths:
        raise ValueError("`paths` is empty; pass at least one checkpoint to average.")
    paths = [Path(path) for path in paths]
    reference_config = _model_config(paths[0])
    total: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for path in paths:
        config = _model_config(path)
        if config != reference_config:
            keys = sorted(
                key
                for key in set(config or {}) | set(reference_config or {})
                if (config or {}).get(key) != (reference_config or {}).get(key)
            )
            raise ValueError(
                f"config.json of {path} differs from that of {paths[0]} in {keys}. Average checkpoints of one model."
            )
        state_dict = load_safetensors_checkpoint(path)
        if not reference:
            reference = state_dict
            total = {key: tensor.to(torch.float32) for key, tensor in state_dict.items() if tensor.is_floating_point()}
            continue
        if state_dict.keys() != reference.keys():
            missing, extra = sorted(reference.keys() - state_dict.keys()), sorted(state_dict.keys() - reference.keys())
            raise ValueError(
                f"{path} has different tensors from {paths[0]}: missing {missing[:5]}, extra {extra[:5]}. Average "
                "checkpoints of one model."
            )
        for key, tensor in state_dict.items():
            first = reference[key]
            if tensor.shape != first.shape or tensor.dtype != first.dtype:
                raise ValueError(
                    f"Tensor `{key}` is {tuple(tensor.shape)} {tensor.dtype} in {path} but {tuple(first.shape)} "
                    f"{first.dtype} in {paths[0]}. Average checkpoints of one model, saved in one dtype."
                )
            if tensor.is_floating_point():
                total[key] += tensor.to(torch.float32)
            elif not torch.equal(tensor, first):
                raise ValueError(
                    f"Non-float tensor `{key}` differs between {path} and {paths[0]}; it cannot be averaged."
                )
    return {
        key: (total[key] / len(paths)).to(tensor.dtype) if key in total else tensor.clone()
        for key, tensor in reference.items()
    }


def is_complete_checkpoint(path: str | Path) -> bool:
    """Whether the Trainer finished writing checkpoint folder `path`. It writes the folder in place, with
    trainer_state.json last, so a checkpoint whose save was killed has none, or a truncated one."""
    try:
        json.loads((Path(path) / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def checkpoint_step(path: str | Path) -> int | None:
    """N of a Trainer checkpoint folder `checkpoint-N`; None for any other name."""
    match = _CHECKPOINT.match(Path(path).name)
    return int(match.group(1)) if match else None


def last_checkpoints(folder: str | Path, n: int, complete_only: bool = False) -> list[Path]:
    """The `n` Trainer checkpoints `checkpoint-<step>` in `folder` with the highest steps, oldest first; with
    `complete_only`, among those whose save finished (`is_complete_checkpoint`)."""
    folder = Path(folder)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive integer, got {n!r}.")
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder. Pass the Trainer's output folder holding checkpoint-* folders.")
    found = sorted(
        (step, child)
        for child in folder.iterdir()
        if child.is_dir()
        and (step := checkpoint_step(child)) is not None
        and (not complete_only or is_complete_checkpoint(child))
    )
    if len(found) < n:
        raise ValueError(f"Found {len(found)} checkpoints in {folder}; averaging the last {n} needs at least {n}.")
    return [path for _, path in found[-n:]]


@dataclass(frozen=True)
class CheckpointInfo:
    """A Trainer checkpoint: its folder, update, training seconds when saved (the wall clock of
    training.WallClockCallback, None where not recorded) and dev BLEU of the evaluation at that update (None: none)."""

    path: Path
    step: int
    seconds: float | None = None
    bleu: float | None = None


def checkpoint_infos(folder: str | Path) -> list[CheckpointInfo]:
    """The complete checkpoints `checkpoint-N` of `folder`, oldest first, with what their trainer_state.json says."""
    infos = []
    for child in Path(folder).glob("checkpoint-*"):
        step = checkpoint_step(child)
        if step is None or not child.is_dir():
            continue
        try:
            state = json.loads((child / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):  # a save that did not finish
            continue
        clock = state.get("stateful_callbacks", {}).get("WallClockCallback", {})
        clock = clock[-1] if isinstance(clock, list) and clock else clock
        seconds = clock.get("attributes", {}).get("elapsed_before") if isinstance(clock, dict) else None
        history = state.get("log_history", [])
        scores = [log["eval_bleu"] for log in history if "eval_bleu" in log and log.get("step") == step]
        infos.append(CheckpointInfo(child, step, seconds, scores[-1] if scores else None))
    return sorted(infos, key=lambda info: info.step)


@dataclass(frozen=True)
class AverageSpan:
    """The end of a run that `average="spread"` spreads its checkpoints over: a `fraction` of the run's training
    time (e.g. "50%") or a number of `seconds` (e.g. "30m")."""

    fraction: float | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str | float) -> AverageSpan:
        value = str(text).strip()
        if value.endswith("%"):
            try:
                percent = float(value[:-1])
            except ValueError:
                percent = -1.0
            if not 0 < percent <= 100:
                raise ValueError(f"`average_span` {text!r}: a share must lie in (0%, 100%], e.g. 50%.")
            return cls(fraction=percent / 100)
        try:
            return cls(seconds=parse_duration(value))
        except ValueError:
            raise ValueError(
                f"`average_span` {text!r} is neither a share of the run (e.g. 50%) nor a duration (e.g. 30m, 1h)."
            ) from None

    def start(self, end: float) -> float:
        """The training time where the span begins, for a run whose last checkpoint is at `end` seconds."""
        return end * (1 - self.fraction) if self.fraction is not None else end - self.seconds

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction is not None else f"{self.seconds:g}s"


def select_last(infos: Sequence[CheckpointInfo], k: int) -> list[CheckpointInfo]:
    """The last `k` checkpoints (all of them where there are fewer), oldest first (§6.1)."""
    return sorted(infos, key=lambda info: info.step)[-k:]


def select_best(infos: Sequence[CheckpointInfo], k: int) -> list[CheckpointInfo]:
    """The `k` checkpoints with the highest dev BLEU (of equal scores the later), oldest first; checkpoints without
    a score are not candidates. Raises ValueError when none has one."""
    scored = [info for info in infos if info.bleu is not None]
    if not scored:
        raise ValueError("No checkpoint has a dev BLEU to pick the best by; train with a validation set.")
    best = sorted(scored, key=lambda info: (info.bleu, info.step))[-k:]
    return sorted(best, key=lambda info: info.step)


def select_spread(infos: Sequence[CheckpointInfo], k: int, span: AverageSpan) -> list[CheckpointInfo]:
    """`k` checkpoints spread evenly over the `span` that ends at the last checkpoint: for the times end - i·span/k
    (i = 0 .. k-1), the nearest checkpoint inside the span not taken yet (of two as near, the later); fewer where the
    span holds fewer. Oldest first. Checkpoints without a recorded time are not candidates (the last one is always)."""
    ordered = sorted(infos, key=lambda info: info.step)
    if not ordered:
        return []
    end = ordered[-1].seconds
    if end is None:
        return ordered[-1:]
    start = span.start(end)
    candidates = [info for info in ordered if info.seconds is not None and info.seconds >= start]
    chosen: list[CheckpointInfo] = []
    for index in range(min(k, len(candidates))):
        target = end - index * (end - start) / k
        left = [info for info in candidates if info not in chosen]
        chosen.append(min(left, key=lambda info: (abs(info.seconds - target), -info.step)))
    return sorted(chosen, key=lambda info: info.step)


def select_checkpoints(
    infos: Sequence[CheckpointInfo], mode: str, k: int, span: AverageSpan | None = None
) -> list[CheckpointInfo]:
    """The checkpoints to average for `mode` in AVERAGE_MODES (see the module docstring), oldest first."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be a positive integer, got {k!r}.")
    if mode == "last":
        return select_last(infos, k)
    if mode == "best":
        return select_best(infos, k)
    if mode == "spread":
        return select_spread(infos, k, span or AverageSpan(fraction=0.5))
    raise ValueError(f"`mode` must be one of {AVERAGE_MODES}, got {mode!r}.")


def selectable_checkpoints(
    infos: Sequence[CheckpointInfo], mode: str, k: int, span: AverageSpan | None = None
) -> list[CheckpointInfo]:
    """The checkpoints that `select_checkpoints(..., mode, k, span)` may still pick when the run goes on from its
    last one: what training keeps where not only the last ones are averaged ("best": the k best so far; "spread":
    those inside the span that ends now, as a later end only moves the span's start later)."""
    if mode == "best":
        return select_best(infos, k) if any(info.bleu is not None for info in infos) else []
    if mode == "spread":
        end = max((info.seconds for info in infos if info.seconds is not None), default=None)
        if end is None:
            return list(infos)
        start = (span or AverageSpan(fraction=0.5)).start(end)
        return [info for info in infos if info.seconds is None or info.seconds >= start]
    return select_last(infos, k)


def write_averaged_model(paths: Sequence[str | Path], output_dir: str | Path, claims: Sequence[str] = ()) -> Path:
    """Average `paths` and write a Hub-ready folder: the model (safetensors, config.json with `auto_map` and the code
    files, generation_config.json of the last checkpoint) plus the last checkpoint's tokenizer, when it has one.
    The config's `auto_map` and `custom_pipelines` are this package's, never the checkpoint's; a checkpoint of
    another model type is refused.
    Written beside `output_dir` first, then swapped in whole (`replaced_folder`): a kill leaves the old folder or the
    new one. The folder's manifest lists what is written and `claims` (what the caller writes into it afterwards:
    `train`'s results and figures); of an existing folder, only its own files are replaced or dropped, any other
    entry is carried over (the commands refuse such a folder first: `average`, `train`)."""
    last = Path(paths[-1]) if paths else None
    if last is None or not (last / "config.json").is_file():
        raise ValueError(f"{last} must be a checkpoint folder with a config.json to build a model folder from.")
    output_dir = Path(output_dir)
    if any(output_dir.resolve() == Path(path).resolve() for path in paths):
        raise ValueError(f"The model folder {output_dir} is one of the checkpoints to average; write to a new folder.")
    config = json.loads((last / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") != VanillaTransformerConfig.model_type:
        raise ValueError(
            f"{last / 'config.json'} has model_type {config.get('model_type')!r}, not "
            f"{VanillaTransformerConfig.model_type!r}: only this package's checkpoints average into a model folder."
        )
    # Whatever code the checkpoint's config points to (another repository's or another model's auto_map and
    # pipelines) is not carried over: save_pretrained below writes this package's registration and code files.
    for key in ("auto_map", "custom_pipelines"):
        config.pop(key, None)
    averaged = average_checkpoints(paths)
    with replaced_folder(output_dir, claims=claims) as folder:
        # Load the mean through from_pretrained (strict for this package's models; tied weights are stored once),
        # then save_pretrained adds auto_map and the code files.
        save_file(averaged, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=False)
        if (last / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(last)
        model.save_pretrained(folder)
        if (last / "tokenizer.json").is_file() or (last / "tokenizer_config.json").is_file():
            load_tokenizer(last).save_pretrained(folder)
    return output_dir


@dataclass(frozen=True)
class AverageOptions:
    """Average `checkpoints` (folders), or with `last` the last N complete `checkpoint-*` folders of the one folder
    in `checkpoints`, into the model folder `output` (§6.1)."""

    checkpoints: Sequence[str | os.PathLike]
    output: str | os.PathLike = option(
        help="the averaged model folder: new, empty, or one this package wrote", flags=("-o",)
    )
    last: int | None = option(
        None, help="average the last N checkpoint-* folders of one folder", parse=positive_int, metavar="N"
    )


@dataclass(frozen=True)
class AverageResult:
    """The checkpoints averaged, oldest first, and the model folder written."""

    checkpoints: list[Path]
    output: Path


def average(options: AverageOptions) -> AverageResult:
    """Average the checkpoints' weights (float32 accumulation) into a Hub-ready model folder: a new or empty one, or
    a model folder of this package's (files.check_output_folder), checked before anything is read."""
    inputs = [("checkpoints", path) for path in options.checkpoints]
    check_output_folder(options.output, "output", MODEL_LAYOUT, inputs)
    if options.last is not None:
        if len(options.checkpoints) != 1:
            raise OptionError(f"`last` takes one folder of checkpoints, got {len(options.checkpoints)} paths.")
        paths = last_checkpoints(options.checkpoints[0], options.last, complete_only=True)  # skips interrupted saves
    else:
        paths = [Path(path) for path in options.checkpoints]
        for path in paths:
            if not path.exists():
                raise OptionError(f"Checkpoint {path} does not exist. Check the path.")
            if path.is_dir():  # a folder of this package's model; a .safetensors file is averaged as it is
                model_folder(path, None, name="Checkpoint", tokenizer=False)
    output = writable_folder(options.output, "output")
    write_averaged_model(paths, output)
    return AverageResult(paths, output)


__all__ = [
    "AVERAGE_MODES",
    "AverageOptions",
    "AverageResult",
    "AverageSpan",
    "CheckpointInfo",
    "average",
    "average_checkpoints",
    "checkpoint_infos",
    "checkpoint_step",
    "is_complete_checkpoint",
    "last_checkpoints",
    "load_safetensors_checkpoint",
    "select_best",
    "select_checkpoints",
    "select_last",
    "select_spread",
    "selectable_checkpoints",
    "write_averaged_model",
]
