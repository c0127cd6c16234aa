"""Kept-alive connections against the real launcher (``python -m app.server``): an idle connection stays open for
``IDG_KEEP_ALIVE_TIMEOUT_S`` (95 s by default), longer than the common clients keep theirs in their pools, so no client
reuses a connection at the moment the server closes it. uvicorn's own default, 5 s, is exactly httpx's pool expiry: a
request sent at that moment is lost (the server closes the socket under it)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from app.core.config import Settings
from app.main import create_app
from app.server import build
from tests.service.conftest import tiny_classifier
from tests.service.reliability.server_app import serve_process

CLIENT_POOL_IDLE_S = {"httpx": 5.0, "aiohttp": 15.0, "a cloud load balancer (AWS ALB)": 60.0, "Go net/http": 90.0}
"""How long common clients keep an idle connection in their pool before dropping it themselves (their defaults)."""
GAPS_S = (4.9, 5.0, 5.1)
"""Idle gaps at and around httpx's pool expiry and uvicorn's default keep-alive."""


def test_the_default_keep_alive_outlasts_the_common_clients_pools() -> None:
    settings = Settings(models=["tiny"])
    server = build(create_app(settings, models={"tiny": tiny_classifier()}))
    assert server.config.timeout_keep_alive == settings.keep_alive_timeout_s == 95
    assert all(settings.keep_alive_timeout_s > idle for idle in CLIENT_POOL_IDLE_S.values()), CLIENT_POOL_IDLE_S


def _get(sock: socket.socket) -> bytes:
    """One GET /health/live on ``sock``, read to the end of its answer (by its Content-Length)."""
    sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: t\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer's headers: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    return body


def test_the_process_closes_an_idle_connection_after_the_configured_keep_alive(tmp_path: Path) -> None:
    with serve_process(tmp_path / "server.log", IDG_KEEP_ALIVE_TIMEOUT_S=2) as served, \
            socket.create_connection(("127.0.0.1", served.port)) as sock:
        _get(sock)
        _get(sock)  # kept alive: a second request on the same connection
        idle_from = time.monotonic()
        sock.settimeout(10)
        assert sock.recv(1) == b""  # the server closed it
        idle_s = time.monotonic() - idle_from
    assert 1.9 <= idle_s <= 3.5, f"closed after {idle_s:.2f} s idle, IDG_KEEP_ALIVE_TIMEOUT_S=2"


@pytest.mark.slow
def test_requests_after_idle_gaps_around_5_s_are_all_answered_on_the_kept_connection(tmp_path: Path) -> None:
    """httpx with its default pool (5 s) and a client whose pool keeps connections longer (aiohttp's 15 s, Go's 90 s):
    each sends a request after 4.9, 5.0 and 5.1 s idle. None is lost, and the longer pool's connection is the same one
    throughout: the server did not close it at 5 s (uvicorn's default did, so a request sent then raced the close)."""
    lost: list[str] = []
    with serve_process(tmp_path / "server.log") as served, \
            httpx.Client(base_url=served.url, timeout=10) as short, \
            httpx.Client(base_url=served.url, timeout=10, limits=httpx.Limits(keepalive_expiry=30)) as long:
        short.get("/health/live").raise_for_status()
        first = long.get("/health/live")
        ports = [first.extensions["network_stream"].get_extra_info("client_addr")[1]]
        for gap in GAPS_S:
            time.sleep(gap)
            for name, client in (("httpx default", short), ("30 s pool", long)):
                try:
                    r = client.get("/health/live")
                    r.raise_for_status()
                except httpx.HTTPError as err:
                    lost.append(f"{name} after {gap} s: {type(err).__name__}: {err}")
                    continue
                if client is long:
                    ports.append(r.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert lost == []
    assert len(ports) == 1 + len(GAPS_S) and len(set(ports)) == 1, f"the 30 s pool's connection changed: local ports {ports}"
