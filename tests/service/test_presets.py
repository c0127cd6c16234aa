"""Cost presets through the service: the default is ``fast``, ``paper`` is 50/50, explicit steps
override, the answer names the preset and the precision, and the model is called exactly as often
as the preset's steps say."""

from __future__ import annotations

import pytest

from idg_core.presets import PRESETS
from tests.service.conftest import AppFactory, image_bytes, serve


async def _attribute(client, **fields: str) -> dict:  # noqa: ANN001
    r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "idg", **fields})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(("fields", "probe", "main", "preset"), [
    ({}, PRESETS["idg"]["fast"]["probe_steps"], PRESETS["idg"]["fast"]["steps"], "fast"),
    ({"preset": "paper"}, 50, 50, "paper"),
    ({"preset": "paper", "steps": "12"}, 50, 12, "paper"),
    ({"steps": "6", "probe_steps": "5"}, 5, 6, None),  # no preset named, and not the default's steps: none
    ({"steps": "50"}, PRESETS["idg"]["fast"]["probe_steps"], 50, None),
    ({"preset": "fast", "steps": "50"}, PRESETS["idg"]["fast"]["probe_steps"], 50, "fast"),
    ({"placement": "authors"}, PRESETS["idg"]["fast"]["probe_steps"], PRESETS["idg"]["fast"]["steps"], "fast"),
])
async def test_the_preset_sets_the_steps_unless_given(
    tiny_app: AppFactory, fields: dict, probe: int, main: int, preset: str | None,
) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        body = await _attribute(client, **fields)
        assert body["parameters"]["preset"] == preset
        assert (body["parameters"]["probe_steps"], body["parameters"]["steps"]) == (probe, main)
        assert len(body["curve"]["probe_alphas"]) == probe and len(body["curve"]["alphas"]) == main
        assert body["cost"] == {"forward_passes": 1 + probe + main, "backward_passes": main}
        assert sum(net.calls) == 1 + probe + main  # images through the model: prediction, probe, main pass
        assert body["precision"] == "fp32"  # auto on the CPU


async def test_an_unknown_preset_is_a_422_that_names_the_choices(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"preset": "turbo"})
        assert r.status_code == 422 and "preset" in r.json()["error"]["message"]
        assert "fast" in r.json()["error"]["message"] and "paper" in r.json()["error"]["message"]


@pytest.mark.parametrize(("fields", "copies", "post"), [
    ({"preset": "quality"}, PRESETS["idg"]["quality"]["smooth_samples"], "rankmix"),
    ({"preset": "quality", "smooth_samples": "2", "postprocess": "none"}, 2, None),
    ({"preset": "quality", "postprocess": "idgi"}, PRESETS["idg"]["quality"]["smooth_samples"], "idgi"),
    ({"preset": "fast"}, 0, None),
])
async def test_quality_adds_its_post_steps_unless_the_request_gives_its_own(tiny_app: AppFactory, fields: dict, copies: int,
                                                                             post: str | None) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        body = await _attribute(client, **fields)
        used = body["parameters"]
        assert used.get("smooth_samples", 0) == copies and used.get("postprocess") in ({post} if post else {None, "none"})
        fast = PRESETS["idg"]["fast"]
        per_copy = fast["probe_steps"] + fast["steps"]
        assert body["cost"] == {"forward_passes": 1 + max(copies, 1) * per_copy, "backward_passes": max(copies, 1) * fast["steps"]}
        assert sum(net.calls) == body["cost"]["forward_passes"]
        # with noisy copies the curve is the first copy's, and the answer says so (its F at α = 1 is not the photo's)
        assert body["curve"]["input"] == ("noisy_copy" if copies else "photo")
        if fields.get("preset") == "quality" and copies == PRESETS["idg"]["quality"]["smooth_samples"]:
            assert body["cost"]["forward_passes"] - 1 <= 400  # AGI's 2 x 20 passes x 10


def test_the_metrics_label_names_the_presets_post_steps() -> None:
    from app.schemas import AttributeParams
    from app.service.render import method_label

    assert method_label(AttributeParams.model_validate({"preset": "quality"})) == "idg+rankmix+smoothgrad"
    assert method_label(AttributeParams.model_validate({"preset": "quality", "smooth_samples": 0})) == "idg+rankmix"
    assert method_label(AttributeParams.model_validate({"method": "ig", "preset": "quality"})) == "ig"
