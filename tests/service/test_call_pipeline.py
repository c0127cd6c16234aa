"""Fixed call sizes warmed before ready, and a device that never waits for the host: the worker
prepares call k+1 while call k is on the (simulated) device, proved by event order."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest
import torch
from fastapi import FastAPI

from app.monitoring.prometheus import Metrics
from app.worker.engine import Worker
from app.worker.jobs import Job
from idg_core import CallStats, evaluate_queries
from idg_core.call_shapes import CallShapes, power_of_two_sizes
from idg_core.explain import explain_plan
from idg_core.methods import METHODS
from idg_core.model_calls import prepare_call
from idg_core.types import Query
from idg_serving.simulated import SimulatedAccelerator
from idg_serving.warm_up import warm_call_shapes
from tests.models import tiny_classifier
from tests.service.conftest import AppFactory, image_bytes, serve


def test_power_of_two_sizes_and_the_size_a_call_runs_at() -> None:
    assert power_of_two_sizes(128, 8) == (8, 16, 32, 64, 128)
    assert power_of_two_sizes(8) == (1, 2, 4, 8)
    assert power_of_two_sizes(96, 8) == (8, 16, 32, 64, 96)
    shapes = CallShapes((8, 16, 32))
    assert [shapes.size_for(n) for n in (1, 8, 9, 17, 32)] == [8, 8, 16, 32, 32]
    with pytest.raises(ValueError, match="larger than the largest"):
        shapes.size_for(33)
    assert CallShapes().size_for(13) == 13  # not fixed: any size


def test_a_call_takes_what_pads_little_and_leaves_the_rest_for_the_next() -> None:
    shapes = CallShapes((8, 16, 32, 64, 128))
    assert shapes.fill(60) == 60  # 64: 4 rows of padding (6%)
    assert shapes.fill(70) == 64  # 128 would be 45% padding: take 64, 6 go in the next call
    assert shapes.fill(500) == 128
    assert shapes.fill(3) == 3  # below the smallest size: padded up, there is nothing else to run
    assert CallShapes().fill(70) == 70


def test_padding_changes_no_answer_and_every_call_runs_at_a_listed_size() -> None:
    model = tiny_classifier()
    x = torch.rand(2, 3, 32, 32)
    queries = [Query.path(x[i], -x[i], torch.linspace(0, 1, 11), 3 + i, grad=bool(i), output="logit") for i in range(2)]
    plain = evaluate_queries(model, queries, batch_size=8)
    shapes = CallShapes((4, 8))
    stats = CallStats()
    padded = evaluate_queries(model, queries, batch_size=8, stats=stats, shapes=shapes)
    assert stats.call_sizes == [8, 4, 8, 4]  # 11 rows of each kind: 8, then 3 padded to 4
    for a, b in zip(plain, padded, strict=True):
        assert torch.allclose(a.values, b.values, atol=1e-6)
        assert torch.equal(a.top1, b.top1)
        assert (a.grads is None) == (b.grads is None)
        if a.grads is not None and b.grads is not None:
            assert torch.allclose(a.grads, b.grads, atol=1e-6)


def test_calls_after_warm_up_are_counted_when_their_size_was_not_warmed() -> None:
    model = tiny_classifier()
    shapes = CallShapes((4, 8))
    warm_call_shapes(model, shapes, 32, torch.device("cpu"))
    assert shapes.warmed == {(4, False), (4, True), (8, False), (8, True)} and shapes.warm_seconds is not None
    x = torch.rand(3, 32, 32)
    evaluate_queries(model, [Query.path(x, -x, torch.linspace(0, 1, 5), 1, grad=True, output="logit")], 8, shapes=shapes)
    assert shapes.unwarmed_calls == 0 and (shapes.real_rows, shapes.padded_rows) == (5, 3)
    loose = CallShapes()
    warm_call_shapes(model, loose, 32, torch.device("cpu"), sizes=[8])
    evaluate_queries(model, [Query.path(x, -x, torch.linspace(0, 1, 5), 1, grad=True, output="logit")], 8, shapes=loose)
    assert loose.unwarmed_calls == 1  # a call of 5 the warm-up never ran


def _sim_worker(call_ms: float, depth: int, events: list[tuple[str, int]], stream: bool = False,
                ahead: int = 2) -> tuple[Worker, SimulatedAccelerator]:
    model = tiny_classifier()
    sim = SimulatedAccelerator(model.net, call_ms, stream=stream)
    model.net = sim
    worker = Worker({"tiny": model}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8, batch_wait_ms=0,
                    max_queue=64, pipeline_depth=depth, on_device_event=lambda what, n: events.append((what, n)), launch_ahead=ahead)
    worker.start()
    return worker, sim


async def _run_jobs(worker: Worker, n: int) -> list[object]:
    loop = asyncio.get_running_loop()
    jobs = []
    for i in range(n):
        x = torch.rand(3, 32, 32)
        plan = explain_plan(x, torch.zeros_like(x), i, "idg", {"steps": 12, "probe_steps": 6})
        jobs.append(Job("tiny", plan, "attribute", time.monotonic() + 60, loop, loop.create_future()))
    for job in jobs:
        worker.submit(job)
    return list(await asyncio.wait_for(asyncio.gather(*[j.future for j in jobs]), 60))


def _overlapped(events: list[tuple[str, int]], what: str = "submitted") -> tuple[int, int]:
    """(calls whose successor was handed over, or with ``what="started"`` launched, before they ended; calls with a successor)."""
    at = {e: i for i, e in enumerate(events)}
    last = max(n for kind, n in events if kind == "ended")
    overlapped = sum(at[(what, k + 1)] < at[("ended", k)] for k in range(1, last) if (what, k + 1) in at)
    return overlapped, last - 1


async def test_call_k_plus_1_is_prepared_while_call_k_is_on_the_device() -> None:
    events: list[tuple[str, int]] = []
    worker, sim = _sim_worker(call_ms=20, depth=2, events=events)
    try:
        results = await _run_jobs(worker, 6)
    finally:
        worker.stop(1)
    assert all(r.result.attributions.shape == (1, 3, 32, 32) for r in results)  # type: ignore[attr-defined]
    overlapped, pairs = _overlapped(events)
    assert pairs >= 10
    assert overlapped >= pairs * 0.7, (overlapped, pairs)  # under load, nearly every next call waits behind the running one
    for k in range(1, pairs + 2):  # and the device runs them one at a time, in order
        assert events.index(("started", k)) < events.index(("ended", k))
        if ("started", k + 1) in events:
            assert events.index(("ended", k)) < events.index(("started", k + 1))


async def test_without_a_pipeline_the_next_call_is_prepared_only_after_the_last_one_ended() -> None:
    """The control: with depth 1 the same event order never shows overlap (so the test above can fail)."""
    events: list[tuple[str, int]] = []
    worker, _ = _sim_worker(call_ms=20, depth=1, events=events)
    try:
        await _run_jobs(worker, 6)
    finally:
        worker.stop(1)
    overlapped, pairs = _overlapped(events)
    assert pairs >= 10 and overlapped == 0


async def test_on_a_stream_call_k_plus_1_is_launched_behind_call_k_with_the_same_answers() -> None:
    """On an asynchronous device (CUDA; here the simulated stream) the next call is queued on the device
    while the one before it runs, so the device does not wait for the host's Python between them."""
    answers = {}
    for stream, ahead in ((False, 2), (True, 2), (True, 1)):
        events: list[tuple[str, int]] = []
        worker, sim = _sim_worker(call_ms=20, depth=2, events=events, stream=stream, ahead=ahead)
        torch.manual_seed(0)
        try:
            results = await _run_jobs(worker, 6)
        finally:
            worker.stop(1)
        answers[stream, ahead] = torch.stack([r.result.attributions for r in results])  # type: ignore[attr-defined]
        early, pairs = _overlapped(events, "started")
        assert pairs >= 10
        if stream and ahead == 2:
            assert early >= pairs * 0.5, (early, pairs)  # under load most calls are launched behind a running one
            assert sim.busy_s == pytest.approx(0.020 * sim.calls)  # each call's time booked once on the device's timeline
        else:
            assert early == 0  # the control: a call starts only once the one before it ended (so the line above can fail)
    assert torch.equal(answers[True, 2], answers[False, 2]) and torch.equal(answers[True, 1], answers[False, 2])


