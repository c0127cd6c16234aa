"""Cost presets: what they set, how explicit steps override them, and (slow) that ``fast`` keeps
IDG's faithfulness on real photos."""

from __future__ import annotations

import pytest

from benchmarks.samples import imagenet_photos, missing_imagenet_samples
from idg_core.methods import METHODS
from idg_core.model_calls import CallStats
from idg_core.presets import DEFAULT_PRESET, PRESETS, attribute, preset_cost, preset_for, preset_params, preset_post
from idg_evaluation.runner import EvalConfig, evaluate_image


def test_presets_name_steps_for_every_method_and_paper_is_the_papers() -> None:
    assert DEFAULT_PRESET == "balanced"
    # the default is fast's steps over two copies sharing the probe, times Grad-CAM's map; the others run their fast
    assert preset_params("idg") == preset_params("idg", "fast")
    assert preset_post("idg") == {"smooth_samples": 2, "smooth_probe": "shared", "smooth_std": 0.1, "postprocess": "cam_product"}
    assert all(PRESETS[m]["balanced"] == PRESETS[m]["fast"] for m in METHODS if m != "idg")
    assert preset_cost("idg").forward == 8 + 2 * 16 + 1 and preset_cost("idg").backward == 2 * 16 + 1
    assert preset_params("idg", "paper") == {"probe_steps": 50, "steps": 50}
    fast = preset_params("idg")
    assert fast["steps"] < 50 and fast["probe_steps"] < 50  # fast is cheaper than the paper
    assert set(PRESETS) == set(METHODS)  # read from each method's file


def test_explicit_steps_override_the_preset_and_none_does_not() -> None:
    assert preset_params("idg", "fast", steps=30, probe_steps=None) == {"probe_steps": PRESETS["idg"]["fast"]["probe_steps"], "steps": 30}
    assert preset_params("ig", "paper", steps=7) == {"steps": 7}


def test_a_preset_whose_grad_cam_step_the_model_cannot_take_runs_its_base() -> None:
    def none() -> None:
        raise ValueError("no spatial feature map")

    def found() -> None:
        return None

    assert preset_for("idg", "balanced", none) == "fast" and preset_for("idg", "balanced", found) == "balanced"
    assert preset_for("idg", "quality", none) == "quality"  # no Grad-CAM step: the model is not asked
    assert preset_for("ig", "balanced", none) == "balanced"  # ig's balanced is its fast, without Grad-CAM

    import torch

    class Pooled(torch.nn.Module):  # no module of its own: no map a CAM could read
        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return z.mean(dim=(2, 3))

    class Known(Pooled):
        def cam_target(self) -> None:
            none()

    stats = CallStats()
    attribute(Known().eval(), torch.rand(1, 3, 8, 8), "black", 1, stats=stats)  # the default on it: fast, counted
    assert (stats.forward_images, stats.backward_images) == (preset_cost("idg", "fast").forward, preset_cost("idg", "fast").backward)
    with pytest.raises(ValueError, match="spatial feature map"):  # a plain module's layer is only found in its call
        attribute(Pooled().eval(), torch.rand(1, 3, 8, 8), "black", 1)


def test_unknown_preset_or_method_is_a_value_error_that_names_the_choices() -> None:
    with pytest.raises(ValueError, match="fast, paper"):
        preset_params("idg", "quick")
    with pytest.raises(ValueError, match="unknown method"):
        preset_params("shap")


@pytest.mark.parametrize("preset", ["balanced", "fast", "quality"])
def test_a_preset_in_the_library_runs_its_steps_and_post_steps_at_the_cost_it_states(preset: str) -> None:
    """``attribute`` runs a preset as the service answers it (its post-steps included) at the cost :func:`preset_cost`
    states, counted in model passes; given smoothing shares the probe as asked, reproducible from its seed; ``idg()``
    alone runs the method's own parameters, without post-steps."""
    import torch

    from idg_core import CallStats, idg
    from idg_core.model_calls import run_plans
    from idg_core.postprocess import build_plan

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 8 * 8, 5)).eval()
    x, targets = torch.rand(3, 3, 8, 8), [1, 2, 3]
    stats = CallStats()
    res = attribute(model, x, "black", targets, preset=preset, stats=stats)
    bound = preset_cost("idg", preset)
    assert (stats.forward_images, stats.backward_images) == (3 * bound.forward, 3 * bound.backward) == (
        res.forward_passes, res.backward_passes)
    steps, post = preset_params("idg", preset), preset_post("idg", preset)
    copies, cam = post.get("smooth_samples", 0), int(post.get("postprocess") == "cam_product")
    probes = 1 if post.get("smooth_probe") == "shared" else max(copies, 1)  # copies sharing one probe, or each its own
    assert bound.forward == probes * steps["probe_steps"] + max(copies, 1) * steps["steps"] + cam  # and Grad-CAM's pass
    # copies sharing one probe of the image: the probe once, the same maps as the plans the service runs
    shared = {"smooth_samples": 2, "smooth_probe": "shared", "smooth_std": 0.15, "postprocess": None}
    stats = CallStats()
    mine = attribute(model, x, "black", targets, preset=preset, seed=7, stats=stats, **shared)
    assert stats.forward_images == 3 * (steps["probe_steps"] + 2 * steps["steps"])
    plans = [build_plan("idg", x[i], torch.zeros(3, 8, 8), t, smooth_seed=7, **shared, **steps) for i, t in enumerate(targets)]
    for i, one in enumerate(run_plans(model, plans, 8)):
        torch.testing.assert_close(mine.attributions[i], one.attributions[0])
    again = attribute(model, x, "black", targets, preset=preset, seed=8, **shared)
    assert not torch.allclose(again.attributions, mine.attributions)  # another draw of the noisy copies
    plain = CallStats()
    idg(model, x[:1], "black", 1, stats=plain)
    own = METHODS["idg"].validate()
    assert plain.forward_images == own["probe_steps"] + own["steps"] and plain.backward_images == own["steps"]
    with pytest.raises(ValueError, match="smooth_probe=shared needs"):
        attribute(model, x, "black", targets, preset=preset, uniform=True, **shared)  # a shared probe with none to share


@pytest.mark.slow
def test_fast_idg_is_no_less_faithful_than_ig50_on_sample_photos() -> None:
    """EfficientNet-Lite0 on the CPU, a few sample photos: insertion and deletion of IDG at the
    ``fast`` preset against IG-50 (the paper's IG), summed over the images."""
    from idg_models import load_model, tune

    photos = imagenet_photos(6)
    if not photos:
        pytest.skip(missing_imagenet_samples())
    model = tune(load_model("efficientnet_lite0").eval(), precision="fp32")
    cfg = EvalConfig(methods={"fast": ("idg", preset_params("idg") | preset_post("idg")),
                              "IG": ("ig", {"steps": 50, "rule": "uniform"})},
                     metrics=("insertion", "deletion"), rise_step=896, batch_size=8)
    records = [evaluate_image(model, p, None, cfg, None, seed=i) for i, p in enumerate(photos)]
    ins = {n: sum(r["methods"][n]["insertion"] for r in records) / len(records) for n in cfg.methods}
    dele = {n: sum(r["methods"][n]["deletion"] for r in records) / len(records) for n in cfg.methods}
    assert ins["fast"] >= ins["IG"] - 0.01, ins
    assert dele["fast"] <= dele["IG"] + 0.01, dele
