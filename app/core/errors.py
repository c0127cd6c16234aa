"""One error type for the edge: every failure becomes a status code and one sentence."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from app.core.request_id import current_request_id

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
    detail: dict[str, object] = {"status": status, "code": code, "message": message}
    rid = current_request_id()
    if rid is not None:
        detail["request_id"] = rid
    return {"error": detail}


def oip_error(message: str) -> dict[str, object]:
    """The Open Inference Protocol's error form, ``{"error": "..."}``, with the request's ID beside it where it has one."""
    rid = current_request_id()
    return {"error": message} if rid is None else {"error": message, "request_id": rid}


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
