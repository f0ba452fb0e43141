"""The server's HTTP connections, bounded in memory and time whatever a client sends or withholds.

- `BodyLimit` (ASGI middleware): reads each request's body, chunked or not, up to `max_bytes` and within
  `timeout` seconds, then hands it to the app. Past the limit it answers 413 at once and reads no further: the
  server holds at most the limit and one chunk (uvicorn drops what the client still sends, so that the client can
  read its 413, until the head deadline below closes the connection). Past the deadline: 408, and the connection
  closed. Once the server is stopping, a request it had not started gets 503 with `Retry-After` (its body read
  first, so that the client gets the answer rather than a reset).
- `GuardedH11Protocol`: uvicorn's h11 protocol, with a deadline for the request head: a connection that has not
  sent a whole request head `request_timeout` seconds after it opened (or after it began a new one) is closed.
  uvicorn's own `timeout_keep_alive` runs only after a response, and any byte received cancels it.
- `DrainingServer`: uvicorn's server, whose shutdown first accepts the connections still waiting in the kernel's
  listen queue (closing the listening socket would reset them), so that each gets its 503; idle connections get
  `SHUTDOWN_GRACE` seconds to send the request they may be sending before they are closed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# A connection idle or mid-head when the server stops: clients send their request as soon as they connect, so a
# second covers one already on its way; one that sends nothing is closed then rather than holding up the exit.
SHUTDOWN_GRACE = 1.0
# What a stopping server asks clients to wait: a restart loads the model, seconds rather than minutes.
RETRY_AFTER = "5"


class ErrorResponse(JSONResponse):
    """A JSON error that renders whatever text it echoes: a lone surrogate (JSON's "\\ud800", which UTF-8 cannot
    encode) is written back as the same escape instead of failing the response."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8", errors="backslashreplace")


class _BodyTooLargeError(Exception):
    def __init__(self, size: int) -> None:
        self.size = size


class _DisconnectedError(Exception):
    pass


class BodyLimit:
    """ASGI middleware: each request's body read whole, at most `max_bytes` within `timeout` seconds, before the app
    sees it (module docstring); `stopping()`: the server is stopping (503 for the requests not yet started);
    `limit_words`: what the limit is made of, for the 413's message."""

    def __init__(
        self, app: Any, max_bytes: int, timeout: float, stopping: Callable[[], bool], limit_words: str
    ) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout
        self.stopping, self.limit_words = stopping, limit_words

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        try:
            if length.isdigit() and int(length) > self.max_bytes:
                raise _BodyTooLargeError(int(length))  # refused before a byte of it is read
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except _BodyTooLargeError as error:
            size = f"{error.size} bytes" if length else f"more than {self.max_bytes} bytes (chunked)"
            message = f"The body has {size}; the limit is {self.max_bytes} ({self.limit_words})."
            await _refuse(scope, receive, send, 413, {"error": message, "limit": self.max_bytes}, close=False)
            return
        except TimeoutError:
            message = f"The body did not arrive within {self.timeout:g} s (the server's --request-timeout)."
            await _refuse(scope, receive, send, 408, {"error": message, "limit": self.timeout})
            return
        except _DisconnectedError:
            return
        if self.stopping():
            message = "The server is shutting down and takes no new requests. Retry on a running one."
            await _refuse(scope, receive, send, 503, {"error": message}, {"Retry-After": RETRY_AFTER})
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()  # what comes after the body: the client's disconnect
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _DisconnectedError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _BodyTooLargeError(size)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    close: bool = True,
) -> None:
    """Answer `status` (and close the connection after it where `close`), without reading more of the request."""
    headers = (headers or {}) | ({"Connection": "close"} if close else {})
    await ErrorResponse(body, status, headers)(scope, receive, send)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (module docstring); the configuration is a
    `ServerConfig`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head(self.config.request_timeout)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.head_timer is None and self._between_requests():  # the first bytes of a next request
            self._await_head(self.config.request_timeout)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a whole head arrived: the body's deadline is BodyLimit's
            self._cancel_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._between_requests():  # a request may be on its way: answered (503) if it comes within the grace
            self._await_head(min(SHUTDOWN_GRACE, self.config.request_timeout))
        else:
            super().shutdown()

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _await_head(self, seconds: float) -> None:
        self._cancel_head_timer()
        self.head_timer = self.loop.call_later(seconds, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()


class ServerConfig(uvicorn.Config):
    """uvicorn's configuration with `GuardedH11Protocol` and its `request_timeout` (seconds)."""

    def __init__(self, app: Any, request_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, http=GuardedH11Protocol, **kwargs)
        self.request_timeout = request_timeout


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown answers the connections the kernel has accepted (module docstring);
    `stopping` is set when it begins (BodyLimit's `stopping`)."""

    def __init__(self, config: ServerConfig, stopping: threading.Event) -> None:
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stopping.set()
        waiting = [connection for server in self.servers for connection in _accept_waiting(server)]
        for server in self.servers:
            server.close()  # at once after the last accept: only a connection made in between is reset
        loop = asyncio.get_running_loop()
        for connection in waiting:
            await loop.connect_accepted_socket(self._protocol, connection)
        await super().shutdown(sockets)

    def _protocol(self) -> asyncio.Protocol:
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )


def _accept_waiting(server: asyncio.Server) -> list[socket.socket]:
    """The connections waiting in the listen queues of `server`'s sockets, accepted (non-blocking)."""
    accepted = []
    for listener in server.sockets:
        with socket.socket(listener.family, listener.type, fileno=os.dup(listener.fileno())) as duplicate:
            duplicate.setblocking(False)
            while True:
                try:
                    connection, _ = duplicate.accept()
                except (BlockingIOError, InterruptedError):
                    break
                connection.setblocking(False)
                accepted.append(connection)
    return accepted


__all__ = ["RETRY_AFTER", "SHUTDOWN_GRACE", "BodyLimit", "DrainingServer", "ErrorResponse", "GuardedH11Protocol"]
