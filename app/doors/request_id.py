"""Request IDs: taken from the request (``X-Request-ID``, gRPC metadata ``x-request-id``, else the Open Inference
Protocol request's ``id``, when it is 1-128 safe characters) or made (32 hex digits) by the door it came through
(:mod:`app.doors.layer`), echoed on every answer, in the log lines written while the request runs
(:class:`RequestIdFilter`), and the Open Inference Protocol answer's ``id`` when the request gave none
(:func:`app.api.oip.write_infer_response`)."""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextvars import ContextVar, Token

HEADER = b"x-request-id"
MAX_LENGTH = 128
SAFE = re.compile(rf"[A-Za-z0-9._:=+/-]{{1,{MAX_LENGTH}}}")
"""What a given ID may be: letters, digits and ``. _ : = + / -`` (UUIDs, hex, base64, trace IDs); anything else (a
newline that would forge a log line, a header's worth of bytes) is replaced by a new ID."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"
"""The service's log lines: `` [<request id>]`` after the logger's name for a line written while a request runs."""

QUIET = re.compile(r"/metrics|(/v2)?/health/.+|/v2/models/[^/]+(/versions/[^/]+)?/ready|/static/.*")
"""Paths whose answers are not logged one by one: probes, scrapes, the page's assets."""

_current: ContextVar[str | None] = ContextVar("idg_request_id", default=None)


def current_request_id() -> str | None:
    """The ID of the request this code runs for (on the event loop, within its middleware), or None."""
    return _current.get()


def bind_request_id(rid: str | None) -> Token[str | None]:
    """Name the request this code runs for until :func:`unbind_request_id` (:meth:`app.doors.layer.Doors.handle`)."""
    return _current.set(rid)


def unbind_request_id(token: Token[str | None]) -> None:
    _current.reset(token)


def request_id_from(given: str | None) -> str:
    """``given`` when it is a safe ID (:data:`SAFE`), else a new one."""
    return given if given is not None and SAFE.fullmatch(given) else uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Gives each record ``request_id`` (or None) and ``request_tag`` (`` [<id>]`` or empty) for :data:`LOG_FORMAT`."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "request_id", None) or _current.get()  # a worker's line names its job's request itself
        record.request_id = rid
        record.request_tag = f" [{rid}]" if rid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line (``IDG_LOG_FORMAT=json``): time, level, logger, message, the request ID when there is one,
    the fields a line carries for pipelines (``extra={"fields": {...}}``: a prediction's class, a request's status...),
    and the traceback of an error."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                                   "message": record.getMessage()}
        rid = getattr(record, "request_id", None)
        if rid:
            line["request_id"] = rid
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(fmt: str = "text") -> None:
    """The service's logging: INFO and up on stderr, as text (:data:`LOG_FORMAT`) or JSON lines (:class:`JsonFormatter`),
    each naming the request it was written for."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    if fmt == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    log_request_ids()


def log_request_ids() -> None:
    """Put :class:`RequestIdFilter` on the root logger's handlers (once each), so :data:`LOG_FORMAT` can name the ID."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RequestIdFilter) for f in handler.filters):
            handler.addFilter(RequestIdFilter())
