"""The service on a CUDA device: concurrent requests batched on the GPU, memory reported, bad input isolated."""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.core.config import Settings
from app.main import create_app
from idg_core.models import set_tf32
from tests.service.conftest import image_bytes, serve, tiny_classifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
async def test_concurrent_attributions_on_cuda(precision: str) -> None:
    tiny = tiny_classifier()
    app = create_app(Settings(models=["tiny"], device="cuda", precision=precision, channels_last=True, batch_wait_ms=50.0),
                     models={"tiny": tiny})
    async with serve(app) as client:
        info = (await client.get("/models")).json()
        assert info["device"].startswith("cuda")
        assert next(tiny.parameters()).is_cuda
        before = len(tiny.net.calls)
        colours = [(40, 120, 200), (200, 40, 10), (10, 200, 40), (120, 120, 120)]
        posts = [client.post("/attribute", files={"file": ("a.png", image_bytes(c), "image/png")},
                             data={"method": "idg", "steps": "16", "probe_steps": "16", "target": "3"}) for c in colours]
        bad = client.post("/attribute", files={"file": ("a.png", b"not an image", "image/png")})
        *answers, refused = await asyncio.gather(*posts, bad)
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert refused.status_code == 415
        calls = tiny.net.calls[before:]
        assert len(calls) < 4 * 3, calls  # served one by one, each request needs >= 3 model calls
        metrics = (await client.get("/metrics")).text
        line = next(ln for ln in metrics.splitlines() if ln.startswith("idg_device_memory_bytes") and 'kind="peak"' in ln)
        assert float(line.split()[-1]) > 0
    set_tf32(False)  # the switches are process-wide: leave them as fp32 for the next test
