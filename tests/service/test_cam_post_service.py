"""The service answers postprocess=cam_regions and cam_product on any method at the method's cost plus Grad-CAM's one
forward and one backward pass, scores the returned map (faithfulness) with method=gradcam and with XRAI's and
Grad-CAM's post-steps, refuses a model without a CAM layer with the same 422 as gradcam, and lists the region rows
with their cost and standing in GET /models."""

from __future__ import annotations

import numpy as np
from httpx import AsyncClient

from app.core.config import Settings
from app.main import create_app
from idg_client import parse_attribution
from idg_core.presets import DEFAULT_PRESET, ROWS, SMOOTH_PRODUCT, preset_cost
from idg_models.zoo import ImageClassifier, Preprocessing
from tests.models import tiny_classifier
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.test_gradcam_service import _Pixels

IDG = {"method": "idg", "preset": "fast", "steps": "4", "probe_steps": "4"}
"""IDG alone (preset=fast: no noisy copies, no post-step of its own), so each request's post-step is the only one."""


async def _attribute(client: AsyncClient, **fields: str) -> dict:  # type: ignore[type-arg]
    r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"return_heatmap": "false",
                                                                                        "return_overlay": "false", **fields})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def test_cam_post_steps_cost_gradcams_pass_more_and_the_answer_scores_their_map(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        plain = (await _attribute(client, **IDG))["cost"]
        for kind in ("cam_regions", "cam_product"):
            body = await _attribute(client, **IDG, postprocess=kind, return_attribution="true")
            assert body["parameters"]["postprocess"] == kind
            if kind == "cam_product":
                assert body["regions"] is None  # a product of two maps: no regions
            else:  # Grad-CAM's blobs, ranked: the map's values fall from one blob to the next, as XRAI's regions
                answer = parse_attribution(body)
                regions = answer.regions
                assert regions is not None and regions.source == "cam_blobs" and regions.order == "regions_then_pixels"
                assert answer.attribution is not None and regions.areas.sum() == regions.labels.size
                value = answer.attribution.astype(np.float64).sum(0)
                for rank in range(1, len(regions.areas)):
                    assert value[regions.labels == rank].min() >= value[regions.labels == rank + 1].max()
                assert (np.diff(regions.gains) <= 0).all()  # each blob's mean CAM, highest first
            assert body["cost"] == {"forward_passes": plain["forward_passes"] + 1, "backward_passes": plain["backward_passes"] + 1}
        # the faithfulness scores read the returned map, whatever made it: 2 x (4 + 1) more forward passes
        for fields in ({"method": "gradcam"}, {**IDG, "postprocess": "xrai"}, {**IDG, "postprocess": "cam_regions"},
                       {**IDG, "postprocess": "cam_product"}):
            bare = (await _attribute(client, **fields))["cost"]
            body = await _attribute(client, **fields, faithfulness="insertion,deletion", faithfulness_steps="4")
            f = body["faithfulness"]
            assert f["steps"] == 4 and 0 <= f["insertion"] <= 1 and 0 <= f["deletion"] <= 1, (fields, f)
            assert body["cost"]["forward_passes"] == bare["forward_passes"] + 2 * 5


async def test_a_model_without_a_cam_layer_is_refused_the_cam_post_steps_with_why() -> None:
    pixels = ImageClassifier("pixels", _Pixels().eval(), Preprocessing(36, 32), [f"c{i}" for i in range(4)])
    app = create_app(Settings(models=["tiny", "pixels"], warmup=False), models={"tiny": tiny_classifier(), "pixels": pixels})
    async with serve(app) as client:
        for kind in ("cam_regions", "cam_product"):
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                                  data={**IDG, "model": "pixels", "postprocess": kind})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", r.text
            message = r.json()["error"]["message"]
            assert f"postprocess={kind} cannot explain model 'pixels'" in message and "no spatial feature map" in message
        ok = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={**IDG, "model": "pixels",
                                                                                            "postprocess": "xrai"})
        assert ok.status_code == 200, ok.text


async def test_models_lists_the_region_rows_with_their_cost_and_standing(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        listed = (await client.get("/models")).json()
    rows = {r["name"]: r for r in listed["rows"]}
    assert list(rows) == list(ROWS) and {"gradcam", "gradcam_pp", "idg@fast+XRAI", "idg@fast+cam_regions",
                                         "idg@fast+cam_product"} <= set(rows)
    fast = next(p for p in listed["presets"] if p["name"] == "fast")["cost"]["idg"]
    assert rows["gradcam"]["cost"] == {"forward_passes": 2, "backward_passes": 1}
    assert rows["idg@fast+XRAI"]["cost"] == fast
    for kind in ("cam_regions", "cam_product"):
        row = rows[f"idg@fast+{kind}"]
        assert row["request"] == {"method": "idg", "preset": "fast", "postprocess": kind}
        assert row["cost"] == {"forward_passes": fast["forward_passes"] + 1, "backward_passes": fast["backward_passes"] + 1}
    smooth = rows[SMOOTH_PRODUCT]  # fast's probe once, its 16 main steps on each of 2 copies, Grad-CAM's pass
    assert smooth["cost"] == {"forward_passes": 8 + 2 * 16 + 1 + 1, "backward_passes": 2 * 16 + 1}  # within issue #72's 50
    assert all(r["standing"] for r in rows.values())
    assert "65 sample photos" in rows["idg@fast+cam_product"]["standing"] and "not measured" in rows["gradcam_pp"]["standing"]
    async with serve(tiny_app()) as client:  # each row's request costs what /models says
        for name, row in rows.items():
            body = await _attribute(client, **row["request"])
            assert body["cost"] == row["cost"], name  # both with the prediction's pass


async def test_a_refusal_over_the_pass_limit_counts_gradcams_pass(tiny_app: AppFactory) -> None:
    # a server starts only under a limit the default answer fits (its passes and the prediction's); noisy copies of IDG
    # 4/4 (8 passes each, their own probes) with the prediction fill the limit exactly: Grad-CAM's one pass goes past it
    copies = -(-preset_cost("idg", DEFAULT_PRESET).forward // 8)
    limit = 8 * copies + 1
    assert limit >= preset_cost("idg", DEFAULT_PRESET).forward + 1
    fields = {**IDG, "postprocess": "cam_regions", "smooth_samples": str(copies), "return_heatmap": "false"}
    async with serve(tiny_app(max_passes=limit, warmup=False)) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert f"may cost up to {limit + 1} model passes, more than the limit of {limit}" in message, message
    assert f"(8 for each of {copies} noisy copies, 1 for cam_regions's Grad-CAM and 1 for the prediction)" in message, message
