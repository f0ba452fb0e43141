"""`python -m conversion <format> SOURCE OUTPUT_DIR [options]`: convert a foreign checkpoint to a Hub-ready folder.

The command line only: each format's flags map one to one onto the fields of its typed options (`--dict-dir` is
`FairseqOptions.dict_dir`), the options' defaults are the flags' defaults, and the result the library returns
(`_common.Finished`) is printed. The library's errors name an option by its field in backquotes, alone or with its
value (`dict_dir`, `max_positions=1`: hf_vanilla_transformer/errors.py's convention); they are worded here as the
flags (`--dict-dir`, `--max-positions 1`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from hf_vanilla_transformer.errors import Terminated, flag_wording, sigterm_raises_terminated
from hf_vanilla_transformer.files import no_space_message

from . import annotated, fairseq, marian, nn_transformer, onnx, opennmt
from ._common import CommonOptions, Finished, ReferenceOptions, SourceOptions
from ._pytorch_sources import SPECIAL_ROLES, PytorchOptions

POSITIONALS = {"source": "SOURCE", "output_dir": "OUTPUT_DIR"}


@dataclass(frozen=True)
class Format:
    """One format of the command: its help line, its flags and the typed options and function they feed."""

    summary: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    options: type[CommonOptions]
    convert: Callable[[Any], Finished]


def summary(module: ModuleType) -> str:
    """A format's help line: the first line of its module's docstring."""
    return (module.__doc__ or module.__name__).strip().splitlines()[0]


def default(options: type[CommonOptions], name: str) -> Any:
    """The default of an options field, which the flag's help states."""
    return next(option.default for option in fields(options) if option.name == name)


def add_common(
    parser: argparse.ArgumentParser, options: type[CommonOptions], source: str, reference_script: str = ""
) -> None:
    """SOURCE, OUTPUT_DIR, `--atol` and `--reference` (where the options have them), `--atol-fp32`, `--base-model`,
    `--license`, `--license-name`: the fields of `CommonOptions`, `SourceOptions` and `ReferenceOptions`
    (conversion/_common.py gives the tolerances' reasons); `reference_script` writes the reference logits."""
    parser.add_argument("source", metavar="SOURCE", type=Path, help=source)
    parser.add_argument(
        "output_dir",
        metavar="OUTPUT_DIR",
        type=Path,
        help="The folder to write: a new or empty one, or a model folder this package wrote (replaced whole).",
    )
    if issubclass(options, SourceOptions):
        parser.add_argument(
            "--atol",
            type=float,
            help=f"Largest accepted float64 logit difference to the source (default {default(options, 'atol'):g}).",
        )
    parser.add_argument(
        "--atol-fp32",
        type=float,
        help="Largest accepted float32 logit / log-probability difference to the source (default "
        f"{default(options, 'atol_fp32'):g}: float32 rounding alone reaches ~6e-5 on a base-size model).",
    )
    parser.add_argument(
        "--base-model",
        help="the source model's Hub repository id, recorded as the card's base_model (default: none recorded)",
    )
    parser.add_argument(
        "--license",
        help="the Hub license id of the converted weights, e.g. apache-2.0, cc-by-4.0, or other with --license-name "
        "(default: the one the source's own model card states, else none)",
    )
    parser.add_argument("--license-name", help="with --license other: the terms' name, kebab-case (my-terms-1.0)")
    if issubclass(options, ReferenceOptions):
        parser.add_argument(
            "--reference",
            type=Path,
            help=f"teacher_forced.safetensors from {reference_script}: refuse the result unless its logits match "
            "the source's within --atol (float64) and --atol-fp32 (default: written unverified).",
        )


