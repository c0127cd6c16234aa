"""Cost presets through the service: the default is ``balanced`` (``fast`` where the model has no layer Grad-CAM can
read), ``paper`` is 50/50, explicit steps override, the answer names the preset and the precision, and the model is
called exactly as often as the preset's steps say."""

from __future__ import annotations

import pytest

from app.core.config import Settings
from app.main import create_app
from idg_core.budget import CAM_POSTPROCESS
from idg_core.presets import DEFAULT_PRESET, PRESETS, preset_cost
from tests.models import steerable_classifier
from tests.service.conftest import AppFactory, image_bytes, serve


async def _attribute(client, **fields: str) -> dict:  # noqa: ANN001
    r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "idg", **fields})
    assert r.status_code == 200, r.text
    return r.json()


FAST = PRESETS["idg"]["fast"]
DEFAULT = PRESETS["idg"][DEFAULT_PRESET]
COPIES = DEFAULT.get("smooth_samples", 0)  # the default's noisy copies
CAM = DEFAULT.get("postprocess") in CAM_POSTPROCESS  # the default's product with Grad-CAM's map


@pytest.mark.parametrize(("fields", "probe", "main", "copies", "cam", "preset"), [
    ({}, DEFAULT["probe_steps"], DEFAULT["steps"], COPIES, CAM, DEFAULT_PRESET),
    ({"preset": "paper"}, 50, 50, 0, False, "paper"),
    ({"preset": "paper", "steps": "12"}, 50, 12, 0, False, "paper"),
    ({"steps": "6", "probe_steps": "5"}, 5, 6, COPIES, CAM, None),  # no preset named, the default's steps replaced
    ({"steps": "50"}, DEFAULT["probe_steps"], 50, COPIES, CAM, None),
    # copies sharing the probe: the default unless it sets its own smoothing, which these values would replace
    ({"smooth_samples": "2", "smooth_probe": "shared"}, DEFAULT["probe_steps"], DEFAULT["steps"], 2, CAM,
     None if "smooth_samples" in DEFAULT else DEFAULT_PRESET),
    ({"preset": "fast"}, FAST["probe_steps"], FAST["steps"], 0, False, "fast"),
    ({"preset": "fast", "steps": "50"}, FAST["probe_steps"], 50, 0, False, "fast"),
    ({"placement": "authors"}, DEFAULT["probe_steps"], DEFAULT["steps"], COPIES, CAM, DEFAULT_PRESET),
    ({"postprocess": "none"}, DEFAULT["probe_steps"], DEFAULT["steps"], COPIES, False, None if CAM else DEFAULT_PRESET),
])
async def test_the_preset_sets_the_steps_unless_given(
    tiny_app: AppFactory, fields: dict, probe: int, main: int, copies: int, cam: bool, preset: str | None,
) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        body = await _attribute(client, **fields)
        assert body["parameters"]["preset"] == preset
        assert (body["parameters"]["probe_steps"], body["parameters"]["steps"]) == (probe, main)
        assert body["parameters"].get("smooth_samples", 0) == copies
        assert (body["parameters"].get("postprocess") in CAM_POSTPROCESS) == cam
        assert len(body["curve"]["probe_alphas"]) == probe and len(body["curve"]["alphas"]) == main
        shared = body["parameters"].get("smooth_probe") == "shared" or not copies
        # copies sharing one probe of the photo pay it once and the main pass per copy; Grad-CAM one pass each way
        per_copy = main if shared else probe + main
        assert body["cost"] == {"forward_passes": 1 + (probe if shared else 0) + max(copies, 1) * per_copy + cam,
                                "backward_passes": max(copies, 1) * main + cam}
        assert sum(net.calls) == body["cost"]["forward_passes"]  # images through the model: prediction, probe, main passes
        assert body["curve"]["probe_input"] == ("photo" if shared else "noisy_copy")
        assert body["curve"]["input"] == ("noisy_copy" if copies else "photo")
        assert body["precision"] == "fp32"  # auto on the CPU


