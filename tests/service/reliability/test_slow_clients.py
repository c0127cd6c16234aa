"""Slow and vanishing clients against the real launcher (``python -m app.server``) over raw sockets:
slow headers and bodies cost a socket for a bounded time, and a client that goes away is counted
as 499 (client closed), logged at info, without a traceback, never as a 5xx."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import Served, serve_process

HEADER_S, BODY_S, MODEL_S = 1.0, 1.0, 1.5
MARGIN_S = 4.0  # generous: a noisy shared machine
UPLOAD_HEAD = b"POST /predict HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("slow") / "server.log"
    with serve_process(log, IDG_HEADER_TIMEOUT_S=HEADER_S, IDG_BODY_TIMEOUT_S=BODY_S, IDG_TEST_DELAY_S=MODEL_S) as s:
        yield s


def _connect(served: Served) -> socket.socket:
    return socket.create_connection(("127.0.0.1", served.port))


def _until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {limit_s} s; it sent {data!r}")
    return data, time.monotonic() - started


def _error(answer: bytes) -> dict[str, object]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), answer
    return json.loads(body)["error"]


def _metric_becomes(served: Served, sample: str, value: float, limit_s: float = 15) -> None:
    deadline = time.monotonic() + limit_s
    while (seen := served.metric(sample)) != value:
        assert time.monotonic() < deadline, f"{sample} is {seen}, expected {value}"
        time.sleep(0.1)


def test_headers_trickled_byte_by_byte_get_408_and_the_connection_closed(served: Served) -> None:
    before = served.metric('idg_read_timeouts_total{phase="headers"}')
    sock = _connect(served)
    sock.sendall(b"GET /health/live HTTP/1.1\r\n")

    def trickle() -> None:  # a byte every 20 ms: each read succeeds, the request never completes
        try:
            for _ in range(2000):
                sock.sendall(b"x")
                time.sleep(0.02)
        except OSError:
            pass

    threading.Thread(target=trickle, daemon=True).start()
    time.sleep(HEADER_S + 0.5)  # a busy client reads late: the answer must still be there to read
    answer, seconds = _until_closed(sock, MARGIN_S)
    seconds += HEADER_S + 0.5
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert _error(answer)["code"] == "header_timeout"
    assert seconds < HEADER_S + MARGIN_S
    assert served.metric('idg_read_timeouts_total{phase="headers"}') == before + 1


def test_a_connection_that_sends_nothing_is_closed_silently(served: Served) -> None:
    answer, _ = _until_closed(_connect(served), HEADER_S + MARGIN_S)
    assert answer == b""


def test_the_next_request_on_a_kept_alive_connection_has_the_same_header_deadline(served: Served) -> None:
    sock = _connect(served)
    sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: t\r\n\r\n")
    sock.settimeout(10)
    first = b""
    while not first.endswith(b'{"status":"alive"}'):
        first += sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200"), first
    sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: t\r\n")  # uvicorn's keep-alive timer stops on these bytes
    answer, _ = _until_closed(sock, HEADER_S + MARGIN_S)
    assert _error(answer)["code"] == "header_timeout"


def test_a_stalled_upload_gets_408_and_the_connection_closed(served: Served) -> None:
    before = served.metric('idg_http_requests_total{route="/predict",status="408"}')
    sock = _connect(served)
    sock.sendall(UPLOAD_HEAD + b'{"image": "')
    answer, seconds = _until_closed(sock, BODY_S + MARGIN_S)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    error = _error(answer)
    assert error["code"] == "body_timeout" and "did not arrive within 1 s" in str(error["message"])
    assert seconds < BODY_S + MARGIN_S
    _metric_becomes(served, 'idg_http_requests_total{route="/predict",status="408"}', before + 1)


def test_a_slow_body_nobody_reads_is_closed_too(served: Served) -> None:
    """405 answers before reading the body: the protocol's backstop still frees the socket."""
    sock = _connect(served)
    sock.sendall(UPLOAD_HEAD.replace(b"/predict", b"/health/live") + b"{")
    answer, seconds = _until_closed(sock, BODY_S + 2 + MARGIN_S)
    assert answer.startswith(b"HTTP/1.1 405"), answer
    assert seconds < BODY_S + 2 + MARGIN_S


def test_a_normal_request_slower_than_the_read_timeouts_to_answer_is_not_cut(served: Served) -> None:
    r = httpx.post(served.url + "/predict", files={"file": ("a.png", image_bytes())}, timeout=30)
    assert r.status_code == 200, r.text  # the model call alone takes MODEL_S > both timeouts


