"""`python -m conversion <format> SOURCE OUTPUT_DIR [options]`: convert a foreign checkpoint to a Hub-ready folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hf_vanilla_transformer.files import no_space_message

from . import annotated, fairseq, marian, nn_transformer, onnx, opennmt
from ._common import add_card_arguments

# Format name -> a module (or object) with `add_arguments(parser)` and `convert(args)`; its docstring's first line
# is the format's help. Add a format with one line here.
FORMATS: dict[str, Any] = {
    "fairseq": fairseq,
    "marian": marian,
    "opennmt": opennmt,
    "to-marian": marian.ToMarian,
    "to-onnx": onnx,
    "nn-transformer": nn_transformer,
    "annotated": annotated,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m conversion",
        description="Convert a checkpoint of another implementation to an hf_vanilla_transformer folder "
        "(safetensors, config, generation config, tokenizer, model card), verified against the source's logits.",
    )
    formats = parser.add_subparsers(dest="format", metavar="FORMAT", required=True, help="the source format:")
    for name, entry in FORMATS.items():
        summary = (entry.__doc__ or name).strip().splitlines()[0]
        format_parser = formats.add_parser(name, help=summary, description=summary)
        entry.add_arguments(format_parser)
        if getattr(entry, "WRITES_MODEL_CARD", True):  # --base-model, --license: the card's metadata
            add_card_arguments(format_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one conversion; errors about the input (unsupported settings, bad files) exit 2 with the message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        FORMATS[args.format].convert(args)
    except (NotImplementedError, ValueError, FileNotFoundError) as error:
        parser.exit(2, f"{parser.prog} {args.format}: error: {error}\n")
    except Exception as error:  # a full disk: one line naming the output; any other error as it is
        message = no_space_message(error, args.output, "OUTPUT folder")
        if message is None:
            raise
        parser.exit(2, f"{parser.prog} {args.format}: error: {message}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
