"""An exception no route turned into an answer, on a real uvicorn: the JSON 500 in the error contract,
with the headers every answer has (``X-Content-Type-Options``, ``X-IDG-Replica``) and ``Connection:
close``, so the client's next request opens a new connection instead of meeting a reset; logged once,
with its traceback (not again by the server). One that fails after its answer began cuts that answer
(the client sees it incomplete, never complete)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import live_server, tiny_classifier


class Boom(RuntimeError):
    pass


@pytest.fixture
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    app: FastAPI = create_app(Settings(models=["tiny"], warmup=False, data_dir=tmp_path_factory.mktemp("data")),
                              models={"tiny": tiny_classifier()})

    @app.get("/boom")
    async def boom() -> None:  # a bug no route caught: a real exception in the real app
        raise Boom("the route's own bug")

    @app.get("/boom-later")
    async def boom_later() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            yield b'{"first": 1}\n'
            raise Boom("failed mid-stream")

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    yield from live_server(app)


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Records of the app and of uvicorn's own error logger (which does not propagate to the root)."""
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        uvicorn_errors.removeHandler(caplog.handler)


def _tracebacks(log: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in log.records if r.exc_info and r.exc_info[0] is Boom]


def test_an_unhandled_exception_is_the_json_500_with_the_service_headers_and_connection_close(
    url: str, server_log: pytest.LogCaptureFixture,
) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(3):  # each time on the connection the previous answer left: never a reset
            r = client.get("/boom")
            assert r.status_code == 500
            # a sentence and the request ID (to find the traceback in the log by), never the traceback or a path
            assert r.json() == {"error": {"status": 500, "code": "internal", "message": "internal error: Boom",
                                          "request_id": r.headers["x-request-id"]}}
            assert r.headers["connection"] == "close" and r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-type"] == "application/json" and r.headers["x-idg-replica"]
            assert client.get("/health/live").status_code == 200
        metrics = client.get("/metrics").text
    assert 'idg_http_requests_total{route="/boom",status="500"} 3.0' in metrics  # counted as answers like any other
    logged = _tracebacks(server_log)
    assert len(logged) == 3 and all("GET /boom failed unexpectedly" in r.getMessage() for r in logged)
    assert not [r for r in server_log.records if "Exception in ASGI application" in r.getMessage()]


def test_an_exception_after_the_answer_began_cuts_it_and_is_logged_once(url: str, server_log: pytest.LogCaptureFixture) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("GET", "/boom-later") as r:
            assert r.status_code == 200
            with pytest.raises(httpx.RemoteProtocolError):
                r.read()  # the body never ends as a complete one
        assert client.get("/health/live").status_code == 200
    logged = _tracebacks(server_log)
    assert len(logged) == 1 and "after its answer began" in logged[0].getMessage()
    assert not [r for r in server_log.records if "Exception in ASGI application" in r.getMessage()]
