"""``IDG_PROCESSES=2``: two real server processes on one port under the launcher (``python -m app.server``).

Each answers (``X-IDG-Replica`` names it), ``/metrics`` is the sum over both whichever one the scrape
reaches, one that dies is replaced, SIGTERM stops them all, so does the launcher's death, and one that cannot
start stops the launcher with its reason instead of a loop of restarts."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import ROOT, Served, serve_process

GRPC = importlib.util.find_spec("grpc") is not None and importlib.util.find_spec("tritonclient") is not None


def _replica_pids(served: Served, want: int, limit_s: float = 90) -> set[int]:
    """The server processes' pids seen answering /health/ready (a new connection each), once ``want`` are seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + limit_s
    while len(seen) < want and time.monotonic() < deadline:
        r = httpx.get(served.url + "/health/ready", timeout=10)
        if r.status_code == 200:
            seen.add(int(r.headers["x-idg-replica"].rsplit(":", 1)[1]))
        else:
            time.sleep(0.1)
    assert len(seen) >= want, f"saw {seen} of {want} processes:\n{served.log()}"
    return seen


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _predict(served: Served) -> httpx.Response:
    files = {"file": ("x.png", image_bytes(), "image/png")}
    return httpx.post(served.url + "/predict", files=files, timeout=30)


def _process_metric(served: Served, name: str) -> dict[int, float]:
    """One of prometheus_client's process metrics (or python_info) in /metrics, by its ``pid`` label (0: none)."""
    text = httpx.get(served.url + "/metrics", timeout=10).text
    found = re.findall(rf'^{name}\{{(.*?)\}} (\S+)$', text, re.M) + [("", v) for v in re.findall(rf"^{name} (\S+)$", text, re.M)]
    return {int(m.group(1)) if (m := re.search(r'pid="(\d+)"', labels)) else 0: float(v) for labels, v in found}


def _grpc_replica_pids(port: int, want: int) -> set[int]:
    """The server processes' pids seen answering gRPC's ServerReady (a new connection each; its trailing metadata names
    the process)."""
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    seen: set[int] = set()
    for _ in range(40):
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            answer, call = stub_of(channel).ServerReady.with_call(pb.ServerReadyRequest(), timeout=10)
            assert answer.ready
            seen.add(int(dict(call.trailing_metadata())["x-idg-replica"].rsplit(":", 1)[1]))
        if len(seen) == want:
            break
    return seen


def test_two_processes_answer_on_one_port_and_metrics_sum_over_both(tmp_path: Path) -> None:
    # and on one gRPC port (IDG_GRPC_PORT), where grpcio is installed: each process opens it with SO_REUSEPORT too
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2, IDG_GRPC_PORT=grpc_port if GRPC else 0) as served:
        pids = _replica_pids(served, 2)
        assert served.proc.pid not in pids  # the launcher serves nothing itself
        answered_by: set[int] = set()
        for _ in range(24):  # a new connection each: the kernel spreads them over both (by their hash: all 24 to one,
            # 1 in 8 million)
            r = _predict(served)
            assert r.status_code == 200, r.text
            answered_by.add(int(r.headers["x-idg-replica"].rsplit(":", 1)[1]))
        # every scrape, whichever process answers it, counts the requests of both
        for _ in range(6):
            assert served.metric('idg_http_requests_total{route="/predict",status="200"}') == 24
        assert served.metric("idg_ready") == 1  # every process ready
        assert served.metric("idg_ready_processes") == 2
        assert served.metric('idg_model_calls_total{model="tiny"}') >= 12
        # each process's own standard metrics, labelled by its pid; Python's once
        assert set(_process_metric(served, "process_resident_memory_bytes")) == pids
        assert all(v > 10e6 for v in _process_metric(served, "process_resident_memory_bytes").values())
        assert set(_process_metric(served, "process_open_fds")) == pids
        assert len(_process_metric(served, "python_info")) == 1
        # the device's own busy time (the processes' shared file), once, beside each process's own summed
        text = httpx.get(served.url + "/metrics", timeout=10).text
        for family in ("idg_device_busy_seconds_total", "idg_device_idle_seconds_total"):
            assert text.count(f"# TYPE {family} counter") == 1
        assert served.metric("idg_device_busy_seconds_total") > 0 and served.metric("idg_process_device_busy_seconds_total") > 0
        if GRPC:
            assert _grpc_replica_pids(grpc_port, 2) == pids
    assert answered_by == pids


