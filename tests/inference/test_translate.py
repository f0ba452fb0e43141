"""`translate` as a command-line tool: stdin streamed in chunks (a line piped in is translated before the pipe
closes), line order and blank lines kept, --output, --n-best with scores, --bf16, --bf16-weights, and one-line
errors."""

import contextlib
import gzip
import io
import itertools
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from hf_vanilla_transformer.errors import DECODING_RANGES, OptionError, check_decoding
from hf_vanilla_transformer.inference import decoding
from hf_vanilla_transformer.inference.decoding import Hypothesis
from hf_vanilla_transformer.inference.evaluation import EvaluateOptions, evaluate
from hf_vanilla_transformer.inference.loading import decoding_attention, load_model
from hf_vanilla_transformer.inference.translation import (
    TranslateOptions,
    Translation,
    _chunks,
    pharaoh,
    token_words,
    translate,
    translate_stream,
    translation_line,
    word_alignment,
)
from hf_vanilla_transformer.model.generation_vanilla_transformer import gnmt_length_penalty
from hf_vanilla_transformer.training.options import TrainOptions, check_report_values

from ..conftest import one_line_error, run

REPO = Path(__file__).resolve().parents[2]
FAST = ["--num-beams", "1", "--max-new-tokens", "6"]


def stdin_run(folder, data: bytes, capsys, monkeypatch, *options: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="\n"))
    return run(["translate", str(folder), *options], capsys)


class TranslateProcess(NamedTuple):
    """A `translate` process and the queue of its stdout's lines."""

    process: subprocess.Popen
    lines: queue.Queue[bytes]


@contextlib.contextmanager
def translate_process(folder: Path, *options: str, stdin: int | None = None) -> Iterator[TranslateProcess]:
    """`translate FOLDER` with the fast decoding and `options` in a process of its own (this checkout's package, one
    thread), and a queue that receives its stdout's lines as they come; killed at the end if still running."""
    command = [sys.executable, "-m", "hf_vanilla_transformer", "translate", str(folder), *FAST, *options]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    lines: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        yield TranslateProcess(process, lines)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_line_piped_in_is_translated_before_stdin_closes(bpe_model, capsys) -> None:
    """The real thing: a subprocess whose stdin stays open answers what has come (a line and a blank line, fewer than
    the default --batch-size) at once, and the next line before stdin closes too."""
    with translate_process(bpe_model, stdin=subprocess.PIPE) as (process, lines):
        process.stdin.write(b"A dog runs.\n\n")
        process.stdin.flush()
        first = [lines.get(timeout=240) for _ in range(2)]  # a hang here: nothing came before stdin closed
        assert process.poll() is None, "the process ended before stdin closed"
        process.stdin.write(b"Two men.\n")
        process.stdin.flush()
        rest = [lines.get(timeout=240)]
        assert process.poll() is None, "the process ended before stdin closed"
        process.stdin.close()
        assert process.wait(timeout=120) == 0, process.stderr.read().decode()
    assert first[1] == b"\n" and first[0].strip() and rest[0].strip()
    code, out, _ = run(["translate", str(bpe_model), "A dog runs.", "Two men.", *FAST], capsys)
    assert code == 0 and out.encode().split(b"\n")[:2] == [first[0].rstrip(b"\n"), rest[0].rstrip(b"\n")]


def test_stream_keeps_order_and_blank_lines_and_reads_lazily(tmp_path, monkeypatch) -> None:
    """translate_stream's own logic, with the decoding replaced by upper-casing: chunks of batch_size lines, blank
    (or white-space) lines never sent to the model, a chunk yielded before the next line is read, bf16 autocast on
    during decoding only when asked."""
    from ..conftest import tiny_model, tiny_tokenizer

    tiny_model().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    calls = []

    def upper(model, tokenizer, sources, *args, n_best=1, scores=False, **kwargs):
        calls.append((list(sources), torch.is_autocast_enabled("cpu")))
        return [[Hypothesis(source.upper(), -1.0 if scores else None)] for source in sources]

    monkeypatch.setattr("hf_vanilla_transformer.inference.translation.translate_n_best", upper)
    read = []

    def lines():
        for line in ["a", "", "b", "  ", "c", "d", "e"]:
            read.append(line)
            yield line

    stream = translate_stream(TranslateOptions(tmp_path, batch_size=3, device="cpu"), lines())
    assert next(stream) == [Translation("A")] and len(read) == 3  # the first chunk, and not a line more
    assert list(stream) == [[], [Translation("B")], [], [Translation("C")], [Translation("D")], [Translation("E")]]
    assert calls == [(["a", "b"], False), (["c", "d"], False), (["e"], False)]
    calls.clear()
    options = TranslateOptions(tmp_path, ["x", ""], device="cpu", bf16=True, n_best=1)
    assert [translation_line(hypotheses) for hypotheses in translate_stream(options)] == ["X\t-1.0000", ""]
    assert calls == [(["x"], True)]
    assert translate(TranslateOptions(tmp_path, ["x", "", "y"], device="cpu")) == ["X", "", "Y"]


def test_translation_line_keeps_one_line_and_its_columns() -> None:
    assert translation_line([Translation("a\tb\r\nc")]) == "a b  c"
    assert translation_line([Translation("a b", -0.5), Translation("a\tc", -1.25)]) == "a b\t-0.5000\ta c\t-1.2500"
    assert translation_line([]) == ""


