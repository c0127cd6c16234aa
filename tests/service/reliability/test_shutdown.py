"""SIGTERM against the real launcher (``python -m app.server``, a separate process): readiness 503
and new work refused at once, in-flight work finishes within the grace, what remains gets a JSON
503, slow clients do not hold the exit, and the process is gone within grace + 5 s."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx

from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import Served, serve_process

GRACE_S = 5.0
BOUND_S = GRACE_S + 5  # the promise


def _attribute(url: str, steps: int, out: dict[str, object], key: str) -> None:
    """guided_ig runs one worker round per step, so ``steps`` sets how long the request works."""
    try:
        r = httpx.post(url + "/attribute", files={"file": ("a.png", image_bytes())},
                       data={"method": "guided_ig", "steps": str(steps), "return_overlay": "false"}, timeout=60)
        out[key] = (r.status_code, r.headers.get("content-type"), r.json(), time.monotonic())
    except (httpx.HTTPError, ValueError) as err:
        out[key] = err


def _read_all(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _wait_for(served: Served, sample: str, value: float, limit_s: float = 20) -> None:
    deadline = time.monotonic() + limit_s
    while served.metric(sample) != value:
        assert time.monotonic() < deadline, f"{sample} never reached {value}"
        time.sleep(0.05)


def _sigterm_and_watch(served: Served) -> tuple[list[httpx.Response], float]:
    """SIGTERM; the readiness answers seen until 503, then one new /predict; seconds to exit."""
    served.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    readiness = []
    while not readiness or readiness[-1].status_code == 200:
        assert time.monotonic() - sent < GRACE_S, "readiness still 200 well into the drain"
        readiness.append(httpx.get(served.url + "/health/ready", timeout=5))
    readiness.append(httpx.post(served.url + "/predict", files={"file": ("a.png", image_bytes())}, timeout=5))
    served.proc.wait(timeout=BOUND_S + 30)
    return readiness, time.monotonic() - sent


def test_sigterm_finishes_in_flight_work_answers_the_rest_in_json_and_exits_in_time(tmp_path: Path) -> None:
    settings = {"IDG_SHUTDOWN_GRACE_S": GRACE_S, "IDG_TEST_DELAY_S": 0.1, "IDG_HEADER_TIMEOUT_S": 60, "IDG_BODY_TIMEOUT_S": 60}
    with serve_process(tmp_path / "server.log", **settings) as served:
        # slow clients: an upload that stalls after 10 bytes, and headers that never end
        uploading = socket.create_connection(("127.0.0.1", served.port))
        uploading.sendall(b"POST /predict HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
                          b"content-length: 100000\r\n\r\n{\"image\":")
        stalled = socket.create_connection(("127.0.0.1", served.port))
        stalled.sendall(b"GET /models HTTP/1.1\r\nhost: t\r\n")
        results: dict[str, object] = {}
        clients = [
            threading.Thread(target=_attribute, args=(served.url, steps, results, key)) for key, steps in (("short", 6), ("long", 400))
        ]
        for c in clients:
            c.start()
        # both jobs are in the worker; whichever came first, the short one shares the long one's
        # gradient calls (its forward prediction pass takes a turn between them, app.worker.scheduler)
        _wait_for(served, "idg_queue_depth", 2.0)

        readiness, exit_s = _sigterm_and_watch(served)
        signalled = time.monotonic() - exit_s
        for c in clients:
            c.join(timeout=30)
        log = served.log()

    assert exit_s < BOUND_S, f"exit took {exit_s:.1f} s\n{log}"
    assert served.proc.returncode == -signal.SIGTERM, f"not the graceful path (watchdog?)\n{log}"
    ready_503, new_work = readiness[-2], readiness[-1]
    assert ready_503.status_code == 503 and ready_503.json() == {"status": "draining"}
    assert new_work.status_code == 503 and new_work.headers["retry-after"] == "5"
    assert new_work.json()["error"]["code"] == "shutting_down"

    assert all(isinstance(r, tuple) for r in results.values()), f"{results}\n{log}"
    status, ctype, body, finished = results["short"]  # type: ignore[misc]
    assert (status, ctype) == (200, "application/json"), f"{body}\n{log}"
    assert finished > signalled, "the short request should still have been running at SIGTERM"
    status, ctype, body, _ = results["long"]  # type: ignore[misc]
    assert (status, ctype) == (503, "application/json"), body
    assert body["error"]["status"] == 503 and "shutting down" in body["error"]["message"]

    answer = _read_all(uploading, 5).decode()
    assert answer.startswith("HTTP/1.1 503"), answer
    assert json.loads(answer.split("\r\n\r\n", 1)[1])["error"]["code"] == "shutting_down"
    assert _read_all(stalled, 5) == b""  # closed, not answered: its request never came
    assert "Traceback" not in log, log


def test_a_stuck_model_call_does_not_hold_the_exit(tmp_path: Path) -> None:
    """The worker is inside a 60 s model call: its request still gets a JSON 503 and the process
    still exits within grace + 5 s."""
    with serve_process(tmp_path / "server.log", IDG_SHUTDOWN_GRACE_S=1, IDG_TEST_DELAY_S=60) as served:
        results: dict[str, object] = {}
        client = threading.Thread(target=_attribute, args=(served.url, 2, results, "stuck"))
        client.start()
        _wait_for(served, "idg_queue_depth", 1.0)
        time.sleep(0.3)  # into the model call
        served.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        served.proc.wait(timeout=60)
        exit_s = time.monotonic() - sent
        client.join(timeout=30)
        log = served.log()

    assert exit_s < 1 + 5, f"exit took {exit_s:.1f} s\n{log}"
    assert isinstance(results["stuck"], tuple), f"{results}\n{log}"
    status, ctype, body, _ = results["stuck"]  # type: ignore[misc]
    assert (status, ctype) == (503, "application/json"), f"{body}\n{log}"
    assert body["error"]["code"] == "shutting_down", f"{body}\n{log}"
    assert "Traceback" not in log, log


def test_an_idle_server_exits_at_once_whatever_the_grace(tmp_path: Path) -> None:
    with serve_process(tmp_path / "server.log", IDG_SHUTDOWN_GRACE_S=60) as served:
        served.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        served.proc.wait(timeout=90)
        assert time.monotonic() - sent < 5, served.log()
