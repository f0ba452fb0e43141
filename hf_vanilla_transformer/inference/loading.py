"""Loading a saved model folder for decoding: the checks that make a wrong folder one clear error (`model_folder`),
the model on its device in its precision (`load_model`: int8 layers, bf16 weights, the CPU speed step), its tokenizer
and the languages it was trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.utils import GENERATION_CONFIG_NAME

from ..errors import DECODING_RANGES, OptionError
from ..files import RESULTS_FILE, TARGET_TOKENIZER, TOKENIZER_FILES
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.generation_vanilla_transformer import LENGTH_PENALTY_TYPES
from ..option_fields import option, positive_int
from .cpu_inference import prepare_for_cpu_inference
from .quantization import int8_engine, quantize_int8

# Where a model decodes: "auto" is the GPU when torch sees one, else the CPU.
DEVICES = ("auto", "cpu", "cuda")


def trust_remote_code_option() -> Any:
    """The `trust_remote_code` option of the commands that load any model folder: without it, code shipped in a
    folder (a config.json auto_map of another model type) never runs."""
    return option(
        False,
        help="load a folder of another model type whose config.json points to code in the folder (auto_map), running "
        "that code; only for folders you trust. Never needed for this package's folders",
    )


def max_input_tokens_option() -> Any:
    """The `max_input_tokens` option of the commands that decode: None, the tokenizer's limit."""
    return option(
        None,
        help="cut longer sources to this many tokens (with one warning counting them); default: the tokenizer's limit",
        parse=positive_int,
    )


def num_beams_option() -> Any:
    """The `num_beams` option of the commands that decode with the model's own decoding: None, the model's."""
    return option(None, help="override the model's beam size", parse=positive_int)


def device_option() -> Any:
    """The `device` option of the commands that decode on a device they pick (one of DEVICES)."""
    return option("auto", help="auto: a GPU if any", choices=DEVICES)


def bf16_option() -> Any:
    """The `bf16` option of the commands that decode: bf16 autocast."""
    return option(
        False,
        help="decode under bf16 autocast (fast on GPUs and CPUs with bf16 matrix units; CPUs without emulate it "
        "slowly)",
    )


def bf16_weights_option() -> Any:
    """The `bf16_weights` option of the commands that decode: the weights cast to bf16 (`load_model`)."""
    return option(
        False,
        help="decode with the weights cast to bf16 (no autocast): faster than bf16 autocast on CPUs with bf16 matrix "
        "units",
    )


def int8_option() -> Any:
    """The `int8` option of the commands that decode: int8 linear layers on the CPU (quantization.quantize_int8)."""
    return option(False, help="int8 linear layers on the CPU (faster; docs/model.md)")


def model_folder(
    path: str | os.PathLike,
    trust_remote_code: bool | None = False,
    *,
    name: str = "`model_dir`",
    tokenizer: bool = True,
) -> Path:
    """`path` as a Path after the checks every command that loads a model folder makes first, so that a wrong folder
    is one clear error (naming it as `name`) rather than a traceback from transformers: config.json is there and is
    a JSON object; the model is this package's (whose code is installed; `check_our_folder`), with its tokenizer
    files when `tokenizer`; or, only with `trust_remote_code`, one whose config's auto_map names code in the folder,
    which would run. `trust_remote_code` None: the caller takes only this package's folders (average, curve), so no
    option helps."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise OptionError(
            f"{name} {path} is not a saved model folder (no config.json). Pass a model folder written by `train` "
            "(RUN/model) or by save_pretrained."
        )
    config = read_json(config_file)
    if not isinstance(config, dict):
        raise OptionError(f"{config_file} is not a JSON object: the folder is damaged. Save or download it again.")
    ours = VanillaTransformerConfig.model_type
    model_type = config.get("model_type")
    if model_type == ours:
        check_our_folder(folder, config, name, tokenizer)
    elif "auto_map" in config and trust_remote_code is not None:
        if not trust_remote_code:
            raise OptionError(
                f"{name} {path} holds a model of type {model_type!r} whose code comes with the folder (auto_map in "
                "config.json); loading it would run that code. Pass `trust_remote_code` if you trust the folder."
            )
    else:
        raise OptionError(
            f"{name} {path} holds a model of type {model_type!r}, not {ours!r}. Pass a folder written by `train` "
            "or by `python -m conversion` (which converts Marian and other formats)."
        )
    return folder


def read_json(path: Path) -> Any:
    """The JSON content of a model folder's file `path`; a file that is not JSON (or not UTF-8) is one OptionError
    naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise OptionError(
            f"{path} is not valid JSON ({error}): the folder is damaged. Save or download the model again."
        ) from None