def test_n_best_lines_are_pairs_of_translation_and_score(bpe_model, capsys, monkeypatch) -> None:
    data = b"A man in a blue shirt.\n\nTwo dogs play in the snow.\n"
    options = ["--num-beams", "3", "--max-new-tokens", "6"]
    code, plain, _ = stdin_run(bpe_model, data, capsys, monkeypatch, *options)
    assert code == 0
    code, out, _ = stdin_run(bpe_model, data, capsys, monkeypatch, *options, "--n-best", "3")
    assert code == 0 and out.count("\n") == 3
    best, blank, best2 = out.split("\n")[:3]
    assert blank == ""
    for line, translation in zip((best, best2), (plain.split("\n")[0], plain.split("\n")[2]), strict=True):
        fields = line.split("\t")
        assert len(fields) == 6 and fields[0] == translation  # `cut -f1` is the plain translation
        scores = [float(score) for score in fields[1::2]]
        assert all(score < 0 for score in scores) and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_scores_are_log_probability_over_the_length_penalty(num_beams) -> None:
    """A hypothesis's score is the sum of its tokens' log-probabilities under the model (teacher-forced) divided by
    GNMT's ((5 + |Y|) / 6)^α: beam search's own score, and the same formula for greedy decoding."""
    from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config

    from ..conftest import tiny_model

    model = tiny_model(seed=1).eval()
    model.generation_config = paper_generation_config(model.config)
    source = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 1, 1]])  # 1: padding
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    kwargs = {"num_beams": num_beams, "num_return_sequences": num_beams, "max_new_tokens": 5}
    kwargs |= {"return_dict_in_generate": True, "output_scores": True}
    with torch.inference_mode():
        output = model.generate(input_ids=source, attention_mask=mask, **kwargs)
        scores = decoding.sequence_scores(model, output, kwargs)
        rows = output.sequences
        sources, masks = (tensor.repeat_interleave(num_beams, dim=0) for tensor in (source, mask))
        logits = model(input_ids=sources, attention_mask=masks, decoder_input_ids=rows[:, :-1]).logits
    log_probs = logits.log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]
    eos = model.config.eos_token_id
    for row in range(len(rows)):
        tokens = rows[row, 1:].tolist()
        length = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        expected = log_probs[row, :length].sum().item() / ((5 + length) / 6) ** 0.6
        assert math.isclose(scores[row].item(), expected, rel_tol=1e-4), (row, tokens)


def test_output_file_and_gzip_input(bpe_model, capsys, monkeypatch, tmp_path) -> None:
    lines = ["A dog.", "", "A girl in a red coat."]
    with gzip.open(tmp_path / "in.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    code, printed, _ = stdin_run(bpe_model, ("\n".join(lines) + "\n").encode(), capsys, monkeypatch, *FAST)
    assert code == 0
    argv = ["translate", str(bpe_model), *FAST, "--input", str(tmp_path / "in.txt.gz")]
    code, out, _ = run([*argv, "--output", str(tmp_path / "out" / "translations.txt")], capsys)
    assert code == 0 and out == ""
    assert (tmp_path / "out" / "translations.txt").read_text(encoding="utf-8") == printed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--n-best", "5"], "`--n-best` 5 needs at least 5 beams, but the decoding has 4"),
        (["--n-best", "2", "--num-beams", "1"], "Pass `--num-beams 2` or more, or a smaller `--n-best`"),
        (
            ["--length-penalty", "nan"],
            "`--length-penalty` must be a number from -5 to 5 (the paper's is 0.6), got nan.",
        ),
        # Finite but absurd: refused with the range instead of an OverflowError traceback from ((5 + |Y|) / 6) ** α.
        (["--length-penalty", "1e308"], "`--length-penalty` must be a number from -5 to 5 (the paper's is 0.6)"),
        (
            ["--num-beams", "1000000"],
            "`--num-beams` must be an integer from 1 to 1000 (the paper's is 4), got 1000000.",
        ),
        (["--max-new-tokens", "1000000000000"], "`--max-new-tokens` must be an integer from 1 to 16384"),
        (["--max-input-tokens", str(2**70)], "`--max-input-tokens` must be an integer from 2 to 1000000"),
        (["--n-best", "0"], "argument --n-best: must be a positive integer, got '0'"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--bf16", "--int8"], "`--bf16` and `--int8` are precisions for the same products; pass one of them."),
        (["--bf16-weights", "--bf16"], "`--bf16` and `--bf16-weights` are precisions for the same products"),
    ],
)
def test_bad_values_are_one_line_and_write_nothing(bpe_model, capsys, monkeypatch, tmp_path, options, message) -> None:
    output = tmp_path / "out.txt"
    code, out, err = stdin_run(bpe_model, b"A dog.\n", capsys, monkeypatch, *options, "--output", str(output))
    if message.startswith("argument"):  # argparse's own: the usage, then the one line
        assert code == 2 and message in err.splitlines()[-1], err
    else:
        one_line_error(code, err, message)
    assert out == "" and not output.exists()


def watch_decoding_precision(monkeypatch) -> list[tuple[set[torch.dtype], bool]]:
    """Each decoding call's (parameter dtypes, bf16 autocast on), recorded in the returned list."""
    seen = []
    translate_n_best = decoding.translate_n_best

    def watch(model, *args, **kwargs):
        seen.append(({parameter.dtype for parameter in model.parameters()}, torch.is_autocast_enabled("cpu")))
        return translate_n_best(model, *args, **kwargs)

    monkeypatch.setattr(decoding, "translate_n_best", watch)  # evaluate's decoding
    monkeypatch.setattr("hf_vanilla_transformer.inference.translation.translate_n_best", watch)  # translate's
    return seen


