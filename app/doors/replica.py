"""``X-IDG-Replica`` and ``X-Content-Type-Options: nosniff`` on every answer (and a Content-Security-Policy and
``X-Frame-Options`` on the page); the replica header says which process served it (``host:pid`` by default; the Ray Serve
wrapper, ``app.ray_serve``, names the Serve replica instead), so users and tests can see the spread."""

from __future__ import annotations

import os
import socket

from starlette.types import Message, Receive, Scope, Send

from app.doors.asgi import HttpMiddleware

HEADER = b"x-idg-replica"
NOSNIFF = (b"x-content-type-options", b"nosniff")
"""On every answer: a browser never guesses another type than the one declared (a JSON error is never run as HTML)."""
PAGES = ("/",)
PAGE_HEADERS = [(b"x-frame-options", b"DENY"),
                (b"content-security-policy", b"default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
                 b"script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")]
_replica = f"{socket.gethostname()}:{os.getpid()}"


def set_replica_id(name: str) -> None:
    """Name this process's replica (called once, before the app serves)."""
    global _replica
    _replica = name


def replica_id() -> str:
    return _replica


class ReplicaHeaderMiddleware(HttpMiddleware):
    """Pure ASGI (no body buffering): adds the header to the response start of every HTTP answer."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (HEADER, _replica.encode("latin-1", "replace")), NOSNIFF]
                if scope["path"] in PAGES:  # the page: no framing by other sites, scripts and styles from this origin only
                    headers += PAGE_HEADERS
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, _send)