def fairseq_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion fairseq SOURCE OUTPUT_DIR` (`FairseqOptions`)."""
    options = fairseq.FairseqOptions
    add_common(
        parser,
        options,
        "A fairseq checkpoint, or a folder with checkpoint_best.pt (or --checkpoint) and its dict.<lang>.txt files "
        "(there or in data-bin/).",
        "conversion/reference/make_fairseq_reference.py",
    )
    parser.add_argument(
        "--checkpoint",
        help=f"Checkpoint file name inside a SOURCE folder (default: the first of "
        f"{', '.join(fairseq.CHECKPOINT_NAMES)}).",
    )
    parser.add_argument("--dict-dir", type=Path, help="Folder with dict.<lang>.txt (default: beside the checkpoint).")
    parser.add_argument("--source-lang", help="Source dictionary language (default: the checkpoint's).")
    parser.add_argument("--target-lang", help="Target dictionary language (default: the checkpoint's).")
    parser.add_argument("--beam", type=int, help=f"Default beam size (fairseq-generate: {default(options, 'beam')}).")
    parser.add_argument(
        "--lenpen", type=float, help=f"Default length penalty (fairseq-generate: {default(options, 'lenpen'):g})."
    )
    parser.add_argument(
        "--max-len-b", type=int, help=f"Most tokens before </s> (fairseq-generate: {default(options, 'max_len_b')})."
    )


def opennmt_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion opennmt SOURCE OUTPUT_DIR` (`OpenNMTOptions`)."""
    options = opennmt.OpenNMTOptions
    add_common(
        parser,
        options,
        "An OpenNMT-py 3.x checkpoint (.pt), or a folder holding one.",
        "conversion/reference/make_opennmt_reference.py",
    )
    parser.add_argument(
        "--checkpoint", help="Checkpoint file name inside a SOURCE folder (default: model.pt, or its only *.pt)."
    )
    parser.add_argument("--beam", type=int, help=f"Default beam size (onmt_translate: {default(options, 'beam')}).")
    parser.add_argument(
        "--max-length", type=int, help=f"Most generated tokens (onmt_translate: {default(options, 'max_length')})."
    )


def pytorch_arguments(parser: argparse.ArgumentParser, options: type[PytorchOptions], what: str) -> None:
    """The flags both converters of plain-PyTorch state dicts take (`PytorchOptions`)."""
    add_common(
        parser,
        options,
        f"The checkpoint: torch.save(model.state_dict()) of {what}.",
        "tests/conversion/fixtures/make_fixtures.py",
    )
    parser.add_argument(
        "--heads", type=int, required=True, help="Attention heads (a state dict does not record them)."
    )
    parser.add_argument(
        "--dropout", type=float, help=f"The model's dropout, for fine-tuning (default {default(options, 'dropout')})."
    )
    for side in ("src", "tgt"):
        parser.add_argument(
            f"--{side}-vocab",
            type=Path,
            help=f"The {side} vocabulary's itos (`vocab.get_itos()`), a JSON list or one token a line: writes a "
            "word-level tokenizer for whitespace-separated pre-tokenized text.",
        )
    for role in SPECIAL_ROLES:
        parser.add_argument(
            f"--{role}-id", type=int, help=f"Id of <{role}> (default {default(options, f'{role}_id')})."
        )
    parser.add_argument(
        "--layer-norm-eps", type=float, help=f"LayerNorm eps (default {default(options, 'layer_norm_eps'):g})."
    )


def nn_transformer_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion nn-transformer SOURCE OUTPUT_DIR --heads H` (`NnTransformerOptions`)."""
    options = nn_transformer.NnTransformerOptions
    pytorch_arguments(parser, options, "the tutorial's Seq2SeqTransformer")
    parser.add_argument("--norm-first", action="store_true", help="nn.Transformer(norm_first=True): pre-LN.")
    parser.add_argument(
        "--activation", help=f"nn.Transformer's activation: relu or gelu (default {default(options, 'activation')})."
    )
    parser.add_argument(
        "--max-len-offset",
        type=int,
        help=f"translate's max_len = source length + this (default {default(options, 'max_len_offset')}).",
    )


def annotated_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion annotated SOURCE OUTPUT_DIR --heads H` (`AnnotatedOptions`)."""
    options = annotated.AnnotatedOptions
    pytorch_arguments(parser, options, "the Annotated Transformer's make_model(...)")
    parser.add_argument(
        "--max-len", type=int, help=f"greedy_decode's max_len, start included (default {default(options, 'max_len')})."
    )


def marian_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion marian SOURCE OUTPUT_DIR` (`MarianOptions`)."""
    add_common(parser, marian.MarianOptions, "A MarianMTModel / OPUS-MT folder (config.json, weights, tokenizer).")


def to_marian_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion to-marian SOURCE OUTPUT_DIR` (`ToMarianOptions`)."""
    add_common(parser, marian.ToMarianOptions, "A folder of our model (config.json, weights, tokenizer).")
    parser.add_argument(
        "--keep-token-ids",
        action="store_true",
        help="Keep our token ids instead of moving <pad> to the last id (CTranslate2 then cannot read the folder).",
    )
    parser.add_argument(
        "--allow-nonzero-start-embedding",
        action="store_true",
        help="Export although the decoder start token's embedding is not zero; CTranslate2 starts from zeros.",
    )