def test_bf16_weights_decode_with_the_model_in_bf16(bpe_model, capsys, monkeypatch) -> None:
    """--bf16-weights casts the weights (every parameter bf16, no autocast) and prints what that model generates."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    seen = watch_decoding_precision(monkeypatch)
    code, out, _ = stdin_run(bpe_model, b"A dog runs.\nTwo men.\n", capsys, monkeypatch, *FAST, "--bf16-weights")
    assert code == 0 and seen == [({torch.bfloat16}, False)]
    # Loaded as translate loads it on the CPU (loading.decoding_attention: eager attention).
    model = AutoModelForSeq2SeqLM.from_pretrained(bpe_model, attn_implementation="eager").to(torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(bpe_model)
    batch = tokenizer(["A dog runs.", "Two men."], return_tensors="pt", padding=True)
    tokens = model.generate(**batch, num_beams=1, max_new_tokens=6)
    assert out.splitlines() == [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]


def test_evaluate_with_bf16_weights_scores_the_bf16_translations(bpe_model, capsys, tmp_path, monkeypatch) -> None:
    """evaluate --bf16-weights decodes as translate --bf16-weights does: its translations as references score chrF
    100 (the random model's outputs are too short for BLEU's 4-grams); with --int8 too it is one line."""
    sentences = ["A dog runs.", "Two men.", "A woman in a red coat."]
    code, bf16, _ = run(["translate", str(bpe_model), *sentences, "--num-beams", "1", "--bf16-weights"], capsys)
    assert code == 0 and len(bf16.splitlines()) == 3
    (tmp_path / "src.txt").write_text("\n".join(sentences) + "\n")
    (tmp_path / "ref.txt").write_text(bf16)
    argv = ["evaluate", str(bpe_model), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    seen = watch_decoding_precision(monkeypatch)
    code, out, _ = run([*argv, "--num-beams", "1", "--bf16-weights", "--no-progress"], capsys)
    assert code == 0 and "\nchrF 100.00\n" in out, out
    assert seen == [({torch.bfloat16}, False)]
    code, _, err = run([*argv, "--bf16-weights", "--int8"], capsys)
    one_line_error(code, err, "`--int8` and `--bf16-weights` are precisions for the same products")


def test_device_cuda_without_a_gpu_is_one_line(bpe_model, capsys, monkeypatch, tmp_path) -> None:
    """`--device cuda` where torch sees no GPU: one line, and no `--output` file created."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    output = tmp_path / "translations.txt"
    options = ["--device", "cuda", "--output", str(output)]
    code, out, err = stdin_run(bpe_model, b"A dog.\n", capsys, monkeypatch, *options)
    one_line_error(code, err, "`--device cuda`: torch sees no CUDA GPU here. Pass `--device cpu`")
    assert out == "" and not output.exists()


def test_output_paths_are_checked_first(bpe_model, capsys, tmp_path) -> None:
    (tmp_path / "in.txt").write_text("A dog.\n")
    argv = ["translate", str(bpe_model), "--input", str(tmp_path / "in.txt"), "--output"]
    one_line_error(*run([*argv, str(tmp_path)], capsys)[::2], f"`--output` {tmp_path} is a folder")
    one_line_error(*run([*argv, str(tmp_path / "in.txt")], capsys)[::2], "is `--input` ", "which this command reads")
    assert (tmp_path / "in.txt").read_text() == "A dog.\n"


def test_bytes_that_are_not_utf8_stop_the_stream_at_their_line(bpe_model, capsys, monkeypatch) -> None:
    """Chunks before the bad line are already printed (they were done); the error names stdin and the line."""
    data = b"A dog.\nA cat.\nCaf\xe9 au lait.\nA girl.\n"
    code, out, err = stdin_run(bpe_model, data, capsys, monkeypatch, *FAST, "--batch-size", "1")
    one_line_error(code, err, "stdin is not UTF-8 text: line 3 has the byte 0xe9", "iconv")
    assert out.count("\n") == 2


def test_chunks_answer_what_has_come_and_batch_a_burst() -> None:
    """On a pipe, a chunk is what has arrived (up to --batch-size): a burst of 5 lines is one chunk of 3 and one of
    2, a line written alone later is a chunk alone (not held back for more); the end comes after the last line."""
    from hf_vanilla_transformer.training.data import LineStream

    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb", buffering=0) as reader:
        stream = _chunks(LineStream(reader, "stdin"), 3)
        os.write(write_end, b"a\nb\nc\nd\ne\n")
        assert next(stream) == ["a", "b", "c"] and next(stream) == ["d", "e"]
        os.write(write_end, "caf\u00e9\r\n".encode())
        assert next(stream) == ["caf\u00e9"]
        os.write(write_end, b"last line without its end")
        os.close(write_end)
        assert list(stream) == [["last line without its end"]]


GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None

# Beam search over a 37,000-word vocabulary (the base configuration's), 16 sources: each step allocates and frees
# (64, 37000) score tensors, 9.5 MB each. Prints the page faults of the second and third of three generate() calls;
# with "keep" first, after `keep_freed_memory()`.
PAGE_FAULTS = """
import resource, sys, torch
from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.inference.cpu_inference import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
sizes = dict(d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, encoder_attention_heads=2, decoder_attention_heads=2)
config = VanillaTransformerConfig(vocab_size=37000, encoder_layers=1, decoder_layers=1, **sizes)
model = VanillaTransformerForConditionalGeneration(config).eval()
ids = torch.randint(4, 37000, (16, 12))
faults = []
with torch.no_grad():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model.generate(input_ids=ids, num_beams=4, do_sample=False, eos_token_id=None, max_new_tokens=10)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[1], faults[2])
"""