def check_our_folder(folder: Path, config: dict[str, Any], name: str, tokenizer: bool) -> None:
    """The checks of a folder of this package's model, each one OptionError naming the file: config.json's values
    (`VanillaTransformerConfig`'s validation) and a model that fits into this machine's memory (`machine_memory`),
    before anything is allocated; generation_config.json's decoding settings (`check_generation_settings`); and,
    when `tokenizer`, a tokenizer.json there; every JSON file of the tokenizers a JSON object."""
    config_file = folder / "config.json"
    try:
        model_config = VanillaTransformerConfig.from_dict(config, name_or_path=str(folder))
    except ValueError as error:  # from_dict's, which wraps the validation's own (a ValueError or TypeError)
        raise OptionError(
            f"{config_file} is invalid: {error.__cause__ or error} Fix that entry of the file."
        ) from None
    memory = machine_memory()
    try:
        if memory is not None:
            model_config.check_memory(memory, "this machine's memory")
    except ValueError as error:
        raise OptionError(f"{config_file}: {error} Or load the model on a machine with more memory.") from None
    generation_file = folder / GENERATION_CONFIG_NAME
    if generation_file.is_file():
        check_generation_settings(read_json(generation_file), generation_file)
    if tokenizer and not (folder / "tokenizer.json").is_file():
        raise OptionError(
            f"{name} {folder} has no tokenizer (no tokenizer.json). Save the tokenizer into the folder "
            "(tokenizer.save_pretrained), or copy tokenizer.json and tokenizer_config.json from the run that "
            "trained the model."
        )
    for side in (folder, folder / TARGET_TOKENIZER):  # each tokenizer's JSON files hold one object
        for file in sorted(side.glob("*.json")) if side.is_dir() else ():
            if file.name in TOKENIZER_FILES and not isinstance(read_json(file), dict):
                raise OptionError(f"{file} is not a JSON object: the folder is damaged. Save or download it again.")


