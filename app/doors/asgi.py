"""What the service's HTTP middlewares share, written once: each is pure ASGI (no body buffering, so the body and the
client's disconnect pass untouched), acts on HTTP requests only (the lifespan's messages pass through) and, where it
answers a request itself, answers with the service's JSON error body (:func:`send_json_error`).

The middlewares, outermost first: :class:`app.doors.replica.ReplicaHeaderMiddleware`, the HTTP door
(:class:`app.doors.layer.HttpDoor`), :class:`app.doors.drain.DrainMiddleware`, the key's share
(:class:`app.doors.layer.HttpAdmission`), :class:`app.api.failures.UnhandledErrorMiddleware`."""

from __future__ import annotations

import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import error_body


class HttpMiddleware:
    """A pure ASGI middleware of HTTP requests: :meth:`handle` runs for each one, anything else (the lifespan) goes to
    the app untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request, passed on to :attr:`app` (or answered here)."""
        raise NotImplementedError


class StartWatch:
    """An ASGI ``send`` that notes whether the answer has begun (``http.response.start`` sent): a middleware that would
    answer a failed request itself can only do so before then."""

    def __init__(self, send: Send) -> None:
        self.started = False
        self._send = send

    async def __call__(self, message: Message) -> None:
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)


async def send_json_error(send: Send, status: int, message: str, code: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer with the service's JSON error body (:func:`app.core.errors.error_body`), its ``Content-Type`` and
    ``Content-Length`` first, then ``headers``."""
    body = json.dumps(error_body(status, message, code)).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
