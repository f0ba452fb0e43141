"""The command line (conversion/__main__.py) against the library: every flag is a field of its format's typed options,
the options' defaults are the flags', errors naming a field are worded as its flag, and the library prints nothing:
the command prints the result it returns."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from conversion import nn_transformer
from conversion.__main__ import FORMATS, as_flags, build_parser, main, options_from
from conversion._common import Finished
from conversion.fairseq import FairseqOptions
from conversion.nn_transformer import NnTransformerOptions

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nn_transformer_tutorial"
VOCABULARIES = {"src_vocab": FIXTURE / "src_vocab.txt", "tgt_vocab": FIXTURE / "tgt_vocab.txt"}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_flag_is_a_field_of_the_formats_options(name: str) -> None:
    """One to one: a flag without a field would be dropped, a field without a flag unreachable from the shell."""
    entry = FORMATS[name]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    entry.add_arguments(parser)
    flags = {action.dest for action in parser._actions if action.dest != "help"}
    assert flags == {option.name for option in fields(entry.options)}


def test_flags_not_given_keep_the_options_defaults() -> None:
    args = build_parser().parse_args(["fairseq", "checkpoint.pt", "out", "--beam", "4", "--dict-dir", "data-bin"])
    options = options_from(args)
    assert options == FairseqOptions(Path("checkpoint.pt"), Path("out"), beam=4, dict_dir=Path("data-bin"))
    assert (options.lenpen, options.atol, options.reference, options.license) == (1.0, 1e-5, None, None)
    args = build_parser().parse_args(["nn-transformer", "model.pt", "out", "--heads", "4", "--norm-first"])
    assert options_from(args) == NnTransformerOptions(Path("model.pt"), Path("out"), heads=4, norm_first=True)


def test_paths_given_as_strings_become_paths() -> None:
    options = NnTransformerOptions("model.pt", "out", heads=4, src_vocab="vocab.txt")  # type: ignore[arg-type]
    assert (options.source, options.output_dir) == (Path("model.pt"), Path("out"))
    assert options.src_vocab == Path("vocab.txt") and options.tgt_vocab is None


def test_errors_name_fields_and_the_command_words_them_as_flags() -> None:
    message = "`source` has no model.pt. Pass `checkpoint` or `beam=4`; `output_dir` is kept; `encoder.version`."
    assert as_flags(message, FairseqOptions) == (
        "`SOURCE` has no model.pt. Pass `--checkpoint` or `--beam 4`; `OUTPUT_DIR` is kept; `encoder.version`."
    )
    assert as_flags("`heads=5` and `dict_dir`", NnTransformerOptions) == "`--heads 5` and `dict_dir`"  # not its field


def test_the_library_prints_nothing_and_returns_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    reference = FIXTURE / "teacher_forced.safetensors"
    options = NnTransformerOptions(
        FIXTURE / "model.pt", tmp_path / "out", heads=4, reference=reference, atol_fp32=1e-5, **VOCABULARIES
    )
    result = nn_transformer.convert(options)
    assert capsys.readouterr().out == ""
    assert isinstance(result, Finished) and result.output_dir == tmp_path / "out"
    assert set(result.differences) == {"fp64", "fp32"} and max(result.differences.values()) < 1e-5
    assert result.verification in (tmp_path / "out" / "README.md").read_text()
    assert result.model.config.d_model == 32


def test_the_command_prints_the_result(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Unverified (no --reference): the report and the card say so, and say how to verify."""
    output = tmp_path / "out"
    assert main(["nn-transformer", str(FIXTURE / "model.pt"), str(output), "--heads", "4"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "Verification: none against the upstream code (no reference logits given; "
        "tests/conversion/fixtures/make_fixtures.py shows how to write them)",
        f"Wrote {output}",
    ]
    assert printed[0].removeprefix("Verification: ") in (output / "README.md").read_text()


@pytest.mark.parametrize("fmt", ["to-marian", "to-onnx"])
@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "`SOURCE` {source} "),
        ("config.json", "{source}/config.json is invalid: `d_model=1000000000` makes a model of"),
        ("generation_config.json", '{source}/generation_config.json has `"num_beams": 0`, which generate() cannot'),
        ("generation_config.json:text", "{source}/generation_config.json is not valid JSON ("),
    ],
)
def test_exports_name_a_damaged_source_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, fmt: str, damage: str, message: str
) -> None:
    """The exports of this package's folders check their source as the commands that load one do: before, a missing
    folder was a traceback (to-marian), d_model 10**9 a ValueError that named no file, and a generation_config.json
    with num_beams 0, or one that is no JSON, was exported (to-marian) without a word."""
    import json

    from ..conftest import tiny_model

    source = tmp_path / "source"
    if damage != "missing":
        tiny_model().save_pretrained(source)
        name = damage.split(":")[0]
        edit = {"config.json": {"d_model": 10**9}, "generation_config.json": {"num_beams": 0}}[name]
        text = json.dumps(json.loads((source / name).read_text()) | edit)
        (source / name).write_text('{"num_beams' if damage.endswith(":text") else text)
    with pytest.raises(SystemExit) as exit_info:
        main([fmt, str(source), str(tmp_path / "out")])
    error = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in error, error
    assert error.splitlines()[-1].startswith(f"python -m conversion {fmt}: error: "), error
    assert message.format(source=source) in error.splitlines()[-1], error
    assert not (tmp_path / "out").exists()
