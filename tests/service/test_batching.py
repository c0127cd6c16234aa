"""The worker: batching across requests, queue limits, deadlines, isolation of failures."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
from fastapi import FastAPI

from tests.service.conftest import AppFactory, image_bytes, serve


def _net(app: FastAPI):
    return app.state.service.models["tiny"].net


async def _attribute(client, img: bytes, **fields: str):
    probe = {"probe_steps": "10"} if fields.get("method", "idg") == "idg" else {}  # only IDG probes
    # preset=fast: IDG without noisy copies or Grad-CAM's pass, so the counted calls below are the method's own
    data = {"preset": "fast", "steps": "10", "return_attribution": "true", "return_overlay": "false"} | probe | fields
    return await client.post("/attribute", files={"file": ("a.png", img, "image/png")}, data=data)


def _attr(r) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(r.json()["attribution"]["data"]))).astype(np.float32)


async def test_concurrent_requests_share_model_calls_and_match_alone(tiny_app: AppFactory) -> None:
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=128, max_round_images=256)
    images = [image_bytes((30 * i, 200 - 20 * i, 90)) for i in range(6)]
    targets = [str(t) for t in (1, 7, 42, 100, 500, 999)]
    async with serve(app) as client:
        net = _net(app)
        alone = []
        for img, t in zip(images, targets, strict=True):
            net.calls.clear()
            alone.append(await _attribute(client, img, target=t))
            assert len(net.calls) == 3  # predict, probe, main pass
        net.calls.clear()
        together = await asyncio.gather(*[_attribute(client, img, target=t) for img, t in zip(images, targets, strict=True)])
        assert all(r.status_code == 200 for r in together)
        assert len(net.calls) < 6 * 3, net.calls  # fewer calls than one set per request
        assert max(net.calls) > 10  # points of several requests in one call
        for a, b in zip(alone, together, strict=True):
            assert np.allclose(_attr(a), _attr(b), atol=1e-3, rtol=1e-2)
            curve_a, curve_b = a.json()["curve"], b.json()["curve"]
            assert curve_a == curve_b or np.allclose(curve_a["logits"], curve_b["logits"], atol=1e-4)


async def test_mixed_methods_share_a_round(tiny_app: AppFactory) -> None:
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=256, max_round_images=512)
    async with serve(app) as client:
        _net(app).calls.clear()
        rs = await asyncio.gather(
            _attribute(client, image_bytes(), method="idg"),
            _attribute(client, image_bytes((1, 2, 3)), method="ig"),
            _attribute(client, image_bytes((9, 9, 9)), method="left_ig"),
        )
        assert [r.status_code for r in rs] == [200, 200, 200]
        assert len(_net(app).calls) < 3 + 2 + 2


async def test_queue_full_answers_503_with_retry_after(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.2, max_queue=2, batch_wait_ms=0.0)
    async with serve(app) as client:
        rs = await asyncio.gather(*[_attribute(client, image_bytes()) for _ in range(6)])
        codes = sorted(r.status_code for r in rs)
        assert codes.count(200) >= 2 and 503 in codes
        busy = next(r for r in rs if r.status_code == 503)
        assert int(busy.headers["retry-after"]) >= 1 and "busy" in busy.json()["error"]["message"]
        text = (await client.get("/metrics")).text
        assert 'idg_rejections_total{reason="queue_full"}' in text


async def test_deadline_answers_504_and_drops_the_work(tiny_app: AppFactory) -> None:
    # the delay is per call, so fix the calls per round: a dropped request stops at the next round
    app = tiny_app(delay_s=0.3, request_timeout_s=0.5, batch_wait_ms=0.0, max_batch_images=32, max_round_images=64)
    async with serve(app) as client:
        r = await _attribute(client, image_bytes(), steps="40", probe_steps="40")
        assert r.status_code == 504 and "deadline" in r.json()["error"]["message"]
        await asyncio.sleep(0.8)
        calls = len(_net(app).calls)
        await asyncio.sleep(0.8)
        assert len(_net(app).calls) == calls  # nothing more computed for the dropped request
        assert app.state.service.worker.depth == 0


async def test_poisoned_request_fails_alone(tiny_app: AppFactory) -> None:
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=256, max_round_images=512)
    async with serve(app) as client:
        poison = image_bytes((255, 0, 255))
        poison = _solid(255, 0, 255)
        rs = await asyncio.gather(
            _attribute(client, image_bytes()), _attribute(client, poison), _attribute(client, image_bytes((5, 200, 5))),
        )
        assert rs[0].status_code == 200 and rs[2].status_code == 200
        assert rs[1].status_code == 500 and "poisoned" in rs[1].json()["error"]["message"]
        again = await _attribute(client, image_bytes())  # the worker is alive
        assert again.status_code == 200


def _solid(r: int, g: int, b: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 40), (r, g, b)).save(buf, format="PNG")
    return buf.getvalue()


async def test_predict_does_not_wait_behind_attribute_work(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.05, batch_wait_ms=0.0, max_batch_images=8, max_round_images=8)
    async with serve(app) as client:
        slow = [asyncio.create_task(_attribute(client, image_bytes(), steps="60", probe_steps="60")) for _ in range(4)]
        await asyncio.sleep(0.3)
        started = asyncio.get_running_loop().time()
        r = await client.post("/predict", files={"file": ("a.png", image_bytes(), "image/png")})
        waited = asyncio.get_running_loop().time() - started
        assert r.status_code == 200
        assert not all(t.done() for t in slow), "predict should overtake queued attribute work"
        assert waited < 2.0
        await asyncio.gather(*slow)


async def test_not_ready_before_models_load(tiny_app: AppFactory) -> None:
    from httpx import ASGITransport, AsyncClient

    app = tiny_app()
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://t") as client:  # no lifespan yet
        r = await client.get("/health/ready")
        assert r.status_code == 503 and r.json()["status"] == "starting"
        assert (await client.get("/health/live")).status_code == 200
        r = await client.post("/predict", files={"file": ("a.png", image_bytes(), "image/png")})
        assert r.status_code == 503 and "not loaded" in r.json()["error"]["message"]


async def test_metrics_report_the_seconds_the_device_was_busy(tiny_app: AppFactory) -> None:
    """Every model call sleeps 50 ms: the busy counter is at least calls x 50 ms and at most the wall time."""
    import re
    import time

    app = tiny_app(delay_s=0.05, warmup=False)
    async with serve(app) as client:
        _net(app).calls.clear()  # the worker's calls only: the start's check of the default finds the CAM layer in a call of its own
        started = time.perf_counter()
        rs = await asyncio.gather(*[_attribute(client, image_bytes((20 * i, 90, 200))) for i in range(3)])
        wall = time.perf_counter() - started
        assert all(r.status_code == 200 for r in rs)
        text = (await client.get("/metrics")).text
    busy = float(re.search(r"^idg_device_busy_seconds_total ([0-9.e+-]+)$", text, re.M).group(1))
    calls = len(_net(app).calls)
    assert calls > 0 and 0.05 * calls <= busy <= wall


async def _post(client, img: bytes, **fields: str):
    data = {"return_attribution": "true", "return_overlay": "false", "target": "3"} | fields
    return await client.post("/attribute", files={"file": ("a.png", img, "image/png")}, data=data)


async def test_the_rivals_batch_with_other_requests_and_match_alone(tiny_app: AppFactory) -> None:
    """Expected Gradients, IDG on EG paths and LA through the service: their points join other requests'
    model calls, and the answer is the one each gives alone."""
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=256, max_round_images=512)
    asks = [{"method": "eg", "samples": "6"}, {"method": "idg_eg", "paths": "2", "steps": "4", "probe_steps": "3"},
            {"method": "la", "max_iter": "2", "classes": "2"}, {"method": "idg", "steps": "4", "probe_steps": "3"}]
    images = [image_bytes((40 * i, 90, 200)) for i in range(len(asks))]
    async with serve(app) as client:
        alone = []
        for img, ask in zip(images, asks, strict=True):
            _net(app).calls.clear()
            alone.append((await _post(client, img, **ask), len(_net(app).calls)))
        assert [r.status_code for r, _ in alone] == [200] * 4, [r.json() for r, _ in alone]
        assert alone[0][0].json()["cost"]["forward_passes"] == 1 + 6  # prediction + one gradient per draw
        assert alone[2][0].json()["cost"]["forward_passes"] == 1 + (2 * 1 + 1) * 2  # LA: one targeted + one untargeted attack
        _net(app).calls.clear()
        together = await asyncio.gather(*[_post(client, img, **ask) for img, ask in zip(images, asks, strict=True)])
        assert [r.status_code for r in together] == [200] * 4
        assert len(_net(app).calls) < sum(n for _, n in alone)  # rounds shared across the four requests
        for (a, _), b in zip(alone, together, strict=True):
            assert np.allclose(_attr(a), _attr(b), atol=1e-4, rtol=1e-3)


async def test_guided_ig_beside_other_requests_gives_its_map_alone_bit_for_bit(tiny_app: AppFactory) -> None:
    """Guided IG ranks its gradients, whose last bits follow the model call's size: sharing calls with other requests
    had moved its map by about its largest value. Its calls are now its own (the scheduler's ``alone``): beside two
    other Guided IG requests and an IDG request, every map is the one it gets alone, bit for bit."""
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=64, max_round_images=128)
    images = [image_bytes((50 * i, 120, 200 - 40 * i)) for i in range(4)]
    asks = [{"method": "guided_ig", "steps": "12"}] * 3 + [{"method": "idg", "steps": "8", "probe_steps": "6"}]
    async with serve(app) as client:
        net = _net(app)
        alone, calls_alone = [], []
        for img, ask in zip(images, asks, strict=True):
            net.calls.clear()
            alone.append(await _attribute(client, img, **ask))
            calls_alone.append(list(net.calls))
        assert [r.status_code for r in alone] == [200] * 4
        assert all(max(c) == 1 for c in calls_alone[:3])  # one image: every Guided IG call holds one row
        net.calls.clear()
        together = await asyncio.gather(*[_attribute(client, img, **ask) for img, ask in zip(images, asks, strict=True)])
        assert [r.status_code for r in together] == [200] * 4
        for a, b in zip(alone[:3], together[:3], strict=True):
            assert np.array_equal(_attr(a), _attr(b))
            assert a.json()["curve"] == b.json()["curve"]
        assert np.allclose(_attr(alone[3]), _attr(together[3]), atol=1e-4, rtol=1e-3)
        gig_calls = sum(len(c) for c in calls_alone[:3]) - 3  # their prediction passes may still be shared
        assert net.calls.count(1) >= gig_calls, net.calls  # every Guided IG step was a call of its own
