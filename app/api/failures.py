"""One request (or one batch item) that fails unexpectedly fails alone, as the JSON 500."""

from __future__ import annotations

import logging

from app.core.errors import ApiError

log = logging.getLogger(__name__)


def internal_error(err: Exception, what: str) -> ApiError:
    """Log ``err`` with its traceback (once: an :class:`ApiError` is answered without Starlette's
    re-raise) and turn it into the 500 ``internal`` error for ``what`` (e.g. "POST /predict")."""
    log.error("%s failed unexpectedly", what, exc_info=err)
    return ApiError(500, f"internal error: {type(err).__name__}", code="internal")