def machine_memory() -> int | None:
    """This machine's physical memory in bytes (what a model loaded here must fit into), None where the platform
    does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows), or no such name
        return None


# generation_config.json's counts that generate() divides by or loops over: the least each may be (None: unset).
GENERATION_COUNTS = {
    "num_beams": 1,
    "num_beam_groups": 1,
    "num_return_sequences": 1,
    "max_length": 1,
    "max_new_tokens": 1,
    "min_length": 0,
    "min_new_tokens": 0,
    "max_new_tokens_offset": 0,
    "top_k": 0,
    "no_repeat_ngram_size": 0,
}


def check_generation_settings(settings: Any, file: Path) -> None:
    """Refuse (OptionError naming `file` and the field) decoding settings that generate() cannot run (where it
    would divide by zero, loop backwards or fail deep in beam search): a count of `GENERATION_COUNTS` that is no
    integer or below its least, more `num_return_sequences` than beams without sampling, a `length_penalty` that is
    no finite number, an unknown `length_penalty_type`. The field is shown as the file spells it ("num_beams": 0)."""
    if not isinstance(settings, dict):
        raise OptionError(f"{file} is not a JSON object: the folder is damaged. Save or download it again.")
    for field, least in GENERATION_COUNTS.items():
        value = settings.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise OptionError(
                f'{file} has `"{field}": {json.dumps(value)}`, which generate() cannot run: it must be an integer '
                f"of at least {least}. Fix that entry of the file."
            )
    beams, sequences = settings.get("num_beams") or 1, settings.get("num_return_sequences") or 1
    if sequences > beams and not settings.get("do_sample"):
        raise OptionError(
            f'{file} has `"num_return_sequences": {sequences}` with `"num_beams": {beams}`: beam search returns at '
            "most one sequence per beam. Fix one of those entries of the file."
        )
    penalty, penalty_type = settings.get("length_penalty"), settings.get("length_penalty_type")
    allowed = DECODING_RANGES["length_penalty"]
    if penalty is not None and not allowed.holds(penalty):
        raise OptionError(
            f'{file} has `"length_penalty": {json.dumps(penalty)}`; it must be a number from {allowed.low} to '
            f"{allowed.high} ({allowed.usual}). Fix that entry of the file."
        )
    if penalty_type is not None and penalty_type not in LENGTH_PENALTY_TYPES:
        raise OptionError(
            f'{file} has `"length_penalty_type": {json.dumps(penalty_type)}`; it must be one of '
            f"{', '.join(LENGTH_PENALTY_TYPES)}. Fix that entry of the file."
        )


def trained_languages(model_dir: Path, src_lang: str | None = None, tgt_lang: str | None = None) -> tuple[str, str]:
    """(`src_lang`, `tgt_lang`); where one is None, the language a folder written by `train` records in
    results.json, else en / de. A damaged results.json is named (when it is needed at all)."""
    results_file = model_dir / RESULTS_FILE
    if (src_lang is not None and tgt_lang is not None) or not results_file.is_file():
        return src_lang or "en", tgt_lang or "de"
    try:
        trained_src, trained_tgt = json.loads(results_file.read_text(encoding="utf-8")).get("languages", ["en", "de"])
    except (ValueError, AttributeError, TypeError) as error:  # not JSON, not an object, not a pair of languages
        raise OptionError(
            f"{results_file} is damaged ({error}); it should hold the run's results as JSON. Pass `src_lang` and "
            "`tgt_lang`, or delete the file."
        ) from None
    return src_lang or trained_src, tgt_lang or trained_tgt


def check_precisions(bf16: bool, int8: bool, bf16_weights: bool) -> None:
    """At most one of bf16 autocast, int8 products and bf16 weights: int8 products take float32 activations, which
    autocast or bf16 weights would hand them in bf16, and autocast over bf16 weights is bf16 weights."""
    precisions = [name for name, on in (("bf16", bf16), ("int8", int8), ("bf16_weights", bf16_weights)) if on]
    if len(precisions) > 1:
        raise OptionError(f"`{'` and `'.join(precisions)}` are precisions for the same products; pass one of them.")


def load_model(
    model_dir: str | os.PathLike,
    trust_remote_code: bool = False,
    device: str = "auto",
    int8: bool = False,
    bf16_weights: bool = False,
    **kwargs: Any,
) -> Any:
    """A saved model for decoding on `device` (one of DEVICES): "auto" is the GPU when there is one (evaluation is
    mostly beam search). Code that comes with the folder runs only with `trust_remote_code` (transformers would
    otherwise ask on the terminal). `int8`: on the CPU with int8 linear layers (quantization.quantize_int8);
    `bf16_weights`: the weights cast to bf16. On the CPU the attention is eager unless `attn_implementation` is
    passed (`decoding_attention`), and a model without int8 layers takes the CPU speed step
    (cpu_inference.prepare_for_cpu_inference)."""
    if device not in DEVICES:
        raise OptionError(f"`device={device}` is not one of {', '.join(DEVICES)}.")
    on_gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    kwargs.setdefault("attn_implementation", decoding_attention(torch.device("cuda" if on_gpu else "cpu")))
    if device == "cuda" and not torch.cuda.is_available():
        raise OptionError("`device=cuda`: torch sees no CUDA GPU here. Pass `device=cpu` (or auto).")
    check_precisions(False, int8, bf16_weights)
    if int8:  # before loading: no int8 kernels in this torch is an error naming the fix
        if device == "cuda":
            raise OptionError("`int8` runs on the CPU (int8 CPU kernels); drop `int8` or pass `device=cpu`.")
        try:
            int8_engine()
        except RuntimeError as error:
            raise OptionError(f"`int8`: {error}") from None
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, trust_remote_code=trust_remote_code, **kwargs)
    if int8:
        return quantize_int8(model)
    if bf16_weights:
        model = model.to(torch.bfloat16)
    return model.to("cuda") if on_gpu else prepare_for_cpu_inference(model)


def decoding_attention(device: torch.device) -> str:
    """eager on the CPU, where PyTorch's fused attention is slow for a decoding step's single query in bf16 (the
    1-hour Multi30k model's test set, the paper's decoding: 1.43x faster with bf16 weights; float32 the same
    translations, within the run-to-run noise; docs/translation.md); sdpa (flash kernels) on a GPU."""
    return "eager" if device.type == "cpu" else "sdpa"


def load_tokenizer(model_dir: str | os.PathLike, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved in `model_dir`; code that comes with the folder runs only with `trust_remote_code`.
    Files that the tokenizer libraries cannot make sense of (JSON of the wrong shape; they raise KeyErrors and bare
    Exceptions) are one OptionError naming the folder; a missing package (ImportError) stays as it is."""
    try:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    except ImportError:
        raise
    except Exception as error:
        raise OptionError(
            f"the tokenizer files of {model_dir} cannot be read ({type(error).__name__}: {error}): the folder is "
            "damaged. Save or download the model again."
        ) from None


__all__ = [
    "DEVICES",
    "GENERATION_COUNTS",
    "check_generation_settings",
    "check_our_folder",
    "check_precisions",
    "decoding_attention",
    "load_model",
    "load_tokenizer",
    "machine_memory",
    "model_folder",
    "read_json",
    "trained_languages",
]