def to_onnx_arguments(parser: argparse.ArgumentParser) -> None:
    """`python -m conversion to-onnx SOURCE OUTPUT_DIR` (`OnnxOptions`)."""
    options = onnx.OnnxOptions
    add_common(parser, options, "A folder of our model (config.json, weights, tokenizer).")
    parser.add_argument(
        "--max-positions",
        type=int,
        help=f"Rows of the exported sinusoid tables: the longest source and output (default "
        f"{default(options, 'max_positions')}; learned positions keep their table).",
    )


# Format name -> its flags, options and function. Add a format with one line here.
FORMATS: dict[str, Format] = {
    "fairseq": Format(summary(fairseq), fairseq_arguments, fairseq.FairseqOptions, fairseq.convert),
    "marian": Format(summary(marian), marian_arguments, marian.MarianOptions, marian.convert),
    "opennmt": Format(summary(opennmt), opennmt_arguments, opennmt.OpenNMTOptions, opennmt.convert),
    "to-marian": Format(
        "hf_vanilla_transformer -> a MarianMTModel folder, which CTranslate2 and ONNX exporters read.",
        to_marian_arguments,
        marian.ToMarianOptions,
        marian.export,
    ),
    "to-onnx": Format(summary(onnx), to_onnx_arguments, onnx.OnnxOptions, onnx.convert),
    "nn-transformer": Format(
        summary(nn_transformer), nn_transformer_arguments, nn_transformer.NnTransformerOptions, nn_transformer.convert
    ),
    "annotated": Format(summary(annotated), annotated_arguments, annotated.AnnotatedOptions, annotated.convert),
}


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: one subcommand per format. A flag not given is left out of the parsed namespace
    (`argparse.SUPPRESS`), so that the options' own defaults apply."""
    parser = argparse.ArgumentParser(
        prog="python -m conversion",
        description="Convert a checkpoint of another implementation to an hf_vanilla_transformer folder "
        "(safetensors, config, generation config, tokenizer, model card), verified against the source's logits.",
    )
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True, help="the source format:")
    for name, entry in FORMATS.items():
        entry.add_arguments(
            formats.add_parser(name, help=entry.summary, description=entry.summary, argument_default=argparse.SUPPRESS)
        )
    return parser


def options_from(args: argparse.Namespace) -> CommonOptions:
    """The typed options of the chosen format, from the flags given (the rest keep the options' defaults)."""
    options = FORMATS[args.format].options
    return options(**{name: value for name, value in vars(args).items() if name != "format"})


def as_flags(message: str, options: type[CommonOptions]) -> str:
    """The library's message in the command line's words: each field of `options` in backquotes becomes the flag
    the user types (`dict_dir` -> `--dict-dir`, `max_positions=1` -> `--max-positions 1`; SOURCE and OUTPUT_DIR for
    the positional ones). Backquoted text that is no field of the format's options stays."""
    names = [option.name for option in fields(options)]
    return flag_wording(message, {name: POSITIONALS.get(name, "--" + name.replace("_", "-")) for name in names})


def main(argv: list[str] | None = None) -> int:
    """Run one conversion and print what it measured and wrote; errors about the input (unsupported settings, bad
    files, a refused verification) exit 2 with the message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    entry = FORMATS[args.format]
    try:
        with sigterm_raises_terminated():
            print(entry.convert(options_from(args)))
    except (KeyboardInterrupt, Terminated) as stop:  # Ctrl-C, SIGTERM: one line, not a traceback; exit 130, 143
        how, number = (
            ("interrupted", signal.SIGINT) if isinstance(stop, KeyboardInterrupt) else ("terminated", signal.SIGTERM)
        )
        where = f"{args.output_dir} is whole (the old folder or the new one, never a mix)"  # files.replaced_folder
        parser.exit(128 + number, f"{parser.prog} {args.format}: {how}; {where}. Run it again to redo it.\n")
    except (NotImplementedError, ValueError, FileNotFoundError) as error:
        parser.exit(2, f"{parser.prog} {args.format}: error: {as_flags(str(error), entry.options)}\n")
    except Exception as error:  # a full disk: one line naming the output; any other error as it is
        message = no_space_message(error, args.output_dir, "OUTPUT folder")
        if message is None:
            raise
        parser.exit(2, f"{parser.prog} {args.format}: error: {message}\n")
    return 0


__all__ = ["FORMATS", "Format", "build_parser", "main", "options_from"]

if __name__ == "__main__":
    sys.exit(main())
