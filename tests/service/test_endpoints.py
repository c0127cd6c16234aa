"""Happy paths on a real photo with the real default model, plus docs and metrics."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from app.core.config import Settings
from app.main import create_app
from benchmarks.samples import ESPRESSO
from tests.service.conftest import serve

PHOTO = ESPRESSO  # the checkout's own photo (samples/): 'espresso', class 967, at 0.96


@pytest.fixture(scope="module")
def lite0_app():
    return create_app(Settings(models=["efficientnet_lite0"], warmup=False))


async def test_predict_multipart_and_json(lite0_app) -> None:
    async with serve(lite0_app) as client:
        r = await client.post("/predict", files={"file": ("coffee.jpg", PHOTO.read_bytes(), "image/jpeg")}, data={"top_k": "3"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model"] == "efficientnet_lite0" and len(body["top_k"]) == 3
        assert body["top_k"][0]["name"] == "espresso" and body["top_k"][0]["probability"] > 0.5
        r2 = await client.post("/predict", json={"image": base64.b64encode(PHOTO.read_bytes()).decode()})
        assert r2.status_code == 200 and r2.json()["top_k"][0]["index"] == 967


async def test_attribute_returns_heatmaps_curve_and_costs(lite0_app) -> None:
    async with serve(lite0_app) as client:
        r = await client.post(
            "/attribute",
            files={"file": ("coffee.jpg", PHOTO.read_bytes(), "image/jpeg")},
            data={"method": "idg", "preset": "fast", "steps": "8", "probe_steps": "6", "return_attribution": "true"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["target"]["name"] == "espresso" and body["parameters"]["steps"] == 8
        for key in ("heatmap_png", "overlay_png"):
            img = Image.open(io.BytesIO(base64.b64decode(body[key])))
            assert img.format == "PNG" and img.size == (224, 224)
        c = body["curve"]
        assert len(c["probe_alphas"]) == 6 and len(c["alphas"]) == 8 and len(c["importance"]) == 8
        assert c["alphas"] == sorted(c["alphas"])
        delta, per_interval = 1 / 5, {}  # 6 probe points: 5 intervals; each interval's samples share its width Δ
        for a, w in zip(c["alphas"], c["weights"], strict=True):
            per_interval[min(int(a / delta), 4)] = per_interval.get(min(int(a / delta), 4), 0.0) + w
        assert all(abs(total - delta) < 1e-9 for total in per_interval.values()), per_interval
        # preset=fast: IDG alone (the default preset would add its noisy copies and Grad-CAM's pass to these steps)
        assert body["cost"] == {"forward_passes": 6 + 8 + 1, "backward_passes": 8}
        arr = np.load(io.BytesIO(base64.b64decode(body["attribution"]["data"])))
        # a real map has values below float16's normal range (~6.1e-5): float32, so that none loses float16's precision
        assert arr.dtype.name == "float32" == body["attribution"]["dtype"] and arr.shape == (3, 224, 224) and np.isfinite(arr).all()
        r = await client.post(
            "/attribute", files={"file": ("c.jpg", PHOTO.read_bytes())}, data={"method": "ig", "steps": "4", "target": "207"},
        )
        assert r.status_code == 200 and r.json()["target"]["index"] == 207 and r.json()["curve"]["probe_alphas"] == []


async def test_models_health_metrics_and_docs(lite0_app) -> None:
    async with serve(lite0_app) as client:
        models = (await client.get("/models")).json()
        assert models["models"][0]["name"] == "efficientnet_lite0" and "idg" in models["methods"]
        assert (await client.get("/health/live")).status_code == 200
        assert (await client.get("/health/ready")).json()["status"] == "ready"
        await client.post("/predict", files={"file": ("c.jpg", PHOTO.read_bytes())})
        text = (await client.get("/metrics")).text
        assert 'idg_http_requests_total{route="/predict",status="200"}' in text
        assert "idg_http_request_seconds_bucket" in text and "idg_batch_images_bucket" in text and "idg_queue_depth" in text
        spec = (await client.get("/openapi.json")).json()
        form = spec["paths"]["/attribute"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
        assert {"file", "method", "target", "steps", "probe_steps", "baseline", "placement", "importance"} <= set(form)
        assert all(v.get("description") for k, v in form.items())
        assert "application/json" in spec["paths"]["/predict"]["post"]["requestBody"]["content"]
        # the schema and the page's assets are counted by their route, not as "unmatched"
        assert (await client.get("/static/style.css")).status_code == 200
        assert (await client.get("/nowhere")).status_code == 404
        text = (await client.get("/metrics")).text
        assert 'idg_http_requests_total{route="/openapi.json",status="200"} 1.0' in text
        assert 'idg_http_requests_total{route="/static/{path}",status="200"} 1.0' in text
        assert 'idg_http_requests_total{route="unmatched",status="404"} 1.0' in text


async def test_every_answer_says_nosniff_and_the_page_forbids_framing_and_foreign_scripts(tiny_app) -> None:
    """#29 item 5: X-Content-Type-Options on every answer (a page, JSON, an error), CSP and X-Frame-Options on the page."""
    async with serve(tiny_app()) as client:
        page, models, missing = await client.get("/"), await client.get("/models"), await client.get("/nope")
        bad = await client.post("/attribute", files={"file": ("a.png", b"<script>alert(1)</script>", "image/png")})
    for r in (page, models, missing, bad):
        assert r.headers["x-content-type-options"] == "nosniff", r.url
    assert page.headers["x-frame-options"] == "DENY"
    csp = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
    assert bad.status_code == 415 and bad.headers["content-type"].startswith("application/json") and "<script>" not in bad.text
