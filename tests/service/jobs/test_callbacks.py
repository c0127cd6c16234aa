"""Job callbacks against a real HTTP receiver: each delivery signed (HMAC-SHA256 of the timestamp and
the raw body, under IDG_CALLBACK_SECRET) and verified by the receiver as a webhook consumer would;
tried again after a 5xx or a 3xx (a redirect is not followed), its outcome kept on the job and counted; the links
built on IDG_PUBLIC_URL, never on the request's Host; credentials in the URL (user:password@, the query's token)
sent to the receiver but never logged nor shown; bad URLs refused with a 422 at submission."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

import app.jobs.callbacks as callbacks
from app.jobs.sealing import Sealer, key_of_setting
from app.jobs.sqlite import FILE_NAME, SqliteStore
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, images, submit, wait_done

SECRET = "receiver-and-service-share-this"
PUBLIC = "https://idg.example.org/api"


def verified(secret: str, headers: Any, body: bytes, now: float) -> bool:
    """What a receiver checks: the signature over ``timestamp.body`` under the shared secret (in constant
    time), and a fresh timestamp (a replayed delivery is refused)."""
    stamp, given = headers.get("X-IDG-Timestamp", ""), headers.get("X-IDG-Signature", "")
    if not stamp.isdigit() or abs(now - int(stamp)) > 300:
        return False
    expected = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, given)


class Receiver(BaseHTTPRequestHandler):
    deliveries: list[tuple[int, dict[str, Any], str | None]] = []
    """(status answered, body, Authorization header) per request."""
    requests: list[str] = []
    """The method and path (with its query) of every request, redirects followed included."""
    fail_first = 0
    fail_status = 503
    always = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        Receiver.requests.append(f"POST {self.path}")
        raw = self.rfile.read(int(self.headers["content-length"]))
        if Receiver.always or len(Receiver.deliveries) < Receiver.fail_first:
            status = Receiver.always or Receiver.fail_status
        else:
            status = 204 if verified(SECRET, self.headers, raw, time.time()) else 401
        Receiver.deliveries.append((status, json.loads(raw), self.headers.get("Authorization")))
        self.send_response(status)
        if 300 <= status < 400:  # a redirect a follower would take: answered 204 there
            self.send_header("Location", "/moved")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 - where a followed 301/302 goes
        Receiver.requests.append(f"GET {self.path}")
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[int]:
    Receiver.deliveries, Receiver.requests, Receiver.fail_first, Receiver.fail_status, Receiver.always = [], [], 0, 503, 0
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


async def _outcome(client: Any, job_id: str) -> dict[str, Any]:
    for _ in range(600):
        status = (await client.get(f"/jobs/{job_id}")).json()
        if status["callback_outcome"]:
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id}: no callback outcome within 30 s")


async def test_a_signed_callback_is_verified_by_its_receiver_and_retried_after_a_5xx(
    tiny_app: AppFactory, receiver: int, caplog: pytest.LogCaptureFixture,
) -> None:
    Receiver.fail_first = 1  # busy once: the second attempt, a second later, is delivered
    hook = f"http://hookuser:hookpassword@127.0.0.1:{receiver}/hook"
    async with serve(tiny_app(public_url=PUBLIC + "/", callback_secret=SECRET)) as client:
        r = await client.post("/jobs", files=images(2), data=FAST | {"callback_url": hook}, headers={"Host": "evil.example:666"})
        assert r.status_code == 202, r.text
        job = r.json()
        assert r.headers["location"] == job["url"] == f"{PUBLIC}/jobs/{job['id']}"  # not the Host the client sent
        assert job["callback_url"] == f"http://***@127.0.0.1:{receiver}/hook"
        await wait_done(client, job["id"])
        status = await _outcome(client, job["id"])
        metrics = (await client.get("/metrics")).text
    assert status["callback_outcome"] == "delivered: HTTP 204 after 2 attempt(s)"
    assert [s for s, _, _ in Receiver.deliveries] == [503, 204]
    body = Receiver.deliveries[-1][1]
    assert (body["id"], body["state"], body["done"]) == (job["id"], "done", 2)
    assert body["results_url"] == f"{PUBLIC}/jobs/{job['id']}/results" and "evil" not in json.dumps(body)
    assert Receiver.deliveries[-1][2]  # the URL's credentials went to the receiver (Basic), as the URL asked
    assert 'idg_durable_job_callbacks_total{outcome="delivered"} 1.0' in metrics
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "hookpassword" not in logged and "hookuser" not in logged and "***@127.0.0.1" in logged


def test_the_receiver_refuses_a_wrong_secret_an_altered_body_and_an_old_timestamp() -> None:
    """The check the receiver above runs is one that can fail."""
    body, now = b'{"id":"x"}', time.time()
    stamp = str(int(now))
    good = {"X-IDG-Timestamp": stamp, "X-IDG-Signature": callbacks.signature(SECRET, stamp, body)}
    assert verified(SECRET, good, body, now)
    assert not verified("another secret", good, body, now)
    assert not verified(SECRET, good, body + b" ", now)
    assert not verified(SECRET, good, body, now + 3600)


async def test_a_callback_never_answered_below_500_is_recorded_as_failed_and_the_job_can_be_swept(
    tiny_app: AppFactory, receiver: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(callbacks, "FIRST_WAIT_S", 0.01)  # the backoff's shape, not its seconds
    Receiver.always = 500
    app = tiny_app()
    async with serve(app) as client:
        job = await submit(client, images(1), callback_url=f"http://127.0.0.1:{receiver}/hook")
        status = await _outcome(client, job["id"])
        assert status["callback_outcome"] == f"failed: HTTP 500 after {callbacks.TRIES} attempts"
        assert len(Receiver.deliveries) == callbacks.TRIES
        assert status["url"] == f"/jobs/{job['id']}"  # no IDG_PUBLIC_URL: paths
        assert await asyncio.to_thread(app.state.jobs.store.due_callbacks) == []  # no longer due: retention sweeps it


BAD_URLS = [
    "http://[::1", "http://" + "a" * 100_000 + ".example/hook", "http://" + "b" * 64 + ".example/", "ftp://example.org/done",
    "http://exa mple.org/", "http://example.org:99999/", "http:///nohost", "https://x.example/" + "p" * 3000,
]


async def test_bad_callback_urls_are_a_422_at_submission(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        for url in BAD_URLS:
            r = await client.post("/jobs", files=images(1), data=FAST | {"callback_url": url})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", (url[:40], r.text[:300])
            assert "callback_url" in r.json()["error"]["message"]
        assert (await client.get("/jobs")).json()["total"] == 0


USER, PASSWORD, TOKEN = "hook-user-7f3a", "hook-pass-91c2", "tok-5e8d0b6a"
SECRETS = (USER, PASSWORD, TOKEN)


async def test_the_credentials_and_token_of_a_callback_url_reach_the_receiver_and_nothing_else(
    tiny_app: AppFactory, receiver: int, caplog: pytest.LogCaptureFixture,
) -> None:
    # the ?token= had been logged twice (httpx's request line, the outcome line) and answered in clear by GET /jobs/{id}
    caplog.set_level(logging.DEBUG)
    exporter = _spans()
    hook = f"http://{USER}:{PASSWORD}@127.0.0.1:{receiver}/hook?token={TOKEN}&v=2"
    shown = f"http://***@127.0.0.1:{receiver}/hook?token=***&v=***"
    answers: list[str] = []
    app = tiny_app(callback_secret=SECRET)
    try:
        async with serve(app) as client:
            r = await client.post("/jobs", files=images(1), data=FAST | {"callback_url": hook})
            assert r.status_code == 202, r.text
            answers.append(r.text)
            job = r.json()
            assert job["callback_url"] == shown
            await wait_done(client, job["id"])
            status = await _outcome(client, job["id"])
            for path in (f"/jobs/{job['id']}", "/jobs", "/metrics"):
                answers.append((await client.get(path)).text)
            for bad in (hook.replace("http://", "ftp://"), hook.replace("127.0.0.1", "[::1")):  # refused: the 422 says which URL
                r = await client.post("/jobs", files=images(1), data=FAST | {"callback_url": bad})
                assert r.status_code == 422, r.text
                answers.append(r.text)
    finally:
        if exporter is not None:
            from app.doors import tracing

            tracing.disable()
    assert status["callback_outcome"] == "delivered: HTTP 204 after 1 attempt(s)" and status["callback_url"] == shown
    # the receiver got all of it: the path with its token, the credentials as Basic authentication
    assert Receiver.requests == [f"POST /hook?token={TOKEN}&v=2"]
    auth = Receiver.deliveries[0][2] or ""
    assert base64.b64decode(auth.removeprefix("Basic ")).decode() == f"{USER}:{PASSWORD}"
    assert Receiver.deliveries[0][1]["callback_url"] == shown  # the body it was sent is a status body like the others
    logged = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert "httpx HTTP Request: POST " in logged and shown in logged  # the lines that had shown it are there, redacted
    if exporter is not None:
        spans = exporter.get_finished_spans()
        assert spans
        answers.append(repr([(s.name, dict(s.attributes or {})) for s in spans]))
    # the job store's rows, read back as any reader of the file reads them, and the file's bytes: the URL as shown
    store_file = app.state.settings.data_dir / FILE_NAME
    with sqlite3.connect(store_file) as conn:
        rows = [repr(row) for table in ("jobs", "images") for row in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608
    assert any(shown in row for row in rows)
    raw = b"".join(p.read_bytes() for p in store_file.parent.iterdir() if p.name.startswith(FILE_NAME))
    for secret in SECRETS:
        assert secret not in logged, secret
        assert secret.encode() not in raw, secret
        for text in (*answers, *rows):
            assert secret not in text, (secret, text[:300])


async def test_a_callback_sealed_under_another_key_fails_saying_so_and_one_under_the_servers_key_arrives(
    tiny_app: AppFactory, receiver: int, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    hook = f"http://{USER}:{PASSWORD}@127.0.0.1:{receiver}/hook?token={TOKEN}"
    params = {"attribute": {"method": "ig", "steps": 4, "return_overlay": False}, "explain_if": None}
    old_key, new_key = "the-key-before-the-change", "the-key-after-the-change"
    before = SqliteStore(tmp_path, sealer=Sealer(key_of_setting(old_key)))  # submitted before the key changed
    before.create_job("stale", params, hook, [("a.png", image_bytes())], 10**9)
    before.close()
    SqliteStore(tmp_path, sealer=Sealer(key_of_setting(new_key))).create_job("fresh", params, hook, [("b.png", image_bytes())], 10**9)
    async with serve(tiny_app(data_dir=tmp_path, jobs_seal_key=new_key, callback_secret=SECRET)) as client:
        stale, fresh = await _outcome(client, "stale"), await _outcome(client, "fresh")
    assert stale["callback_outcome"].startswith("failed: its callback URL, sealed in the job store, could not be opened: "
                                                "it was sealed with another key"), stale
    assert stale["callback_url"] == fresh["callback_url"] == f"http://***@127.0.0.1:{receiver}/hook?token=***"
    assert fresh["callback_outcome"] == "delivered: HTTP 204 after 1 attempt(s)"
    # only the fresh job's callback arrived, with the URL's real credentials and token
    assert Receiver.requests == [f"POST /hook?token={TOKEN}"] and Receiver.deliveries[0][1]["id"] == "fresh"
    assert base64.b64decode((Receiver.deliveries[0][2] or "").removeprefix("Basic ")).decode() == f"{USER}:{PASSWORD}"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("job stale: callback" in line and "sealed with another key" in line for line in errors), errors


def _spans() -> Any:
    """An in-memory span exporter with tracing on, or None where OpenTelemetry's SDK is not installed."""
    try:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    except ImportError:
        return None
    from app.doors import tracing

    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    return exporter


