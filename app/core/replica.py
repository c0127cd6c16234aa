"""``X-IDG-Replica`` on every answer: which process served it (``host:pid`` by default; the Ray Serve
wrapper, ``app.ray_serve``, names the Serve replica instead), so users and tests can see the spread."""

from __future__ import annotations

import os
import socket

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-idg-replica"
_replica = f"{socket.gethostname()}:{os.getpid()}"


def set_replica_id(name: str) -> None:
    """Name this process's replica (called once, before the app serves)."""
    global _replica
    _replica = name


def replica_id() -> str:
    return _replica


class ReplicaHeaderMiddleware:
    """Pure ASGI (no body buffering): adds the header to the response start of every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, _replica.encode("latin-1", "replace"))]
            await send(message)

        await self.app(scope, receive, _send)
