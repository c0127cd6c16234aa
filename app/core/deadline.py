"""A request's deadline counts from its arrival (``IDG_REQUEST_TIMEOUT_S``), for every route and
every stage: reading nothing more once it passed, decoding, waiting in the queue, the worker's model
calls. Routes take ``time.perf_counter()`` on arrival; the waits compare against ``time.monotonic()``."""

from __future__ import annotations

import time

from app.core.errors import ApiError


def deadline_of(received: float, timeout: float) -> float:
    """The ``time.monotonic()`` by which a request that arrived at ``received`` (its
    ``time.perf_counter()``) must be answered."""
    return time.monotonic() + timeout - (time.perf_counter() - received)


def past_deadline(timeout: float, message: str | None = None) -> ApiError:
    """The 504 of a request that did not finish within ``timeout`` seconds of its arrival."""
    return ApiError(504, message or f"the request did not finish within its deadline of {timeout:g} s", code="deadline")
