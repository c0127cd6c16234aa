"""The service answers method=spectral_ig: listed in GET /models with its parameters, run by /attribute at
the cost it declares, its bad values refused with a 422 that names them."""

from __future__ import annotations

from idg_core import METHODS
from tests.service.conftest import AppFactory, image_bytes, serve


async def test_spectral_ig_is_listed_and_answered(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        listed = (await client.get("/models")).json()
        assert listed["methods"]["spectral_ig"] == METHODS["spectral_ig"].summary
        assert {p["name"] for p in listed["method_parameters"]["spectral_ig"]} == {"steps", "overlap", "basis", "schedule", "output"}
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                              data={"method": "spectral_ig", "steps": "6", "basis": "dct", "overlap": "0.3"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["method"] == "spectral_ig" and body["parameters"]["basis"] == "dct" and body["parameters"]["overlap"] == 0.3
        assert body["curve"]["output"] == "probability" and len(body["curve"]["alphas"]) == 5  # S - 1 gradient points
        assert body["cost"]["backward_passes"] == 5
        bad = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "spectral_ig", "overlap": "1.5"})
        assert bad.status_code == 422 and "overlap" in bad.json()["error"]["message"]


async def test_a_presets_step_count_above_the_servers_cap_is_capped_and_a_given_one_refused(tiny_app: AppFactory) -> None:
    """spectral_ig's paper preset sets 200 path points; a server with IDG_MAX_STEPS=64 runs it at 64 (its answer says so),
    as the web page's preset selector must get an answer, while a request that names steps=200 itself gets a 422."""
    async with serve(tiny_app(max_steps=64)) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "spectral_ig", "preset": "paper"})
        assert r.status_code == 200, r.text
        assert r.json()["parameters"]["steps"] == 64 and r.json()["cost"]["backward_passes"] == 63
        fast = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "spectral_ig"})
        assert fast.status_code == 200 and fast.json()["parameters"]["steps"] == 50  # the default, fast: IG-50's cost
        given = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "spectral_ig", "steps": "200"})
        assert given.status_code == 422 and "steps must be <= 64, got 200" in given.json()["error"]["message"]
