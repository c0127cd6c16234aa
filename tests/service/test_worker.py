"""The worker alone: cancellation of a job whose client went away, graceful shutdown, and a newer
job's forward pass not starved by an older job's run of gradient steps."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest
import torch

from app.monitoring.prometheus import Metrics
from app.worker.engine import QueueFull, Worker
from app.worker.jobs import Job, JobCancelled
from idg_core.explain import explain_plan
from idg_core.types import Query
from tests.service.conftest import tiny_classifier


def _worker(delay_s: float) -> tuple[Worker, object]:
    model = tiny_classifier(delay_s)
    w = Worker({"tiny": model}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8, batch_wait_ms=0, max_queue=8)
    w.start()
    return w, model.net


def _job(loop: asyncio.AbstractEventLoop, steps: int = 20) -> Job:
    x = torch.rand(3, 32, 32)
    plan = explain_plan(x, torch.zeros_like(x), None, "idg", {"steps": steps, "probe_steps": steps})
    return Job("tiny", plan, "attribute", time.monotonic() + 60, loop, loop.create_future())


async def test_cancelled_job_is_dropped_and_stops_costing() -> None:
    worker, net = _worker(0.05)
    loop = asyncio.get_running_loop()
    job = _job(loop, steps=40)
    worker.submit(job)
    await asyncio.sleep(0.15)
    job.cancel("client_disconnected")
    with pytest.raises(JobCancelled) as err:
        await asyncio.wait_for(job.future, 5)
    assert err.value.reason == "client_disconnected"
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
    assert all(r.result.attributions.shape == (1, 3, 32, 32) and r.result.backward_passes == 20 for r in results)
    with pytest.raises(QueueFull, match="busy"):
        worker.submit(_job(loop))


def _forward_then_gradients(steps: int) -> Generator[list[Query], Any, int]:
    """Guided IG's pattern: a forward-only pass (the prediction), then one gradient per step."""
    x = torch.rand(1, 3, 32, 32)
    yield [Query.at(x, 0, grad=False, output="logit", label="prediction")]
    for step in range(steps):
        yield [Query.at(x, 0, grad=True, output="logit", label=f"step {step + 1}")]
    return steps


async def test_a_newer_jobs_forward_pass_takes_its_turn_between_an_older_jobs_gradient_steps() -> None:
    """A job arriving while another is on its run of gradient steps needs a forward-only round
    first, and gets the next round; then it shares the older job's gradient calls, not waiting
    for the older job's last step."""
    worker, net = _worker(0.02)
    loop = asyncio.get_running_loop()

    def job(steps: int) -> Job:
        return Job("tiny", _forward_then_gradients(steps), "attribute", time.monotonic() + 60, loop, loop.create_future())

    older = job(1000)  # about 20 s of rounds
    worker.submit(older)
    deadline = time.monotonic() + 10
    while len(net.calls) < 3:  # its forward pass, then gradient steps
        assert time.monotonic() < deadline, "the older job never started"
        await asyncio.sleep(0.01)
    newer = job(5)
    worker.submit(newer)
    try:
        assert await asyncio.wait_for(asyncio.shield(newer.future), 5) == 5
        assert not older.future.done()
        assert newer.rounds == 1 + 5  # its forward pass, then its 5 steps
    finally:
        worker.cancel(older, "client_disconnected")
        await asyncio.to_thread(worker.stop, 1)


def test_warm_up_runs_on_the_worker_thread_before_start_returns() -> None:
    """The requests' thread is the one warmed (its malloc arena grows there, not on the first request)."""
    model = tiny_classifier(0.0)
    w = Worker({"tiny": model}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8, batch_wait_ms=0, max_queue=8)
    seen: list[str] = []

    def warm() -> None:
        time.sleep(0.2)
        seen.append(threading.current_thread().name)
        model(torch.rand(2, 3, 32, 32))

    w.start(warm)
    assert seen == ["idg-worker"]  # done by the time start returned
    assert len(model.net.calls) == 1
    w.stop(1)


def test_a_failed_warm_up_is_raised_and_the_worker_takes_nothing() -> None:
    w = Worker({"tiny": tiny_classifier(0.0)}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8,
               batch_wait_ms=0, max_queue=8)

    def warm() -> None:
        raise RuntimeError("no compiler")

    with pytest.raises(RuntimeError, match="no compiler"):
        w.start(warm)
    assert not w._thread.is_alive()