def _device_time(served: Served) -> tuple[float, dict[str, float]]:
    """When the scrape went out (``time.monotonic``), and the device's busy and idle seconds with the processes' own."""
    sent = time.monotonic()
    text = httpx.get(served.url + "/metrics", timeout=10).text
    names = {"busy": "idg_device_busy_seconds_total", "host": 'idg_device_idle_seconds_total{cause="host"}',
             "no_work": 'idg_device_idle_seconds_total{cause="no_work"}', "processes": "idg_process_device_busy_seconds_total"}
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return sent, {k: float(values[name]) for k, name in names.items()}


@pytest.mark.slow  # a server of its own (~40 s on 2 busy cores); tests/service/test_device_time.py is the quick check
def test_two_processes_on_one_device_read_its_busy_time_once(tmp_path: Path) -> None:
    """Every model call takes 1 s in each process (TinyNet sleeps: the two processes' calls overlap in time, as theirs
    do on a GPU they share): the device's busy time is the union of their calls, within the wall time, where the sum
    of the processes' own passes it; busy and idle add up to the wall time."""
    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2, IDG_TEST_DELAY_S=1.0) as served:
        pids = _replica_pids(served, 2)
        for _ in range(3):  # until a burst reaches both processes (8 new connections all to one: 1 in 128)
            t0, before = _device_time(served)
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(lambda _: _predict(served), range(8)))
            t1, after = _device_time(served)
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            if {int(r.headers["x-idg-replica"].rsplit(":", 1)[1]) for r in answers} == pids:
                break
        else:
            pytest.fail("no burst reached both processes")
        d = {k: after[k] - before[k] for k in after}
        wall = t1 - t0
        assert d["busy"] >= 1.0 and d["busy"] <= wall + 0.05, (d, wall)
        assert d["processes"] >= d["busy"] + 0.5, (d, wall)  # the processes' calls overlapped: their sum counts it twice
        assert d["busy"] >= d["processes"] / 2 - 0.05, (d, wall)  # two processes: at most twice
        assert abs(d["busy"] + d["host"] + d["no_work"] - wall) <= 0.3, (d, wall)


@pytest.mark.slow  # 19 s on the 2-core VM: make test kept under its 15 minutes (2026-11-27: 15:30 of checks)
def test_a_process_that_dies_is_replaced_and_sigterm_then_stops_every_process(tmp_path: Path) -> None:
    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2, IDG_SHUTDOWN_GRACE_S=5) as served:
        first = _replica_pids(served, 2)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)  # as the kernel's OOM killer would
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "starting another in its place" not in served.log():
            time.sleep(0.1)
        assert "starting another in its place" in served.log()
        # while the replacement starts, every new connection goes to the living process (the dead one's socket is closed)
        for _ in range(8):
            r = _predict(served)
            assert r.status_code == 200 and int(r.headers["x-idg-replica"].rsplit(":", 1)[1]) in first - {victim}, r.text
        after = _replica_pids(served, 2)  # then the replacement answers too, on the same port
        assert len(after - first) == 1 and victim not in after and served.proc.poll() is None
        assert set(_process_metric(served, "process_resident_memory_bytes")) == after  # the dead one's gone
        assert _predict(served).status_code == 200

        started = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=30) == 0, served.log()
        took = time.monotonic() - started
    assert took < 5 + 6  # the grace and the launcher's margin: an idle server stops at once
    assert not any(_alive(pid) for pid in after)
    assert served.log().count("Finished server process") == 2  # each drained and shut down (the killed one could not)


