"""No request holds the worker past its deadline: the deadline is enforced between model calls and
at the checkpoints of long host work, slots are freed at once, degenerate parameters are refused
before any work, and a watchdog reports a worker stuck past deadline + grace."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch
from fastapi import FastAPI
from httpx import AsyncClient, Response

from app.monitoring.prometheus import Metrics
from app.worker.engine import Worker
from app.worker.jobs import Job, JobCancelled
from idg_core.explain import explain_plan
from idg_core.types import AttributionResult, Plan
from tests.models import TinyNet
from tests.service.conftest import AppFactory, image_bytes, serve, tiny_classifier


def _net(app: FastAPI) -> TinyNet:
    return app.state.service.models["tiny"].net


async def _attribute(client: AsyncClient, **fields: str) -> Response:
    # preset=fast: IDG without noisy copies or Grad-CAM's pass, so the points and passes counted below are the steps'
    data = {"preset": "fast", "return_overlay": "false", "return_heatmap": "false"} | fields
    return await client.post("/attribute", files={"file": ("a.png", image_bytes(), "image/png")}, data=data)


async def _timed_predict(client: AsyncClient) -> tuple[Response, float]:
    began = time.monotonic()
    r = await client.post("/predict", files={"file": ("a.png", image_bytes(), "image/png")})
    return r, time.monotonic() - began


async def test_a_late_request_leaves_the_device_within_a_call_and_predict_is_served_at_once(tiny_app: AppFactory) -> None:
    # 400 gradient points at 0.1 s per call of 8: 5 s of work against a 1 s deadline
    app = tiny_app(delay_s=0.1, request_timeout_s=1.0, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512)
    async with serve(app) as client:
        r, normal = await _timed_predict(client)
        assert r.status_code == 200
        began = time.monotonic()
        r = await _attribute(client, steps="400", probe_steps="8")
        late = time.monotonic() - began
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline"
        assert late < 1.0 + 1.0
        assert app.state.service.worker.depth == 0  # its slot is free at once
        r, waited = await _timed_predict(client)
        assert r.status_code == 200
        assert waited < normal + 1.0, (waited, normal)  # the worker dropped the late round within one call
        await asyncio.sleep(0.3)
        calls = len(_net(app).calls)
        await asyncio.sleep(0.6)
        assert len(_net(app).calls) == calls  # nothing more is computed for the late request
        assert 'idg_rejections_total{reason="deadline"} 1.0' in (await client.get("/metrics")).text


async def test_an_abandoned_request_frees_its_slot_while_its_round_still_runs(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.1, max_queue=1, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512)
    async with serve(app) as client:
        slow = asyncio.create_task(_attribute(client, steps="400", probe_steps="8"))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if len(_net(app).calls) > 3:  # the main pass is running
                break
        busy = await _attribute(client, steps="4", probe_steps="4")
        assert busy.status_code == 503  # the one slot is taken
        slow.cancel()  # the client goes away
        await asyncio.sleep(0.05)
        assert app.state.service.worker.depth == 0
        began = time.monotonic()
        r = await _attribute(client, steps="4", probe_steps="4")
        assert r.status_code == 200
        assert time.monotonic() - began < 3.0


async def test_degenerate_parameters_are_refused_before_any_work(tiny_app: AppFactory) -> None:
    cases = [
        ({"method": "guided_ig", "fraction": "0", "steps": "1"}, "one feature at a time"),
        ({"method": "guided_ig", "fraction": "0.001"}, "fraction must be a number in [0.01, 1.0]"),
        ({"method": "agi", "epsilon": "0"}, "never moves the image"),
        ({"method": "agi", "max_iter": "512", "adversarial_classes": "50"}, "may cost up to 51201 model passes"),
        # the remedy names the method's own counts (it had said "steps, probe_steps, max_iter or adversarial_classes")
        ({"method": "la", "max_iter": "512", "classes": "512"}, "more than the limit of 2048: lower max_iter or classes"),
        # 2,048 passes of the method, its prediction and two scores' passes: the scores had been left out of the bound
        ({"method": "ig", "steps": "512", "smooth_samples": "4", "faithfulness": "insertion,deletion", "faithfulness_steps": "224"},
         "may cost up to 2461 model passes, more than the limit of 2048: lower steps, probe_steps, smooth_samples or "
         "faithfulness_steps (512 for each of 4 noisy copies, 1 for the prediction and 412 for faithfulness=insertion,deletion "
         "in 224 steps)"),
        # exactly the limit's 2,048 passes, and the prediction's one more
        ({"method": "ig", "steps": "512", "smooth_samples": "4"}, "may cost up to 2049 model passes, more than the limit of 2048"),
    ]
    app = tiny_app(max_passes=2048)
    async with serve(app) as client:
        _net(app).calls.clear()
        for fields, words in cases:
            r = await _attribute(client, **fields)
            assert r.status_code == 422, (fields, r.text)
            assert r.json()["error"]["code"] == "invalid_parameter" and words in r.json()["error"]["message"], r.text
        assert _net(app).calls == []  # refused before any model call
        r = await _attribute(client, method="idg", steps="512", probe_steps="512")  # the most the steps bound allows
        assert r.status_code == 200 and r.json()["cost"]["forward_passes"] == 1 + 1024


async def test_watchdog_fails_a_stuck_request_and_readiness_says_why(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=2.5, warmup=False, request_timeout_s=0.3, watchdog_grace_s=0.5)
    async with serve(app) as client:
        began = time.monotonic()
        r, _ = await _timed_predict(client)  # its one model call hangs for 2.5 s
        assert r.status_code == 504
        _net(app).delay_s = 0.0  # the call already hanging goes on; the next ones are quick
        for _ in range(40):
            ready = await client.get("/health/ready")
            if ready.status_code == 503:
                break
            await asyncio.sleep(0.05)
        assert ready.status_code == 503 and ready.json()["status"] == "stuck", ready.text
        assert "past the deadline" in ready.json()["reason"] and time.monotonic() - began < 2.0
        refused, _ = await _timed_predict(client)
        assert refused.status_code == 503 and "stalled" in refused.json()["error"]["message"]
        for _ in range(20):  # the watchdog looks every 0.25 s
            if 'idg_rejections_total{reason="stuck"} 1.0' in (await client.get("/metrics")).text:
                break
            await asyncio.sleep(0.05)
        assert 'idg_rejections_total{reason="stuck"} 1.0' in (await client.get("/metrics")).text
        assert app.state.service.worker.depth == 0
        while (await client.get("/health/ready")).status_code != 200:  # the hanging call returns
            assert time.monotonic() - began < 10
            await asyncio.sleep(0.05)
        r, _ = await _timed_predict(client)
        assert r.status_code == 200


def _host_plan(sleeps: list[float], slices: int, each_s: float) -> Plan:
    """Long host work in slices with a checkpoint (an empty query list) between them."""
    for _ in range(slices):
        time.sleep(each_s)
        sleeps.append(each_s)
        yield []
    return AttributionResult(attributions=torch.zeros(1, 3, 2, 2))


async def test_long_host_work_stops_at_the_next_checkpoint_after_its_deadline() -> None:
    worker = Worker({"tiny": tiny_classifier()}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8,
                    batch_wait_ms=0, max_queue=4)
    worker.start()
    loop = asyncio.get_running_loop()
    done: list[float] = []
    job = Job("tiny", _host_plan(done, 100, 0.05), "attribute", time.monotonic() + 0.5, loop, loop.create_future())
    worker.submit(job)
    began = time.monotonic()
    with pytest.raises(JobCancelled) as err:  # a job past its deadline must not finish
        await asyncio.wait_for(job.future, 5)
    assert err.value.reason == "deadline"
    assert time.monotonic() - began < 0.5 + 0.5
    await asyncio.sleep(0.2)
    assert 5 <= len(done) < 20 and worker.depth == 0  # it stopped long before its 100 slices
    worker.stop(1)


async def test_stop_drops_in_flight_work_before_the_next_model_call() -> None:
    model = tiny_classifier(delay_s=0.1)
    worker = Worker({"tiny": model}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=512,
                    batch_wait_ms=0, max_queue=4)
    worker.start()
    loop = asyncio.get_running_loop()
    x = torch.rand(3, 32, 32)
    job = Job("tiny", explain_plan(x, torch.zeros_like(x), None, "idg", {"steps": 400, "probe_steps": 8}), "attribute",
              time.monotonic() + 60, loop, loop.create_future())
    worker.submit(job)
    await asyncio.sleep(0.5)  # inside the 5 s main pass
    began = time.monotonic()
    await asyncio.to_thread(worker.stop, 0.0)
    assert time.monotonic() - began < 1.0
    with pytest.raises(JobCancelled) as err:  # a job dropped at shutdown must not finish
        await asyncio.wait_for(job.future, 1)
    assert err.value.reason == "shutting_down"
