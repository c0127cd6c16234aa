"""Route dependencies: the service object and the optional API key. Both are `async def` though they
never wait: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request for nothing."""

from __future__ import annotations

from fastapi import Request
from starlette.datastructures import State

from app.core.errors import SHUTTING_DOWN, ApiError
from app.doors.door import HTTP, api_key_refusal
from app.doors.keys import Key, match
from app.service import Service


async def get_service(request: Request) -> Service:
    """The service, or 503: while starting, and once a shutdown began (new work goes elsewhere)."""
    return ready_service(request.app.state)


def ready_service(state: State) -> Service:
    """The app's service, or 503 while starting and once a shutdown began (any door: ``state`` is the app's)."""
    if getattr(state, "draining", False):
        state.metrics.rejections.labels("shutting_down").inc()
        raise ApiError(503, SHUTTING_DOWN, headers={"Retry-After": "5", "Connection": "close"}, code="shutting_down")
    service = getattr(state, "service", None)
    if service is None or not state.ready:
        raise ApiError(503, "the service is starting: models are not loaded yet", headers={"Retry-After": "5"}, code="not_ready")
    return service


def request_key(request: Request) -> Key | None:
    """The configured key the request sends (None if none of them), found by the HTTP door (:meth:`app.doors.door.Door.given_key`)."""
    given = HTTP.given_key(request.headers)
    return None if given is None else match(request.app.state.keys, given)


def has_api_key(request: Request) -> bool:
    """True when no key is configured or the request sends one of them."""
    return not request.app.state.keys or request_key(request) is not None


async def require_api_key(request: Request) -> None:
    """401 unless a configured key comes as ``X-API-Key`` or ``Authorization: Bearer`` (the HTTP door's refusal,
    :func:`app.doors.door.api_key_refusal`); the key (its name and rights) is then ``request.state.key`` (None where no
    key is configured: open to all)."""
    request.state.key = request_key(request)
    if request.state.key is None and (refusal := api_key_refusal(HTTP, request.app.state.keys, request.headers)) is not None:
        raise refusal


async def require_api_key_for_metrics(request: Request) -> None:
    """/metrics' guard: the API key only where ``IDG_METRICS_NEED_KEY`` asks for it."""
    if request.app.state.settings.metrics_need_key:
        await require_api_key(request)