def _metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def _methods_fields() -> list[dict[str, str]]:
    """Every registered method at its defaults with each step count small (from the registry: a new method is exercised too)."""
    fields = []
    for name, method in METHODS.items():
        steps = {p: "3" for p in method.params.steps if p in method.presets.get("fast", {}) or p == "steps"}
        fields.append({"method": name, "return_overlay": "false"} | steps)
    return fields


async def _mixed_traffic(app: FastAPI) -> tuple[list[int], list[int], str, dict[str, object]]:
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()  # the warm-up's calls
        fields = _methods_fields()
        posts = [client.post("/attribute", files={"file": ("a.png", image_bytes((20 * i, 90, 200 - 9 * i)), "image/png")},
                             data=fields[i % len(fields)]) for i in range(15)]
        posts += [client.post("/predict", files={"file": ("b.png", image_bytes((i, 2 * i, 3 * i)), "image/png")}) for i in range(5)]
        codes = [r.status_code for r in await asyncio.gather(*posts)]
        metrics = (await client.get("/metrics")).text
        info = (await client.get("/models")).json()["models"][0]
        return codes, list(net.calls), metrics, info


async def test_with_fixed_sizes_every_call_after_ready_runs_at_a_warmed_size(tiny_app: AppFactory) -> None:
    app = tiny_app(fixed_call_sizes=True, max_batch_images=16, batch_wait_ms=5.0, device="cpu")
    codes, calls, metrics, info = await _mixed_traffic(app)
    assert set(codes) == {200}
    assert info["call_sizes"] == [1, 2, 4, 8, 16] and info["warm_seconds"] is not None and info["unwarmed_calls"] == 0
    assert calls and set(calls) <= {1, 2, 4, 8, 16}, sorted(set(calls))
    assert _metric(metrics, "idg_unwarmed_calls") == 0
    assert _metric(metrics, 'idg_call_rows_total{kind="real",model="tiny"}') > 0


