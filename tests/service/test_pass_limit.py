"""``IDG_MAX_PASSES`` against every pass a request takes: a refusal states the whole bound (the method times its noisy
copies, their probe, the prediction and the faithfulness games), which is the bound the library's counting tests check
(:mod:`tests.core.test_budget`), and a request at exactly that limit is served, its real model passes within it."""

from __future__ import annotations

import re

import pytest
from httpx import AsyncClient, Response

from app.schemas import AttributeParams
from app.service.planning import explain_options, method_params
from idg_core.budget import explanation_bound, postprocess_bound
from idg_core.methods import METHODS
from idg_core.presets import preset_cost
from tests.service.conftest import AppFactory, image_bytes, serve, tiny_classifier

CROP = 32
"""The tiny model's crop: the faithfulness games' pixels."""


def library_bound(fields: dict[str, str], max_steps: int = 512) -> int:
    """The forward passes :func:`idg_core.budget.explanation_bound` gives the request (as the counting tests compute it)."""
    from app.core.config import Settings

    settings, model = Settings(max_steps=max_steps), tiny_classifier()
    params = AttributeParams.model_validate({"model": "tiny", **fields})
    used = method_params(settings, params, model.num_classes)
    options = explain_options(settings, params, model, used)
    method = postprocess_bound(METHODS[params.method].bound(used), options.post)
    return explanation_bound(method, options.metrics, CROP, CROP, options.steps, predict=True).forward


async def attribute(client: AsyncClient, **fields: str) -> Response:
    data = {"return_overlay": "false", "return_heatmap": "false"} | fields
    return await client.post("/attribute", files={"file": ("a.png", image_bytes(), "image/png")}, data=data)


def stated(r: Response) -> int:
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", r.text
    found = re.search(r"may cost up to (\d+) model passes, more than the limit of (\d+)", r.json()["error"]["message"])
    assert found is not None, r.text
    return int(found[1])


async def test_the_refusal_of_many_noisy_copies_states_all_their_passes(tiny_app: AppFactory) -> None:
    # the request: refused with "may cost up to 520 passes" (the method alone) where it would take 32,777
    fields = {"method": "idg", "preset": "fast", "steps": "512", "smooth_samples": "64", "smooth_probe": "shared"}
    async with serve(tiny_app(max_passes=500, warmup=False)) as client:
        r = await attribute(client, **fields)
        assert stated(r) == library_bound(fields) == 512 * 64 + 8 + 1
        message = r.json()["error"]["message"]
        assert "lower steps, probe_steps or smooth_samples" in message
        assert "(512 for each of 64 noisy copies, 8 for their shared probe and 1 for the prediction)" in message, message
        own = {**fields, "smooth_probe": "own"}  # each copy runs its own probe
        assert stated(await attribute(client, **own)) == library_bound(own) == 520 * 64 + 1


@pytest.mark.parametrize("fields", [  # each over the default's bound (a server whose limit it passes does not start)
    {"method": "idg", "steps": "10", "probe_steps": "3", "smooth_samples": "3", "smooth_probe": "shared",
     "faithfulness": "insertion,deletion", "faithfulness_steps": "4"},
    {"method": "idg", "steps": "20", "probe_steps": "3", "smooth_samples": "2", "smooth_probe": "own", "postprocess": "rankmix"},
    {"method": "ig", "steps": "20", "smooth_samples": "2", "faithfulness": "deletion", "faithfulness_steps": "3"},
    {"method": "eg", "samples": "50"},
    {"method": "idg", "steps": "12", "probe_steps": "3", "smooth_samples": "2", "smooth_probe": "own", "postprocess": "cam_product",
     "faithfulness": "deletion", "faithfulness_steps": "12"},
], ids=["idg-shared-scored", "idg-rankmix", "ig-smooth-scored", "eg", "idg-cam-product-scored"])
async def test_a_request_at_its_stated_bound_is_served_within_it_and_one_pass_less_is_refused(
    tiny_app: AppFactory, fields: dict[str, str],
) -> None:
    whole = library_bound(fields)
    assert whole - 1 >= preset_cost("idg").forward + 1  # a server whose limit the default attribution passes does not start
    async with serve(tiny_app(max_passes=whole - 1, warmup=False)) as client:
        assert stated(await attribute(client, **fields)) == whole
    app = tiny_app(max_passes=whole, warmup=False)
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        app.state.service.models["tiny"].cam_target()  # Grad-CAM's layer is found once, by a pass of its own: not counted
        net.calls.clear()
        r = await attribute(client, **fields)
        assert r.status_code == 200, r.text
        taken = sum(net.calls)  # the images the model itself was given
        assert r.json()["cost"]["forward_passes"] == taken <= whole, (taken, whole)
