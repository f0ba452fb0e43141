"""The options of `serve` (`ServeOptions`), apart from the server so that the command line builds its flags from them
without the `serve` extra."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..inference.loading import (
    bf16_option,
    bf16_weights_option,
    device_option,
    int8_option,
    max_input_tokens_option,
    trust_remote_code_option,
)
from ..option_fields import milliseconds, option, positive_float, positive_int


@dataclass(frozen=True)
class ServeOptions:
    """Serve the model in `model_dir` on http://`host`:`port`, loaded as `translate` loads it. One `generate()`
    decodes the waiting sentences of equal decoding options, at most `max_batch_tokens` source tokens with padding;
    `max_input_tokens` is the default cut of long sources."""

    model_dir: str | os.PathLike
    host: str = option("127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    port: int = option(8000, help="the port (0: a free one, which the log names)", parse=int)
    device: str = device_option()
    bf16: bool = bf16_option()
    bf16_weights: bool = bf16_weights_option()
    int8: bool = int8_option()
    trust_remote_code: bool = trust_remote_code_option()
    max_batch_tokens: int = option(
        2048, help="source tokens per generate() call, padding included (sentences x the longest)", parse=positive_int
    )
    max_wait_ms: float = option(
        5.0,
        help="how long a sentence waits for others to batch with (while the model is busy, they gather anyway)",
        parse=milliseconds,
    )
    max_queue: int = option(256, help="requests waiting or being translated; more get 503", parse=positive_int)
    max_sentences: int = option(64, help="sentences per request; more: 413", parse=positive_int)
    max_chars: int = option(1000, help="characters per sentence; more: 413", parse=positive_int)
    max_input_tokens: int | None = max_input_tokens_option()
    request_timeout: float = option(
        30.0,
        help="seconds for a request's head to arrive (else the connection is closed) and as many for its body "
        "(else 408)",
        parse=positive_float,
    )
    access_log: bool = option(True, help="no log line per request", negated="--no-access-log")


__all__ = ["ServeOptions"]