@pytest.mark.skipif(not GLIBC, reason="keep_freed_memory tunes glibc's malloc")
def test_keep_freed_memory_stops_the_page_faults_of_each_decoding_step() -> None:
    """With glibc's defaults, the large score tensors that beam search allocates at every step are mapped afresh
    again and again, and their pages fault in each time (thousands of faults per generate() call); after
    keep_freed_memory the freed memory is reused."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    faults = {}
    for setting in ("default", "keep"):
        result = subprocess.run(
            [sys.executable, "-c", PAGE_FAULTS, setting], capture_output=True, text=True, env=env, check=True
        )
        faults[setting] = [int(count) for count in result.stdout.split()]
    assert min(faults["default"]) > 2_000, faults  # a (64, 37000) float32 tensor is 2,313 pages of 4 KB
    # The fewest of the calls: under memory pressure from other processes the kernel may take back kept pages once.
    assert min(faults["keep"]) < 200, faults


def test_translate_and_evaluate_keep_freed_memory(bpe_model, capsys, monkeypatch, tmp_path) -> None:
    """The decoding commands set the allocator up for decoding before they load the model."""
    calls = []
    monkeypatch.setattr("hf_vanilla_transformer.cli.keep_freed_memory", lambda: calls.append(True) or True)
    code, out, _ = run(["translate", str(bpe_model), "A dog runs.", *FAST], capsys)
    assert code == 0 and calls == [True]
    (tmp_path / "src.txt").write_text("A dog runs.\n")
    (tmp_path / "ref.txt").write_text(out)
    argv = ["evaluate", str(bpe_model), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")]
    code, _, _ = run([*argv, "--num-beams", "1", "--no-progress"], capsys)
    assert code == 0 and calls == [True, True]


def test_decoding_on_the_cpu_loads_eager_attention_unless_chosen(bpe_model) -> None:
    """translate and evaluate load with eager attention on the CPU (faster beam search than sdpa there); a caller's
    choice is kept, and the int8 model gets it too."""
    assert load_model(bpe_model, device="cpu").config._attn_implementation == "eager"
    assert load_model(bpe_model, device="cpu", int8=True).config._attn_implementation == "eager"
    chosen = load_model(bpe_model, device="cpu", attn_implementation="sdpa")
    assert chosen.config._attn_implementation == "sdpa"
    assert decoding_attention(torch.device("cuda")) == "sdpa"


def test_a_closed_stdout_ends_translate_quietly(bpe_model) -> None:
    """`translate … | head -1` where the reader has gone before the first line: no BrokenPipeError traceback, nothing
    on stderr, exit status 141 (128 + SIGPIPE, what a shell reports for a writer ended by its reader)."""
    command = [sys.executable, "-m", "hf_vanilla_transformer", "translate", str(bpe_model), *FAST]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: the first write fails with EPIPE
    try:
        result = subprocess.run(
            command, input=b"A dog runs.\nTwo men.\n", stdout=write_end, stderr=subprocess.PIPE, env=env, cwd=REPO
        )
    finally:
        os.close(write_end)
    stderr = result.stderr.decode()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert result.returncode == 141, stderr


def test_evaluate_reads_src_and_ref_from_pipes(bpe_model, capsys, tmp_path) -> None:
    """--src and --ref may be FIFOs (as bash's `<(...)`, a /dev/fd/N), read once: the scores are those of the same
    lines in regular files. A folder or a missing path is still refused in one line."""
    sources, references = "A dog runs.\nTwo men.\n", "Ein Hund rennt.\nZwei Männer.\n"
    (tmp_path / "src.txt").write_text(sources, encoding="utf-8")
    (tmp_path / "ref.txt").write_text(references, encoding="utf-8")

    def evaluate(src: Path, ref: Path) -> tuple[int, str, str]:
        return run(["evaluate", str(bpe_model), "--src", str(src), "--ref", str(ref), "--num-beams", "1"], capsys)

    code, expected, err = evaluate(tmp_path / "src.txt", tmp_path / "ref.txt")
    assert code == 0 and "BLEU" in expected, err
    fifos = {tmp_path / "src.fifo": sources, tmp_path / "ref.fifo": references}
    feeders = []
    for fifo, text in fifos.items():
        os.mkfifo(fifo)
        feeders.append(threading.Thread(target=fifo.write_text, args=(text,), kwargs={"encoding": "utf-8"}))
        feeders[-1].start()
    try:
        code, out, err = evaluate(tmp_path / "src.fifo", tmp_path / "ref.fifo")
    finally:
        for fifo in fifos:  # a writer still blocked on its open (the run failed before reading) gets a reader
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        for feeder in feeders:
            feeder.join(timeout=30)
    assert code == 0, err
    assert re.sub(r"in [\d.]+ s", "", out) == re.sub(r"in [\d.]+ s", "", expected)  # all but the time taken
    code, _, err = evaluate(tmp_path, tmp_path / "ref.txt")
    one_line_error(code, err, f"`--src` {tmp_path} does not exist or is not a file. Check the path.")
    code, _, err = evaluate(tmp_path / "src.txt", tmp_path / "missing.txt")
    one_line_error(code, err, f"`--ref` {tmp_path / 'missing.txt'} does not exist or is not a file. Check the path.")


# ---------------------------------------------------------------------------------------------------- decoding modes


@pytest.fixture(scope="module")
def word_model(tmp_path_factory) -> Path:
    """A tiny untrained model with the paper's decoding and a word-level tokenizer (one token per word, w4 ... w60)."""
    from hf_vanilla_transformer.model.generation_vanilla_transformer import paper_generation_config

    from ..conftest import tiny_model, tiny_tokenizer

    model = tiny_model(seed=3)
    model.generation_config = paper_generation_config(model.config)
    folder = tmp_path_factory.mktemp("words") / "model"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def generated(folder: Path, sources: list[str], seed: int | None = None, **kwargs) -> tuple:
    """`model.generate(**kwargs)` on `sources` as one padded batch (the model loaded as translate loads it), after
    `torch.manual_seed(seed)`: the model, the tokenizer, the batch and generate's rows of token ids."""
    from transformers import AutoTokenizer

    model, tokenizer = load_model(folder, device="cpu"), AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    if seed is not None:
        torch.manual_seed(seed)
    with torch.inference_mode():
        return model, tokenizer, batch, model.generate(**batch, **kwargs)


def generated_texts(folder: Path, sources: list[str], seed: int | None = None, **kwargs) -> list[str]:
    """The detokenized outputs of `generated`, generate's rows in order."""
    _, tokenizer, _, tokens = generated(folder, sources, seed, **kwargs)
    return [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]


def texts_of(options: TranslateOptions) -> list[list[str]]:
    return [[translation.text for translation in line] for line in translate_stream(options)]


def test_sampling_with_a_seed_is_generate_after_manual_seed(word_model) -> None:
    """--sampling --seed S: generate(do_sample=True, ...) after torch.manual_seed(S), one beam although the model's
    decoding has 4, the N samples of each line in generate's order; the same seed gives the same samples, another
    seed others, and the caller's random state is left as it was."""
    sources = ["w5 w6 w7 w8", "w9 w10"]  # longest first: the batch's order is the input's
    sampling = dict(top_k=5, top_p=0.9, temperature=0.7)
    options = TranslateOptions(word_model, sources, sampling=True, num_return_sequences=3, seed=11, **sampling)
    state = torch.get_rng_state()
    texts = texts_of(options)
    assert torch.equal(torch.get_rng_state(), state)
    expected = generated_texts(
        word_model, sources, 11, do_sample=True, num_beams=1, num_return_sequences=3, **sampling
    )
    assert texts == [expected[:3], expected[3:]]
    assert texts_of(options) == texts
    assert texts_of(TranslateOptions(word_model, sources, sampling=True, num_return_sequences=3, seed=12)) != texts


def test_sampled_scores_are_the_models_log_probability_over_the_length_penalty(word_model) -> None:
    """A sample's score is under the model's own distribution (teacher-forced log-probabilities over GNMT's
    ((5 + |Y|) / 6)^0.6, |Y| up to the first </s>), not under the temperature / top-k shaped one it was drawn from."""
    sampling = dict(temperature=0.5, top_k=3, num_return_sequences=2)
    options = TranslateOptions(word_model, ["w5 w6 w7"], sampling=True, seed=2, scores=True, **sampling)
    (line,) = translate_stream(options)
    model, _, batch, rows = generated(word_model, ["w5 w6 w7"], 2, do_sample=True, num_beams=1, **sampling)
    with torch.inference_mode():
        logits = model(**{name: batch[name].repeat(2, 1) for name in batch}, decoder_input_ids=rows[:, :-1]).logits
    log_probs = logits.log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]
    for row, translation in enumerate(line):
        tokens = rows[row, 1:].tolist()
        length = tokens.index(model.config.eos_token_id) + 1
        expected = log_probs[row, :length].sum().item() / ((5 + length) / 6) ** 0.6
        assert math.isclose(translation.score, expected, rel_tol=1e-4), (translation, expected)