async def test_a_model_without_a_layer_grad_cam_can_read_runs_the_presets_base_and_says_so() -> None:
    # the steering model has no spatial feature map: the default's Grad-CAM product cannot run on it, so the default
    # answers fast (IDG alone) and names it; asked for by name, the same; a request's own cam_product is refused
    app = create_app(Settings(models=["steer"], warmup=False), models={"steer": steerable_classifier()})
    fast = preset_cost("idg", "fast")
    async with serve(app) as client:
        for fields in ({}, {"preset": DEFAULT_PRESET}):
            body = await _attribute(client, model="steer", **fields)
            assert body["parameters"]["preset"] == "fast" and "postprocess" not in body["parameters"], body["parameters"]
            assert "smooth_samples" not in body["parameters"]
            assert body["curve"]["input"] == "photo" and body["curve"]["probe_input"] == "photo"  # no noisy copy ran
            assert body["cost"] == {"forward_passes": 1 + fast.forward, "backward_passes": fast.backward}
        body = await _attribute(client, model="steer", steps="6")  # the default's steps replaced: no preset, as elsewhere
        assert body["parameters"]["preset"] is None and body["parameters"]["steps"] == 6
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                              data={"model": "steer", "postprocess": "cam_product"})
        assert r.status_code == 422 and "cannot explain model 'steer'" in r.json()["error"]["message"], r.text


async def test_uniform_under_the_default_runs_each_copy_without_a_probe(tiny_app: AppFactory) -> None:
    # the default's copies share IDG's probe; uniform=true runs none, so each copy runs as asked (not a 422 about a
    # smooth_probe the request never gave), and the answer says so
    async with serve(tiny_app()) as client:
        body = await _attribute(client, uniform="true", steps="6")
    used = body["parameters"]
    assert used["uniform"] is True and used.get("smooth_samples", 0) == COPIES
    if COPIES:
        assert used["smooth_probe"] == "own"
        assert body["curve"]["input"] == "noisy_copy" and body["curve"]["probe_input"] == "noisy_copy"  # no shared probe ran
    assert body["cost"] == {"forward_passes": 1 + max(COPIES, 1) * 6 + CAM, "backward_passes": max(COPIES, 1) * 6 + CAM}


async def test_an_unknown_preset_is_a_422_that_names_the_choices(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"preset": "turbo"})
        assert r.status_code == 422 and "preset" in r.json()["error"]["message"]
        assert "fast" in r.json()["error"]["message"] and "paper" in r.json()["error"]["message"]


@pytest.mark.parametrize(("fields", "copies", "post", "shared"), [
    ({"preset": "quality"}, PRESETS["idg"]["quality"]["smooth_samples"], "rankmix", False),
    ({"preset": "quality", "smooth_samples": "2", "postprocess": "none"}, 2, None, False),
    ({"preset": "quality", "postprocess": "idgi"}, PRESETS["idg"]["quality"]["smooth_samples"], "idgi", False),
    ({"preset": "fast"}, 0, None, False),
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
    assert [p["name"] for p in presets][0] == DEFAULT_PRESET and [p["default"] for p in presets] == [True, False, False, False]
    by_name = {p["name"]: p for p in presets}
    assert by_name[DEFAULT_PRESET]["parameters"]["idg"] == DEFAULT
    assert by_name["balanced"]["parameters"]["ig"] == by_name["fast"]["parameters"]["ig"]  # the others run their fast
    # what a default answer costs, with the prediction: the probe once, the main pass per copy, Grad-CAM's pass
    copies = max(COPIES, 1)  # the probe once where copies share it
    probes = DEFAULT["probe_steps"] if DEFAULT.get("smooth_probe") == "shared" else copies * DEFAULT["probe_steps"]
    assert by_name[DEFAULT_PRESET]["cost"]["idg"] == {"forward_passes": 1 + probes + copies * DEFAULT["steps"] + CAM,
                                                      "backward_passes": copies * DEFAULT["steps"] + CAM}
    assert answer["cost"] == by_name[DEFAULT_PRESET]["cost"]["idg"]
    assert by_name["fast"]["cost"]["idg"] == {"forward_passes": 1 + FAST["probe_steps"] + FAST["steps"],
                                              "backward_passes": FAST["steps"]}
    assert by_name["paper"]["cost"]["idg"] == {"forward_passes": 101, "backward_passes": 50}
    assert by_name["quality"]["cost"]["idg"]["forward_passes"] == 1 + 16 * (8 + 16)
    assert all("AGI" in p["standing"] for p in presets if p["name"] != "paper")


def test_the_metrics_label_names_the_presets_post_steps() -> None:
    from app.schemas import AttributeParams
    from app.service.render import method_label

    assert method_label(AttributeParams.model_validate({"preset": "quality"})) == "idg+rankmix+smoothgrad"
    assert method_label(AttributeParams.model_validate({"preset": "quality", "smooth_samples": 0})) == "idg+rankmix"
    assert method_label(AttributeParams.model_validate({"method": "ig", "preset": "quality"})) == "ig"