@pytest.mark.parametrize(("url", "shown"), [
    ("https://u:p@h.example:8443/a/b?token=t0k&x=1#frag", "https://***@h.example:8443/a/b?token=***&x=***#***"),
    ("https://h.example/hook?sig=abc%3D%3D&empty=&&bare", "https://h.example/hook?sig=***&empty=***&&***"),
    ("http://tokenonly@h.example/", "http://***@h.example/"),
    ("http://h.example/plain", "http://h.example/plain"),
    ("http://[::1", "http://[::1"),  # cannot be split, but holds no "@", "?" nor "#": nothing secret to hide
    # a password holding "/", "#" or "?" ends the authority early (urllib reads its first part as the port, or the host):
    # whatever is before the "@" may be secret
    ("http://user:pa/ss@h.example/hook", "http://***"),
    ("http://user:pa#ss@h.example/hook", "http://***"),
    ("http://user:pa?ss@h.example/hook?token=t", "http://***"),
    ("https://u:12/34@h.example/", "https://***"),  # splits (host u, port 12), its "@" outside the authority all the same
    ("tok/en@h.example", "***"),
])
def test_redacted_hides_userinfo_query_values_and_the_fragment(url: str, shown: str) -> None:
    assert callbacks.redacted(url) == shown
    assert callbacks.redacted(shown) == shown  # what the store keeps, shown again as it is


