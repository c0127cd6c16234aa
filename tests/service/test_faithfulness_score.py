"""The faithfulness score, IDGI and SmoothGrad through the real app: the score agrees with
idg_core.metrics at the same step count, its passes are counted, and bad options are 422s."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from app.core.config import Settings
from app.core.images import load_input
from idg_core.methods import ig
from idg_core.metrics import deletion, insertion
from idg_core.paths import resolve_baseline
from tests.service.conftest import AppFactory, image_bytes, serve

IG = {"method": "ig", "steps": "4", "rule": "riemann_trapezoid"}


async def _attribute(client, **fields: str) -> dict:  # noqa: ANN001
    r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
    assert r.status_code == 200, r.text
    return r.json()


async def test_score_agrees_with_the_library_metrics_and_its_passes_are_counted(tiny_app: AppFactory) -> None:
    app = tiny_app()
    async with serve(app) as client:
        model = app.state.service.models["tiny"]
        model.net.calls.clear()
        body = await _attribute(client, **IG, faithfulness="deletion,insertion", faithfulness_steps="8")
        f = body["faithfulness"]
        assert f["steps"] == 8 and 0 <= f["insertion"] <= 1 and 0 <= f["deletion"] <= 1
        assert body["cost"] == {"forward_passes": 1 + 4 + 2 * 9, "backward_passes": 4}
        assert sum(model.net.calls) == 1 + 4 + 2 * 9
        assert body["parameters"]["faithfulness"] == "insertion,deletion" and body["parameters"]["faithfulness_steps"] == 8
        # the same map and scores computed by the library: 32 x 32 pixels in 8 steps = 128 pixels per step
        x = await load_input(image_bytes(), model, Settings(), torch.device("cpu"))
        base = resolve_baseline("mean", x.unsqueeze(0))
        attr = ig(model, x.unsqueeze(0), base, int(body["target"]["index"]), steps=4, rule="riemann_trapezoid").attributions
        sal = attr[0].abs().sum(0).unsqueeze(0)  # |attribution| summed over channels
        p = model.preprocessing
        assert f["insertion"] == pytest.approx(insertion(model, x.unsqueeze(0), sal, mean=p.mean, std=p.std, step=128)[0].auc, abs=1e-5)
        assert f["deletion"] == pytest.approx(deletion(model, x.unsqueeze(0), sal, substrate=p.mean, step=128)[0].auc, abs=1e-5)
        metrics = (await client.get("/metrics")).text
        assert 'idg_faithfulness_count{method="ig",metric="insertion",model="tiny"} 1.0' in metrics
        # the default step count comes from the settings; one metric costs steps + 1
        body = await _attribute(client, **IG, faithfulness="deletion")
        assert body["faithfulness"]["insertion"] is None and body["faithfulness"]["steps"] == 28
        assert body["cost"]["forward_passes"] == 1 + 4 + 28 + 1
        assert (await _attribute(client, **IG))["faithfulness"] is None


async def test_score_in_batch_and_default_steps_setting(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(faithfulness_steps=4)) as client:
        files = [("files", ("a.png", image_bytes())), ("files", ("b.png", image_bytes((200, 30, 90))))]
        r = await client.post("/attribute/batch", files=files, data={**IG, "faithfulness": "insertion"})
        assert r.status_code == 200, r.text
        for item in r.json()["items"]:
            assert item["result"]["faithfulness"]["steps"] == 4 and item["result"]["faithfulness"]["deletion"] is None


async def test_idgi_and_smoothgrad_through_the_api(tiny_app: AppFactory) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        body = await _attribute(client, **IG, postprocess="idgi", return_attribution="true")
        attr = np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"]))).astype(np.float64)
        logits = body["curve"]["logits"]
        assert attr.sum() == pytest.approx(logits[-1] - logits[0], rel=1e-2, abs=1e-3)  # IDGI completeness on the path
        assert body["parameters"]["postprocess"] == "idgi" and body["cost"] == {"forward_passes": 5, "backward_passes": 4}
        net.calls.clear()
        body = await _attribute(client, **IG, smooth_samples="3", smooth_kind="vargrad")
        assert body["cost"] == {"forward_passes": 1 + 12, "backward_passes": 12} and sum(net.calls) == 13
        assert body["parameters"]["smooth_samples"] == 3 and body["parameters"]["smooth_kind"] == "vargrad"
        net.calls.clear()  # IDG's copies sharing its probe: the prediction, the probe once, then 3 copies x 4 main steps
        # (preset=fast: without the default's Grad-CAM product and its pass)
        body = await _attribute(client, method="idg", preset="fast", steps="4", probe_steps="5", smooth_samples="3",
                                smooth_probe="shared")
        assert body["cost"] == {"forward_passes": 1 + 5 + 12, "backward_passes": 12} and sum(net.calls) == 18
        assert body["parameters"]["smooth_probe"] == "shared"
        net.calls.clear()
        body = await _attribute(client, **IG, postprocess="rankmix", return_attribution="true")
        mixed = np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"]))).astype(np.float64).sum(0)
        assert body["parameters"]["postprocess"] == "rankmix" and body["cost"] == {"forward_passes": 5, "backward_passes": 4}
        assert sum(net.calls) == 5 and mixed.min() >= 0 and mixed.max() <= 1 + 1e-3  # a rank score per pixel
        assert mixed.mean() == pytest.approx(0.5, abs=1e-3)  # the mean of two ranks that each run evenly over 0..1


@pytest.mark.parametrize(("fields", "words"), [
    ({"faithfulness": "auc"}, "faithfulness"),
    ({"faithfulness": "insertion", "faithfulness_steps": "0"}, "faithfulness_steps"),
    ({"postprocess": "idgi", "method": "agi", "steps": None, "rule": None}, "path method"),
    ({"postprocess": "rankmix", "method": "agi", "steps": None, "rule": None}, "path method"),
    ({"smooth_samples": "64", "steps": "512"}, "smooth_samples"),
    ({"smooth_samples": "2", "smooth_probe": "shared"}, "probe"),  # ig has no probe to share
    ({"method": "idg", "uniform": "true", "rule": None, "smooth_samples": "2", "smooth_probe": "shared"}, "probe"),  # nor this idg
    ({"smooth_samples": "2", "smooth_probe": "mine"}, "smooth_probe"),
])
async def test_bad_options_are_422s_that_say_why(tiny_app: AppFactory, fields: dict, words: str) -> None:
    async with serve(tiny_app()) as client:
        data = {k: v for k, v in {**IG, **fields}.items() if v is not None}
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=data)
        assert r.status_code == 422, r.text
        assert words in r.json()["error"]["message"]