@pytest.mark.slow  # 11-18 s: make test keeps under its 15 minutes (run with -m slow)
def test_a_killed_launcher_takes_its_processes_with_it(tmp_path: Path) -> None:
    """SIGKILL gives the launcher no chance to stop them: the kernel tells each (PR_SET_PDEATHSIG), and they stop."""
    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2) as served:
        pids = _replica_pids(served, 2)
        served.proc.kill()
        served.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in pids), served.log()


@pytest.mark.slow  # 11-18 s: make test keeps under its 15 minutes (run with -m slow)
def test_a_process_that_cannot_start_stops_the_launcher_with_its_reason(tmp_path: Path) -> None:
    env = {**os.environ, "IDG_PROCESSES": "2", "IDG_MODELS": f"resnet50={tmp_path / 'missing.pth'}", "IDG_WARMUP": "false"}
    proc = subprocess.run([sys.executable, "-m", "app.server", "--port", "0"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "failed to start" in proc.stderr and "missing.pth" in proc.stderr
    assert proc.stderr.count("server process 0: pid") == 1  # not restarted


@pytest.mark.parametrize("slow", [0, 1])
def test_processes_started_together_take_no_work_before_the_port_is_ready(tmp_path: Path, slow: int) -> None:
    """IDG_PROCESSES=2, one process held in its start-up: until the port says ready every request is a 503 from the one
    process that answers while the port starts (never an answer from a ready process beside a 503 from one still
    starting, which had passed a CUDA host's /health/ready); the first process ready opens the port, and the other
    listens only once it is warm too. ``slow``: which process is held (0: the one that answers early)."""
    hold = tmp_path / "hold"
    hold.write_text("")
    with serve_process(tmp_path / "server.log", wait_ready=False, IDG_PROCESSES=2, IDG_TEST_HOLD_START=hold,
                       IDG_TEST_HOLD_PROCESS=slow) as served:
        deadline = time.monotonic() + 60
        while served.log().count("ready: tiny on cpu") < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        while time.monotonic() < deadline:  # the early process listens (the other may be ready before it imported the app)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(served.url + "/health/live", timeout=5).status_code == 200:
                    break
            time.sleep(0.1)
        seen: dict[int, set[str]] = {}
        for _ in range(16):  # a new connection each, so the kernel would spread them over both processes' sockets
            r = _predict(served)
            seen.setdefault(r.status_code, set()).add(r.headers.get("x-idg-replica", ""))
        if slow == 0:  # the early process is held: the ready one waits for it, the port answers "starting"
            assert set(seen) == {503}, seen
            assert httpx.get(served.url + "/health/ready", timeout=10).status_code == 503
            assert "listening once another server process of the port is ready" in served.log()
        else:  # the early process is ready and serves; the held one has not listened
            assert set(seen) == {200} and len(seen[200]) == 1, seen
        hold.unlink()
        pids = _replica_pids(served, 2)
        for _ in range(16):
            r = _predict(served)
            assert r.status_code == 200, r.text
        assert len(pids) == 2


def test_idg_ready_is_0_while_one_process_has_started_and_is_not_ready(tmp_path: Path) -> None:
    """What a scrape reads during a start or a restart: the process still loading has said it is not ready. Each
    process here is a Python of its own (the values are kept per pid), writing into one metrics directory."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    serving = "from app.monitoring.prometheus import Metrics; Metrics().ready.set(1)"
    loading = "from app.monitoring.prometheus import not_ready_yet; not_ready_yet()"

    def scrape() -> str:
        text = subprocess.run([sys.executable, "-c", "from prometheus_client import CollectorRegistry; from app.monitoring.prometheus "
                               "import exposition; print(exposition(CollectorRegistry()).decode())"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120, check=True).stdout
        return next(line for line in text.splitlines() if line.startswith("idg_ready "))

    subprocess.run([sys.executable, "-c", serving], cwd=ROOT, env=env, timeout=120, check=True)
    assert scrape() == "idg_ready 1.0"  # the serving process's value (the scraping one holds no gauge here)
    subprocess.run([sys.executable, "-c", loading], cwd=ROOT, env=env, timeout=120, check=True)
    assert scrape() == "idg_ready 0.0"
