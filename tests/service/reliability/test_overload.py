"""Honest overload signals: Retry-After estimates the real wait from the queued work and the
measured throughput, /predict has its own admission so attributions cannot starve it, and a burst
of clients retrying per Retry-After all end with the right answer."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch
from fastapi import FastAPI
from httpx import AsyncClient, Response

from app.monitoring.prometheus import Metrics
from app.worker.engine import QueueFull, Worker
from app.worker.jobs import Job
from tests.service.conftest import AppFactory, image_bytes, serve, tiny_classifier


async def _attribute(client: AsyncClient, img: bytes | None = None, **fields: str) -> Response:
    data = {"steps": "40", "probe_steps": "40", "return_overlay": "false", "return_heatmap": "false"} | fields
    return await client.post("/attribute", files={"file": ("a.png", img or image_bytes(), "image/png")}, data=data)


async def _predict(client: AsyncClient, img: bytes | None = None) -> tuple[Response, float]:
    began = time.monotonic()
    r = await client.post("/predict", files={"file": ("a.png", img or image_bytes(), "image/png")})
    return r, time.monotonic() - began


async def test_retry_after_grows_with_the_queued_work() -> None:
    worker = Worker({"tiny": tiny_classifier()}, torch.device("cpu"), Metrics(), max_batch_images=8, max_round_images=8,
                    batch_wait_ms=0, max_queue=4)  # not started: the jobs stay queued
    loop = asyncio.get_running_loop()

    def job(cost: float) -> Job:
        return Job("tiny", iter(()), "attribute", time.monotonic() + 60, loop, loop.create_future(), cost=cost)  # type: ignore[arg-type]

    jobs, waits = [job(500) for _ in range(4)], []
    for j in jobs:
        worker.submit(j)
        waits.append(worker.wait_estimate())
    assert waits == pytest.approx([waits[0] * k for k in (1, 2, 3, 4)]) and waits[0] > 0  # it grows with the queue
    extra = job(500)
    with pytest.raises(QueueFull) as full:  # a full queue must refuse
        worker.submit(extra)
    assert full.value.retry_after == max(1, math.ceil(waits[-1]))
    worker.cancel(jobs[0], "client_disconnected")  # its slot and its work leave the estimate at once
    assert worker.depth == 3 and worker.wait_estimate() == pytest.approx(waits[2])
    worker.submit(job(500))


async def _burst_retry_after(app: FastAPI, client: AsyncClient, queue: int) -> tuple[int, float]:
    """Fill a queue of ``queue`` with identical jobs plus one more; (Retry-After of the one refused,
    seconds from that refusal until the admitted ones were done)."""
    rs = []

    async def one() -> None:
        rs.append((await _attribute(client), time.monotonic()))

    tasks = [asyncio.create_task(one()) for _ in range(queue + 1)]
    await asyncio.gather(*tasks)
    refused = [(r, t) for r, t in rs if r.status_code == 503]
    done = [t for r, t in rs if r.status_code == 200]
    assert len(refused) == 1 and len(done) == queue, [r.status_code for r, _ in rs]
    return int(refused[0][0].headers["retry-after"]), max(done) - refused[0][1]


async def test_retry_after_tracks_the_real_wait(tiny_app: AppFactory) -> None:
    results = {}
    for queue in (1, 6):
        app = tiny_app(delay_s=0.03, max_queue=queue, batch_wait_ms=0.0, max_batch_images=8, max_round_images=8)
        async with serve(app) as client:
            for _ in range(2):  # measure the throughput first
                assert (await _attribute(client)).status_code == 200
            results[queue] = await _burst_retry_after(app, client, queue)
    (small, _), (large, real) = results[1], results[6]
    assert large > small >= 1  # it grows with the queue
    assert real / 2 <= large <= 2 * real + 1, results  # and is near the real wait


async def test_predict_is_admitted_and_quick_while_attributions_fill_their_queue(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.05, max_queue=3, max_predict_queue=4, batch_wait_ms=0.0, max_batch_images=8, max_round_images=16)
    async with serve(app) as client:
        _, normal = await _predict(client)
        slow = [asyncio.create_task(_attribute(client, steps="400", probe_steps="8")) for _ in range(8)]
        await asyncio.sleep(0.3)
        predicted = await asyncio.gather(*[_predict(client, image_bytes((9 * i, 50, 90))) for i in range(4)])
        assert [r.status_code for r, _ in predicted] == [200] * 4
        assert max(t for _, t in predicted) < normal + 1.5, (normal, [t for _, t in predicted])
        assert not all(t.done() for t in slow)
        refused = [t.result() for t in slow if t.done()]
        assert len(refused) == 5 and all(r.status_code == 503 for r in refused)  # only 3 attributions admitted
        for t in slow:
            t.cancel()
        await asyncio.gather(*slow, return_exceptions=True)


async def test_a_burst_retrying_per_retry_after_all_end_with_the_right_class(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.02, max_queue=3, batch_wait_ms=0.0, max_batch_images=8, max_round_images=32)
    images = [image_bytes((23 * i % 256, 255 - 19 * i % 256, 77 * i % 256)) for i in range(10)]
    async with serve(app) as client:
        expected = [(await _predict(client, img))[0].json()["top_k"][0]["index"] for img in images]
        attempts = [0] * len(images)

        async def client_loop(i: int) -> Response:
            while True:
                attempts[i] += 1
                r = await _attribute(client, images[i], steps="8", probe_steps="8")
                if r.status_code != 503 or attempts[i] > 20:
                    return r
                await asyncio.sleep(float(r.headers["retry-after"]))

        began = time.monotonic()
        rs = await asyncio.gather(*[client_loop(i) for i in range(len(images))])
        assert [r.status_code for r in rs] == [200] * len(images)
        assert [r.json()["target"]["index"] for r in rs] == expected
        assert sum(attempts) > len(images)  # the queue did overflow
        assert max(attempts) <= 8 and time.monotonic() - began < 30, attempts
