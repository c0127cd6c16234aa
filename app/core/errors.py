"""One error type for the edge: every failure becomes a status code and one sentence."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from types import TracebackType

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.doors.request_id import current_request_id

log = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down: retry the request (another instance may take it)"
"""The one message of a request refused or dropped because the server stops (code and reason ``shutting_down``)."""


class ApiError(Exception):
    """An error with its HTTP status and one user-facing sentence."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None, code: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.code = code


def error_body(status: int, message: str, code: str) -> dict[str, object]:
    """The service's error form: the status, a stable code, one sentence, and the request's ID (the one its
    ``X-Request-ID`` header carries, to quote to whoever reads the logs) where a door gave the request one. Never a
    traceback or a server path: those go to the log (:func:`app.api.failures.internal_error`)."""
    return {"error": error_detail(status, message, code)}


def error_detail(status: int, message: str, code: str) -> dict[str, object]:
    """What :func:`error_body` holds under ``error`` (alone: the ``error`` event of ``/attribute/stream``)."""
    detail: dict[str, object] = {"status": status, "code": code, "message": message}
    rid = current_request_id()
    if rid is not None:
        detail["request_id"] = rid
    return detail


def oip_error(message: str) -> dict[str, object]:
    """The Open Inference Protocol's error form, ``{"error": "..."}``, with the request's ID beside it where it has one."""
    rid = current_request_id()
    return {"error": message} if rid is None else {"error": message, "request_id": rid}


OUR_PACKAGES = frozenset({"app", "idg_core", "idg_models", "idg_evaluation", "idg_serving"})
"""The project's own packages: an error raised in their code is one of its sentences (a model's output that is not
finite, logits of the wrong shape), not a model's exception."""
MODEL_MESSAGE_CHARS = 300
"""The most of a model's own error message an answer quotes (the whole of it is in the log)."""
_TORCHSCRIPT = ("The following operation failed in the TorchScript interpreter", "Traceback of TorchScript")
_EXCEPTION_LINE = re.compile(r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*): (.*\S)")
"""An unindented ``builtins.ValueError: message`` line: how TorchScript's traceback ends with the model's own error."""


def _innermost(tb: TracebackType | None) -> str | None:
    """The module of the frame where an exception was raised (the last Python frame of its traceback), or None."""
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", ""))


def _clip(text: str) -> str:
    return text if len(text) <= MODEL_MESSAGE_CHARS else text[: MODEL_MESSAGE_CHARS - 3].rstrip() + "..."


def model_failure(err: BaseException) -> str:
    """The one sentence every door answers for a request whose model call or plan raised ``err`` (the 500
    ``model_error``; the door's status and form are its own). A model's exception (raised outside the project's
    packages: in the model's code, in torch, in TorchScript's interpreter) is named by its type and the first line of
    its message: "the model raised RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x48 and 2x2)", never the
    interpreter's traceback, whose message holds the model's source lines and file names (the real error is its last
    ``Type: message`` line), and at most :data:`MODEL_MESSAGE_CHARS` of it. One of the project's own sentences
    (a model's logits or gradients not finite, an output of the wrong shape) is said as it is. The whole traceback goes
    to the log, under the request's ID (:func:`app.worker.waiting.submit_and_wait`)."""
    text = str(err)
    kind = type(err).__name__
    if any(marker in text for marker in _TORCHSCRIPT):
        lines = [m for line in text.splitlines() if (m := _EXCEPTION_LINE.fullmatch(line))]
        if not lines:
            return f"the model raised an error in TorchScript's interpreter ({kind}; its traceback is in the log)"
        kind, first = lines[-1].group(1), lines[-1].group(2)
        return f"the model raised {kind}: {_clip(first)}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    module = _innermost(err.__traceback__)
    if module is None or module.split(".")[0] in OUR_PACKAGES:
        return f"the model failed on this request: {first or kind}"
    return f"the model raised {kind}: {_clip(first)}" if first else f"the model raised {kind}"


HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})
_PATH_PARAMETER = re.compile(r"\{[^}/]+\}")


def documented_methods(app: FastAPI, path: str) -> frozenset[str]:
    """The methods the served schema (``/openapi.json``) documents for ``path``, upper-case; empty for a path it does
    not document. A literal path wins over a template; a template's ``{parameter}`` matches one path segment."""
    paths: dict[str, dict[str, object]] = app.openapi().get("paths", {})
    ops = paths.get(path)
    if ops is None:
        for template, template_ops in paths.items():
            pieces = _PATH_PARAMETER.split(template)
            if len(pieces) > 1 and re.fullmatch("[^/]+".join(map(re.escape, pieces)), path):
                ops = template_ops
                break
    return frozenset(m.upper() for m in ops or () if m in HTTP_METHODS)


def allow_header(methods: Iterable[str]) -> str:
    """An ``Allow`` header's value: the methods, sorted."""
    return ", ".join(sorted(set(methods)))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.code), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
        message = f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        return JSONResponse(error_body(422, message, "invalid_parameter"), status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _: ClientDisconnect) -> Response:
        # not a server failure: no traceback; the metrics count it as 499 (client closed)
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.info("%s went away before its request to %s %s was read", client, request.method, request.url.path)
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:  # Starlette's Allow names the methods of the first route on the path only (POST of
            # /jobs, where GET /jobs is a route of its own): every method the schema documents for the path
            given = (headers or {}).get("Allow", "").replace(" ", "").split(",")
            documented = documented_methods(request.app, request.scope["path"])
            allowed = allow_header({*documented, *filter(None, given)})
            headers = {**(headers or {}), "Allow": allowed}
            message = f"{request.method} is not allowed on {request.scope['path']}; it takes {allowed}"
            return JSONResponse(error_body(405, message, "method_not_allowed"), status_code=405, headers=headers)
        path = request.scope["path"]
        if exc.status_code == 404 and path.endswith("/") and path != "/" and documented_methods(request.app, path.rstrip("/")):
            # no redirect to the path without its slash (a 307 with no body, and clients that do not resend a POST's body)
            message = f"no route {path}; the route is {path.rstrip('/')}, without the trailing slash"
            return JSONResponse(error_body(404, message, "not_found"), status_code=404, headers=headers)
        return JSONResponse(error_body(exc.status_code, str(exc.detail), "http_error"), status_code=exc.status_code, headers=headers)
