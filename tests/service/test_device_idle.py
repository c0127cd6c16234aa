"""What the device waited for when it had nothing to run: ``idg_device_idle_seconds_total{cause}`` splits each idle
gap into ``no_work`` (the worker held no request) and ``host`` (it held one and was still preparing its next call),
so a device that is not busy says whether more requests (clients, server processes) or a faster worker would fill it."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
import torch
from prometheus_client import generate_latest

from app.monitoring.prometheus import Metrics
from app.worker.device import split_gap
from app.worker.engine import Worker
from app.worker.jobs import Job
from idg_core.types import AttributionResult, Plan, Query
from idg_serving.simulated import SimulatedAccelerator
from tests.models import tiny_classifier


def test_a_gap_is_host_time_from_when_the_worker_held_work_and_no_work_before() -> None:
    assert split_gap(10.0, 12.0, None) == (2.0, 0.0)  # no request held: the whole gap waited for work
    assert split_gap(10.0, 12.0, 11.5) == (1.5, 0.5)  # a request arrived 0.5 s before the launch: that part waited for the host
    assert split_gap(10.0, 12.0, 9.0) == (0.0, 2.0)  # held work all along: the host was the holdup
    assert split_gap(10.0, 9.5, 9.0) == (0.0, 0.0)  # a launch before the recorded end books nothing


def _two_calls(host_s: float, device: torch.device) -> Plan:
    """A plan with ``host_s`` of host work between its two model calls (on the worker thread, as a plan's host steps run)."""
    yield [Query.at(torch.rand(1, 3, 32, 32, device=device), 0, grad=False, output="logit")]
    time.sleep(host_s)
    yield [Query.at(torch.rand(1, 3, 32, 32, device=device), 0, grad=False, output="logit")]
    return AttributionResult(attributions=torch.zeros(1, 3, 2, 2))


def _idle(metrics: Metrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {cause: float(v) for cause, v in re.findall(r'^idg_device_idle_seconds_total{cause="(\w+)"} ([0-9.e+-]+)$', text, re.M)}


_CUDA = pytest.param("cuda-events", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])


@pytest.mark.parametrize("where", ["calls-on-the-stage-thread", "simulated-stream", _CUDA])
async def test_idle_time_is_split_by_whether_the_worker_held_a_request(where: str) -> None:
    """The gap measured three ways: the stage thread's clock between calls (a CPU), the simulated device's timeline,
    and the CUDA events of the calls on either side of it (a GPU)."""
    device = torch.device("cuda" if where == "cuda-events" else "cpu")
    model = tiny_classifier().to(device)
    if where != "cuda-events":
        model.net = SimulatedAccelerator(model.net, 20, stream=where == "simulated-stream")
    model.net(torch.rand(1, 3, 32, 32, device=device))  # a call on the device before the worker's first: its gap is not traffic's
    time.sleep(0.3)
    metrics = Metrics()
    worker = Worker({"tiny": model}, device, metrics, max_batch_images=8, max_round_images=8, batch_wait_ms=0, max_queue=8)
    worker.start()
    loop = asyncio.get_running_loop()

    async def run(host_s: float) -> None:
        job = Job("tiny", _two_calls(host_s, device), "attribute", time.monotonic() + 30, loop, loop.create_future())
        worker.submit(job)
        await asyncio.wait_for(job.future, 10)

    try:
        await run(0.4)  # the device idles 0.4 s between the job's calls, while the worker does the job's host work
        first = _idle(metrics)
        await asyncio.sleep(0.5)  # then nothing is held for 0.5 s
        await run(0.0)
        second = _idle(metrics)
        worker._device.skip_next_gap()  # as after a failed call's requests were evaluated again outside the stage
        await asyncio.sleep(0.3)
        await run(0.0)
        third = _idle(metrics)
    finally:
        worker.stop(1)
    assert first["host"] >= 0.35 and first["no_work"] < 0.05, first  # the gap before the worker's first call is not counted
    assert second["no_work"] - first["no_work"] >= 0.45, second  # waiting for the next request
    assert second["host"] - first["host"] < 0.1, second  # the second job's own host work is a gathering of points
    assert third["no_work"] - second["no_work"] < 0.1, third  # the skipped gap is not booked; the job's second call's is tiny


async def test_the_models_of_a_simulated_device_share_its_timeline() -> None:
    """Two models on one simulated device are one device: their calls are booked on one timeline, so one model's call
    fills a gap in the other's (each with a timeline of its own, their idle time had counted the other's calls)."""
    from app.core.config import Settings
    from app.main import create_app
    from tests.service.conftest import image_bytes, serve

    models = {"a": tiny_classifier(), "b": tiny_classifier()}
    app = create_app(Settings(models=["a", "b"], warmup=True, simulated_call_ms=5.0, batch_wait_ms=0.0), models=models)
    async with serve(app) as client:
        nets = [app.state.service.models[name].net for name in ("a", "b")]
        assert all(isinstance(n, SimulatedAccelerator) and n.stream for n in nets)
        assert nets[0].timeline is nets[1].timeline
        for name in ("a", "b"):
            r = await client.post("/predict", files={"file": ("x.png", image_bytes((10, 20, 30)), "image/png")}, data={"model": name})
            assert r.status_code == 200, r.text
    assert nets[0].calls and nets[1].calls
