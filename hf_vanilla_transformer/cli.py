"""`hf-vanilla-transformer` (also `python -m hf_vanilla_transformer`): train, evaluate, translate, average, push,
curve, attention, serve.

This module only maps command-line flags onto the fields of the library's options (training/options.py, the
`*Options` of inference/, training/, hub.py, where the work is done) and back, and prints: the library's progress
(its "hf_vanilla_transformer" logger, INFO) goes to stdout while a command runs, and its errors, which name option
fields (errors.py), are worded with the flags (`max_length=1` becomes `--max-length 1`). `hf-vanilla-transformer
train` with no options is the main job (recipes.MULTI30K): Multi30k EN→DE, a joint 8k BPE, the
`transformer-multi30k` preset trained inside `Seq2SeqTrainer` for a wall-clock budget, the last checkpoints averaged
(§6.1), test_2016 BLEU with the paper's decoding and example translations printed, and a Hub-ready model folder
(`outputs/multi30k-en-de/model`) that `pipeline("translation", model=...)` loads and `push` uploads.

Each command's flags are made from the option fields of its options class (option_fields.option), imported when the
parser is built; those modules import no optional extra (`datasets`, `sacrebleu`, `matplotlib`, FastAPI), which the
commands import as they run: without them every `--help` and `translate` work, and a command that needs one names
its extra (tests/cli/test_core_install.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed
import yaml
from transformers import HfArgumentParser
from transformers.utils import logging as transformers_logging

from .errors import Terminated, close_matches, flag_wording, sigterm_raises_terminated
from .files import exclusive_lock, existing_file, no_space_message, writable_file
from .hub import PushOptions, push
from .inference.attention_maps import AttentionOptions, plot_attention_maps
from .inference.cpu_inference import keep_freed_memory
from .inference.loading import model_folder
from .option_fields import (
    flag_of,
    options_of,
    read,
)
from .training.recipes import DEFAULT_RECIPE, RECIPES, Recipe

T = TypeVar("T")
PROG = "hf-vanilla-transformer"
PACKAGE_LOGGER = "hf_vanilla_transformer"
# The positional argument of the commands that load a model folder.
MODEL_DIR_HELP = "a saved model folder with its tokenizer"


class CommandLineError(ValueError):
    """An error the command line words itself (in flags): not reworded as the library's errors are."""


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse `type` from a reader of option_fields: its ValueError is argparse's error, worded as it is."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def _duration_text(seconds: float) -> str:
    """A duration as the command line writes it: 14m, 1h, 1h30m, 90s."""
    hours, rest = divmod(round(seconds), 3600)
    minutes, seconds = divmod(rest, 60)
    return "".join(f"{value}{unit}" for value, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if value)


def _add_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, item: dataclasses.Field[Any], default: Any = None
) -> None:
    """The flag of an option field (option_fields.option), its destination the field's name; `default` is shown in
    its help (a duration as 14m) where it is not None, and is the flag's argparse default. A field without a
    default is a required flag."""
    from .training.options import parse_duration

    meta = item.metadata
    words = meta["help"]
    if default is not None and not isinstance(default, bool):
        words += f" (default: {_duration_text(default) if meta['parse'] is parse_duration else default})"
    arguments: dict[str, Any] = {"dest": item.name, "default": default, "help": words.replace("%", "%%")}
    if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
        arguments["required"] = True
    if meta["negated"] is not None:
        arguments["action"] = "store_false"
    elif item.type in ("bool", bool):
        arguments["action"] = "store_true"
    else:
        parse = meta["parse"]
        arguments.update(type=parse and _argparse_type(parse), choices=meta["choices"], metavar=meta["metavar"])
        if meta["nargs"] is not None:
            arguments["nargs"] = meta["nargs"]
        if meta["const"] is not None:  # the flag alone means `const`
            arguments.update(nargs="?", const=meta["const"])
    parser.add_argument(flag_of(item), *meta["flags"], **arguments)


