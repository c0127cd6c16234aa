"""The service answers method=gradcam and gradcam_pp: listed in GET /models, one forward and one backward pass beside
the prediction in the answer's cost, a map that is one CAM spread over the channels; a model with no spatial feature
layer gets a 422 that says why, on /attribute and on a job's door alike."""

from __future__ import annotations

import base64
import io

import numpy as np
import torch
from torch import Tensor, nn

from app.core.config import Settings
from app.main import create_app
from idg_core import METHODS
from idg_models.zoo import ImageClassifier, Preprocessing
from tests.models import tiny_classifier
from tests.service.conftest import AppFactory, image_bytes, serve


class _Pixels(nn.Module):
    """A classifier of a flattened image: no feature map at all."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(3 * 32 * 32, 4)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(x.flatten(1))
        return out


async def test_gradcam_is_listed_and_answered_at_one_pass_each_way(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        listed = (await client.get("/models")).json()
        for name in ("gradcam", "gradcam_pp"):
            assert listed["methods"][name] == METHODS[name].summary
            assert {p["name"] for p in listed["method_parameters"][name]} == {"output"}
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                                  data={"method": name, "return_attribution": "true"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["method"] == name
            assert (body["cost"]["forward_passes"], body["cost"]["backward_passes"]) == (2, 1)  # the prediction, the CAM
            raw = body["attribution"]
            maps = np.load(io.BytesIO(base64.b64decode(raw["data"]))).astype(np.float64)
            assert maps.shape == (3, 32, 32) and (maps >= 0).all() and maps.max() > 0
            assert np.allclose(maps[0], maps[1]) and np.allclose(maps[0], maps[2])  # one map, a third in each channel


async def test_a_model_without_a_spatial_layer_is_refused_with_why() -> None:
    pixels = ImageClassifier("pixels", _Pixels().eval(), Preprocessing(36, 32), [f"c{i}" for i in range(4)])
    app = create_app(Settings(models=["tiny", "pixels"], warmup=False), models={"tiny": tiny_classifier(), "pixels": pixels})
    async with serve(app) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "gradcam", "model": "pixels"})
        assert r.status_code == 422, r.text
        assert "gradcam cannot explain model 'pixels'" in r.json()["error"]["message"]
        assert "no spatial feature map" in r.json()["error"]["message"]
        ok = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                               data={"method": "ig", "model": "pixels", "steps": "4"})
        assert ok.status_code == 200, ok.text