@pytest.mark.parametrize("decoding", [{"num_beams": 1}, {"num_beams": 3, "n_best": 2}], ids=["greedy", "beam"])
def test_prefixed_outputs_start_with_the_prefix_and_are_generate_with_decoder_input_ids(word_model, decoding) -> None:
    """Lines of different prefix lengths (none, one word, two words) in one chunk: each output starts with its
    line's prefix and is generate(decoder_input_ids=[start, prefix...]) of that line alone; the paper's limit
    (source + 50 tokens) counts the tokens after the prefix."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(word_model)
    sources, prefixes = ["w5 w6 w7", "w8 w9", "w10 w11 w12 w13"], ["w20 w21", "", "w30"]
    outputs = decoding.get("n_best", 1)
    texts = texts_of(TranslateOptions(word_model, sources, prefixes=prefixes, **decoding))
    start = tokenizer.pad_token_id  # the model's decoder start token, Marian's choice
    for source, prefix, line in zip(sources, prefixes, texts, strict=True):
        kwargs = {"num_beams": decoding["num_beams"], "num_return_sequences": outputs}
        if prefix:
            kwargs["decoder_input_ids"] = torch.tensor(
                [[start, *tokenizer(prefix, add_special_tokens=False)["input_ids"]]]
            )
        assert line == generated_texts(word_model, [source], **kwargs)
        assert all(text.startswith(prefix) for text in line)
        limit = len(source.split()) + 1 + 50  # source tokens with </s>, + 50 (§6.1); the output's </s> counts
        assert all(len(text.split()) - len(prefix.split()) <= limit - 1 for text in line)


def test_sampling_after_a_prefix_is_generate_with_decoder_input_ids(word_model) -> None:
    options = TranslateOptions(word_model, ["w5 w6 w7"], prefixes=["w40 w41 w42"], sampling=True, seed=4, top_p=0.8)
    (line,) = texts_of(options)
    prompt = torch.tensor([[1, 40, 41, 42]])  # the decoder start token (1) and the prefix's word ids
    assert line == generated_texts(
        word_model, ["w5 w6 w7"], 4, do_sample=True, num_beams=1, top_k=0, top_p=0.8, decoder_input_ids=prompt
    )
    assert line[0].startswith("w40 w41 w42 ")


def test_prefix_file_and_prefix_column_on_the_command_line(word_model, capsys, monkeypatch, tmp_path) -> None:
    """`--prefix FILE` (line i for input line i, an empty line for none) and `--prefix-column` (source<TAB>prefix)
    print what the library gives; a prefix file of another length is one line, as are both ways at once."""
    sources, prefixes = ["w5 w6", "w7 w8 w9", "", "w10"], ["w30", "", "w31", "w32 w33"]
    library = TranslateOptions(word_model, sources, num_beams=2, max_new_tokens=6, prefixes=prefixes)
    expected = [line[0] if line else "" for line in texts_of(library)]
    (tmp_path / "prefixes.txt").write_text("\n".join(prefixes) + "\n")
    options = ["--num-beams", "2", "--max-new-tokens", "6", "--prefix", str(tmp_path / "prefixes.txt")]
    code, out, err = stdin_run(word_model, ("\n".join(sources) + "\n").encode(), capsys, monkeypatch, *options)
    assert code == 0 and out.split("\n")[:-1] == expected, err
    assert expected[0].startswith("w30 ") and expected[3].startswith("w32 w33 ") and expected[2] == ""
    columns = "".join(
        f"{source}\t{prefix}\n" if prefix else f"{source}\n" for source, prefix in zip(sources, prefixes, strict=True)
    )
    code, out, err = stdin_run(word_model, columns.encode(), capsys, monkeypatch, *options[:4], "--prefix-column")
    assert code == 0 and out.split("\n")[:-1] == expected, err
    code, out, err = stdin_run(word_model, b"w5\nw6\nw7\nw8\nw9\n", capsys, monkeypatch, *options)
    one_line_error(code, err, "`--prefix` ended before input line 5: pass one prefix per input line")
    code, out, err = run(["translate", str(word_model), "w5", *options], capsys)
    one_line_error(code, err, "`--prefix` has 4 lines, the input 1: pass one prefix per input line")
    code, _, err = run(["translate", str(word_model), "w5", *options, "--prefix-column"], capsys)
    one_line_error(code, err, "`--prefix` and `--prefix-column` both give the prefixes: pass one of them.")
    code, _, err = run(
        ["translate", str(word_model), "w5", *options, "--output", str(tmp_path / "prefixes.txt")], capsys
    )
    one_line_error(code, err, "is `--prefix`", "which this command reads")
    assert (tmp_path / "prefixes.txt").read_text() == "\n".join(prefixes) + "\n"


@pytest.mark.parametrize("prefix", ["", "w40 w41"], ids=["plain", "prefixed"])
def test_alignments_are_the_argmax_of_the_last_layers_averaged_cross_attention(word_model, prefix) -> None:
    """With one token per word, output word j aligns to the source word of the largest encoder-decoder attention
    of the last layer (heads averaged) in the row of the query that predicted it; </s> is never aligned (neither the
    source's nor the output's) and prefix words are aligned like the others."""
    source = "w5 w6 w7 w8"
    options = TranslateOptions(word_model, [source], prefixes=[prefix], num_beams=1, max_new_tokens=8, alignments=True)
    ((translation,),) = translate_stream(options)
    prompt = {"decoder_input_ids": torch.tensor([[1, 40, 41]])} if prefix else {}  # start token, w40, w41
    model, tokenizer, batch, rows = generated(word_model, [source], num_beams=1, max_new_tokens=8, **prompt)
    with torch.inference_mode():
        attentions = model(**batch, decoder_input_ids=rows[:, :-1], output_attentions=True).cross_attentions
    cross = attentions[-1][0].mean(0)[:, :-1]  # (output tokens, source words): the source's </s> left out
    words = [position for position, token in enumerate(rows[0, 1:].tolist()) if token >= 4]  # w4 ... w60
    assert translation.text == " ".join(tokenizer.convert_ids_to_tokens(rows[0, 1:][words]))
    assert translation.alignment == tuple((int(cross[position].argmax()), j) for j, position in enumerate(words))
    assert len(source.split()) > max(i for i, _ in translation.alignment)
    line = translation_line([translation])
    assert re.fullmatch(r"[^\t]+\t\d+-\d+( \d+-\d+)*", line) and line.split("\t")[0] == translation.text


def test_word_alignment_sums_source_subwords_and_averages_output_subwords() -> None:
    """A source word's weight is the attention mass on its tokens (0.3 + 0.3 beats a single 0.4); an output word
    pools its tokens; tokens of no word (-1) count for nothing."""
    attention = torch.tensor(
        [
            [0.3, 0.3, 0.4, 0.0],  # output word 0: source word 0 holds 0.6 against 0.4 (a mean would say 0.3)
            [0.1, 0.0, 0.5, 0.4],  # output word 1, first token: source word 1 ...
            [0.0, 0.35, 0.0, 0.65],  # ... second token: word 0; </s> (0.65) is no word. Pooled: 0.45 < 0.5
            [0.9, 0.0, 0.1, 0.0],  # the output's </s>: no word
        ]
    )
    source_words, target_words = [0, 0, 1, -1], [0, 1, 1, -1]
    assert word_alignment(attention, source_words, target_words) == ((0, 0), (1, 1))
    attention[2] = torch.tensor([0.0, 0.6, 0.0, 0.4])  # pooled: source word 0 has 0.1 + 0.6 > 0.5
    assert word_alignment(attention, source_words, target_words) == ((0, 0), (0, 1))
    assert word_alignment(attention, [-1] * 4, target_words) == ()
    assert pharaoh(((0, 0), (2, 1))) == "0-0 2-1"


def test_token_words_of_a_byte_fallback_bpe(bpe_model) -> None:
    """Source tokens by their offsets, output tokens by the characters their decoding adds: a lone ▁ belongs to the
    word it starts, the two bytes of ü to its word (the second adds no character), </s> to none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_model)
    text = "A dog über."
    encoded = tokenizer(text, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert tokens == ["▁", "A", "▁", "d", "o", "g", "▁", "<0xC3>", "<0xBC>", "b", "e", "r", ".", "</s>"]
    expected = [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
    assert token_words(text, encoded["offset_mapping"][:-1]) == expected
    ids = encoded["input_ids"][:-1]
    ends = [len(tokenizer.decode(ids[:count])) for count in range(len(ids) + 1)]
    assert token_words(tokenizer.decode(ids), list(itertools.pairwise(ends))) == expected


def test_alignments_scores_and_samples_on_one_line(bpe_model, capsys, monkeypatch) -> None:
    """--sampling --num-return-sequences 3 --alignments --scores: per output its translation, its Pharaoh alignment
    (one pair per output word, source words of the input line) and its score, 9 tab-separated fields; a blank
    line stays empty; the same --seed prints the same lines."""
    data = b"A man in a blue shirt.\n\nTwo dogs play.\n"
    options = ["--sampling", "--num-return-sequences", "3", "--alignments", "--scores", "--seed", "5", *FAST[2:]]
    code, out, err = stdin_run(bpe_model, data, capsys, monkeypatch, *options)
    assert code == 0, err
    lines = out.split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    for line, source in zip((lines[0], lines[2]), ("A man in a blue shirt.", "Two dogs play."), strict=True):
        fields = line.split("\t")
        assert len(fields) == 9
        for text, alignment, score in zip(fields[::3], fields[1::3], fields[2::3], strict=True):
            pairs = [tuple(map(int, pair.split("-"))) for pair in alignment.split()]
            assert [j for _, j in pairs] == list(range(len(text.split())))
            assert all(0 <= i < len(source.split()) for i, _ in pairs)
            assert float(score) < 0
    assert stdin_run(bpe_model, data, capsys, monkeypatch, *options)[1] == out


def test_scores_flag_prints_what_n_best_1_prints(bpe_model, capsys, monkeypatch) -> None:
    data = b"A man in a blue shirt.\n\nTwo dogs play.\n"
    code, scores, _ = stdin_run(bpe_model, data, capsys, monkeypatch, *FAST, "--scores")
    assert code == 0 and scores == stdin_run(bpe_model, data, capsys, monkeypatch, *FAST, "--n-best", "1")[1]
    assert len(scores.split("\n")[0].split("\t")) == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--top-p", "0"], "argument --top-p: must be a number in (0, 1], got '0'"),
        (["--top-p", "1.5"], "argument --top-p: must be a number in (0, 1], got '1.5'"),
        (["--temperature", "0"], "argument --temperature: must be a positive number, got '0'"),
        (["--top-k", "-1"], "argument --top-k: must be a non-negative integer, got '-1'"),
        (["--num-return-sequences", "0"], "argument --num-return-sequences: must be a positive integer, got '0'"),
        (["--num-return-sequences", "5"], "`--num-return-sequences` 5 needs at least 5 beams, but the decoding has 4"),
        (
            ["--sampling", "--num-beams", "2", "--num-return-sequences", "3"],
            "needs at least 3 beams, but the decoding has 2",
        ),
        (["--top-k", "5"], "`--top-k` applies to sampling only: pass `--sampling` too, or drop `--top-k`."),
        (["--seed", "1"], "`--seed` applies to sampling only: pass `--sampling` too, or drop `--seed`."),
        (["--n-best", "2", "--num-return-sequences", "2"], "pass one of `--n-best` and `--num-return-sequences`."),
    ],
)
def test_bad_decoding_modes_are_one_line(bpe_model, capsys, monkeypatch, tmp_path, options, message) -> None:
    output = tmp_path / "out.txt"
    code, out, err = stdin_run(bpe_model, b"A dog.\n", capsys, monkeypatch, *options, "--output", str(output))
    if message.startswith("argument"):
        assert code == 2 and message in err.splitlines()[-1], err
    else:
        one_line_error(code, err, message)
    assert out == "" and not output.exists()