@pytest.mark.parametrize("password", ["Qx7/Zr9-a1", "Qx7#Zr9-a1", "Qx7?Zr9-a1"])
async def test_a_refused_callback_url_shows_no_part_of_its_password(
    tiny_app: AppFactory, caplog: pytest.LogCaptureFixture, password: str,
) -> None:
    # refused with a 422 that had shown the password twice: in urllib's port error ('Qx7') and in the URL echoed
    caplog.set_level(logging.DEBUG)
    async with serve(tiny_app()) as client:
        r = await client.post("/jobs", files=images(1), data=FAST | {"callback_url": f"http://hookuser:{password}@127.0.0.1:9/hook"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", r.text
        message = r.json()["error"]["message"]
        assert message.startswith("callback_url has a port that is not a number") and "percent-encoded (%2F, %3F, %23" in message
        assert message.endswith("got 'http://***'"), message
        assert (await client.get("/jobs")).json()["total"] == 0
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    for part in ("Qx7", "Zr9-a1", "hookuser"):
        assert part not in r.text and part not in logged, part


async def test_a_callback_answered_with_a_redirect_is_not_delivered_and_the_redirect_not_followed(
    tiny_app: AppFactory, receiver: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(callbacks, "FIRST_WAIT_S", 0.01)
    Receiver.always = 302
    async with serve(tiny_app(callback_secret=SECRET)) as client:
        job = await submit(client, images(1), callback_url=f"http://127.0.0.1:{receiver}/hook")
        status = await _outcome(client, job["id"])
        metrics = (await client.get("/metrics")).text
    assert status["callback_outcome"] == f"failed: HTTP 302 (a redirect: not followed) after {callbacks.TRIES} attempts"
    assert Receiver.requests == ["POST /hook"] * callbacks.TRIES  # tried again, never at /moved
    assert 'idg_durable_job_callbacks_total{outcome="failed"} 1.0' in metrics
    assert 'idg_durable_job_callbacks_total{outcome="delivered"} 0.0' in metrics


@pytest.mark.parametrize("redirect", [301, 307, 308])
async def test_a_redirect_is_a_failed_try_tried_again(
    tiny_app: AppFactory, receiver: int, monkeypatch: pytest.MonkeyPatch, redirect: int,
) -> None:
    monkeypatch.setattr(callbacks, "FIRST_WAIT_S", 0.01)
    Receiver.fail_first, Receiver.fail_status = 1, redirect
    async with serve(tiny_app(callback_secret=SECRET)) as client:
        job = await submit(client, images(1), callback_url=f"http://127.0.0.1:{receiver}/hook")
        status = await _outcome(client, job["id"])
    assert status["callback_outcome"] == "delivered: HTTP 204 after 2 attempt(s)"
    assert Receiver.requests == ["POST /hook", "POST /hook"]
