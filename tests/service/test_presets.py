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


FAST = PRESETS["idg"]["fast"]
COPIES = FAST.get("smooth_samples", 0)  # the default's noisy copies (none today)


@pytest.mark.parametrize(("fields", "probe", "main", "copies", "preset"), [
    ({}, FAST["probe_steps"], FAST["steps"], COPIES, "fast"),
    ({"preset": "paper"}, 50, 50, 0, "paper"),
    ({"preset": "paper", "steps": "12"}, 50, 12, 0, "paper"),
    ({"steps": "6", "probe_steps": "5"}, 5, 6, COPIES, None),  # no preset named, the default's steps replaced
    ({"steps": "50"}, FAST["probe_steps"], 50, COPIES, None),
    # copies sharing the probe: "fast" unless the default sets its own smoothing, which these values would replace
    ({"smooth_samples": "2", "smooth_probe": "shared"}, FAST["probe_steps"], FAST["steps"], 2,
     None if "smooth_samples" in FAST else "fast"),
    ({"preset": "fast", "steps": "50"}, FAST["probe_steps"], 50, COPIES, "fast"),
    ({"placement": "authors"}, FAST["probe_steps"], FAST["steps"], COPIES, "fast"),
])
async def test_the_preset_sets_the_steps_unless_given(
    tiny_app: AppFactory, fields: dict, probe: int, main: int, copies: int, preset: str | None,
) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        body = await _attribute(client, **fields)
        assert body["parameters"]["preset"] == preset
        assert (body["parameters"]["probe_steps"], body["parameters"]["steps"]) == (probe, main)
        assert body["parameters"].get("smooth_samples", 0) == copies
        assert len(body["curve"]["probe_alphas"]) == probe and len(body["curve"]["alphas"]) == main
        shared = body["parameters"].get("smooth_probe") == "shared" or not copies
        # copies sharing one probe of the photo pay it once and the main pass per copy
        per_copy = main if shared else probe + main
        assert body["cost"] == {"forward_passes": 1 + (probe if shared else 0) + max(copies, 1) * per_copy,
                                "backward_passes": max(copies, 1) * main}
        assert sum(net.calls) == body["cost"]["forward_passes"]  # images through the model: prediction, probe, main passes
        assert body["curve"]["probe_input"] == ("photo" if shared else "noisy_copy")
        assert body["curve"]["input"] == ("noisy_copy" if copies else "photo")
        assert body["precision"] == "fp32"  # auto on the CPU


async def test_an_unknown_preset_is_a_422_that_names_the_choices(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"preset": "turbo"})
        assert r.status_code == 422 and "preset" in r.json()["error"]["message"]
        assert "fast" in r.json()["error"]["message"] and "paper" in r.json()["error"]["message"]


@pytest.mark.parametrize(("fields", "copies", "post", "shared"), [
    ({"preset": "quality"}, PRESETS["idg"]["quality"]["smooth_samples"], "rankmix", False),
    ({"preset": "quality", "smooth_samples": "2", "postprocess": "none"}, 2, None, False),
    ({"preset": "quality", "postprocess": "idgi"}, PRESETS["idg"]["quality"]["smooth_samples"], "idgi", False),
    ({"preset": "fast"}, COPIES, None, FAST.get("smooth_probe") == "shared"),
    ({"preset": "fast", "smooth_samples": "2", "smooth_probe": "shared"}, 2, None, True),
    ({"preset": "fast", "smooth_samples": "2", "smooth_probe": "own"}, 2, None, False),
])
async def test_a_presets_post_steps_apply_unless_the_request_gives_its_own(tiny_app: AppFactory, fields: dict, copies: int,
                                                                           post: str | None, shared: bool) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        body = await _attribute(client, **fields)
        used = body["parameters"]
        assert used.get("smooth_samples", 0) == copies and used.get("postprocess") in ({post} if post else {None, "none"})
        probe, main = used["probe_steps"], used["steps"]
        forward = probe + max(copies, 1) * main if shared else max(copies, 1) * (probe + main)
        assert body["cost"] == {"forward_passes": 1 + forward, "backward_passes": max(copies, 1) * main}
        assert sum(net.calls) == body["cost"]["forward_passes"]
        # with noisy copies the curve is the first copy's, and the answer says so (its F at α = 1 is not the photo's);
        # a shared probe is the photo's own
        assert body["curve"]["input"] == ("noisy_copy" if copies else "photo")
        assert body["curve"]["probe_input"] == ("noisy_copy" if copies and not shared else "photo")
        if fields.get("preset") == "quality" and copies == PRESETS["idg"]["quality"]["smooth_samples"]:
            assert body["cost"]["forward_passes"] - 1 <= 400  # AGI's 2 x 20 passes x 10


async def test_models_lists_each_presets_settings_cost_and_standing(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        presets = (await client.get("/models")).json()["presets"]
        answer = await _attribute(client)  # the default answer: its cost is what /models says, in the same terms
    assert [p["name"] for p in presets][0] == "fast" and [p["default"] for p in presets] == [True, False, False]
    by_name = {p["name"]: p for p in presets}
    assert by_name["fast"]["parameters"]["idg"] == FAST
    # what a default answer costs, with the prediction: the probe once, the main pass per copy
    copies = max(COPIES, 1)  # the probe once where copies share it
    probes = FAST["probe_steps"] if FAST.get("smooth_probe") == "shared" else copies * FAST["probe_steps"]
    assert by_name["fast"]["cost"]["idg"] == {"forward_passes": 1 + probes + copies * FAST["steps"],
                                              "backward_passes": copies * FAST["steps"]}
    assert answer["cost"] == by_name["fast"]["cost"]["idg"]
    assert by_name["paper"]["cost"]["idg"] == {"forward_passes": 101, "backward_passes": 50}
    assert by_name["quality"]["cost"]["idg"]["forward_passes"] == 1 + 16 * (8 + 16)
    assert all("AGI" in p["standing"] for p in presets if p["name"] != "paper")


def test_the_metrics_label_names_the_presets_post_steps() -> None:
    from app.schemas import AttributeParams
    from app.service.render import method_label

    assert method_label(AttributeParams.model_validate({"preset": "quality"})) == "idg+rankmix+smoothgrad"
    assert method_label(AttributeParams.model_validate({"preset": "quality", "smooth_samples": 0})) == "idg+rankmix"
    assert method_label(AttributeParams.model_validate({"method": "ig", "preset": "quality"})) == "ig"
