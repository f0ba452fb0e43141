"""Deployment check: a model folder trained here, exported to CTranslate2, against ours on Multi30k test_2016.

    python -m bench.deployment outputs/multi30k-en-de/model --json bench/results/deployment.json

`python -m conversion to-marian` (no force flag: training keeps the decoder-start embedding row at zero), then
CTranslate2's `TransformersConverter`; CTranslate2 runs with compute type float32 and int8. On every sentence of
test_2016 (bundled, `load_multi30k`), each runtime decodes greedy and beam 4, in the same batches (`--batch-size`
sentences, sorted by source length, longest first). Reported per runtime: the fraction of greedy token sequences
identical to ours, the fraction of beam-4 outputs identical to ours, beam-4 sacreBLEU (cased 13a, detokenized),
and the wall seconds for the whole set of each decoding.

Decoding settings. Ours: the folder's generation config (the paper's §6.1: beam 4, GNMT length penalty
lp(Y) = ((5 + |Y|) / 6)^α with α = 0.6, at most source length + 50 tokens); greedy is the same with num_beams=1.
CTranslate2: `min_decoding_length=0` (its default 1 forbids an immediate </s>, which ours allows),
`max_decoding_length` = the batch's longest source + 50 (CTranslate2 has one limit per call, not one per sentence),
each output then cut to its sentence's limit as ours (exact for greedy, where a prefix does not depend on the limit;
for beam search only outputs that run to the limit could differ), and for beam 4 `length_penalty=0.6`.
CTranslate2 divides a hypothesis's log-probability by |Y|^α, not by GNMT's ((5 + |Y|) / 6)^α, and has no GNMT
option; the same α with its own formula is its closest setting (|Y|^α penalises length changes of the short
Multi30k sentences somewhat more).

Timing: ours in this process; each CTranslate2 runtime in a process of its own (`--worker`), because once
CTranslate2 has run in a process, PyTorch's small matrix products there slow down (see bench/README.md), and to
load nothing of ours beside it. Both use `--threads` threads.

ONNX Runtime runs the `python -m conversion to-onnx` export of the same folder (`conversion.onnx.OnnxTranslator`,
greedy only: it has no beam search), also in its own process. A runtime is a worker in `RUNTIMES`: a function of
(work folder with the Marian and ONNX exports, source token lists, batch plan, args) that returns `RuntimeResult`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class RuntimeResult:
    """One runtime's outputs on the whole test set: token strings per sentence (no start token, </s> or padding),
    in input order, and wall seconds for the whole set."""

    greedy: list[list[str]]
    beam: list[list[str]] | None  # None: the runtime decodes greedily only (ONNX Runtime through OnnxTranslator)
    greedy_seconds: float
    beam_seconds: float | None
    detail: str = ""


def batch_plan(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Sentence indices in batches of `batch_size`, sorted by source length (longest first), as evaluation does."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


# -------------------------------------------------------------------------------------------------------- ours
def ours(model_dir: Path, sources: list[str], plan: list[list[int]]) -> RuntimeResult:
    """Our model from `model_dir` with its own generation config (beam) and num_beams=1 (greedy)."""
    from transformers import AutoTokenizer

    from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = model.config.eos_token_id
    outputs: dict[str, list[list[str]]] = {}
    seconds: dict[str, float] = {}
    for name, kwargs in (("greedy", {"num_beams": 1}), ("beam", {})):
        outputs[name] = [[] for _ in sources]
        start = time.perf_counter()
        for indices in plan:
            batch = tokenizer([sources[index] for index in indices], padding=True, return_tensors="pt")
            with torch.inference_mode():
                output_ids = model.generate(**batch, do_sample=False, **kwargs)
            for index, row in zip(indices, output_ids.tolist(), strict=True):
                # Without the start token, up to </s>: a <pad> generated (CTranslate2 cannot) stays and counts.
                row = row[1:]
                outputs[name][index] = tokenizer.convert_ids_to_tokens(row[: row.index(eos)] if eos in row else row)
        seconds[name] = time.perf_counter() - start
    config = model.generation_config
    detail = f"beam {config.num_beams}, {config.length_penalty_type} α={config.length_penalty}"
    return RuntimeResult(outputs["greedy"], outputs["beam"], seconds["greedy"], seconds["beam"], detail)


# ------------------------------------------------------------------------------------------------- CTranslate2
def ctranslate2_worker(compute_type: str) -> Callable[[Path, list[list[str]], list[list[int]], Any], RuntimeResult]:
    """A `RUNTIMES` worker: CTranslate2 on the Marian export, with `compute_type` (module docstring)."""

    def run(export: Path, source_tokens: list[list[str]], plan: list[list[int]], args: Any) -> RuntimeResult:
        import ctranslate2

        ct2_dir = export.parent / "ct2"
        if not (ct2_dir / "model.bin").is_file():  # converted once, float32; int8 is quantized when loading
            ctranslate2.converters.TransformersConverter(str(export)).convert(str(ct2_dir), force=True)
        translator = ctranslate2.Translator(
            str(ct2_dir), device="cpu", compute_type=compute_type, intra_threads=args.threads
        )
        outputs: dict[str, list[list[str]]] = {}
        seconds: dict[str, float] = {}
        for name, beam in (("greedy", 1), ("beam", 4)):
            outputs[name] = [[] for _ in source_tokens]
            start = time.perf_counter()
            for indices in plan:
                batch = [source_tokens[index] for index in indices]
                results = translator.translate_batch(
                    batch,
                    beam_size=beam,
                    length_penalty=0.6 if beam > 1 else 1.0,
                    min_decoding_length=0,
                    max_decoding_length=max(len(tokens) for tokens in batch) + 50,
                    max_batch_size=len(batch),
                )
                for index, result in zip(indices, results, strict=True):
                    # Ours ends each sentence at its own limit (</s> forced as token source length + 50).
                    outputs[name][index] = result.hypotheses[0][: len(source_tokens[index]) + 49]
            seconds[name] = time.perf_counter() - start
        detail = f"beam 4, length_penalty=0.6 (|Y|^α), {compute_type}"
        return RuntimeResult(outputs["greedy"], outputs["beam"], seconds["greedy"], seconds["beam"], detail)

    return run


# ---------------------------------------------------------------------------------------------- ONNX Runtime
def onnx_worker(export: Path, source_tokens: list[list[str]], plan: list[list[int]], args: Any) -> RuntimeResult:
    """A `RUNTIMES` worker: greedy decoding with ONNX Runtime on the `to-onnx` export (its generation config: the
    same per-sentence limit as ours)."""
    import onnxruntime
    from transformers import AutoTokenizer

    from conversion.onnx import OnnxTranslator

    folder = export.parent / "onnx"
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    translator = OnnxTranslator(folder, session_options=options)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    greedy: list[list[str]] = [[] for _ in source_tokens]
    start = time.perf_counter()
    for indices in plan:
        rows = [tokenizer.convert_tokens_to_ids(source_tokens[index]) for index in indices]
        width = max(len(row) for row in rows)
        input_ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
        attention_mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
        for index, row in zip(indices, translator.generate(input_ids, attention_mask).tolist(), strict=True):
            row = row[1:]
            greedy[index] = tokenizer.convert_ids_to_tokens(row[: row.index(eos)] if eos in row else row)
    seconds = time.perf_counter() - start
    return RuntimeResult(greedy, None, seconds, None, f"greedy only, onnxruntime {onnxruntime.__version__}")


# The rows besides ours, each run in its own process on the exports.
RUNTIMES: dict[str, Callable[[Path, list[list[str]], list[list[int]], Any], RuntimeResult]] = {
    "ct2_float32": ctranslate2_worker("float32"),
    "ct2_int8": ctranslate2_worker("int8"),
    "onnxruntime": onnx_worker,
}


def run_worker(name: str, work: Path, args: argparse.Namespace) -> RuntimeResult:
    """`RUNTIMES[name]` in a fresh process (`--worker NAME --work WORK`); its result comes back as JSON."""
    command = [sys.executable, "-m", "bench.deployment", str(args.model_dir), "--worker", name, "--work", str(work)]
    command += ["--threads", str(args.threads)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return RuntimeResult(**json.loads(output.strip().splitlines()[-1]))


# ------------------------------------------------------------------------------------------------------ report
def compare(name: str, result: RuntimeResult, reference: RuntimeResult, detokenize: Callable, refs: list[str]) -> dict:
    """A table row: identical fractions against `reference` (ours), greedy and beam-4 sacreBLEU, seconds (None where
    the runtime has no beam search)."""
    from hf_vanilla_transformer.inference.evaluation import score_translations

    row: dict[str, Any] = {"runtime": name, "decoding": result.detail}
    for kind, label in (("greedy", "greedy"), ("beam", "beam4")):
        outputs, ours_outputs = getattr(result, kind), getattr(reference, kind)
        if outputs is None:
            row |= {f"{label}_identical_to_ours": None, f"{label}_bleu": None, f"{label}_seconds": None}
            continue
        scores = score_translations([detokenize(tokens) for tokens in outputs], refs)
        same = sum(a == b for a, b in zip(outputs, ours_outputs, strict=True)) / len(refs)
        row |= {f"{label}_identical_to_ours": same, f"{label}_bleu": scores["bleu"]}
        row |= {f"{label}_seconds": getattr(result, f"{kind}_seconds"), "bleu_signature": scores["bleu_signature"]}
    return row


def print_table(rows: list[dict[str, Any]], sentences: int) -> None:
    def cell(value: float | None, width: int, digits: int) -> str:
        return f"{'-':>{width}s}" if value is None else f"{value:{width}.{digits}f}"

    print(f"\n{sentences} sentences of Multi30k test_2016")
    print(f"{'runtime':12s} {'greedy = ours':>13s} {'beam4 = ours':>12s}", end=" ")
    print(f"{'greedy BLEU':>11s} {'beam4 BLEU':>10s} {'greedy s':>9s} {'beam4 s':>8s}")
    for row in rows:
        print(
            f"{row['runtime']:12s} {cell(row['greedy_identical_to_ours'], 13, 4)} "
            f"{cell(row['beam4_identical_to_ours'], 12, 4)} {cell(row['greedy_bleu'], 11, 2)} "
            f"{cell(row['beam4_bleu'], 10, 2)} {cell(row['greedy_seconds'], 9, 2)} {cell(row['beam4_seconds'], 8, 2)}"
        )
    for row in rows:
        print(f"  {row['runtime']}: {row['decoding']}")


def test_set(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    from hf_vanilla_transformer.training.data import load_multi30k

    test = load_multi30k(args.src_lang, args.tgt_lang, splits=("test",))["test"]
    count = len(test) if args.max_sentences is None else min(args.max_sentences, len(test))
    return list(test["source"][:count]), list(test["target"][:count])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path, help="A model folder of train (e.g. outputs/multi30k-en-de/model).")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--max-sentences", type=int, default=None, help="The first N test sentences only (checks).")
    parser.add_argument("--runtimes", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES))
    parser.add_argument("--json", type=Path, help="Write the rows and settings to this file.")
    parser.add_argument("--worker", choices=list(RUNTIMES), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.worker:
        plan = json.loads((args.work / "plan.json").read_text())
        result = RUNTIMES[args.worker](args.work / "marian", plan["source_tokens"], plan["batches"], args)
        print(json.dumps(asdict(result)))
        return 0

    from transformers import AutoTokenizer

    from conversion.__main__ import main as convert

    sources, references = test_set(args)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    encoded = tokenizer(sources).input_ids
    plan = batch_plan([len(ids) for ids in encoded], args.batch_size)
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        if convert(["to-marian", str(args.model_dir), str(work / "marian")]) != 0:
            return 1
        if "onnxruntime" in args.runtimes and convert(["to-onnx", str(args.model_dir), str(work / "onnx")]) != 0:
            return 1
        source_tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded]
        (work / "plan.json").write_text(json.dumps({"source_tokens": source_tokens, "batches": plan}))
        print(f"ours: decoding {len(sources)} sentences", flush=True)
        reference = ours(args.model_dir, sources, plan)
        results = {"ours": reference}
        for name in args.runtimes:
            print(f"{name}: decoding in its own process", flush=True)
            results[name] = run_worker(name, work, args)

    def detokenize(tokens: list[str]) -> str:
        ids = tokenizer.convert_tokens_to_ids(tokens)
        return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()

    rows = [compare(name, result, reference, detokenize, references) for name, result in results.items()]
    print_table(rows, len(sources))
    if args.json:
        settings = {"model_dir": str(args.model_dir), "sentences": len(sources), "batch_size": args.batch_size}
        settings |= {"threads": args.threads, "languages": [args.src_lang, args.tgt_lang]}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