def test_each_decoding_range_takes_its_bounds_and_refuses_past_them_in_translate_evaluate_and_train(
    bpe_model,
) -> None:
    for name, allowed in DECODING_RANGES.items():
        step = 1 if allowed.integer else 1e-6
        check_decoding(**{name: allowed.low}, **{f"eval_{name}": allowed.high})
        for value in (allowed.low - step, allowed.high + step, math.nan, True, "4"):
            with pytest.raises(OptionError, match=rf"^`{name}` must be .* from {allowed.low} to {allowed.high} \("):
                check_decoding(**{name: value})
    # The bound on α keeps both penalties finite: in float64 (the beam searches') at any length, in float32 up to
    # 5e7 tokens.
    lengths = torch.tensor([1.0, 1024.0, 5e7])
    for alpha in (DECODING_RANGES["length_penalty"].low, DECODING_RANGES["length_penalty"].high):
        assert math.isfinite(gnmt_length_penalty(10**30, alpha)) and math.isfinite(float(10**30) ** alpha)
        assert torch.isfinite(gnmt_length_penalty(lengths, alpha)).all() and torch.isfinite(lengths**alpha).all()
    # evaluate and train check the same ranges, before any data is read.
    for options in (EvaluateOptions(bpe_model, length_penalty=1e308), EvaluateOptions(bpe_model, num_beams=10**6)):
        with pytest.raises(OptionError, match=r"must be .* from"):
            evaluate(options)
    with pytest.raises(OptionError, match=r"^`eval_num_beams` must be an integer from 1 to 1000"):
        check_report_values(TrainOptions(eval_num_beams=2000))
    with pytest.raises(OptionError, match=r"^`length_penalty` must be a number from -5 to 5"):
        check_report_values(TrainOptions(length_penalty=1e308))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sampling": True, "top_p": 1.5}, "`top_p` must be a number in (0, 1] (1: no cut), got 1.5."),
        ({"sampling": True, "temperature": 0.0}, "`temperature` must be a number from 0.01 to 100"),
        ({"sampling": True, "temperature": 1e-300}, "`temperature` must be a number from 0.01 to 100"),
        (
            {"length_penalty": 1e308},
            "`length_penalty` must be a number from -5 to 5 (the paper's is 0.6), got 1e+308.",
        ),
        ({"num_beams": 10**6}, "`num_beams` must be an integer from 1 to 1000"),
        ({"n_best": 2000}, "`n_best` must be an integer from 1 to 1000"),
        ({"max_new_tokens": 10**12}, "`max_new_tokens` must be an integer from 1 to 16384"),
        ({"sampling": True, "top_k": -1}, "`top_k` must be a non-negative integer, got -1."),
        ({"sampling": True, "seed": 2**63}, "`seed` must be a non-negative integer below 2**63"),
        ({"num_return_sequences": 0}, "`num_return_sequences` must be an integer from 1 to 1000"),
        (
            {"sampling": True, "num_return_sequences": 10**6},
            "`num_return_sequences` must be an integer from 1 to 1000",
        ),
        ({"prefixes": ["w5"]}, "`prefixes` has 1 lines, `sentences` 2: pass one prefix per sentence"),
        ({"num_beams": 1, "num_return_sequences": 2}, "`num_return_sequences` 2 needs at least 2 beams"),
    ],
)
def test_bad_decoding_fields_name_the_field(word_model, fields, message) -> None:
    with pytest.raises(OptionError) as error:
        translate(TranslateOptions(word_model, ["w5", "w6"], **fields))
    assert message in str(error.value)


