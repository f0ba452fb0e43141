"""`hf-vanilla-transformer serve` (hf_vanilla_transformer/serving): the JSON API on a real uvicorn on a free port,
dynamic batching (one generate() for concurrent requests, the results of one-at-a-time), the limits and bad requests
(4xx, the server keeps serving), hostile connections (a chunked body past the limit, silent and half-sent
requests, connections waiting in the kernel at shutdown: raw sockets on 127.0.0.1), SIGTERM with a request in flight
(answered, exit 0), the page in a headless chromium, the curl examples of docs/serving.md, and bench/serve_load.py
with tiny numbers.

The model is conftest's tiny untrained one with a byte-level BPE: its translations are nonsense but deterministic,
which is all the checks need. Requests cap the outputs (`max_new_tokens`) to keep the tests short."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from hf_vanilla_transformer.cli import main
from hf_vanilla_transformer.inference.attention_maps import attention_maps
from hf_vanilla_transformer.inference.translation import TranslateOptions, pharaoh
from hf_vanilla_transformer.serving import (
    DynamicBatcher,
    Item,
    Limits,
    QueueFullError,
    ServeOptions,
    ServingModel,
    create_app,
    http_server,
    load_serving_model,
)
from hf_vanilla_transformer.serving.connections import RETRY_AFTER

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"max_new_tokens": 8}  # outputs of the untrained model run to source + 50 tokens otherwise


@pytest.fixture(scope="module")
def serving_model(bpe_model: Path) -> ServingModel:
    return load_serving_model(ServeOptions(bpe_model))


@pytest.fixture
def short_outputs(serving_model: ServingModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's own decoding with outputs of at most source length + 4 tokens (instead of + 50), for the tests
    whose requests take the model's decoding as they are (the page's, the docs' examples)."""
    monkeypatch.setattr(serving_model.model.generation_config, "max_new_tokens_offset", 4)


@contextlib.contextmanager
def running_server(app: Any) -> Iterator[tuple[uvicorn.Server, threading.Thread]]:
    """`app` on the server of `serve` (http_server) in a thread, on a free port of 127.0.0.1: yields the server and
    its thread; stops it gracefully."""
    server = http_server(app, "127.0.0.1", 0, access_log=False)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, thread
    finally:
        server.should_exit = True
        thread.join(60)


@contextlib.contextmanager
def live_server(app: Any) -> Iterator[str]:
    """`app` served as `running_server` does: yields its URL."""
    with running_server(app) as (server, _):
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"


@contextlib.contextmanager
def client_of(app: Any) -> Iterator[httpx.Client]:
    with live_server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        yield client


def generate_calls(monkeypatch: pytest.MonkeyPatch, model: Any) -> list[int]:
    """The rows (sources) of each `model.generate` call from now on."""
    calls: list[int] = []
    original = model.generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["input_ids"].shape[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counted)
    return calls


def wait_until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def texts_and_scores(answer: dict) -> list[list[tuple[str, float | None]]]:
    return [[(h["text"], h["score"]) for h in t["hypotheses"]] for t in answer["translations"]]


# ---------------------------------------------------------------------------------------------------- the API


def test_translate_answers_each_sentence_in_order_as_the_model_decodes_it_alone(serving_model) -> None:
    sentences = ["A man is riding a bike.", "  ", "Two dogs play in the snow."]
    with client_of(create_app(serving_model)) as client:
        many = client.post("/translate", json={"text": sentences, "n_best": 2, **SHORT})
        one = client.post("/translate", json={"text": sentences[0], **SHORT})
        health = client.get("/health").json()
    assert many.status_code == 200 and one.status_code == 200
    translations = many.json()["translations"]
    assert [len(t["hypotheses"]) for t in translations] == [2, 0, 2]  # a blank line: no hypotheses, text ""
    assert translations[1]["text"] == ""
    for sentence, translation in zip(sentences[::2], translations[::2], strict=True):
        (expected,) = serving_model.decode(TranslateOptions("", n_best=2, **SHORT), None, [sentence])
        assert [h["text"] for h in translation["hypotheses"]] == [h.text for h in expected]
        assert [h["score"] for h in translation["hypotheses"]] == pytest.approx([h.score for h in expected], abs=1e-4)
        assert translation["text"] == expected[0].text
    (best,) = one.json()["translations"]
    # No n_best or scores: no score, as translate; no alignments asked for: none.
    assert best["hypotheses"] == [{"text": best["text"], "score": None, "alignment": None}]
    assert health["status"] == "ok" and health["decoder_layers"] == 2 and health["decoder_heads"] == 4


