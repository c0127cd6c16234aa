"""The worker alone: cancellation of a job whose client went away, and graceful shutdown."""

from __future__ import annotations

import asyncio
import time

import torch

from app.core.metrics import Metrics
from idg_core.explain import explain_plan as attribute_plan
from app.worker.engine import Worker
from app.worker.jobs import Job, JobCancelled
from tests.service.conftest import tiny_classifier


def _worker(delay_s: float) -> tuple[Worker, object]:
    model = tiny_classifier(delay_s)
    w = Worker({"tiny": model}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8, batch_wait_ms=0, max_queue=8)
    w.start()
    return w, model.net


def _job(loop: asyncio.AbstractEventLoop, steps: int = 20) -> Job:
    x = torch.rand(3, 32, 32)
    plan = attribute_plan(x, torch.zeros_like(x), None, "idg", {"steps": steps, "probe_steps": steps})
    return Job("tiny", plan, "attribute", time.monotonic() + 60, loop, loop.create_future())


async def test_cancelled_job_is_dropped_and_stops_costing() -> None:
    worker, net = _worker(0.05)
    loop = asyncio.get_running_loop()
    job = _job(loop, steps=40)
    worker.submit(job)
    await asyncio.sleep(0.15)
    job.cancel("client_disconnected")
    try:
        await asyncio.wait_for(job.future, 5)
        raise AssertionError("a cancelled job must not succeed")
    except JobCancelled as err:
        assert err.reason == "client_disconnected"
    calls = len(net.calls)
    assert calls < 1 + 40 // 8 * 2  # it stopped long before its last call
    await asyncio.sleep(0.2)
    assert len(net.calls) == calls and worker.depth == 0
    worker.stop(1)


async def test_shutdown_finishes_in_flight_work_then_refuses() -> None:
    worker, _ = _worker(0.02)
    loop = asyncio.get_running_loop()
    jobs = [_job(loop) for _ in range(3)]
    for job in jobs:
        worker.submit(job)
    await asyncio.to_thread(worker.stop, 10)
    results = await asyncio.gather(*[j.future for j in jobs])
    assert all(r[2].attributions.shape == (1, 3, 32, 32) for r in results)
    try:
        worker.submit(_job(loop))
        raise AssertionError("a stopped worker must refuse work")
    except Exception as err:  # noqa: BLE001
        assert "busy" in str(err)