def _add_options(
    parser: argparse.ArgumentParser, cls: type, defaults: object = None, groups: Sequence[str] = ()
) -> dict[str, argparse._ArgumentGroup]:
    """One flag per option field of `cls` (a command's options class), under its group (`groups` first, in their
    order; the others as they come); its default `defaults`' attribute of the field's name (a recipe), else the
    field's. Returns the groups, by title, for the command's own flags."""
    made = {title: parser.add_argument_group(title) for title in groups}
    for item in options_of(cls):
        title = item.metadata["group"]
        if title is not None and title not in made:
            made[title] = parser.add_argument_group(title)
        if defaults is not None:
            default = getattr(defaults, item.name)
        else:
            default = None if item.default is dataclasses.MISSING else item.default
        _add_option(parser if title is None else made[title], item, default)
    return made


def _command_options(cls: type[T], args: argparse.Namespace, **own: Any) -> T:
    """A command's options (`cls`, a dataclass of the library) from the parsed arguments of its fields' names (each
    flag's destination is its field), and `own`: the fields the command sets itself (a negated flag's, one read
    from a file)."""
    names = {item.name for item in dataclasses.fields(cls)} & set(vars(args)) - set(own)  # type: ignore[arg-type]
    return cls(**{name: getattr(args, name) for name in names}, **own)


# ---------------------------------------------------------------------------------------------------- wording


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The parser's subcommands (`train`, `translate`, ...), each with its own parser in `.choices`."""
    return next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def _option_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Each option field (argparse destination) of every command, mapped to its flag (the first long one), the
    fields of `command` first. Positional arguments (`model_dir`) keep their names."""
    subparsers = _subcommands(parser)
    commands = [subparsers.choices[command], *subparsers.choices.values()]
    flags: dict[str, str] = {}
    for subparser in commands:
        for action in subparser._actions:
            long = [text for text in action.option_strings if text.startswith("--")]
            if long and action.dest not in flags:
                flags[action.dest] = long[0]
    return flags


def _flag_wording(message: str, flags: Mapping[str, str], quoted: bool = True) -> str:
    """`message` of the library in this command line's words (errors.flag_wording; `evaluate=False` -> `--no-eval`)."""
    from .training.options import TrainOptions

    # The fields whose flag says the opposite (`evaluate=False` is --no-eval): their flag is their destination's.
    negated = {item.name: item.name for item in options_of(TrainOptions) if item.metadata["negated"] is not None}
    return flag_wording(message, flags, quoted, negated)


class _FlagWording(logging.Formatter):
    """Log records of this package in the command line's words (`_flag_wording`); others as they are."""

    def __init__(self, fmt: str, flags: Mapping[str, str], quoted: bool) -> None:
        super().__init__(fmt)
        self.flags, self.quoted = flags, quoted

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return _flag_wording(text, self.flags, self.quoted) if record.name.startswith(PACKAGE_LOGGER) else text


@contextlib.contextmanager
def _printed_progress(flags: Mapping[str, str]) -> Iterator[None]:
    """For the body: the package's progress (INFO records) on stdout, one message a line as `print` wrote it and
    flushed at once; its warnings keep going to stderr through the root logger (`main`)."""
    package = logging.getLogger(PACKAGE_LOGGER)
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(lambda record: record.levelno < logging.WARNING)
    handler.setFormatter(_FlagWording("%(message)s", flags, quoted=False))
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


# ---------------------------------------------------------------------------------------------------- train


def _budget(recipe: Recipe) -> str:
    """The recipe's budget as the help text writes it: 14m, 100000 updates, ..."""
    parts = [_duration_text(recipe.max_time)] if recipe.max_time is not None else []
    parts += [f"{recipe.max_steps} updates"] if recipe.max_steps is not None else []
    parts += [f"{recipe.epochs} epochs"] if recipe.epochs is not None else []
    return " or ".join(parts)