def test_two_concurrent_requests_share_one_generate_call_with_the_results_of_one_at_a_time(
    serving_model, monkeypatch
) -> None:
    calls = generate_calls(monkeypatch, serving_model.model)
    bodies = [
        {"text": "A man is riding a bike.", "n_best": 2, **SHORT},
        {"text": ["Two dogs play in the snow.", "A girl in a red coat."], "n_best": 2, **SHORT},
    ]
    # The first request waits up to 2 s for company: the second arrives meanwhile.
    with client_of(create_app(serving_model, max_wait=2.0)) as client:
        with ThreadPoolExecutor(2) as pool:
            together = [
                answer.json() for answer in pool.map(lambda body: client.post("/translate", json=body), bodies)
            ]
        assert calls == [3]  # one generate() for the three sentences
        alone = [client.post("/translate", json=body).json() for body in bodies]
    assert calls == [3, 1, 2]
    for batched, single in zip(together, alone, strict=True):
        assert [[text for text, _ in row] for row in texts_and_scores(batched)] == [
            [text for text, _ in row] for row in texts_and_scores(single)
        ]
        for row, row_alone in zip(texts_and_scores(batched), texts_and_scores(single), strict=True):
            assert [score for _, score in row] == pytest.approx([score for _, score in row_alone], abs=1e-4)


def test_requests_with_other_decoding_options_are_not_batched_together(serving_model, monkeypatch) -> None:
    calls = generate_calls(monkeypatch, serving_model.model)
    bodies = [{"text": "A man.", **SHORT}, {"text": "A dog.", "num_beams": 1, **SHORT}, {"text": "A cat.", **SHORT}]
    with client_of(create_app(serving_model, max_wait=2.0)) as client:
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda body: client.post("/translate", json=body), bodies))
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    assert sorted(calls) == [1, 2]  # the two of the model's decoding together, the greedy one alone


def test_seeded_sampling_draws_the_samples_of_generate_whatever_runs_beside_it(serving_model) -> None:
    body = {"text": "A man is riding a bike.", "sampling": True, "top_k": 20, "temperature": 0.9}
    body |= {"num_return_sequences": 3, "scores": True, "seed": 7, **SHORT}
    model, tokenizer = serving_model.model, serving_model.tokenizer
    torch.manual_seed(7)
    tokens = model.generate(
        **tokenizer([body["text"]], return_tensors="pt"),
        do_sample=True,
        num_beams=1,
        top_k=20,
        top_p=1.0,
        temperature=0.9,
        num_return_sequences=3,
        max_new_tokens=8,
    )
    expected = [text.strip() for text in tokenizer.batch_decode(tokens, skip_special_tokens=True)]
    other = {"text": ["A dog.", "A cat."], "sampling": True, **SHORT}
    with client_of(create_app(serving_model, max_wait=1.0)) as client:
        with ThreadPoolExecutor(2) as pool:
            seeded, unseeded = pool.map(lambda b: client.post("/translate", json=b), [body, other])
        again = client.post("/translate", json=body)
    (translation,) = seeded.json()["translations"]
    assert [h["text"] for h in translation["hypotheses"]] == expected
    assert all(isinstance(h["score"], float) for h in translation["hypotheses"])
    assert again.json() == seeded.json() and unseeded.status_code == 200


def test_a_prefix_starts_the_translation_as_forced_decoder_tokens(serving_model) -> None:
    model, tokenizer = serving_model.model, serving_model.tokenizer
    prefix_ids = tokenizer(text_target="Ein Mann", add_special_tokens=False)["input_ids"]
    start = model.generation_config.decoder_start_token_id
    tokens = model.generate(
        **tokenizer(["A man is riding a bike."], return_tensors="pt"),
        decoder_input_ids=torch.tensor([[start, *prefix_ids]]),
        num_beams=1,
        max_new_tokens=8,
    )
    expected = tokenizer.batch_decode(tokens, skip_special_tokens=True)[0].strip()
    body = {"text": ["A man is riding a bike.", "A dog."], "prefix": ["Ein Mann", ""], "num_beams": 1, **SHORT}
    with client_of(create_app(serving_model)) as client:
        answer = client.post("/translate", json=body).json()
    with_prefix, without = answer["translations"]
    assert with_prefix["text"] == expected and expected.startswith("Ein Mann")
    assert (
        without["text"]
        == serving_model.decode(TranslateOptions("", num_beams=1, **SHORT), None, ["A dog."])[0][0].text
    )