def test_a_byte_order_mark_is_dropped_at_the_start_of_input_and_stdin_only(bpe_model, capsys, monkeypatch, tmp_path):
    """A UTF-8 BOM (what Windows editors put first) starts no text: a file, a .gz or stdin starting with one gives
    the translations of the same lines without it, and `evaluate --src` the same hypotheses. A BOM further on is a
    character of its line, kept (the readers' lines)."""
    from hf_vanilla_transformer.training.data import LineStream, read_lines

    text = "A dog runs.\nTwo men.\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "bom.txt").write_text("\ufeff" + text, encoding="utf-8")
    with gzip.open(tmp_path / "bom.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\ufeff" + text)
    greedy = ["--num-beams", "1"]  # no cap on the length: the untrained model's first tokens do not tell them apart
    argv = ["translate", str(bpe_model), *greedy, "--input"]
    code, expected, err = run([*argv, str(tmp_path / "plain.txt")], capsys)
    assert code == 0 and expected.count("\n") == 2, err
    assert run([*argv, str(tmp_path / "bom.txt")], capsys)[:2] == (0, expected)
    assert run([*argv, str(tmp_path / "bom.txt.gz")], capsys)[:2] == (0, expected)
    assert stdin_run(bpe_model, ("\ufeff" + text).encode(), capsys, monkeypatch, *greedy)[:2] == (0, expected)
    hypotheses = []
    for name in ("plain.txt", "bom.txt"):
        argv = ["evaluate", str(bpe_model), "--src", str(tmp_path / name), "--ref", str(tmp_path / "plain.txt")]
        assert run([*argv, *greedy, "--output", str(tmp_path / f"{name}.json")], capsys)[0] == 0
        hypotheses.append(json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))["hypotheses"])
    assert hypotheses[0] == hypotheses[1]
    (tmp_path / "inner.txt").write_text("\ufeffA.\n\ufeffB.\n", encoding="utf-8")
    assert read_lines(tmp_path / "inner.txt") == ["A.", "\ufeffB."]
    assert list(LineStream(io.BytesIO("\ufeffA.\n\ufeffB.\n".encode()), "stdin")) == ["A.", "\ufeffB."]