def _add_train_parser(subparsers: Any, recipe: Recipe) -> None:
    """The `train` options, one flag per TrainOptions option (training/options.py), under its group; the defaults
    shown are `recipe`'s (the one `--recipe` names), and each is the library's: `run_train` passes only the options
    given."""
    from .training.options import DEFAULT_OUTPUT_DIR, GROUPS, TrainOptions

    parser = subparsers.add_parser(
        "train",
        help="train a model (default: the Multi30k EN-DE main job, ~20 minutes on 2 CPU cores)",
        description=(
            "Train a translation model inside transformers' Seq2SeqTrainer, average the last checkpoints (§6.1), "
            "evaluate on the test set and write a Hub-ready folder. With no options: Multi30k EN->DE, preset "
            f"{DEFAULT_RECIPE.preset}, a {_budget(DEFAULT_RECIPE)} training budget, into {DEFAULT_OUTPUT_DIR}. "
            "--recipe starts from other settings; options given explicitly override the recipe's. Any other "
            "Seq2SeqTrainingArguments field is an option too, spelt as in transformers' run_translation.py "
            "(e.g. --optim adafactor --max_grad_norm 1.0 --weight_decay 0.01 --fp16 --deepspeed ds.json); "
            "--config FILE reads options and Trainer arguments from a YAML or JSON file, which the command line "
            "overrides. RUN/run_config.json records the resolved configuration: --config it to repeat the run."
        ),
    )
    summaries = "; ".join(f"{item.name}: {item.summary}" for item in RECIPES.values())
    parser.add_argument(
        "--recipe",
        default=recipe.name,
        choices=sorted(RECIPES),
        help=f"the settings to start from (hf_vanilla_transformer/training/recipes.py): {summaries} "
        f"(default: {recipe.name})".replace("%", "%%"),
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML (.yaml/.yml) or JSON file of options (their names with underscores: lr, warmup_steps, "
        "max_time, ...; `recipe`) and Trainer arguments (optim, max_grad_norm, ...); the command line overrides it",
    )
    _add_options(parser, TrainOptions, recipe, GROUPS)
    parser.set_defaults(func=run_train, train_parser=parser)


class _Unset:
    """The value of an option that was not given (argparse keeps a namespace's values instead of its defaults)."""


def _given(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The options of `argv` that `parser` knows, by destination, only those given (not the defaults); and the rest
    of `argv`."""
    unset = _Unset()
    namespace = argparse.Namespace(**{action.dest: unset for action in parser._actions})
    namespace, rest = parser.parse_known_args(argv, namespace=namespace)
    return {name: value for name, value in vars(namespace).items() if value is not unset}, rest


def _trainer_parser() -> argparse.ArgumentParser:
    """transformers' HfArgumentParser over VanillaSeq2SeqTrainingArguments (what run_translation.py parses), whose
    errors are one-line CommandLineErrors instead of a usage message and exit."""
    from .training.trainer import VanillaSeq2SeqTrainingArguments

    parser = HfArgumentParser(VanillaSeq2SeqTrainingArguments)

    def error(message: str) -> None:
        raise CommandLineError(f"Trainer argument: {message}.")

    parser.error = error  # type: ignore[method-assign]
    return parser


def _trainer_arguments(argv: list[str], ours: list[str]) -> dict[str, Any]:
    """The Trainer arguments in `argv` (what the `train` options left), typed as HfArgumentParser types them; an
    unknown one is an error naming the closest of `ours` (the `train` options) and the Trainer's."""
    if not argv:
        return {}
    parser = _trainer_parser()
    given, unknown = _given(parser, argv)
    if unknown:
        option = next((text for text in unknown if text.startswith("-")), None)
        if option is None:
            raise CommandLineError(
                f"`train` takes no value {unknown[0]!r} here; it follows no option. Check the quoting."
            )
        known = ours + [text for action in parser._actions for text in action.option_strings]
        name = option.split("=", 1)[0]
        raise CommandLineError(
            f"Unknown option `{name}`{close_matches(name, known)}: `train` takes its own options (--help) and the "
            "fields of Seq2SeqTrainingArguments as --FIELD VALUE."
        )
    return given


def _read_config(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainOptions values with `recipe`, Trainer arguments) of a --config file. Keys are TrainOptions option names
    (dashes read as underscores) or Trainer argument names; string values are read as on the command line (so
    durations such as "1h" and YAML's "1e-3" work), other values are taken as the file types them."""
    from .training.options import TrainOptions
    from .training.train import trainer_argument_names

    file = existing_file(path, "config")
    try:
        text = file.read_text(encoding="utf-8")
        content = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        problem = " ".join(str(error).split())
        raise CommandLineError(f"`--config` {path} is not valid {file.suffix[1:].upper()}: {problem}") from None
    if file.suffix not in (".json", ".yaml", ".yml"):
        raise CommandLineError(f"`--config` {path}: name a .yaml, .yml or .json file.")
    if not isinstance(content, dict):
        raise CommandLineError(f"`--config` {path} must hold a mapping of option names to values.")
    options = {item.name: item for item in options_of(TrainOptions)}
    trainer_names = trainer_argument_names()
    ours: dict[str, Any] = {}
    trainer: dict[str, Any] = {}
    for key, value in content.items():
        name = str(key).replace("-", "_")
        if name in options:
            try:
                ours[name] = read(options[name], value) if isinstance(value, str) else value
            except ValueError as error:
                raise CommandLineError(f"`--config` {path}: `{key}`: {error}.") from None
        elif name == "recipe":
            ours[name] = value
        elif name in trainer_names:
            trainer[name] = _trainer_arguments([f"--{name}", value], [])[name] if isinstance(value, str) else value
        else:
            known = [*options, "recipe", *trainer_names]
            raise CommandLineError(
                f"`--config` {path}: unknown key `{key}`{close_matches(name, known)}. Keys are TrainOptions names "
                "(the options' names with underscores) and Seq2SeqTrainingArguments fields."
            )
    return ours, trainer


def run_train(args: argparse.Namespace) -> int:
    """The `train` subcommand: the recipe, overridden by the --config file, overridden by the options given, through
    `training.train.train`; what the `train` options do not name are Trainer arguments."""
    from .training.options import TrainOptions
    from .training.train import train

    given = _given(args.train_parser, args.argv[1:])[0]
    ours, trainer = _read_config(args.config) if args.config is not None else ({}, {})
    ours.update((item.name, given[item.name]) for item in options_of(TrainOptions) if item.name in given)
    recipe = given.get("recipe", ours.pop("recipe", DEFAULT_RECIPE.name))
    if recipe not in RECIPES:
        raise CommandLineError(f"`recipe` {recipe!r} in --config {args.config}: pick one of {sorted(RECIPES)}.")
    ours_options = [text for action in args.train_parser._actions for text in action.option_strings]
    trainer.update(_trainer_arguments(args.trainer_argv, ours_options))
    options = TrainOptions.from_recipe(
        RECIPES[recipe], **ours, trainer_args=trainer, command=shlex.join([PROG, *args.argv])
    )
    args.run_folder = options.output_dir  # --config may name it: where an interrupt looks for checkpoints
    result = train(options)
    if result is not None:  # None: a process of a distributed run other than the one that writes the results
        print(f"Done in {result.summary['seconds'] / 60:.1f} minutes. Results: {result.results_file}", flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Training ended on every process: the command's process group goes before the interpreter does. A gloo
        # group left to the exit aborted a torchrun process now and then ("terminate called without an active
        # exception"; pytorch/pytorch#190489).
        torch.distributed.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------------- evaluate


def _add_evaluate_parser(subparsers: Any) -> None:
    from .inference.evaluation import EvaluateOptions

    parser = subparsers.add_parser(
        "evaluate",
        help="score a model folder on a test set (sacreBLEU, lowercased BLEU, chrF)",
        description="Translate a test set with the model's own decoding (§6.1 by default) and score it.",
    )
    parser.add_argument("model_dir", help=MODEL_DIR_HELP)
    _add_options(parser, EvaluateOptions)
    parser.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace) -> int:
    """The `evaluate` subcommand."""
    from .inference.evaluation import EvaluateOptions, evaluate

    keep_freed_memory()  # this process decodes: no fresh mapping per step's scores

    results = evaluate(_command_options(EvaluateOptions, args))
    print(
        f"BLEU {results['bleu']:.2f} ({results['bleu_signature']})\n"
        f"lowercased BLEU {results['bleu_lowercase']:.2f}\nchrF {results['chrf']:.2f}\n"
        f"{results['n']} sentences in {results['seconds']:.1f} s"
    )
    return 0


# ---------------------------------------------------------------------------------------------------- translate


def _add_translate_parser(subparsers: Any) -> None:
    """The `translate` options, one flag per TranslateOptions option (inference/translation.py), and the command's
    own: the sentences, --input, --output and --prefix (a file of the prefixes)."""
    from .inference.translation import MODES, TranslateOptions

    parser = subparsers.add_parser(
        "translate",
        help="translate sentences (arguments, or one per line on stdin or --input)",
        description="Translate with a saved model and its own decoding (§6.1: beam 4, alpha 0.6, source + 50). "
        "Lines from stdin or --input are translated in chunks of --batch-size lines, each chunk printed as soon as "
        "it is done (--batch-size 1 for a line-by-line pipe); one output line per input line, in order, a blank "
        "line for a blank line.",
    )
    parser.add_argument("model_dir", help=MODEL_DIR_HELP)
    parser.add_argument("text", nargs="*", help="sentences to translate; none: read lines from --input or stdin")
    parser.add_argument(
        "--input",
        metavar="FILE",
        help="translate the lines of this UTF-8 file (.gz allowed); a pipe (FIFO) streams line by line as stdin does",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the translations to this file instead of stdout (flushed after each chunk: a run that stops "
        "leaves the lines done so far; one run at a time: a second run naming it is refused)",
    )
    modes = _add_options(parser, TranslateOptions)[MODES]
    modes.add_argument(
        "--prefix",
        dest="prefixes",
        metavar="FILE",
        help="force each output to start with line i of this UTF-8 file (.gz allowed) for input line i (an empty "
        "line: no prefix)",
    )
    parser.set_defaults(func=run_translate)


def _input_lines(path: Path, stack: contextlib.ExitStack) -> list[str] | Iterator[str]:
    """The lines of `translate --input`: a file (or .gz) is read whole as `evaluate --src` reads it (UTF-8, else an
    error naming the line, before any decoding; a CRLF line end is a line end); a pipe (a FIFO, bash's `<(...)`)
    line by line as it arrives, as stdin, so that a line written into it is translated before the writer closes
    it."""
    from .parallel_text import LineStream, read_lines

    if path.is_file() or path.suffix == ".gz":
        return read_lines(path)
    return LineStream(stack.enter_context(open(path, "rb")), str(path))


def run_translate(args: argparse.Namespace) -> int:
    """The `translate` subcommand: one output line per input line, in input order (`translation.translation_line`),
    from the arguments, --input (`_input_lines`) or stdin (line by line as it arrives). A file or stream's leading
    byte order mark is dropped (parallel_text.BOM). One run at a time writes an --output file: it holds the file's lock
    (files.exclusive_lock) from the start, and a second run is refused before it loads anything."""
    from .inference.translation import TranslateOptions, translate_stream, translation_line
    from .parallel_text import LineStream, read_lines

    # A tool's stderr carries warnings and errors only: no bar for loading the weights.
    transformers_logging.disable_progress_bar()
    keep_freed_memory()  # this process decodes: no fresh mapping per step's scores
    model_folder(args.model_dir, args.trust_remote_code)  # a wrong folder is reported before stdin is read
    if args.text and args.input is not None:
        raise CommandLineError("Pass sentences either as arguments or with `--input`, not both.")
    with contextlib.ExitStack() as stack:
        if args.output is not None:
            inputs = [("model_dir", args.model_dir), ("input", args.input), ("prefixes", args.prefixes)]
            output = writable_file(args.output, "output", "text", "translations.txt", inputs)
            if not output.exists() or output.is_file():  # a device or pipe (/dev/null) is no file to mix lines in
                stack.enter_context(exclusive_lock(output.resolve(), "output", "translate run"))
        if args.text:
            lines = args.text
        elif args.input is not None:
            lines = _input_lines(existing_file(args.input, "input"), stack)
        else:
            lines = LineStream(sys.stdin.buffer, "stdin")
        # --prefix FILE is read whole, before decoding (a bad byte is reported first); its lines go with the input.
        prefixes = read_lines(existing_file(args.prefixes, "prefixes")) if args.prefixes is not None else None
        # (--prefix names a file: its lines, read above, go with the input lines)
        options = _command_options(TranslateOptions, args, prefixes=())
        results = translate_stream(options, lines, prefixes)
        # The first line comes once the model is loaded and the options checked: only then is --output created.
        first = list(itertools.islice(results, 1))
        out = sys.stdout if args.output is None else stack.enter_context(open(output, "w", encoding="utf-8"))
        for hypotheses in itertools.chain(first, results):
            out.write(translation_line(hypotheses) + "\n")
            out.flush()  # at once: the reader of a pipe waits for it, and a stopped run keeps what is done
    return 0


# ---------------------------------------------------------------------------------------------------- average


def _add_average_parser(subparsers: Any) -> None:
    from .training.averaging import AverageOptions

    parser = subparsers.add_parser(
        "average",
        help="average checkpoints into one model folder (§6.1)",
        description=(
            "Average the weights of checkpoints (float32 accumulation) into a Hub-ready model folder. Pass the "
            "checkpoint folders, or one folder of Trainer checkpoints with --last N."
        ),
    )
    parser.add_argument(
        "checkpoints", nargs="+", help="checkpoint folders (or one folder of checkpoint-* with --last)"
    )
    _add_options(parser, AverageOptions)
    parser.set_defaults(func=run_average)


def run_average(args: argparse.Namespace) -> int:
    """The `average` subcommand."""
    from .training.averaging import AverageOptions, average

    result = average(_command_options(AverageOptions, args))
    names = ", ".join(path.name for path in result.checkpoints)
    print(f"Averaged {len(result.checkpoints)} checkpoints ({names}) into {result.output}")
    return 0


# ---------------------------------------------------------------------------------------------------- push


def _add_push_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "push",
        help="upload a model folder to the Hugging Face Hub",
        description=(
            "Upload exactly the model's files (weights, configs, tokenizer files, code files, card, figures, "
            "results.json) of MODEL_DIR (the model folder of `train`, OUTPUT_DIR/model, or a converted folder) to "
            "REPO_ID in one commit, creating the repository if needed; the card of a `train` folder is rendered "
            "again with REPO_ID. Needs a token (`hf auth login` or HF_TOKEN)."
        ),
    )
    parser.add_argument("model_dir", help="the model folder")
    parser.add_argument("repo_id", help="the Hub repository, e.g. your-name/multi30k-en-de")
    _add_options(parser, PushOptions)
    parser.set_defaults(func=run_push)


def run_push(args: argparse.Namespace) -> int:
    """The `push` subcommand."""
    result = push(_command_options(PushOptions, args))
    print(f"Pushed {len(result.files)} files to {args.repo_id}: {result.url}")
    return 0


# ---------------------------------------------------------------------------------------------------- curve


def _add_curve_parser(subparsers: Any) -> None:
    from .training.learning_curve import CurveOptions

    parser = subparsers.add_parser(
        "curve",
        help="plot validation BLEU of a run's snapshots against training minutes",
        description="Score the snapshots of `train --curve-every` (RUN_DIR/curve) on Multi30k validation with "
        "greedy decoding; write RUN_DIR/learning_curve.json and RUN_DIR/model/learning_curve.png (with the curves "
        "of --compare-curve FILE beside it, if given).",
    )
    parser.add_argument("run_dir", help="the --output-dir of a `train --curve-every ...` run")
    _add_options(parser, CurveOptions)
    parser.set_defaults(func=run_curve)


def run_curve(args: argparse.Namespace) -> int:
    """The `curve` subcommand."""
    from .training.learning_curve import CurveOptions, learning_curve

    result = learning_curve(_command_options(CurveOptions, args))
    print(f"Wrote {result.png}")
    return 0


# ---------------------------------------------------------------------------------------------------- attention


def _add_attention_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "attention",
        help="plot attention maps of one sentence",
        description="Plot encoder self-, decoder self- and encoder-decoder attention (layers x heads heatmaps).",
    )
    parser.add_argument("model_dir", help=MODEL_DIR_HELP)
    parser.add_argument("sentence", help="the source sentence")
    _add_options(parser, AttentionOptions)
    parser.set_defaults(func=run_attention)


def run_attention(args: argparse.Namespace) -> int:
    """The `attention` subcommand: print the paths of the written plots."""
    for path in plot_attention_maps(_command_options(AttentionOptions, args)):
        print(path)
    return 0


# ---------------------------------------------------------------------------------------------------- serve


def _add_serve_parser(subparsers: Any) -> None:
    from .serving.options import ServeOptions

    parser = subparsers.add_parser(
        "serve",
        help="serve a model folder over HTTP: a JSON API and a page with the attention (docs/serving.md)",
        description="Serve a saved model on http://HOST:PORT/: POST /translate (JSON; the decoding options of "
        "`translate`, sampling and prefixes), POST /attention, GET /health, the API's docs at /docs and a page at / "
        "to type sentences and see the translation and its cross-attention. Requests from concurrent clients are "
        "batched into one generate() call. SIGTERM or Ctrl-C: the requests in flight are answered, then exit 0. "
        "Needs the serve extra (pip install -e '.[serve]').",
    )
    parser.add_argument("model_dir", help=MODEL_DIR_HELP)
    _add_options(parser, ServeOptions)
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """The `serve` subcommand: serves until SIGTERM or Ctrl-C, then exits 0 once the requests in flight are done."""
    from .serving import ServeOptions, serve  # an ImportError without the `serve` extra (main words it)

    transformers_logging.disable_progress_bar()
    keep_freed_memory()  # this process decodes: no fresh mapping per step's scores
    serve(_command_options(ServeOptions, args))
    return 0


# ---------------------------------------------------------------------------------------------------- main


def _chosen_recipe(argv: list[str]) -> Recipe:
    """The recipe `train --recipe NAME` names (the default one otherwise): its settings become the defaults of the
    `train` options, so that the options given explicitly override them. An unknown name is left for the full
    parser to report."""
    if argv[:1] != ["train"]:
        return DEFAULT_RECIPE
    recipe = argparse.ArgumentParser(add_help=False)
    recipe.add_argument("--recipe", default=DEFAULT_RECIPE.name)
    name = recipe.parse_known_args(argv[1:])[0].recipe
    return RECIPES.get(name, DEFAULT_RECIPE)


def build_parser(recipe: Recipe = DEFAULT_RECIPE) -> argparse.ArgumentParser:
    """The command line; `recipe` gives the defaults of the `train` options."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The Transformer of 'Attention Is All You Need' as a Hugging Face model: train, evaluate, "
        "translate, average checkpoints, plot attention, serve over HTTP.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_parser(subparsers, recipe)
    _add_evaluate_parser(subparsers)
    _add_translate_parser(subparsers)
    _add_average_parser(subparsers)
    _add_push_parser(subparsers)
    _add_curve_parser(subparsers)
    _add_attention_parser(subparsers)
    _add_serve_parser(subparsers)
    return parser


# Each command's output: (its attribute in the parsed options, its option), named when the disk fills up.
_OUTPUT = {
    "train": ("output_dir", "--output-dir"),
    "evaluate": ("output", "--output"),
    "translate": ("output", "--output"),
    "average": ("output", "--output"),
    "curve": ("run_dir", "run_dir"),
    "attention": ("out", "--out"),
}


# The extra (pyproject.toml) that brings each module a command may need beyond the core install; `train` and `curve`
# need the `train` extra, which holds all of `eval`.
_EXTRA_OF_MODULE = {
    "datasets": "eval",
    "sacrebleu": "eval",
    "matplotlib": "eval",
    "fastapi": "serve",
    "uvicorn": "serve",
}


def _missing_extra(command: str, error: ImportError) -> str | None:
    """The one-line error for a module of an extra that is not installed (`error`, or the error it was raised from,
    names it); None for any other import error."""
    name = error.name or getattr(error.__cause__, "name", None) or ""
    extra = _EXTRA_OF_MODULE.get(name.split(".")[0])
    if extra is None:
        return None
    extra = "train" if command in ("train", "curve") else extra
    return f"`{command}` needs {name}: pip install 'hf_vanilla_transformer[{extra}]'."


def _after_interrupt(args: argparse.Namespace) -> str:
    """Where an interrupted command leaves things, in one sentence. `train`: the command that continues the run
    from its last complete checkpoint (the same arguments with --resume, without --overwrite, which contradicts
    it); before this run saved one, the command that starts it again. The other commands are run again."""
    if args.command != "train":
        return "Run it again to redo it."
    from .training.averaging import last_checkpoints
    from .training.run_folder import CHECKPOINTS

    checkpoints = Path(getattr(args, "run_folder", args.output_dir)) / CHECKPOINTS
    again = [arg for arg in args.argv if arg not in ("--resume", "--overwrite")]
    try:
        (last,) = last_checkpoints(checkpoints, 1, complete_only=True)
    except ValueError:  # no checkpoint folder, or only a half-written checkpoint in it
        last = None
    # With --overwrite, an earlier run's checkpoints stay until this run has checked its data: they are not its own.
    written = (last / "trainer_state.json").stat().st_mtime if last is not None else 0.0  # the Trainer's last file
    if last is not None and ("--overwrite" not in args.argv or written >= args.started):
        command = shlex.join([PROG, *again, "--resume"])
        return f"The run folder keeps its checkpoints up to {last.name}; to continue from it: {command}"
    if last is None and checkpoints.is_dir() and any(checkpoints.glob("checkpoint-*")):  # half-written only
        command = shlex.join([PROG, *again, "--overwrite"])
        return f"No checkpoint in {checkpoints} is complete; to start afresh: {command}"
    command = shlex.join([PROG, *[arg for arg in args.argv if arg != "--resume"]])
    return f"No checkpoint of this run was saved yet; to start it again: {command}"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of what is still buffered fails no more."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _file_clock() -> float:
    """Now, as the file system stamps a file written now. Linux stamps files from its coarse clock, which lags
    time.time() by up to a tick (a few ms): a checkpoint written just after the start must not look older than
    the run. Elsewhere, time.time() less a 20 ms tick."""
    if sys.platform.startswith("linux"):
        return time.clock_gettime(5)  # CLOCK_REALTIME_COARSE, which the time module does not name
    return time.time() - 0.02


def main(argv: list[str] | None = None) -> int:
    """Console script entry point; returns the exit status: 2 for bad values (as argparse), 130 for Ctrl-C, 143 for
    SIGTERM (128 + the signal, as a shell reports a process the signal ended), 141 for a closed stdout."""
    started = _file_clock()
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_chosen_recipe(argv))
    command = _subcommands(parser).choices.get(argv[0]) if argv else None
    if command is not None and argv[0] != "train":
        # Positionals may follow options (`translate MODEL --int8 "A man."`): argparse's intermixed parsing, which
        # works on a parser without subcommands, so on the command's own.
        args = command.parse_intermixed_args(argv[1:], argparse.Namespace(command=argv[0]))
        extras: list[str] = []
    else:  # what the `train` options do not know are Trainer arguments (run_train)
        args, extras = parser.parse_known_args(argv)
    args.argv, args.trainer_argv, args.started = argv, extras, started
    flags = _option_flags(parser, args.command)
    # Warnings and errors on stderr; the package's progress (INFO) goes to stdout (`_printed_progress`), not here.
    stderr = logging.StreamHandler()
    stderr.setLevel(logging.WARNING)
    stderr.setFormatter(_FlagWording("%(levelname)s %(name)s: %(message)s", flags, quoted=True))
    logging.basicConfig(handlers=[stderr], level=logging.WARNING)
    try:
        with _printed_progress(flags), sigterm_raises_terminated():
            return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line saying where things stand, not a traceback
        parser.exit(128 + signal.SIGINT, f"{parser.prog} {args.command}: interrupted. {_after_interrupt(args)}\n")
    except Terminated:  # SIGTERM: the same line, and the status a shell reports for a process SIGTERM ended
        message = f"{parser.prog} {args.command}: terminated (SIGTERM). {_after_interrupt(args)}\n"
        parser.exit(128 + signal.SIGTERM, message)
    except BrokenPipeError:  # stdout's reader went away (`| head -1`): stop quietly, as the shell's own tools do
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a writer that SIGPIPE ended
    except CommandLineError as error:
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")
    except ImportError as error:  # an optional extra the command needs is not installed
        message = _missing_extra(args.command, error)
        if message is None:
            raise
        parser.exit(2, f"{parser.prog} {args.command}: error: {message}\n")
    except (ValueError, FileNotFoundError) as error:  # OptionError (a ValueError) and the libraries' own checks
        parser.exit(2, f"{parser.prog} {args.command}: error: {_flag_wording(str(error), flags)}\n")
    except Exception as error:  # a full disk: one line naming where it was writing; any other error as it is
        name, option = _OUTPUT.get(args.command, ("model_dir", "folder"))
        message = no_space_message(error, getattr(args, name), option)
        if message is None:
            raise
        parser.exit(2, f"{parser.prog} {args.command}: error: {message}\n")


__all__ = ["build_parser", "main"]