def test_alignments_are_the_ones_translate_prints(serving_model) -> None:
    sentence = "A man is riding a bike."
    with client_of(create_app(serving_model)) as client:
        answer = client.post("/translate", json={"text": sentence, "alignments": True, "num_beams": 1, **SHORT})
    (hypothesis,) = answer.json()["translations"][0]["hypotheses"]
    options = TranslateOptions("", sentences=[sentence], alignments=True, num_beams=1, **SHORT)
    (expected,) = serving_model.decode(options, None, [sentence])[0]
    assert hypothesis["text"] == expected.text and hypothesis["alignment"]
    assert pharaoh(map(tuple, hypothesis["alignment"])) == pharaoh(expected.alignment)


def test_attention_is_the_cross_attention_of_the_chosen_layer_and_head(serving_model) -> None:
    body = {"text": "A man is riding a bike.", "translation": "Ein Mann fährt Fahrrad.", "layer": 1, "head": 2}
    with client_of(create_app(serving_model)) as client:
        answer = client.post("/attention", json=body)
        default = client.post("/attention", json={"text": body["text"]})
    assert answer.status_code == 200 and default.status_code == 200
    maps = attention_maps(serving_model.model, serving_model.tokenizer, body["text"], body["translation"])
    result = answer.json()
    assert (result["source_tokens"], result["target_tokens"]) == (maps.source_tokens, maps.output_tokens)
    assert torch.tensor(result["weights"]) == pytest.approx(maps.cross[1, 2], abs=1e-4)
    assert [sum(row) for row in result["weights"]] == pytest.approx([1.0] * len(result["target_tokens"]), abs=1e-3)
    assert default.json()["layer"] == 0 and default.json()["weights"]  # teacher-forced on its own translation


# ---------------------------------------------------------------------------------------------------- limits


def test_more_sentences_or_characters_than_the_limits_answer_413_naming_field_value_and_limit(serving_model) -> None:
    app = create_app(serving_model, Limits(max_sentences=2, max_chars=30))
    with client_of(app) as client:
        many = client.post("/translate", json={"text": ["a", "b", "c"]})
        long = client.post("/translate", json={"text": ["A man.", "x" * 31]})
        long_prefix = client.post("/translate", json={"text": "A man.", "prefix": "y" * 31})
        huge = client.post("/translate", content=json.dumps({"text": "z" * 100_000}))
        still = client.post("/translate", json={"text": ["A man.", "x" * 30], **SHORT})
    assert many.status_code == 413
    assert many.json() | {"error": ""} == {"error": "", "field": "text", "value": "3 sentences", "limit": 2}
    assert "--max-sentences" in many.json()["error"]
    assert long.status_code == 413 and (long.json()["field"], long.json()["limit"]) == ("text[1]", 30)
    assert "31 characters" in long.json()["error"] and "--max-chars" in long.json()["error"]
    assert long_prefix.status_code == 413 and long_prefix.json()["field"] == "prefix"
    # 100 KB is over the body limit of 2 sentences of 30 characters: refused before it is read.
    assert huge.status_code == 413 and huge.json()["limit"] == app.state.limits.max_body_bytes
    assert still.status_code == 200


BAD_REQUESTS = [
    # (body, status, the field named, a part of the message)
    (b'{"text": [', 400, None, "not valid JSON"),
    (b"\xff\xfe{", 400, None, "not valid JSON"),
    (b'{"text": 5}', 422, "text", "valid string"),
    (b'{"text": []}', 422, "text", "empty list"),
    (b"[1, 2]", 422, "body", "object"),
    (b'{"text": ["a", 3]}', 422, "text[1]", "valid string"),
    (b'{"num_beams": 2}', 422, "text", "required"),
    (b'{"text": "a", "num_beams": "4"}', 422, "num_beams", "valid integer"),
    (b'{"text": "a", "num_beams": 0}', 422, "num_beams", "an integer from 1 to 1000"),
    (b'{"text": "a", "num_beams": 1000}', 422, "num_beams", "less than or equal to 16"),
    (b'{"text": "a", "beams": 4}', 422, "beams", "Extra inputs"),
    (b'{"text": "a", "n_best": 9}', 422, "n_best", "needs at least 9 beams"),
    (b'{"text": "a", "top_k": 5}', 422, "top_k", "applies to sampling only"),
    (b'{"text": "a", "n_best": 2, "num_return_sequences": 2}', 422, "n_best", "pass one of"),
    (
        b'{"text": "a", "sampling": true, "num_beams": 2, "num_return_sequences": 3}',
        422,
        "num_return_sequences",
        "beams",
    ),
    (b'{"text": "a", "sampling": true, "top_p": 1.5}', 422, "top_p", "a number in (0, 1]"),
    (b'{"text": ["a", "b"], "prefix": ["x"]}', 422, "prefix", "one prefix per sentence"),
    (b'{"text": "a", "length_penalty": NaN}', 422, "length_penalty", "a number from -5 to 5"),
    # Finite but absurd: refused with the range, as `translate` refuses them, instead of a 500 from the decoding.
    (b'{"text": "a", "length_penalty": 1e308}', 422, "length_penalty", "a number from -5 to 5"),
    (b'{"text": "a", "sampling": true, "temperature": 1e-300}', 422, "temperature", "a number from 0.01 to 100"),
    (b'{"text": "a", "max_input_tokens": 1180591620717411303424}', 422, "max_input_tokens", "from 2 to 1000000"),
    # A lone surrogate is no text (the tokenizer cannot take it): 422 naming the field, not a 500.
    (b'{"text": "\\ud800"}', 422, "text", "lone surrogate (\\ud800) at character 0"),
    (b'{"text": ["a", "b\\udfff"]}', 422, "text[1]", "lone surrogate (\\udfff) at character 1"),
    (b'{"text": "a", "prefix": "\\ud800x"}', 422, "prefix", "lone surrogate"),
]


