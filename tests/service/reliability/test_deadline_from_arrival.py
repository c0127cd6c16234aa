"""A request's deadline counts from its arrival, for every route and every stage (decoding
included): /attribute and /predict answer 504 by their deadline however long their decode or a
first stage took, and /attribute/batch answers by its deadline with what is done and 504 for the
rest. Decodes are slowed on purpose (a fixed sleep in the decode's thread) so the timings are the
same on any machine; large decodes still take turns in their slots after the deadline passed."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from typing import Any

import pytest
import torch
from PIL import Image

import app.core.images as images
from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import AppFactory, image_bytes, serve, tiny_classifier

DECODE_S = 0.25  # each large decode, slowed to this
TIMEOUT_S = 1.0
SLACK_S = 0.5  # what the answer may take beyond its deadline (rendering what is done, the event loop, a busy CI core)


def _large_png(shade: int) -> bytes:
    """4.2 megapixels (over LARGE_DECODE_PIXELS: decoded in a slot), a few kB of PNG."""
    buf = io.BytesIO()
    Image.new("RGB", (2100, 2000), (200, 30 + shade, 60)).save(buf, format="PNG")
    return buf.getvalue()


class SlowLargeDecodes:
    """Wraps ``images.model_input``: each large decode sleeps ``DECODE_S`` first; counts them and
    the most that ran at once."""

    def __init__(self) -> None:
        self.real = images.model_input
        self.lock = threading.Lock()
        self.started = self.active = self.most = 0

    def __call__(self, data: bytes, model: Any, settings: Settings, device: torch.device) -> torch.Tensor:
        if len(data) < 1000 or images.decode_pixels(data, model, settings) <= images.LARGE_DECODE_PIXELS:
            return self.real(data, model, settings, device)
        with self.lock:
            self.started += 1
            self.active += 1
            self.most = max(self.most, self.active)
        try:
            time.sleep(DECODE_S)
            return self.real(data, model, settings, device)
        finally:
            with self.lock:
                self.active -= 1


@pytest.fixture
def slow_decodes(monkeypatch: pytest.MonkeyPatch) -> SlowLargeDecodes:
    spy = SlowLargeDecodes()
    monkeypatch.setattr(images, "model_input", spy)
    return spy


async def test_a_batch_answers_by_its_deadline_with_what_is_done_and_504_for_the_rest(slow_decodes: SlowLargeDecodes) -> None:
    # two small images (decoded at once) and 12 large ones taking turns in one slot: 3 s of decoding against a 1 s deadline
    settings = Settings(models=["tiny"], warmup=False, max_concurrent_decodes=1, request_timeout_s=TIMEOUT_S, max_batch_files=16)
    files = [("files", ("small0.png", image_bytes())), ("files", ("small1.png", image_bytes((90, 20, 160))))]
    files += [("files", (f"large{i}.png", _large_png(i))) for i in range(12)]
    async with serve(create_app(settings, models={"tiny": tiny_classifier()})) as client:
        began = time.monotonic()
        r = await client.post("/attribute/batch", files=files, data={"steps": "2", "probe_steps": "3"})
        took = time.monotonic() - began
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert took < TIMEOUT_S + SLACK_S, took  # not 12 x 0.25 s of decoding later
        assert [i["status"] for i in items[:2]] == [200, 200]  # what was done is answered
        late = [i for i in items[2:] if i["status"] != 200]
        assert len(late) >= 6, [i["status"] for i in items]
        assert all(i["status"] == 504 and i["error"]["code"] == "deadline" for i in late), late
        assert r.json()["failed"] == len(late)
        started = slow_decodes.started
        time.sleep(2 * DECODE_S)  # the decode running at the deadline ends; no decode starts after it
        assert slow_decodes.started <= started + 1 < 12
        assert slow_decodes.most == 1  # the slot was held until each decode's thread returned
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())})
        assert r.status_code == 200  # nothing left behind


async def test_a_single_attribution_counts_its_decode(slow_decodes: SlowLargeDecodes) -> None:
    settings = Settings(models=["tiny"], warmup=False, max_concurrent_decodes=1, request_timeout_s=2 * DECODE_S)
    async with serve(create_app(settings, models={"tiny": tiny_classifier()})) as client:
        # two large images: the second waits for the first's slot, then decodes; 2 x 0.25 s against 0.5 s
        first = client.post("/attribute", files={"file": ("a.png", _large_png(0))}, data={"steps": "2", "probe_steps": "3"})
        began = time.monotonic()
        r1, r2 = await asyncio.gather(first, client.post("/attribute", files={"file": ("b.png", _large_png(1))},
                                                         data={"steps": "2", "probe_steps": "3"}))
        took = time.monotonic() - began
        codes = sorted([r1.status_code, r2.status_code])
        assert 504 in codes, (r1.text, r2.text)
        late = r1 if r1.status_code == 504 else r2
        assert late.json()["error"] == {"status": 504, "code": "deadline", "request_id": late.headers["x-request-id"],
                                        "message": f"the request did not finish within its deadline of {2 * DECODE_S:g} s"}
        assert took < 2 * DECODE_S + SLACK_S, took


async def test_an_explanation_after_predict_counts_from_the_arrival(tiny_app: AppFactory) -> None:
    # each model call 0.45 s: the prediction one call, its explanation (fast: 8 probe points, then 16 with
    # gradients) two: 1.35 s against 1.2 s. Timed from the explanation's own start it would fit (0.9 s).
    app = tiny_app(delay_s=0.45, request_timeout_s=1.2, batch_wait_ms=0.0, max_batch_images=16)
    async with serve(app) as client:
        began = time.monotonic()
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())},
                              data={"explain_if": "confidence >= 0", "preset": "fast"})
        took = time.monotonic() - began
        assert r.status_code == 504 and r.json()["error"]["code"] == "deadline", r.text
        assert took < 1.2 + SLACK_S, took
