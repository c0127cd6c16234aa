"""One request (or one batch item) that fails unexpectedly fails alone, as the JSON 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive, Scope, Send

from app.core.errors import ApiError
from app.doors.asgi import HttpMiddleware, StartWatch, send_json_error

T = TypeVar("T")

log = logging.getLogger(__name__)


def internal_error(err: Exception, what: str) -> ApiError:
    """Log ``err`` with its traceback (once: an :class:`ApiError` is answered without Starlette's
    re-raise) and turn it into the 500 ``internal`` error for ``what`` (e.g. "POST /predict")."""
    log.error("%s failed unexpectedly", what, exc_info=err)
    return ApiError(500, f"internal error: {type(err).__name__}", code="internal")


async def alone(work: Awaitable[T], what: str) -> T:
    """``await work``; an :class:`ApiError` passes as it is, any other failure becomes ``what``'s JSON 500."""
    try:
        return await work
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - any other failure is this request's JSON 500, logged once
        raise internal_error(err, what) from err


class UnhandledErrorMiddleware(HttpMiddleware):
    """The last resort: an exception no route turned into an answer becomes the JSON 500 ``internal``,
    logged once with its traceback, with ``Connection: close`` (the server drops the connection after
    it; a client told so opens a new one instead of meeting a reset), and, being inside the other
    middleware, with every header they add (``X-Content-Type-Options``, ``X-IDG-Replica``, CORS) and
    counted by the metrics. Starlette's own last resort answered outside them, and re-raised, so the
    server logged it twice. An exception after the answer began can only end it: the connection is
    closed without the body's end, so the client sees a cut answer, not a complete one."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = StartWatch(send)
        try:
            await self.app(scope, receive, watch)
        except Exception as err:  # noqa: BLE001 - the one place every unexpected failure ends
            log.error("%s %s failed unexpectedly%s", scope.get("method"), scope.get("path"),
                      " after its answer began (cut)" if watch.started else "", exc_info=err)
            if watch.started:
                return
            await send_json_error(send, 500, f"internal error: {type(err).__name__}", "internal", [(b"connection", b"close")])
