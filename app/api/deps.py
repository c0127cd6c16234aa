"""Route dependencies: the service object and the optional API key. Both are `async def` though they
never wait: FastAPI runs a plain `def` dependency in its thread pool, a thread hop per request for nothing."""

from __future__ import annotations

import secrets

from fastapi import Request

from app.core.errors import SHUTTING_DOWN, ApiError
from app.service import Service


async def get_service(request: Request) -> Service:
    """The service, or 503: while starting, and once a shutdown began (new work goes elsewhere)."""
    state = request.app.state
    if getattr(state, "draining", False):
        state.metrics.rejections.labels("shutting_down").inc()
        raise ApiError(503, SHUTTING_DOWN, headers={"Retry-After": "5", "Connection": "close"}, code="shutting_down")
    service = getattr(state, "service", None)
    if service is None or not state.ready:
        raise ApiError(503, "the service is starting: models are not loaded yet", headers={"Retry-After": "5"}, code="not_ready")
    return service


async def require_api_key(request: Request) -> None:
    """401 unless the configured key comes as ``X-API-Key`` or ``Authorization: Bearer``."""
    expected = request.app.state.settings.api_key
    if not expected:
        return
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    if given is None:
        raise ApiError(401, "this service needs an API key: send it as X-API-Key or 'Authorization: Bearer <key>'", code="unauthorized")
    if not secrets.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "the API key is wrong", code="unauthorized")