def test_a_line_of_invisible_characters_is_blank(bpe_model, capsys, monkeypatch) -> None:
    """Zero-width space, non-joiner and joiner, word joiner, BOM and soft hyphen show nothing: a line of them (and
    white space) is a blank line, an empty output line, never sent to the model; one character that shows makes a
    line a sentence."""
    invisible = ["\u200b", "\u200b\u200b \u200c", "\u200d\t\u2060", "\ufeff\u00ad", " \u3000\u200b "]
    data = "\n".join(["A dog runs.", *invisible, "Two men."]).encode() + b"\n"
    code, out, err = stdin_run(bpe_model, data, capsys, monkeypatch, *FAST)
    lines = out.split("\n")
    assert code == 0 and len(lines) == len(invisible) + 3, err
    assert lines[0] and lines[-2] and lines[1:-2] == [""] * len(invisible)
    from hf_vanilla_transformer.inference.translation import is_blank

    assert all(is_blank(line) for line in ["", *invisible])
    assert not any(is_blank(line) for line in ["a", "\u200ba", ".\u00ad"])


def test_a_line_written_into_an_input_fifo_is_translated_before_the_writer_closes_it(bpe_model, tmp_path) -> None:
    """`--input FIFO` (a named pipe, bash's `<(...)`) streams as stdin does: a line written into it is answered while
    the writer keeps it open, and the next line too."""
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    with translate_process(bpe_model, "--input", str(fifo)) as (process, lines):
        writer = os.open(fifo, os.O_RDWR)  # read-write: never waits for the reader, which may have failed
        try:
            os.write(writer, b"A dog runs.\n")
            first = lines.get(timeout=240)  # a hang here: the FIFO is read to its end before translating
            assert process.poll() is None, "the process ended before the FIFO closed"
            os.write(writer, b"Two men.\n")
            second = lines.get(timeout=240)
            assert process.poll() is None, "the process ended before the FIFO closed"
        finally:
            os.close(writer)  # the last writer: the reader sees the end
        assert process.wait(timeout=120) == 0, process.stderr.read().decode()
    assert first.strip() and second.strip()


def test_a_second_run_writing_the_same_output_is_refused(bpe_model, capsys, tmp_path) -> None:
    """While a run writes `--output` (its lock `.NAME.lock` beside it, taken before the model loads), a second run
    naming the same file exits 2 in one line naming the file and the holder's PID, and changes nothing: the file
    holds the first run's lines alone. Once the first run has ended, a run writes it again."""
    output = tmp_path / "out.txt"
    options = ("--output", str(output), "--batch-size", "1")
    with translate_process(bpe_model, *options, stdin=subprocess.PIPE) as (holder, _):
        holder.stdin.write(b"A dog runs.\n")
        holder.stdin.flush()
        for _ in range(2400):  # until the holder's first line is in the file (at most 4 minutes)
            if holder.poll() is not None or (output.exists() and output.read_bytes().endswith(b"\n")):
                break
            time.sleep(0.1)
        assert holder.poll() is None and output.read_bytes().endswith(b"\n"), "the first run wrote no line"
        argv = ["translate", str(bpe_model), *FAST, "--output", str(output), "Two men.", "A girl."]
        code, _, err = run(argv, capsys)
        one_line_error(code, err, f"`--output` {output} is in use by another translate run (PID {holder.pid};")
        holder.stdin.write(b"Two men.\n")
        holder.stdin.close()
        assert holder.wait(timeout=120) == 0, holder.stderr.read().decode()
    code, expected, _ = run(["translate", str(bpe_model), *FAST, "A dog runs.", "Two men."], capsys)
    assert code == 0 and output.read_text(encoding="utf-8") == expected
    assert run([*argv[:-2], "A girl."], capsys)[0] == 0
    assert output.read_text(encoding="utf-8").count("\n") == 1