def test_bad_requests_answer_4xx_in_one_line_and_the_server_keeps_serving(serving_model) -> None:
    with client_of(create_app(serving_model)) as client:
        headers = {"Content-Type": "application/json"}
        for body, status, field, words in BAD_REQUESTS:
            answer = client.post("/translate", content=body, headers=headers)
            assert answer.status_code == status, (body, answer.text)
            error = answer.json()
            assert words in error["error"] and "\n" not in error["error"], (body, error)
            if field is not None:
                named = error.get("field") or error["errors"][0]["field"]
                assert named == field, (body, error)
        form = client.post("/translate", content=b'{"text": "a"}', headers={"Content-Type": "text/plain"})
        layer = client.post("/attention", json={"text": "A man.", "layer": 2})
        head = client.post("/attention", json={"text": "A man.", "head": -1})
        surrogate = client.post("/attention", content=b'{"text": "A man.", "translation": "\\udc80"}', headers=headers)
        wrong_method = client.get("/translate")
        good = client.post("/translate", json={"text": "A man.", **SHORT})
    assert form.status_code == 422 and "Content-Type: application/json" in form.json()["error"]
    assert layer.status_code == 422 and "the decoder has 2 layers (0 to 1)" in layer.json()["error"]
    assert head.status_code == 422 and head.json()["errors"][0]["field"] == "head"
    assert surrogate.status_code == 422 and surrogate.json()["field"] == "translation"
    assert surrogate.json()["value"] == "\udc80"  # echoed back as the JSON escape it came as
    assert wrong_method.status_code == 405
    assert good.status_code == 200 and good.json()["translations"][0]["text"]


def test_a_full_queue_answers_503_and_the_admitted_request_is_still_answered(serving_model, monkeypatch) -> None:
    release = threading.Event()
    original = serving_model.model.generate

    def held(*args: Any, **kwargs: Any) -> Any:
        release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(serving_model.model, "generate", held)
    with client_of(create_app(serving_model, max_queue=1, max_wait=0.0)) as client, ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/translate", json={"text": "A man.", **SHORT})
        wait_until(lambda: client.get("/health").json()["queued"] == 1)
        refused = client.post("/translate", json={"text": "A dog.", **SHORT})
        release.set()
        answered = first.result()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "--max-queue" in refused.json()["error"] and refused.json()["limit"] == 1
    assert answered.status_code == 200


# ---------------------------------------------------------------------------------------------------- connections


