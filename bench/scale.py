"""Corpus size: preprocessing time and the peak memory of `train` for 29k, 290k and 2.9M sentence pairs.

    python -m bench.scale --sizes 29000 290000 2900000 --work /tmp/scale --json-dir bench/results

Not a test: it takes about half an hour on 2 cores (most of it tokenizing 2.9M pairs). Corpora: Multi30k train
EN->DE (29,000 pairs, bundled) repeated to the size; copy 0 is the original, every further copy has the words of
each sentence (both sides, independently) shuffled by a generator seeded with (copy, line): deterministic, the same
sentence lengths and vocabulary as Multi30k (so tokens/s is comparable across sizes), and pairs that differ from
the original's. Written as plain text files under `--work`.

For each size, in processes of their own:
- **preprocessing** (`--worker preprocess`), in an empty `datasets` cache: `load_parallel_files` (stream the two
  files into Arrow), the BPE trained on `data.tokenizer_sample` (the default `--tokenizer-sample` and seed of
  `train`), `prepare_pairs` (tokenize through `datasets.map` into Arrow and clean). Seconds of each and per pair,
  and the process's peak RSS.
- **train**: the real CLI, `python -m hf_vanilla_transformer train --train-src/--train-tgt ... --max-steps 50
  --no-eval` with every other option at its default (the main job's model, bf16 where the CPU has bf16 matrix
  units), on the cache the preprocessing left (so it reloads the Arrow files, trains the same BPE on the same
  sample and reuses the tokenized cache: a second run, as the user's). Its peak RSS up to the 50th update and the
  end is `resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` of a wrapper process that runs only it; its training
  tokens/s is the mean `tgt_tokens_per_second` of the Trainer's logs (every 10 updates) after the first update's.

Writes `scale_<size>.json` per size into `--json-dir` and prints a table with the targets of issue 23 item 4.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MULTI30K = 29_000


def make_corpus(size: int, folder: Path) -> tuple[Path, Path]:
    """Multi30k train EN/DE repeated to `size` pairs, copies after the first with word-shuffled sentences."""
    from hf_vanilla_transformer.training.data import MULTI30K_DIR, read_lines

    source_path, target_path = folder / f"corpus-{size}.en", folder / f"corpus-{size}.de"
    if source_path.is_file() and target_path.is_file():
        return source_path, target_path
    folder.mkdir(parents=True, exist_ok=True)
    sides = [read_lines(MULTI30K_DIR / "train.en.gz"), read_lines(MULTI30K_DIR / "train.de.gz")]
    for lines, path in zip(sides, (source_path, target_path), strict=True):
        partial = path.with_suffix(".partial")
        with partial.open("w", encoding="utf-8") as handle:
            for index in range(size):
                copy, line = divmod(index, len(lines))
                words = lines[line].split(" ")
                if copy:
                    words = [words[i] for i in np.random.default_rng((copy, line)).permutation(len(words))]
                handle.write(" ".join(words) + "\n")
        partial.replace(path)
    return source_path, target_path


def preprocess(source_path: Path, target_path: Path) -> dict:
    """Worker: time the three preprocessing stages as `train` runs them (this process's datasets cache)."""
    from hf_vanilla_transformer.training.data import load_parallel_files, prepare_pairs, tokenizer_sample
    from hf_vanilla_transformer.training.options import TrainOptions
    from hf_vanilla_transformer.training.tokenization import train_bpe_tokenizer

    options = TrainOptions()
    seconds = {}
    start = time.perf_counter()
    pairs = load_parallel_files(source_path, target_path)
    seconds["load"] = time.perf_counter() - start
    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(
        tokenizer_sample(pairs, options.tokenizer_sample, seed=options.seed), vocab_size=options.vocab_size
    )
    seconds["bpe"] = time.perf_counter() - start
    start = time.perf_counter()
    prepared = prepare_pairs(pairs, tokenizer, max_length=options.max_length)
    seconds["tokenize_and_clean"] = time.perf_counter() - start
    total = sum(seconds.values())
    return {
        "pairs": len(pairs),
        "bpe_sentences": min(2 * len(pairs), options.tokenizer_sample),
        "seconds": {name: round(value, 2) for name, value in seconds.items()},
        "seconds_total": round(total, 2),
        "microseconds_per_pair": round(1e6 * total / len(pairs), 2),
        "kept_pairs": prepared.cleaning.kept,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_measured(command: list[str], env: dict[str, str], log: Path) -> tuple[float, int, float, dict, str]:
    """(seconds, exit status, peak RSS in MB, {VmRSS, RssAnon, RssFile} in MB at the polled peak, last line of its
    output) of `command` run alone under a wrapper process; its output and errors go to `log`."""
    # The wrapper also polls the child's /proc status: RSS split into anonymous and file-backed (memory-mapped
    # files) at its peak, which getrusage does not tell.
    wrapper = (
        "import resource, subprocess, sys, json, time\n"
        "child = subprocess.Popen(sys.argv[1:])\n"
        "peak = {}\n"
        "while child.poll() is None:\n"
        "    try:\n"
        "        status = dict(line.split(':', 1) for line in open(f'/proc/{child.pid}/status'))\n"
        "        now = {k: int(status[k].split()[0]) for k in ('VmRSS', 'RssAnon', 'RssFile')}\n"
        "        peak = now if now['VmRSS'] > peak.get('VmRSS', 0) else peak\n"
        "    except (OSError, KeyError, ValueError):\n"
        "        pass\n"
        "    time.sleep(0.2)\n"
        "usage = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([child.returncode, usage, peak]), file=sys.stderr)\n"
    )
    start = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-c", wrapper, *command], env=env, stdout=handle, stderr=subprocess.PIPE, text=True
        )
    seconds = time.perf_counter() - start
    output = log.read_text()
    log.write_text(output + done.stderr)
    code, rss_kb, split = json.loads(done.stderr.strip().splitlines()[-1])
    split_mb = {name: round(kb / 1024, 1) for name, kb in split.items()}
    return seconds, code, rss_kb / 1024, split_mb, (output.strip().splitlines() or [""])[-1]


def measure(size: int, work: Path, steps: int, train_options: list[str]) -> dict:
    source_path, target_path = make_corpus(size, work)
    cache = work / f"cache-{size}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).parents[1])}
    log = work / f"preprocess-{size}.log"
    command = [sys.executable, "-m", "bench.scale", "--worker", str(source_path), str(target_path)]
    _, code, _, _, last = run_measured(command, env, log)
    if code:
        raise SystemExit(f"preprocessing {size} failed (exit {code}); see {log}")
    result = {"size": size, "preprocess": json.loads(last)}
    output = work / f"run-{size}"
    shutil.rmtree(output, ignore_errors=True)
    train = [sys.executable, "-m", "hf_vanilla_transformer", "train", "--train-src", str(source_path)]
    train += ["--train-tgt", str(target_path), "--max-steps", str(steps), "--no-eval", "--no-progress"]
    train += ["--logging-steps", "10", "--output-dir", str(output), *train_options]
    log = work / f"train-{size}.log"
    seconds, code, rss, split, _ = run_measured(train, env, log)
    if code:
        raise SystemExit(f"train {size} failed (exit {code}); see {log}")
    state = json.loads(next(output.glob("checkpoints/checkpoint-*/trainer_state.json")).read_text())
    # Every training log but the first update's (logging_first_step), which holds the start-up.
    rates = [entry["tgt_tokens_per_second"] for entry in state["log_history"] if entry.get("step", 0) > 1]
    rates = [rate for rate in rates if rate is not None]
    result["train"] = {
        "command": " ".join(train[1:]),
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(rss, 1),
        "peak_rss_split_mb": split,
        "updates": state["global_step"],
        "tgt_tokens_per_second": round(float(np.mean(rates)), 1) if rates else None,
        "tgt_tokens_per_second_logs": rates,
    }
    result["log_lines"] = [line for line in log.read_text().splitlines() if line.startswith(("Cleaning", "Reusing"))]
    shutil.rmtree(output, ignore_errors=True)
    return result


def table(results: list[dict]) -> str:
    rows = [
        "| pairs | load s | BPE s (sentences) | tokenize+clean s | µs/pair | preprocess RSS MB | train peak RSS MB "
        "(anonymous + file-backed) "
        "| train tgt tok/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        pre, train = result["preprocess"], result["train"]
        rows.append(
            f"| {result['size']:,} | {pre['seconds']['load']:.1f} | {pre['seconds']['bpe']:.1f} "
            f"({pre['bpe_sentences']:,}) | {pre['seconds']['tokenize_and_clean']:.1f} | "
            f"{pre['microseconds_per_pair']:.1f} | {pre['peak_rss_mb']:,.0f} | {train['peak_rss_mb']:,.0f} "
            f"({train['peak_rss_split_mb'].get('RssAnon', float('nan')):,.0f} + "
            f"{train['peak_rss_split_mb'].get('RssFile', float('nan')):,.0f}) | "
            f"{train['tgt_tokens_per_second'] or float('nan'):,.0f} |"
        )
    return "\n".join(rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(preprocess(Path(sys.argv[2]), Path(sys.argv[3]))), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[MULTI30K, 10 * MULTI30K, 100 * MULTI30K])
    parser.add_argument("--work", type=Path, default=Path("/tmp/hf-vanilla-scale"))
    parser.add_argument("--json-dir", type=Path, default=Path("bench/results"))
    parser.add_argument("--steps", type=int, default=50, help="updates of each `train` run")
    parser.add_argument(
        "--train-options", default="", help='more `train` options, e.g. "--max-tokens 1024" (one string)'
    )
    args = parser.parse_args()
    results = []
    for size in args.sizes:
        result = measure(size, args.work, args.steps, args.train_options.split())
        args.json_dir.mkdir(parents=True, exist_ok=True)
        (args.json_dir / f"scale_{size}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result), flush=True)
        results.append(result)
    print(table(results))


if __name__ == "__main__":
    main()
