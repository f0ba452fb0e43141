"""Load on `hf-vanilla-transformer serve` from a bounded load generator on 127.0.0.1 (issue 36, item 4).

    python -m bench.serve_load outputs/multi30k-en-de/model --json bench/results/serve_load.json
    python -m bench.serve_load MODEL_DIR --quick                     # a check: tiny numbers, a minute or two

The server runs as its own process (`serve MODEL_DIR --port 0 --no-access-log`, plus `--serve-args`). For each
number of concurrent clients (`--clients`, default 1 8 32) the generator sends exactly `--requests` requests (default
2,000), each client one at a time over its own keep-alive connection (a closed loop: the load is bounded by the
clients), each request `--sentences-per-request` Multi30k test_2016 source sentences (cycled). Reported per level:
requests/s and sentences/s over the level's wall time, p50/p95 latency, errors (an answer other than 200 with one
translation per sentence) and lost requests (no answer: a connection error or a timeout). Then bad requests mixed into
good ones at 8 clients (malformed JSON, wrong types, 100 KB inputs, empty lists, unknown fields, too many sentences):
each must be answered 4xx and each good one 200, and a good request after them 200. Then the server's peak memory
(VmHWM), its exit status after SIGTERM (0), and `translate`'s own decoding of the same sentences in this process
(`translate_n_best` in chunks of `--translate-batch-size` lines, as the command decodes; the model loaded first, not
timed): its sentences/s and how many of the server's translations are identical to it.

Not part of the test suite (tests/serving/test_serve.py runs `--quick` with a tiny model); results go to
docs/runs/serving-and-scale.md with the host. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from transformers.utils import logging as transformers_logging

from bench.common import host
from hf_vanilla_transformer.inference.decoding import translate_n_best
from hf_vanilla_transformer.inference.loading import load_model, load_tokenizer
from hf_vanilla_transformer.training.data import MULTI30K_DIR

# Requests the server must refuse (4xx), each with what makes it bad.
BAD_BODIES: list[tuple[str, bytes]] = [
    ("malformed JSON", b'{"text": ["A man.",'),
    ("wrong type", b'{"text": 42}'),
    ("wrong option type", b'{"text": "A man.", "num_beams": "four"}'),
    ("100 KB input", json.dumps({"text": "a" * 100_000}).encode()),
    ("empty list", b'{"text": []}'),
    ("unknown field", b'{"text": "A man.", "beam": 4}'),
    ("too many sentences", json.dumps({"text": ["A man."] * 1000}).encode()),
    ("not an object", b'["A man."]'),
]


def multi30k_sentences(count: int) -> list[str]:
    with gzip.open(MULTI30K_DIR / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    return list(itertools.islice(itertools.cycle(lines), count))


class Server:
    """`hf-vanilla-transformer serve` as a process: its URL from uvicorn's log line."""

    def __init__(self, model_dir: Path, serve_args: list[str]) -> None:
        command = [sys.executable, "-m", "hf_vanilla_transformer", "serve", str(model_dir), "--port", "0"]
        self.process = subprocess.Popen(
            [*command, "--no-access-log", *serve_args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.log: list[str] = []
        started = threading.Event()

        def read() -> None:
            for line in self.process.stdout:
                self.log.append(line)
                if "Uvicorn running on" in line:
                    started.set()

        threading.Thread(target=read, daemon=True).start()
        if not started.wait(300):
            self.process.kill()
            raise SystemExit("The server did not start:\n" + "".join(self.log))
        self.url = re.search(r"Uvicorn running on (http://\S+)", "".join(self.log))[1]

    def peak_memory_mib(self) -> float:
        """VmHWM: the most resident memory the server process has held (Linux)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1]) / 1024

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(300)


def run_level(url: str, bodies: list[tuple[bytes, int | None]], clients: int) -> dict[str, Any]:
    """Send `bodies` (JSON bytes, the translations expected, or None for a bad request) from `clients` closed-loop
    clients; returns the level's numbers and the answers."""
    work = iter(enumerate(bodies))
    lock = threading.Lock()
    latencies: list[float] = []
    answers: list[Any] = [None] * len(bodies)
    outcomes = {"errors": 0, "lost": 0, "bad_answered_4xx": 0, "bad_other": 0}

    def client() -> None:
        with httpx.Client(base_url=url, timeout=300, headers={"Content-Type": "application/json"}) as http:
            while True:
                with lock:
                    item = next(work, None)
                if item is None:
                    return
                index, (body, expected) = item
                started = time.perf_counter()
                try:
                    response = http.post("/translate", content=body)
                except httpx.HTTPError:
                    with lock:
                        outcomes["lost"] += 1
                    continue
                elapsed = time.perf_counter() - started
                with lock:
                    if expected is None:
                        outcomes["bad_answered_4xx" if 400 <= response.status_code < 500 else "bad_other"] += 1
                        continue
                    latencies.append(elapsed)
                    translations = response.json().get("translations") if response.status_code == 200 else None
                    if translations is None or len(translations) != expected:
                        outcomes["errors"] += 1
                    else:
                        answers[index] = [translation["text"] for translation in translations]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    good = [expected for _, expected in bodies if expected is not None]
    quantiles = statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) > 1 else latencies * 19
    return {
        "clients": clients,
        "requests": len(good),
        "seconds": round(seconds, 3),
        "requests_per_second": round(len(good) / seconds, 2),
        "sentences_per_second": round(sum(good) / seconds, 2),
        "p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
        "p95_ms": round(quantiles[18] * 1000, 1) if latencies else None,
        **outcomes,
        "answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path, help="a model folder (e.g. outputs/multi30k-en-de/model)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per level")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients per level")
    parser.add_argument("--sentences-per-request", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, help="cap every output (checks with an untrained model)")
    parser.add_argument("--translate-batch-size", type=int, default=32, help="translate's --batch-size")
    parser.add_argument("--serve-args", default="", help='more `serve` options, e.g. "--int8 --max-wait-ms 10"')
    parser.add_argument("--quick", action="store_true", help="a check: 24 requests at 1 and 4 clients")
    parser.add_argument("--json", type=Path, help="write the results to this file")
    args = parser.parse_args(argv)
    started_on = host()
    transformers_logging.disable_progress_bar()  # no bar for loading the weights between the report's lines
    if args.quick:
        args.requests, args.clients = 24, [1, 4]
    serve_args = shlex.split(args.serve_args)
    options = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
    per_request = args.sentences_per_request
    sentences = multi30k_sentences(args.requests * per_request)
    requests = [sentences[start : start + per_request] for start in range(0, len(sentences), per_request)]
    good = [(json.dumps({"text": batch, **options}).encode(), len(batch)) for batch in requests]

    server = Server(args.model_dir, serve_args)
    levels, status = [], None
    try:
        run_level(server.url, good[: min(8, len(good))], 1)  # warm-up: first-call costs out of the numbers
        for clients in args.clients:
            level = run_level(server.url, good, clients)
            levels.append(level)
            print(
                f"{clients:>3} clients: {level['requests_per_second']:8.2f} requests/s, "
                f"{level['sentences_per_second']:8.2f} sentences/s, p50 {level['p50_ms']} ms, "
                f"p95 {level['p95_ms']} ms, {level['errors']} errors, {level['lost']} lost",
                flush=True,
            )
        # Every fifth request bad, cycling through the kinds.
        bad_count = max(len(BAD_BODIES), len(good) // 4)
        bad = [(body, None) for _, body in itertools.islice(itertools.cycle(BAD_BODIES), bad_count)]
        goods = itertools.cycle(good)
        mixed = [item for body in bad for item in [*itertools.islice(goods, 4), body]]
        mixed_level = run_level(server.url, mixed, 8)
        after = httpx.post(f"{server.url}/translate", json={"text": "A man is riding a bike.", **options}, timeout=300)
        peak = server.peak_memory_mib()
    finally:
        status = server.stop()
    bad_report = {
        "sent": bad_count,
        "kinds": [name for name, _ in BAD_BODIES],
        "answered_4xx": mixed_level["bad_answered_4xx"],
        "other": mixed_level["bad_other"],
        "good_errors": mixed_level["errors"],
        "good_lost": mixed_level["lost"],
        "good_after": str(after.status_code),
    }
    print(
        f"bad requests: {bad_report['answered_4xx']} of {bad_count} answered 4xx; good ones beside them: "
        f"{bad_report['good_errors']} errors, {bad_report['good_lost']} lost; "
        f"a good request after: {after.status_code}"
    )

    # translate's decoding of the same sentences, in this process, with the server's precision options.
    model = load_model(args.model_dir, int8="--int8" in serve_args, bf16_weights="--bf16-weights" in serve_args)
    tokenizer = load_tokenizer(args.model_dir)
    started = time.perf_counter()
    hypotheses = translate_n_best(
        model, tokenizer, sentences, args.translate_batch_size, options or None, progress=False
    )
    seconds = time.perf_counter() - started
    reference = [found[0].text for found in hypotheses]
    served = [text for answer in levels[-1]["answers"] if answer for text in answer]
    same = sum(a == b for a, b in zip(served, reference, strict=False))
    translate = {
        "sentences": len(sentences),
        "batch_size": args.translate_batch_size,
        "seconds": round(seconds, 3),
        "sentences_per_second": round(len(sentences) / seconds, 2),
        "identical_to_the_server": f"{same} of {len(served)}",
    }
    print(
        f"translate (batches of {args.translate_batch_size}): {translate['sentences_per_second']:.2f} sentences/s; "
        f"the server's translations identical to it: {translate['identical_to_the_server']}"
    )
    print(f"server peak memory {peak:.0f} MiB; exit status after SIGTERM {status}")
    results = {
        "host": started_on,
        "settings": {
            "requests": args.requests,
            "clients": args.clients,
            "sentences_per_request": per_request,
            "serve_args": serve_args,
            "max_new_tokens": args.max_new_tokens,
        },
        "levels": [{key: value for key, value in level.items() if key != "answers"} for level in levels],
        "bad_requests": bad_report,
        "server_peak_memory_mib": round(peak, 1),
        "server_exit_status": status,
        "translate": translate,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    failed = (
        any(level["errors"] or level["lost"] for level in levels)
        or bad_report["answered_4xx"] != bad_count
        or bad_report["good_errors"]
        or bad_report["good_lost"]
        or after.status_code != 200
        or status != 0
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
