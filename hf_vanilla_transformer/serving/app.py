"""`hf-vanilla-transformer serve MODEL_DIR`: a JSON API and a page over a saved model folder (FastAPI on uvicorn).

- `POST /translate`: {"text": "..." or [...], the decoding options of `translate` (inference.translation's
  `TranslateOptions`: beam search, sampling, prefixes, scores, alignments)} -> {"translations": [{"text",
  "hypotheses": [{"text", "score", "alignment"}, ...]}, ...]}, one per sentence, in order.
- `POST /attention`: {"text", "translation" (optional), "layer", "head"} -> the cross-attention of that decoder layer
  and head over the source and target tokens (the paper's Figures 3-5), for the page's heatmap.
- `GET /health`; `GET /` the page (page.html, no external resources); `GET /docs` and `/openapi.json`, FastAPI's.

Requests from concurrent clients are batched (batching.DynamicBatcher: one `generate()` per batch on one worker
thread). Errors are JSON {"error": one line naming the field, its value and the limit or fix, ...}: 400 malformed
JSON, 408 a body that did not arrive in time, 413 more sentences or characters than the limits (or a longer body,
refused while it is read), 422 wrong types and values, 503 a full queue. On SIGTERM (or Ctrl-C) the server stops
accepting connections, answers the requests it has (503 with Retry-After for those it had not started), then exits
with status 0. connections.py keeps bodies and connections bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import re
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import OptionError, check_decoding
from ..inference.loading import DEVICES, check_precisions, load_model, load_tokenizer, model_folder
from ..inference.translation import TranslateOptions, check_translate_options
from .batching import DynamicBatcher, Item, QueueFullError, ShuttingDownError
from .connections import RETRY_AFTER, BodyLimit, DrainingServer, ErrorResponse, ServerConfig
from .engine import ServingModel
from .options import ServeOptions

logger = logging.getLogger(__name__)

PAGE = Path(__file__).with_name("page.html")
# Work one request may ask for, whatever the server's flags: beams and samples per sentence, tokens per output.
MAX_BEAMS = 16
MAX_NEW_TOKENS = 1024


@dataclass(frozen=True)
class Limits:
    """The request limits of a server (ServeOptions' fields of the same names)."""

    max_sentences: int = 64
    max_chars: int = 1000
    max_input_tokens: int | None = None
    request_timeout: float = 30.0

    @property
    def max_body_bytes(self) -> int:
        """A request body longer than this cannot pass the limits (a character is at most 6 bytes of JSON,
        `\\uXXXX`), so it is refused: before it is read when its length is declared, once this much has arrived
        when it is chunked."""
        return 6 * self.max_sentences * self.max_chars * 2 + 65536  # text and prefix, and the options


# ---------------------------------------------------------------------------------------------------- the schema


class _Body(BaseModel):
    # Strict: "4" is not 4 and true is not 1; an unknown field is an error, not silently ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


class TranslateRequest(_Body):
    # Values are checked as `translate` checks them (check_translate_options, errors.DECODING_RANGES); the bounds
    # here are the server's own, on the work of one request.
    text: str | list[str] = Field(description='a sentence, or a list of sentences (a blank one translates to "")')
    num_beams: int | None = Field(None, le=MAX_BEAMS, description="beams (default: the model's, §6.1: 4)")
    n_best: int | None = Field(
        None, le=MAX_BEAMS, description="N outputs per sentence with their scores (beam search: N <= beams)"
    )
    length_penalty: float | None = Field(None, description="alpha, -5 to 5 (the model's kind stays)")
    max_new_tokens: int | None = Field(None, le=MAX_NEW_TOKENS, description="cap on every output, EOS included")
    max_input_tokens: int | None = Field(None, description="cut longer sources to this many tokens (2 or more)")
    sampling: bool = Field(False, description="sample instead of beam search (back-translation)")
    top_k: int | None = Field(None, description="sampling: the k most likely tokens only (0: all, the default)")
    top_p: float | None = Field(None, description="sampling: nucleus probability mass, in (0, 1] (default 1)")
    temperature: float | None = Field(None, description="sampling: 0.01 to 100 (default 1)")
    num_return_sequences: int | None = Field(
        None, le=MAX_BEAMS, description="N outputs per sentence (beam search: N <= beams); not with n_best"
    )
    scores: bool = Field(False, description="each output with its score (n_best implies it)")
    alignments: bool = Field(False, description="each output with its hard word alignment to the source")
    seed: int | None = Field(None, description="sampling: the same samples for the same request")
    prefix: str | list[str] | None = Field(
        None, description="the translation starts with this text (one for all sentences, or one per sentence)"
    )


class HypothesisOut(BaseModel):
    text: str
    score: float | None = Field(description="log P(Y | X) / length penalty; with n_best or scores")
    alignment: list[tuple[int, int]] | None = Field(
        description="with alignments: [source word, output word] pairs, 0-based, words split at white space"
    )


class TranslationOut(BaseModel):
    text: str = Field(description="the best (or first sampled) hypothesis")
    hypotheses: list[HypothesisOut]


class TranslateResponse(BaseModel):
    translations: list[TranslationOut]


class AttentionRequest(_Body):
    text: str = Field(description="the source sentence")
    translation: str | None = Field(None, description="the target to teacher-force (default: the model's own)")
    layer: int = Field(0, ge=0, description="decoder layer, 0-based")
    head: int = Field(0, ge=0, description="attention head, 0-based")


class AttentionResponse(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str]
    layer: int
    head: int
    weights: list[list[float]] = Field(description="weights[t][s]: target token t's attention to source token s")


# ---------------------------------------------------------------------------------------------------- errors


class ApiError(Exception):
    """A refused request: its status and a JSON body {"error", "field", "value", "limit"} (those that apply)."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        value: Any = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers
        self.body = {"error": message} | ({"field": field, "value": _shown(value)} if field else {}) | extra


def _shown(value: Any, length: int = 80) -> Any:
    """A value as an error shows it: long strings and lists cut (a 100 KB input is not echoed back); a body that
    was not JSON (bytes) as text."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, float) and not math.isfinite(value):  # NaN and Infinity are no JSON values
        return str(value)
    if isinstance(value, str) and len(value) > length:
        return value[:length] + f"... ({len(value)} characters)"
    if isinstance(value, (list, dict)) and len(str(value)) > length:
        return f"{type(value).__name__} of {len(value)} items"
    return value


def _field_name(location: tuple[Any, ...]) -> str:
    """("body", "text", 3) -> "text[3]"; a union's branch names ("str", "list[str]") are left out."""
    name = ""
    for part in location[1:] if location[:1] == ("body",) else location:
        if isinstance(part, int):
            name += f"[{part}]"
        elif part not in ("str", "list[str]", "int", "float"):
            name += f".{part}" if name else str(part)
    return name or "body"


def _validation_response(request: Request, error: RequestValidationError) -> ErrorResponse:
    """FastAPI's validation errors as one line naming each field and value: malformed JSON 400, the rest 422."""
    errors = error.errors()
    if any(item["type"] == "json_invalid" for item in errors):
        where = errors[0].get("ctx", {}).get("error", "")
        return ErrorResponse({"error": f"The body is not valid JSON ({where}). Send a JSON object."}, status_code=400)
    found = [(_field_name(tuple(item["loc"])), item) for item in errors]
    problems, seen = [], set()
    for field, item in found:
        # A union reports each branch: `text` is not a string, `text[1]` is not a string; the deepest one says it.
        deeper = any(other.startswith(f"{field}[") or other.startswith(f"{field}.") for other, _ in found)
        if field in seen or deeper:
            continue
        seen.add(field)
        problem = {"field": field, "message": item["msg"]}
        problems.append(problem if item["type"] == "missing" else problem | {"value": _shown(item.get("input"))})
    content_type = request.headers.get("content-type", "")
    hint = ""
    if problems and problems[0]["field"] == "body" and "json" not in content_type:
        hint = f" Send the body as JSON with `Content-Type: application/json` (got {content_type or 'none'!r})."
    line = "; ".join(
        f"`{p['field']}`" + (f" = {p['value']!r}" if "value" in p else "") + f": {p['message']}" for p in problems[:3]
    )
    return ErrorResponse({"error": line + "." + hint, "errors": problems}, status_code=422)


# ---------------------------------------------------------------------------------------------------- checks


def _sentences(text: str | list[str], limits: Limits) -> list[str]:
    sources = [text] if isinstance(text, str) else text
    if not sources:
        raise ApiError(422, "`text` is an empty list; pass at least one sentence.", "text", [])
    if len(sources) > limits.max_sentences:
        raise ApiError(
            413,
            f"`text` has {len(sources)} sentences; the limit is {limits.max_sentences} (the server's "
            "--max-sentences). Send them in several requests.",
            "text",
            f"{len(sources)} sentences",
            limit=limits.max_sentences,
        )
    for index, source in enumerate(sources):
        _check_text(f"text[{index}]" if not isinstance(text, str) else "text", source, limits)
    return sources


def _check_text(field: str, text: str, limits: Limits) -> None:
    """413 past the characters' limit; 422 for a lone surrogate (JSON's "\\ud800" unpaired), which is no Unicode
    text: the tokenizer cannot take it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = f"\\u{ord(text[error.start]):04x}"
        raise ApiError(
            422,
            f"`{field}` has a lone surrogate ({code}) at character {error.start}, which is not text: escape a "
            "character outside the BMP as a pair (\\ud83d\\ude00), or send it as UTF-8.",
            field,
            text,
        ) from None
    if len(text) > limits.max_chars:
        raise ApiError(
            413,
            f"`{field}` has {len(text)} characters; the limit is {limits.max_chars} (the server's --max-chars). "
            "Split it into sentences.",
            field,
            text,
            limit=limits.max_chars,
        )


def _prefixes(body: TranslateRequest, count: int, limits: Limits) -> list[str | None]:
    """One prefix (or None) per sentence."""
    if body.prefix is None:
        return [None] * count
    if isinstance(body.prefix, str):
        _check_text("prefix", body.prefix, limits)
        return [body.prefix or None] * count
    if isinstance(body.text, str) or len(body.prefix) != count:
        raise ApiError(
            422,
            f"`prefix` is a list of {len(body.prefix)}, but `text` has {count} sentence(s): pass one prefix per "
            'sentence ("" for none), or one string for all.',
            "prefix",
            body.prefix,
        )
    for index, prefix in enumerate(body.prefix):
        _check_text(f"prefix[{index}]", prefix, limits)
    return [prefix or None for prefix in body.prefix]


def _translate_options(body: TranslateRequest, model: ServingModel, limits: Limits) -> TranslateOptions:
    """The request's decoding as the library's options, checked as `translate` checks them (422 naming the field)."""
    # The request's decoding options are TranslateOptions fields of the same names; the text and prefixes go to the
    # batcher, and a request without `max_input_tokens` takes the server's.
    decoding = body.model_dump(exclude={"text", "prefix", "max_input_tokens"})
    options = TranslateOptions(
        model_dir="",  # the model is loaded: `Translator` reads only the decoding fields
        **decoding,
        max_input_tokens=body.max_input_tokens if body.max_input_tokens is not None else limits.max_input_tokens,
        bf16=model.bf16,
    )
    try:
        check_translate_options(options, model.default_beams)
    except OptionError as error:
        field = re.search(r"`(\w+)", str(error))
        name = field[1] if field and field[1] in TranslateRequest.model_fields else None
        raise ApiError(422, str(error), name, getattr(body, name) if name else None) from None
    return options


async def _answer(future: Any) -> Any:
    """The result of a decoding the batcher ran, its errors as the API's."""
    try:
        return await asyncio.wrap_future(future)
    except (ValueError, TypeError) as error:  # options transformers refuses for this model
        raise ApiError(422, f"The decoding options were refused: {error}") from None
    except Exception as error:
        logger.exception("decoding failed")
        raise ApiError(500, f"Decoding failed: {type(error).__name__}: {error}") from None


def _admitted(batcher: DynamicBatcher, submit: Callable[[], Any]) -> Any:
    """`submit()` (a submission to `batcher`), a full queue or a server stopping answered 503 with Retry-After."""
    try:
        return submit()
    except QueueFullError:
        message = (
            f"The server is busy: {batcher.max_queue} requests are waiting or being translated (the server's "
            "--max-queue). Retry later."
        )
        raise ApiError(503, message, limit=batcher.max_queue, headers={"Retry-After": "1"}) from None
    except ShuttingDownError as error:
        raise ApiError(503, str(error), headers={"Retry-After": RETRY_AFTER}) from None


async def _translate(
    body: TranslateRequest, model: ServingModel, batcher: DynamicBatcher, limits: Limits, exclusive: Iterator[int]
) -> dict[str, Any]:
    """The answer of `POST /translate`: the non-blank sentences decoded in the batcher, blank ones answered with an
    empty text."""
    sources = _sentences(body.text, limits)
    prefixes = _prefixes(body, len(sources), limits)
    options = _translate_options(body, model, limits)
    kept = [index for index, source in enumerate(sources) if source.strip()]
    hypotheses: list[list[Any]] = [[] for _ in sources]
    if kept:
        # A seeded request's keys end with a number of its own: it is decoded alone, so its draws are its own.
        token = next(exclusive) if options.seed is not None else None
        counts = model.token_counts([sources[index] for index in kept], options.max_input_tokens)
        items = [
            Item((options, prefixes[index], token), sources[index], count)
            for index, count in zip(kept, counts, strict=True)
        ]
        results = await _answer(_admitted(batcher, lambda: batcher.submit(items, together=token is not None)))
        for index, result in zip(kept, results, strict=True):
            hypotheses[index] = result
    return {
        "translations": [
            {
                "text": found[0].text if found else "",
                "hypotheses": [
                    {"text": item.text, "score": item.score, "alignment": item.alignment} for item in found
                ],
            }
            for found in hypotheses
        ]
    }


def _check_attention_request(body: AttentionRequest, model: ServingModel, limits: Limits) -> None:
    """422 for a blank or too long `text` or `translation`, or a layer or head the decoder does not have."""
    if not body.text.strip():
        raise ApiError(422, "`text` is blank; pass a sentence.", "text", body.text)
    _check_text("text", body.text, limits)
    if body.translation is not None:
        _check_text("translation", body.translation, limits)
    for field, value, count, what in (
        ("layer", body.layer, model.decoder_layers, "layers"),
        ("head", body.head, model.decoder_heads, "heads"),
    ):
        if value >= count:
            raise ApiError(
                422,
                f"`{field}` {value} is out of range: the decoder has {count} {what} (0 to {count - 1}).",
                field,
                value,
                limit=count - 1,
            )


def _add_error_handlers(app: FastAPI, limits: Limits) -> None:
    """Every refusal in the API's one form ({"error", ...}): the API's own, Starlette's (404, 405, a body that is not
    JSON), a body that fails validation, and a body over the limits (BodyLimit, before it is read whole)."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> ErrorResponse:
        return ErrorResponse(error.body, status_code=error.status, headers=error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> ErrorResponse:
        # Starlette's own refusals (404, 405, a body that is not UTF-8) in the same form as the API's errors.
        message = f"{error.detail} ({request.method} {request.url.path})."
        if error.status_code == 400:  # the only 400 of Starlette here: a body that json.loads cannot read
            message = f"The body is not valid JSON ({error.detail}). Send a JSON object, in UTF-8."
        return ErrorResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> ErrorResponse:
        return _validation_response(request, error)

    app.add_middleware(
        BodyLimit,
        max_bytes=limits.max_body_bytes,
        timeout=limits.request_timeout,
        stopping=app.state.stopping.is_set,
        limit_words=f"{limits.max_sentences} sentences of {limits.max_chars} characters: the server's "
        "--max-sentences and --max-chars",
    )


# ---------------------------------------------------------------------------------------------------- the app


def create_app(
    model: ServingModel,
    limits: Limits | None = None,
    max_batch_tokens: int = 2048,
    max_wait: float = 0.005,
    max_queue: int = 256,
    name: str = "model",
) -> FastAPI:
    """The ASGI app over `model`; its lifespan starts the batcher's worker and, at shutdown, answers every request
    admitted before it stops. `max_wait` in seconds."""
    limits = limits or Limits()
    batcher = DynamicBatcher(
        lambda key, sources: model.decode(key[0], key[1], sources), max_batch_tokens, max_wait, max_queue
    )
    exclusive = itertools.count()  # the keys of seeded requests (`_translate`)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.close)

    app = FastAPI(
        title="hf-vanilla-transformer serve",
        summary=f"Translation with {name} (Attention Is All You Need).",
        lifespan=lifespan,
    )
    # Set when the server begins to stop (DrainingServer): requests not yet started are answered 503.
    app.state.batcher, app.state.limits, app.state.stopping = batcher, limits, threading.Event()
    page = PAGE.read_text(encoding="utf-8")

    _add_error_handlers(app, limits)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """The server's state: the model, the requests in its queue and its limits."""
        return {
            "status": "ok",
            "model": name,
            "queued": batcher.admitted,
            "max_queue": batcher.max_queue,
            "decoder_layers": model.decoder_layers,
            "decoder_heads": model.decoder_heads,
            "default_beams": model.default_beams,
            "max_sentences": limits.max_sentences,
            "max_chars": limits.max_chars,
        }

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(body: TranslateRequest) -> dict[str, Any]:
        """Translate one sentence or a list; decoding options as the `translate` command's."""
        return await _translate(body, model, batcher, limits, exclusive)

    @app.post("/attention", response_model=AttentionResponse)
    async def attention(body: AttentionRequest) -> dict[str, Any]:
        """The encoder-decoder attention of one decoder layer and head, teacher-forced on `translation`."""
        _check_attention_request(body, model, limits)
        target = body.translation if body.translation and body.translation.strip() else None
        maps = await _answer(
            _admitted(
                batcher,
                lambda: batcher.run_exclusive(lambda: model.cross_attention(body.text, target, body.layer, body.head)),
            )
        )
        return maps | {"layer": body.layer, "head": body.head}

    return app


# ---------------------------------------------------------------------------------------------------- serve


def _check_serve_options(options: ServeOptions) -> None:
    """One-line errors for values the command line's parser would have refused (library callers)."""
    for name in ("port", "max_batch_tokens", "max_queue", "max_sentences", "max_chars"):
        value = getattr(options, name)
        low = 0 if name == "port" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (name == "port" and value > 65535):
            what = "a port number (0 to 65535)" if name == "port" else f"an integer of at least {low}"
            raise OptionError(f"`{name}` must be {what}, got {value!r}.")
    check_decoding(max_input_tokens=options.max_input_tokens)
    for name, unit, positive in (
        ("max_wait_ms", "milliseconds >= 0", False),
        ("request_timeout", "seconds > 0", True),
    ):
        value = getattr(options, name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or value < 0 or (positive and value == 0):
            raise OptionError(f"`{name}` must be a number of {unit}, got {value!r}.")
    if options.device not in DEVICES:
        raise OptionError(f"`device={options.device}` is not one of {', '.join(DEVICES)}.")
    check_precisions(options.bf16, options.int8, options.bf16_weights)


def load_serving_model(options: ServeOptions) -> ServingModel:
    """The model and tokenizer of `options.model_dir`, loaded as `translate` loads them."""
    folder = model_folder(options.model_dir, options.trust_remote_code)
    model = load_model(folder, options.trust_remote_code, options.device, options.int8, options.bf16_weights)
    bf16 = "bf16" if options.bf16 else "bf16_weights" if options.bf16_weights else None
    if bf16 and model.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise OptionError(f"`{bf16}`: this GPU has no bf16 support. Drop `{bf16}`.")
    return ServingModel(model, load_tokenizer(folder, options.trust_remote_code), bf16=options.bf16)


def http_server(app: FastAPI, host: str, port: int, access_log: bool = True) -> DrainingServer:
    """uvicorn serving `app` (create_app's) on `host`:`port` with the connection guards of connections.py: a
    deadline for each request head (the app's `request_timeout`), and a shutdown that answers every connection the
    kernel has accepted. Idle keep-alive connections close after uvicorn's 5 s."""
    config = ServerConfig(
        app,
        app.state.limits.request_timeout,
        host=host,
        port=port,
        access_log=access_log,
        timeout_graceful_shutdown=None,
    )
    return DrainingServer(config, app.state.stopping)


def serve(options: ServeOptions) -> None:
    """Load the model, serve it until SIGTERM or SIGINT (Ctrl-C), answer the requests in flight, and return."""
    _check_serve_options(options)
    model = load_serving_model(options)
    limits = Limits(options.max_sentences, options.max_chars, options.max_input_tokens, options.request_timeout)
    app = create_app(
        model, limits, options.max_batch_tokens, options.max_wait_ms / 1000, options.max_queue, str(options.model_dir)
    )
    server = http_server(app, options.host, options.port, options.access_log)
    logger.info(f"Serving {options.model_dir}: the page at /, the API at /translate, its docs at /docs")

    def stop(signum: int, frame: object) -> None:
        server.should_exit = True

    # uvicorn handles SIGTERM and SIGINT while it runs: it stops accepting, answers the requests in flight, and then
    # raises the signal again for the handler it found. That handler is this one, so that a stop that was asked for
    # ends with status 0 rather than with the command line's "terminated" (or Python's KeyboardInterrupt).
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)} if in_main_thread else {}
    try:
        server.run()
    except SystemExit:  # uvicorn's way to stop when it cannot bind (it logged why)
        if server.started:
            raise
        raise OptionError(
            f"Could not serve on {options.host}:{options.port} (uvicorn's error above says why); pass another "
            "`port` (0: any free one) or `host`."
        ) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


__all__ = [
    "AttentionRequest",
    "Limits",
    "TranslateRequest",
    "create_app",
    "http_server",
    "load_serving_model",
    "serve",
]
