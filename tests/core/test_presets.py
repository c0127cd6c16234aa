"""Cost presets: what they set, how explicit steps override them, and (slow) that ``fast`` keeps
IDG's faithfulness on real photos."""

from __future__ import annotations

import pytest

from benchmarks.samples import imagenet_photos, missing_imagenet_samples
from idg_core.methods import METHODS
from idg_core.presets import DEFAULT_PRESET, PRESETS, preset_params
from idg_evaluation.runner import EvalConfig, evaluate_image


def test_presets_name_steps_for_every_method_and_paper_is_the_papers() -> None:
    assert DEFAULT_PRESET == "fast"
    assert preset_params("idg", "paper") == {"probe_steps": 50, "steps": 50}
    fast = preset_params("idg")
    assert fast["steps"] < 50 and fast["probe_steps"] < 50  # fast is cheaper than the paper
    assert set(PRESETS) == set(METHODS)  # read from each method's file


def test_explicit_steps_override_the_preset_and_none_does_not() -> None:
    assert preset_params("idg", "fast", steps=30, probe_steps=None) == {"probe_steps": PRESETS["idg"]["fast"]["probe_steps"], "steps": 30}
    assert preset_params("ig", "paper", steps=7) == {"steps": 7}


def test_unknown_preset_or_method_is_a_value_error_that_names_the_choices() -> None:
    with pytest.raises(ValueError, match="fast, paper"):
        preset_params("idg", "quick")
    with pytest.raises(ValueError, match="unknown method"):
        preset_params("shap")


@pytest.mark.slow
def test_fast_idg_is_no_less_faithful_than_ig50_on_sample_photos() -> None:
    """EfficientNet-Lite0 on the CPU, a few sample photos: insertion and deletion of IDG at the
    ``fast`` preset against IG-50 (the paper's IG), summed over the images."""
    from idg_models import load_model, tune

    photos = imagenet_photos(6)
    if not photos:
        pytest.skip(missing_imagenet_samples())
    model = tune(load_model("efficientnet_lite0").eval(), precision="fp32")
    cfg = EvalConfig(methods={"fast": ("idg", preset_params("idg", "fast")), "IG": ("ig", {"steps": 50, "rule": "uniform"})},
                     metrics=("insertion", "deletion"), rise_step=896, batch_size=8)
    records = [evaluate_image(model, p, None, cfg, None, seed=i) for i, p in enumerate(photos)]
    ins = {n: sum(r["methods"][n]["insertion"] for r in records) / len(records) for n in cfg.methods}
    dele = {n: sum(r["methods"][n]["deletion"] for r in records) / len(records) for n in cfg.methods}
    assert ins["fast"] >= ins["IG"] - 0.01, ins
    assert dele["fast"] <= dele["IG"] + 0.01, dele
