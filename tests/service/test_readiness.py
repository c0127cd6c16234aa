"""Readiness has one meaning (issue #60): the process can answer interactive work (/predict, /attribute, /v2).
``/health/ready``, ``idg_ready`` and ``idg_ready_processes`` say the same in every case: starting (503 ``starting``,
0), ready (200, 1), draining (503 ``draining``, 0), and with the job store down, which is no part of readiness (200
with ``job_store: unreachable``, 1), while the /jobs routes answer 503 ``store_unavailable`` and
``idg_durable_job_store_up`` is 0 (its own alert). The store is stopped for real: a PostgreSQL server stopped as an
outage stops it, and SQLite's write lock held by another process past the store's timeout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from httpx import ASGITransport, AsyncClient

from app.doors.drain import start_draining
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, images
from tests.service.jobs.postgres_server import postgres_cluster
from tests.service.jobs.test_store_outage import write_locked

PROBES = 7


async def metric(client: AsyncClient, name: str) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


async def readiness(client: AsyncClient) -> tuple[int, dict[str, Any], float, float]:
    """What the probe answers and what the gauges say, read together: they must agree."""
    r = await client.get("/health/ready")
    ready, processes = await metric(client, "idg_ready"), await metric(client, "idg_ready_processes")
    assert (r.status_code == 200) == (ready == 1) == (processes == 1), (r.status_code, r.text, ready, processes)
    return r.status_code, r.json(), ready, processes


async def until(check: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s} s"
        await asyncio.sleep(0.05)


async def interactive_work_answers(client: AsyncClient) -> None:
    r = await client.post("/predict", files={"file": ("a.png", image_bytes())})
    assert r.status_code == 200, r.text


async def store_down_is_no_unreadiness(client: AsyncClient) -> None:
    """With the store unreachable: every probe 200 saying so, the gauges 1, predictions answered, the jobs routes 503."""
    for _ in range(PROBES):
        status, body, _, _ = await readiness(client)
        assert status == 200 and body["job_store"] == "unreachable" and "unreachable since" in body["job_store_reason"], body
        assert await metric(client, "idg_durable_job_store_up") == 0
        r = await client.post("/jobs", files=images(1), data=FAST)
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
        await interactive_work_answers(client)


async def test_starting_ready_and_draining_say_the_same_in_the_probe_and_the_gauges(tiny_app: AppFactory) -> None:
    app = tiny_app(warmup=False)
    # before its lifespan has run (the server answers /metrics and the probes while the models load)
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://test") as early:
        status, body, ready, _ = await readiness(early)
        assert status == 503 and body == {"status": "starting"} and ready == 0
    async with serve(app) as client:
        status, body, ready, _ = await readiness(client)
        assert status == 200 and body["status"] == "ready" and body["job_store"] == "up" and ready == 1
        start_draining(app)  # what SIGTERM does first
        status, body, ready, _ = await readiness(client)
        assert status == 503 and body == {"status": "draining"} and ready == 0


@pytest.mark.slow
async def test_a_stopped_postgresql_store_takes_the_jobs_routes_out_not_the_instance(tiny_app: AppFactory) -> None:
    with postgres_cluster() as server:
        app = tiny_app(warmup=False, jobs_db_url=server.url, jobs_store_timeout_s=1.0)
        async with serve(app) as client:
            status, body, _, _ = await readiness(client)
            assert status == 200 and body["job_store"] == "up"
            await asyncio.to_thread(server.stop)  # as an outage stops it: every session ended
            await until(lambda: _store_up_is(client, 0), "the store counted as unreachable")
            await store_down_is_no_unreadiness(client)
            await asyncio.to_thread(server.start)
            await until(lambda: _store_up_is(client, 1), "the store back")
            status, body, _, _ = await readiness(client)
            assert status == 200 and body["job_store"] == "up" and "job_store_reason" not in body


async def test_a_locked_sqlite_store_takes_the_jobs_routes_out_not_the_instance(tiny_app: AppFactory, tmp_path: Path) -> None:
    data = tmp_path / "data"
    app = tiny_app(warmup=False, data_dir=data, jobs_store_timeout_s=0.25)
    async with serve(app) as client:
        with write_locked(data / "jobs.sqlite3", 6.0):  # another process holds the write lock, 24 times the timeout
            r = await client.post("/jobs", files=images(1), data=FAST)  # meets the lock: the store is unreachable
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
            # the submission may have waited behind the runner's claim, itself waiting for the lock, and been refused as
            # busy a moment before the claim's failure marks the store unreachable: both are met within the timeout
            await until(lambda: _store_up_is(client, 0), "the store seen unreachable", timeout_s=5.0)
            await store_down_is_no_unreadiness(client)
        await until(lambda: _store_up_is(client, 1), "the store back")  # the runner's next claim finds it again
        status, body, _, _ = await readiness(client)
        assert status == 200 and body["job_store"] == "up"


async def _store_up_is(client: AsyncClient, value: float) -> bool:
    return await metric(client, "idg_durable_job_store_up") == value