def test_a_chunked_body_past_the_limit_answers_413_after_reading_at_most_the_limit_and_one_chunk(
    serving_model,
) -> None:
    app = create_app(serving_model, Limits(max_sentences=1, max_chars=10))
    limit, chunk = app.state.limits.max_body_bytes, 65536
    read, sent = [0], []

    async def receive() -> dict[str, Any]:  # a chunked body that never ends, as the app sees it
        assert read[0] <= 20 * limit, "the body was read on past 20 times the limit"
        read[0] += chunk
        return {"type": "http.request", "body": b'{"text": "' + b"a" * (chunk - 10), "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http"}
    scope |= {"path": "/translate", "raw_path": b"/translate", "query_string": b"", "root_path": ""}
    scope |= {"headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")]}
    scope |= {"server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "state": {}}
    asyncio.run(app(scope, receive, send))
    assert limit < read[0] <= limit + chunk
    assert sent[0]["status"] == 413
    body = json.loads(sent[1]["body"])
    assert body["limit"] == limit and f"more than {limit} bytes (chunked)" in body["error"]


def test_a_chunked_body_past_the_limit_is_answered_413_over_a_real_connection(serving_model) -> None:
    app = create_app(serving_model, Limits(max_sentences=1, max_chars=10))
    with running_server(app) as (server, _):
        with socket.create_connection(server.servers[0].sockets[0].getsockname(), timeout=30) as connection:
            connection.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            connection.sendall(b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b'{"text": "' + b"a" * 65526
            for _ in range(16):  # 1 MB, 16 times the limit
                connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.sendall(b"0\r\n\r\n")
            status, _, body = read_answer(connection)
    assert status == 413 and "(chunked)" in json.loads(body)["error"]


def answer_of(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, headers (lowercased names) and body of an HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    fields = (line.split(":", 1) for line in lines)
    return int(status.split()[1]), {name.strip().lower(): value.strip() for name, value in fields}, body


def read_answer(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response (with a Content-Length) read from `connection`, which may stay open."""
    raw = b""
    while b"\r\n\r\n" not in raw or len(raw.partition(b"\r\n\r\n")[2]) < int(answer_of(raw)[1]["content-length"]):
        chunk = connection.recv(65536)
        assert chunk, f"the connection closed after {raw!r}"
        raw += chunk
    return answer_of(raw)


def read_until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout bounds the wait)."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def test_connections_that_send_no_whole_request_are_closed_after_the_request_timeout(serving_model) -> None:
    app = create_app(serving_model, Limits(request_timeout=0.5))
    with running_server(app) as (server, _):
        address = server.servers[0].sockets[0].getsockname()
        silent = [socket.create_connection(address, timeout=30) for _ in range(20)]
        partial_head, partial_body = (
            socket.create_connection(address, timeout=30),
            socket.create_connection(address, timeout=30),
        )
        partial_head.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
        partial_body.sendall(b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"text"')
        try:
            # Closed by the server (EOF), not by the 30 s timeout of these sockets (which would raise).
            assert all(read_until_closed(connection) == b"" for connection in [*silent, partial_head])
            answer = read_until_closed(partial_body)
        finally:
            for connection in [*silent, partial_head, partial_body]:
                connection.close()
        with httpx.Client(base_url=f"http://{address[0]}:{address[1]}", timeout=60) as client:
            still = client.post("/translate", json={"text": "A man.", **SHORT})
    assert answer_of(answer)[0] == 408 and b"did not arrive within 0.5 s" in answer
    assert still.status_code == 200


def test_at_shutdown_connections_waiting_in_the_kernel_are_answered_503_with_retry_after(
    serving_model, monkeypatch
) -> None:
    release, stopping, holding, sent = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    original = serving_model.model.generate

    def held(*args: Any, **kwargs: Any) -> Any:
        release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(serving_model.model, "generate", held)
    body = json.dumps({"text": "A man.", **SHORT}).encode()
    request = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    app = create_app(serving_model, max_wait=0.0)
    with running_server(app) as (server, thread):
        tick = server.on_tick

        async def on_tick(counter: int) -> bool:
            # SIGTERM's flag, seen while the event loop is held (as under load): the connections made meanwhile wait
            # in the kernel's listen queue, unread, when the shutdown begins.
            if not stopping.is_set():
                return await tick(counter)
            holding.set()
            assert sent.wait(30)
            return True

        monkeypatch.setattr(server, "on_tick", on_tick)
        address = server.servers[0].sockets[0].getsockname()
        in_flight = socket.create_connection(address, timeout=60)
        in_flight.sendall(request)
        wait_until(lambda: app.state.batcher.admitted == 1)
        stopping.set()
        assert holding.wait(30)
        waiting = [socket.create_connection(address, timeout=60) for _ in range(20)]
        for connection in waiting:
            connection.sendall(request)
        sent.set()
        release.set()
        thread.join(60)
        answers = [answer_of(read_until_closed(connection)) for connection in [in_flight, *waiting]]
        for connection in [in_flight, *waiting]:
            connection.close()
    assert not thread.is_alive()
    assert answers[0][0] == 200 and json.loads(answers[0][2])["translations"]  # the request in flight is served
    for status, headers, answer in answers[1:]:
        assert (status, headers["retry-after"], headers["connection"]) == (503, RETRY_AFTER, "close")
        assert "shutting down" in json.loads(answer)["error"]


# ---------------------------------------------------------------------------------------------------- the batcher


def test_batches_keep_to_the_token_budget_and_the_order_of_arrival() -> None:
    decoded: list[tuple[str, list[str]]] = []
    entered, gate = threading.Event(), threading.Event()

    def decode(key: str, sources: list[str]) -> list[str]:
        entered.set()
        gate.wait(10)
        decoded.append((key, sources))
        return [source.upper() for source in sources]

    batcher = DynamicBatcher(decode, max_batch_tokens=12, max_wait=0.0, max_queue=10)
    batcher.start()
    blocker = batcher.submit([Item("k", "first", 1)])  # taken at once; the worker holds it until the gate opens
    assert entered.wait(10)
    # Waiting meanwhile: 4 sentences of 3 tokens of key a (12 tokens: one batch), then one more (a second batch)
    # and one of key b between them.
    futures = [batcher.submit([Item("a", f"a{i}", 3) for i in range(3)]), batcher.submit([Item("b", "b0", 2)])]
    futures += [batcher.submit([Item("a", "a3", 3), Item("a", "a4", 3)])]
    gate.set()
    results = [future.result(10) for future in [blocker, *futures]]
    batcher.close()
    assert results == [["FIRST"], ["A0", "A1", "A2"], ["B0"], ["A3", "A4"]]
    assert decoded == [("k", ["first"]), ("a", ["a0", "a1", "a2", "a3"]), ("b", ["b0"]), ("a", ["a4"])]


def test_the_batcher_refuses_past_max_queue_and_answers_everything_admitted_when_closed() -> None:
    gate = threading.Event()
    batcher = DynamicBatcher(lambda key, sources: (gate.wait(10), sources)[1], 100, max_wait=10.0, max_queue=2)
    batcher.start()
    first, second = batcher.submit([Item(1, "x", 1)]), batcher.submit([Item(2, "y", 1)])
    with pytest.raises(QueueFullError):
        batcher.submit([Item(1, "z", 1)])
    gate.set()
    started = time.monotonic()
    batcher.close()  # does not wait out max_wait: closing decodes what is admitted at once
    assert (first.result(0), second.result(0)) == (["x"], ["y"]) and time.monotonic() - started < 5
    assert batcher.admitted == 0


def test_a_failed_decoding_answers_its_requests_and_the_worker_goes_on() -> None:
    def decode(key: str, sources: list[str]) -> list[str]:
        if key == "bad":
            raise RuntimeError("boom")
        return sources

    batcher = DynamicBatcher(decode, 100, max_wait=0.0, max_queue=4)
    batcher.start()
    bad, good = batcher.submit([Item("bad", "x", 1)]), batcher.submit([Item("good", "y", 1)])
    with pytest.raises(RuntimeError, match="boom"):
        bad.result(10)
    assert good.result(10) == ["y"]
    batcher.close()


# ---------------------------------------------------------------------------------------------------- the command


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(model_dir: Path, *options: str) -> Iterator[tuple[subprocess.Popen, str, list[str]]]:
    """`hf-vanilla-transformer serve MODEL_DIR --port 0 OPTIONS` as a process: yields it, its URL (from uvicorn's
    log) and the log lines so far (stderr, growing)."""
    command = [sys.executable, "-m", "hf_vanilla_transformer", "serve", str(model_dir), "--port", "0", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if "Uvicorn running on" in line:
                found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert found.wait(180), "the server did not start:\n" + "".join(lines)
        url = re.search(r"Uvicorn running on (http://\S+)", "".join(lines))[1]
        yield process, url, lines
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_sigterm_answers_the_request_in_flight_then_exits_0(bpe_model: Path) -> None:
    # The request waits 3 s for company (--max-wait-ms): SIGTERM comes while it is in the server.
    # Connections opened just before the signal get an answer too: served, or 503 with Retry-After, never a reset.
    body = json.dumps({"text": "A man.", **SHORT}).encode()
    request = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    with server_process(bpe_model, "--max-wait-ms", "3000") as (process, url, lines):
        with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(1) as pool:
            answer = pool.submit(client.post, "/translate", json={"text": ["A man.", "A dog."], **SHORT})
            wait_until(lambda: client.get("/health").json()["queued"] == 1)
            late = [
                socket.create_connection((httpx.URL(url).host, httpx.URL(url).port), timeout=120) for _ in range(10)
            ]
            for connection in late:
                connection.sendall(request)
            process.send_signal(signal.SIGTERM)
            response = answer.result(120)
            status = process.wait(120)
            answers = [answer_of(read_until_closed(connection)) for connection in late]
            for connection in late:
                connection.close()
    assert response.status_code == 200 and len(response.json()["translations"]) == 2
    assert all(code == 200 or (code == 503 and headers["retry-after"]) for code, headers, _ in answers), answers
    assert status == 0, "".join(lines)
    assert "Shutting down" in "".join(lines) and "Traceback" not in "".join(lines)


def test_serve_errors_are_one_line_and_exit_2(bpe_model: Path, tmp_path: Path, capsys) -> None:
    for argv, words in (
        (["serve", str(tmp_path)], "is not a saved model folder"),
        (["serve", str(bpe_model), "--bf16", "--int8"], "`--bf16` and `--int8`"),
        (["serve", str(bpe_model), "--request-timeout", "inf"], "`--request-timeout` must be a number of seconds > 0"),
        (
            ["serve", str(bpe_model), "--max-input-tokens", str(2**70)],
            "`--max-input-tokens` must be an integer from 2",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        error = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and words in error and "\n" not in error, error
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(SystemExit) as exit_:
            main(["serve", str(bpe_model), "--port", str(taken.getsockname()[1])])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and "Could not serve on 127.0.0.1" in error and "--port" in error


# ---------------------------------------------------------------------------------------------------- the page

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver key of an element reference


class WebDriver:
    """The few W3C WebDriver commands the page test needs, sent to chromedriver with httpx (no selenium)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=120)
        options = {"binary": CHROMIUM, "args": ["--headless=new", "--no-sandbox", "--window-size=1100,1100"]}
        options["args"] += ["--disable-gpu", "--disable-dev-shm-usage"]
        capabilities = {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}
        self.session = self.command("POST", "/session", {"capabilities": capabilities})["sessionId"]

    def command(self, method: str, path: str, body: dict | None = None) -> Any:
        answer = self.http.request(method, path, json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["value"]

    def __call__(self, method: str, path: str, body: dict | None = None) -> Any:
        return self.command(method, f"/session/{self.session}{path}", body)

    def find(self, css: str) -> list[str]:
        return [found[ELEMENT] for found in self("POST", "/elements", {"using": "css selector", "value": css})]

    def script(self, source: str) -> Any:
        return self("POST", "/execute/sync", {"script": source, "args": []})

    def close(self) -> None:
        self.command("DELETE", f"/session/{self.session}")
        self.http.close()


def answers(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.TransportError:  # not listening yet
        return False


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None, reason="no chromium/chromedriver (.ci/run installs)")
def test_the_page_translates_a_typed_sentence_and_draws_the_attention_heatmap(serving_model, short_outputs) -> None:
    # docs/serving_page.png is this screenshot: SERVING_PAGE_MODEL=folder (a trained model) and
    # SERVING_PAGE_SCREENSHOT=docs/serving_page.png take it with that model and save it there.
    if os.environ.get("SERVING_PAGE_MODEL"):
        serving_model = load_serving_model(ServeOptions(os.environ["SERVING_PAGE_MODEL"]))
    sentence = "A man is riding a bike."
    port = free_port()
    driver_process = subprocess.Popen([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL)
    try:
        name = os.environ.get("SERVING_PAGE_MODEL", "the tiny untrained test model")
        with live_server(create_app(serving_model, name=name)) as url:
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/status"), 60)
            browser = WebDriver(f"http://127.0.0.1:{port}")
            try:
                browser("POST", "/url", {"url": url + "/"})
                layers = serving_model.decoder_layers
                wait_until(lambda: browser.script("return document.getElementById('layer').options.length") == layers)
                (text,) = browser.find("#text")
                browser("POST", f"/element/{text}/value", {"text": sentence})
                (button,) = browser.find("#translate")
                browser("POST", f"/element/{button}/click", {})
                wait_until(lambda: len(browser.find("#heatmap td.cell")) > 0, 120)
                shown = browser.script(
                    "return Array.from(document.querySelectorAll('.hypothesis'), (e) => e.textContent)"
                )
                scores = browser.script("return Array.from(document.querySelectorAll('.score'), (e) => e.textContent)")
                cells = browser.script(
                    "return Array.from(document.querySelectorAll('#heatmap tr'), (row) => "
                    "Array.from(row.querySelectorAll('td.cell'), (cell) => Number(cell.dataset.weight)))"
                )
                colored = browser.script(
                    "return Array.from(document.querySelectorAll('#heatmap td.cell'))"
                    ".every((cell) => /^rgb\\(/.test(cell.style.backgroundColor))"
                )
                error = browser.script("return document.getElementById('error').textContent")
                png = base64.b64decode(browser("GET", "/screenshot"))
            finally:
                browser.close()
            with httpx.Client(base_url=url, timeout=120) as client:
                expected = client.post("/translate", json={"text": [sentence], "n_best": 3}).json()
                best = expected["translations"][0]["hypotheses"][0]["text"]
                layer = serving_model.decoder_layers - 1  # the page starts on the last layer, head 0
                maps = client.post("/attention", json={"text": sentence, "translation": best, "layer": layer})
    finally:
        driver_process.terminate()
        driver_process.wait(30)
    assert error == ""
    assert shown == [h["text"] or "(empty)" for h in expected["translations"][0]["hypotheses"]]
    assert scores == [f"{h['score']:.3f}" for h in expected["translations"][0]["hypotheses"]]
    assert [row for row in cells if row] == maps.json()["weights"]  # the table is the attention of the best
    assert colored  # each cell's weight is drawn as its colour
    assert png.startswith(b"\x89PNG")
    if os.environ.get("SERVING_PAGE_SCREENSHOT"):
        Path(os.environ["SERVING_PAGE_SCREENSHOT"]).write_bytes(png)


# ---------------------------------------------------------------------------------------------------- docs, bench

SERVING_DOC = ROOT / "docs" / "serving.md"


def curl_examples() -> list[tuple[list[str], int, Any]]:
    """docs/serving.md's curl commands: (arguments, the status in the line's `# -> NNN` comment, the JSON of the
    ```json block that follows the command's block, if any)."""
    text = SERVING_DOC.read_text(encoding="utf-8")
    blocks = list(re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL))
    examples = []
    for index, block in enumerate(blocks):
        if block[1] != "bash":
            continue
        answer = None
        if index + 1 < len(blocks) and blocks[index + 1][1] == "json":
            answer = json.loads(blocks[index + 1][2])
        commands = re.sub(r"\\\n", " ", block[2]).splitlines()
        for command in commands:
            if command.startswith("curl "):
                status = re.search(r"# -> (\d{3})", command)
                assert status, f"docs/serving.md: `{command}` has no `# -> STATUS` comment"
                examples.append((shlex.split(command, comments=True), int(status[1]), answer))
    return examples


def same_shape(documented: Any, actual: Any, where: str = "") -> None:
    """The actual answer has the documented one's keys and kinds of values (texts and numbers vary by model)."""
    kinds = (dict, list, str, bool, (int, float), type(None))
    kind = next(kind for kind in kinds if isinstance(documented, kind))
    assert isinstance(actual, kind) and not (kind == (int, float) and isinstance(actual, bool)), (where, actual)
    if isinstance(documented, dict):
        assert set(actual) == set(documented), (where, sorted(actual), sorted(documented))
        for key in documented:
            same_shape(documented[key], actual[key], f"{where}.{key}")
    elif isinstance(documented, list) and documented:
        assert actual, where
        same_shape(documented[0], actual[0], f"{where}[0]")


@pytest.mark.slow
def test_the_curl_examples_of_docs_serving_md_run_as_documented(serving_model, short_outputs) -> None:
    examples = curl_examples()
    assert len(examples) >= 6
    with live_server(create_app(serving_model)) as url:
        for words, status, documented in examples:
            argv = [word.replace("http://127.0.0.1:8000", url) for word in words]
            run = subprocess.run([*argv, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, (words, run.stderr)
            body, _, code = run.stdout.rpartition("\n")
            assert int(code) == status, (shlex.join(words), body)
            if documented is not None:
                same_shape(documented, json.loads(body), shlex.join(words))


@pytest.mark.slow
def test_the_load_bench_runs_quick_with_no_errors_and_bad_requests_answered_4xx(bpe_model, tmp_path) -> None:
    output = tmp_path / "load.json"
    command = [sys.executable, "-m", "bench.serve_load", str(bpe_model), "--quick", "--json", str(output)]
    run = subprocess.run([*command, "--max-new-tokens", "8"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(output.read_text(encoding="utf-8"))
    for level in results["levels"]:
        assert level["errors"] == 0 and level["lost"] == 0 and level["requests"] == results["settings"]["requests"]
        assert level["requests_per_second"] > 0 and level["p95_ms"] >= level["p50_ms"] > 0
    bad = results["bad_requests"]
    assert bad["sent"] > 0 and bad["answered_4xx"] == bad["sent"] and bad["good_after"] == "200"
    assert results["server_peak_memory_mib"] > 0 and results["translate"]["sentences_per_second"] > 0
