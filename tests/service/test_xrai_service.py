"""The service answers postprocess=xrai on any method: the map with XRAI's ranked regions in the answer (a label PNG of
region ranks and each region's rank, gain and area), at the method's own cost, read back by the Python client; a bad
xrai_order is a 422."""

from __future__ import annotations

import numpy as np

from idg_client import parse_attribution
from tests.service.conftest import AppFactory, image_bytes, serve


async def test_xrai_regions_are_in_the_answer_for_any_method(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        # preset=fast: the plain answer has no post-step of its own (the default's Grad-CAM pass would be replaced by XRAI)
        for method, fields in (("idg", {"preset": "fast", "steps": "4", "probe_steps": "4"}), ("eg", {"preset": "fast", "samples": "3"})):
            plain = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": method, **fields})
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                                  data={"method": method, "postprocess": "xrai", "return_attribution": "true", **fields})
            assert plain.status_code == 200 and r.status_code == 200, r.text
            body = r.json()
            assert body["parameters"]["postprocess"] == "xrai" and body["parameters"]["xrai_order"] == "regions_then_pixels"
            assert body["cost"] == plain.json()["cost"]  # no model pass of its own
            assert plain.json()["regions"] is None
            answer = parse_attribution(body)
            regions = answer.regions
            assert regions is not None and regions.order == "regions_then_pixels"
            h, w = body["attribution"]["shape"][1:]
            assert regions.labels.shape == (h, w) and regions.labels.min() == 1 and regions.labels.max() == len(body["regions"]["regions"])
            rows = body["regions"]["regions"]
            assert [row["rank"] for row in rows] == list(range(1, len(rows) + 1))
            assert sum(row["area"] for row in rows) == h * w
            assert [row["area"] for row in rows] == np.bincount(regions.labels.ravel())[1:].tolist()
            assert abs(sum(row["share"] for row in rows) - 1.0) < 1e-9
            # the map ranks the regions first: every pixel of region 1 above every pixel of region 2
            assert answer.attribution is not None
            sal = np.abs(answer.attribution.astype(np.float64)).sum(0)
            if len(rows) > 1:
                assert sal[regions.labels == 1].min() > sal[regions.labels == 2].max()
            assert regions.top(0.0).sum() == rows[0]["area"]  # at least the first region


async def test_plain_xrai_order_and_a_bad_one(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                              data={"postprocess": "xrai", "xrai_order": "regions", "return_attribution": "true"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["regions"]["order"] == "regions" and body["parameters"]["xrai_order"] == "regions"
        answer = parse_attribution(body)
        assert answer.regions is not None and answer.attribution is not None
        sal = np.abs(answer.attribution.astype(np.float64)).sum(0)
        for rank in range(1, len(body["regions"]["regions"]) + 1):
            assert np.ptp(sal[answer.regions.labels == rank]) <= 1e-3 * sal.max()  # one value per region (float16 array)
        bad = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                                data={"postprocess": "xrai", "xrai_order": "pixels"})
        assert bad.status_code == 422 and "xrai_order" in bad.json()["error"]["message"]
        for fields in ({"xrai_order": "regions"}, {"postprocess": "cam_regions", "xrai_order": "regions"}):  # no XRAI to order
            alone = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"steps": "2", **fields})
            assert alone.status_code == 422, alone.text
            assert alone.json()["error"]["message"].startswith("xrai_order orders XRAI's regions: it needs postprocess=xrai, got ")