async def test_without_fixed_sizes_calls_meet_sizes_the_warm_up_did_not_run(tiny_app: AppFactory) -> None:
    """The control: the same traffic at any size is counted (so the counter above can fail)."""
    app = tiny_app(fixed_call_sizes=False, max_batch_images=16, batch_wait_ms=5.0, device="cpu")
    codes, calls, metrics, info = await _mixed_traffic(app)
    assert set(codes) == {200} and info["call_sizes"] == []
    assert not set(calls) <= {1, 2, 4, 8, 16} or len(set(calls)) > 1
    assert _metric(metrics, "idg_unwarmed_calls") > 0 and info["unwarmed_calls"] > 0


async def test_padded_calls_answer_as_unpadded_ones(tiny_app: AppFactory) -> None:
    fields = {"method": "idg", "steps": "7", "probe_steps": "5", "return_attribution": "true", "return_overlay": "false"}
    answers = []
    for fixed in (False, True):
        async with serve(tiny_app(fixed_call_sizes=fixed, max_batch_images=16)) as client:
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes(), "image/png")}, data=fields)
            assert r.status_code == 200
            answers.append(r.json())
    assert answers[0]["curve"]["alphas"] == answers[1]["curve"]["alphas"]
    assert np.allclose(answers[0]["curve"]["logits"], answers[1]["curve"]["logits"], atol=1e-5)


def test_a_calls_batch_holds_each_querys_points_bit_for_bit_and_pads_with_its_last() -> None:
    """The points are written straight into the call's batch: bit for bit the path's formula, base + alpha * (x - base)
    as the reference computes it (and an explicit query's own points), in the chunk's order, and padding rows that copy
    the last real one."""
    torch.manual_seed(0)
    x, base = torch.randn(3, 3, 8, 8), torch.randn(3, 8, 8)
    alphas = [torch.rand(5) for _ in range(2)]
    queries = [Query.path(base, x[i] - base, alphas[i], target=i, grad=True, output="logit") for i in range(2)]
    queries.append(Query.at(x, target=2, grad=True, output="logit"))
    chunk = [(1, 1, 4), (0, 0, 5), (2, 0, 3)]  # 11 rows, padded to 16
    prepared = prepare_call(queries, chunk, grad=True, shapes=CallShapes(power_of_two_sizes(16)))
    path = [base.unsqueeze(0) + alphas[i].view(-1, 1, 1, 1) * (x[i] - base).unsqueeze(0) for i in range(2)]
    expected = torch.cat([path[1][1:4], path[0][0:5], x[0:3]])
    assert all(torch.equal(queries[i].points(0, 5), path[i]) for i in range(2))  # the query's own points: the same
    assert prepared.size == 16 and prepared.n == 11
    assert torch.equal(prepared.inputs[:11], expected)
    assert torch.equal(prepared.inputs[11:], expected[-1:].expand(5, 3, 8, 8))
    assert torch.equal(prepare_call(queries, chunk, grad=True).inputs, expected)  # sizes not fixed: no padding