def test_a_long_body_of_declared_length_has_its_time_at_the_minimum_rate_on_the_socket_too(served: Served) -> None:
    # 4 MB declared: IDG_MIN_UPLOAD_RATE (500 kB/s) gives it 8 s, far past IDG_BODY_TIMEOUT_S (1 s). The app allowed that,
    # but the protocol closed the socket at the plain timeout + 2 s, so a large job on a slow link never arrived
    body = json.dumps({"image": base64.b64encode(image_bytes()).decode()}).encode()
    body += b" " * (4_000_000 - len(body))  # JSON's trailing whitespace
    sock = _connect(served)
    sock.sendall(b"POST /predict HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body))
    pieces = 50
    for i in range(pieces):  # over 5 s: past the 3 s the socket had, within the 8 s the rate gives
        time.sleep(5.0 / pieces)
        sock.sendall(body[i * len(body) // pieces:(i + 1) * len(body) // pieces])
    answer, _ = _until_closed_or_answered(sock, MODEL_S + MARGIN_S)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_the_time_a_declared_length_buys_on_the_socket_stops_at_the_largest_body_a_route_takes() -> None:
    from app.server import ReadLimits

    limits = ReadLimits(10.0, 60.0, None, 500_000, 300_000_000)
    assert limits.body_s(None) == limits.body_s(1_000) == 60.0
    assert limits.body_s(100_000_000) == 200.0
    assert limits.body_s(10**13) == 600.0  # not 2e7 s: a declared 10 TB nobody reads is closed like any body


def _until_closed_or_answered(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """What the server sends until its answer's body is complete (Content-Length) or it closes, and how long that took."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), None)
        if length is not None and len(rest) >= length:
            break
    return data, time.monotonic() - started


def test_a_client_aborting_its_upload_counts_499_and_logs_no_traceback(served: Served) -> None:
    sample = 'idg_http_requests_total{route="/predict",status="%s"}'
    before = served.metric(sample % 499)
    sock = _connect(served)
    sock.sendall(UPLOAD_HEAD + b'{"image": "')
    time.sleep(0.3)
    sock.close()
    _metric_becomes(served, sample % 499, before + 1)
    assert served.metric(sample % 500) == 0
    log = served.log()
    assert "went away before its request to POST /predict was read" in log
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_a_client_leaving_while_its_job_runs_counts_499_not_503(served: Served) -> None:
    sample = 'idg_http_requests_total{route="/predict",status="%s"}'
    before = served.metric(sample % 499)
    sock = _connect(served)
    body = json.dumps({"image": base64.b64encode(image_bytes()).decode()}).encode()
    sock.sendall(UPLOAD_HEAD.replace(b"100000", str(len(body)).encode()) + body)
    deadline = time.monotonic() + 10
    while served.metric("idg_queue_depth") != 1.0:  # the job is in the worker (the model call takes MODEL_S)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    sock.close()
    _metric_becomes(served, sample % 499, before + 1)
    assert served.metric(sample % 503) == 0
    assert served.metric(sample % 500) == 0
    assert "Traceback" not in served.log()
    # the request's log line says what the metric counted (it had said 503, the status sent to nobody)
    deadline = time.monotonic() + 5
    while "POST /predict 499 in " not in served.log():
        assert time.monotonic() < deadline, served.log()[-2000:]
        time.sleep(0.05)
    assert "POST /predict 503 in " not in served.log()


def test_a_client_that_leaves_while_its_attribution_waits_has_its_work_dropped(served: Served) -> None:
    """The socket closes while the attribution is in the worker: its job is dropped within a
    moment (not at its deadline), so at most the model call already running touches it."""
    calls = 'idg_model_calls_total{model="tiny"}'
    body = json.dumps({"image": base64.b64encode(image_bytes()).decode(), "method": "idg", "steps": 64, "probe_steps": 8}).encode()
    sock = _connect(served)
    sock.sendall(b"POST /attribute HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    _metric_becomes(served, "idg_queue_depth", 1.0, limit_s=MARGIN_S)  # admitted: 9 model calls of MODEL_S each to go
    sock.close()
    left = time.monotonic()
    _metric_becomes(served, "idg_queue_depth", 0.0, limit_s=MARGIN_S)
    assert time.monotonic() - left < MARGIN_S
    after = served.metric(calls)
    time.sleep(2.5 * MODEL_S)
    assert served.metric(calls) <= after + 1  # the call running when it left, at most
    log = served.log()
    assert "went away; dropping it" in log
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log


def test_a_client_leaving_an_event_stream_counts_499_with_its_real_duration(served: Served) -> None:
    """The stream's 200 headers went out at once, but the answer never finished: that is a client that
    left (499), not a success, and its latency runs until it left, not until the headers."""
    sample = 'idg_http_requests_total{route="/attribute/stream",status="%s"}'
    seconds = 'idg_http_request_seconds_sum{route="/attribute/stream"}'
    before, before_200, before_s = served.metric(sample % 499), served.metric(sample % 200), served.metric(seconds)
    body = json.dumps({"image": base64.b64encode(image_bytes()).decode(), "method": "idg", "steps": 64, "probe_steps": 8}).encode()
    sock = _connect(served)
    sock.sendall(b"POST /attribute/stream HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n" % len(body) + body)
    sock.settimeout(MARGIN_S)
    head = b""
    while b"event: accepted" not in head:
        head += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200"), head
    time.sleep(MODEL_S)  # a model call of MODEL_S runs for it meanwhile; then the client leaves mid-stream
    sock.close()
    _metric_becomes(served, sample % 499, before + 1)
    assert served.metric(sample % 200) == before_200
    assert served.metric(seconds) - before_s >= MODEL_S
    assert "Traceback" not in served.log()
