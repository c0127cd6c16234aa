"""One request (or one batch item) that fails unexpectedly fails alone, as the JSON 500."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from app.core.errors import ApiError

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
