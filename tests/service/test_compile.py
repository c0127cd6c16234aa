"""IDG_COMPILE in the real app: graphs are made before ready (even with IDG_WARMUP=false), /models
names the sizes and the start-up cost, concurrent traffic of mixed sizes makes no new graph
(idg_compile_late_graphs stays 0) and answers as the uncompiled app does."""

from __future__ import annotations

import asyncio
import base64
import io

import numpy as np
import pytest
import torch._dynamo

from app.core.config import Settings
from app.core.model_loading import ModelLoadError
from app.main import create_app
from idg_models import ImageClassifier, Preprocessing, compiled
from idg_models.compiled import compiled_part
from tests.models import SmallCNN
from tests.service.conftest import image_bytes, serve


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()  # each test starts with no graph compiled


def app(compile: bool):  # noqa: ANN201 - a FastAPI app
    # SmallCNN, not the service tests' TinyNet: TinyNet's lock and data-dependent branch make dynamo skip it whole
    model = ImageClassifier("small", SmallCNN(0, classes=1000).eval(), Preprocessing(36, 32), [f"c{i}" for i in range(1000)])
    settings = Settings(models=["small"], warmup=False, batch_wait_ms=20.0, compile=compile, max_batch_images=8)
    return create_app(settings, models={"small": model})


async def attributions(client, n: int) -> list[np.ndarray]:  # noqa: ANN001 - httpx.AsyncClient
    async def one(i: int) -> np.ndarray:
        r = await client.post("/attribute", files={"file": ("x.png", image_bytes((30 * i, 90, 200 - 20 * i)))},
                              data={"method": "idg", "steps": str(3 + i), "probe_steps": "3", "return_attribution": "true"})
        assert r.status_code == 200, r.text
        return np.load(io.BytesIO(base64.b64decode(r.json()["attribution"]["data"])))

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def test_compiled_app_makes_its_graphs_before_ready_and_none_under_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "DEFAULT_BACKEND", "eager")  # the same graphs as inductor, no code generation
    compiled_app = app(compile=True)
    async with serve(compiled_app) as client:
        info = (await client.get("/models")).json()["models"][0]
        assert info["compile_sizes"] == [1, 2, 4, 8] and info["compile_seconds"] > 0
        part = compiled_part(compiled_app.state.service.models["small"])
        assert part is not None and part.graphs == 8  # 4 sizes x (forward only, forward for a gradient)
        got = await attributions(client, 5)  # concurrent: calls of several sizes, padded
        preds = await asyncio.gather(*(client.post("/predict", files={"file": ("p.png", image_bytes((9 * i, 0, 0)))})
                                       for i in range(3)))
        assert all(p.status_code == 200 for p in preds)
        text = (await client.get("/metrics")).text
        assert part.graphs == 8 and 'idg_compile_late_graphs{model="small"} 0.0' in text
        assert 'idg_compile_seconds{model="small"}' in text
    async with serve(app(compile=False)) as client:
        assert (await client.get("/models")).json()["models"][0]["compile_sizes"] == []
        want = await attributions(client, 5)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=1e-2, atol=1e-3)


async def test_a_model_that_does_not_compile_stops_start_up_with_a_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "DEFAULT_BACKEND", broken)
    with pytest.raises(ModelLoadError, match=r"(?s)cannot torch.compile model .small.*no C\+\+ compiler.*IDG_COMPILE=false"):
        async with serve(app(compile=True)):
            pass
