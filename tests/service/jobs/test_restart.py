"""A job survives its server: a real server process (``python -m app.server``) is killed with
SIGKILL mid-job, restarted on the same data directory, stopped with SIGTERM mid-job, restarted
again, and every image is answered exactly once."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from app.jobs.sqlite import FILE_NAME
from app.jobs.store import RUNNING
from tests.service.jobs.helpers import FAST, images
from tests.service.reliability.server_app import Served, serve_process

pytestmark = pytest.mark.slow
N = 40


def _status(served: Served, job_id: str) -> dict:
    return httpx.get(f"{served.url}/jobs/{job_id}", timeout=10).json()


def _wait_answered(served: Served, job_id: str, at_least: int, limit_s: float = 120) -> dict:
    deadline = time.monotonic() + limit_s
    while (status := _status(served, job_id))["done"] + status["failed"] < at_least:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


def _kill_holding_claims(served: Served, db: Path, limit_s: float = 60) -> int:
    """SIGKILL the server at a moment it holds claims: it is frozen (SIGSTOP), its store read, and killed only if some
    images are claimed, else let go on; two images in flight finish together, so an unlucky kill could find none."""
    deadline = time.monotonic() + limit_s
    while True:
        served.proc.send_signal(signal.SIGSTOP)
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            held = conn.execute("SELECT count(*) FROM images WHERE state = ?", (RUNNING,)).fetchone()[0]
        if held or time.monotonic() > deadline:
            served.proc.send_signal(signal.SIGKILL)
            served.proc.wait(timeout=30)
            return held
        served.proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)


def test_kill_9_and_sigterm_mid_job_lose_nothing_and_answer_every_image_once(tmp_path: Path) -> None:
    # a lease far longer than the test: the claims of the killed process come back by the restart's own recovery
    settings = {"IDG_DATA_DIR": tmp_path / "data", "IDG_TEST_DELAY_S": 0.03, "IDG_JOBS_LEASE_S": 600, "IDG_SHUTDOWN_GRACE_S": 2}
    with serve_process(tmp_path / "first.log", **settings) as served:
        r = httpx.post(f"{served.url}/jobs", files=[(k, v[:2]) for k, v in images(N)], data=FAST, timeout=30)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        _wait_answered(served, job_id, 5)
        assert _kill_holding_claims(served, tmp_path / "data" / FILE_NAME) > 0
    with serve_process(tmp_path / "second.log", **settings) as served:
        assert "took back" in served.log()  # the images the killed process held, at once
        before = _status(served, job_id)
        assert 5 <= before["done"] < N and before["state"] == "running", before
        _wait_answered(served, job_id, before["done"] + 5)
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(timeout=30)
        assert "job runner stopped" in served.log()  # drained: its images in the worker were given back
    with serve_process(tmp_path / "third.log", **settings) as served:
        middle = _status(served, job_id)
        assert before["done"] + 5 <= middle["done"] < N, middle
        final = _wait_answered(served, job_id, N)
        assert (final["state"], final["done"], final["failed"]) == ("done", N, 0)
        lines = httpx.get(f"{served.url}/jobs/{job_id}/results", params={"summary": "true"}, timeout=30).text.splitlines()
    answers = [json.loads(line) for line in lines]
    assert [a["seq"] for a in answers] == list(range(1, N + 1))
    assert sorted(a["index"] for a in answers) == list(range(N))  # each image once, none lost
    assert all(a["status"] == 200 and a["filename"] == f"img{a['index']:04d}.png" for a in answers)
