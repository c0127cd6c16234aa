"""Cost presets: named settings every method declares in its file (``Method.presets``), chosen by
measuring faithfulness against cost. This module reads them back from the registry, with what each
costs (:func:`preset_cost`) and where it stands (:data:`PRESET_STANDING`); docs/methods/presets.md has the tables.

``balanced`` is the service's default answer. For IDG it is ``fast``'s 8 probe / 16 main steps over two noisy copies
(noise 0.1) sharing one probe, times Grad-CAM's map: 41 forward + 33 gradient passes (42 with the prediction). It is the
only setting within 50 passes that is first or tied on insertion, deletion, SIC, AIC and DiffID against AGI, IDG-50/50,
Spectral IG and Grad-CAM, paired per image on the 65 sample photos (:func:`idg_evaluation.report.first_or_tied`), on
EfficientNet-Lite0, Lite1 and Lite2 (results/region-search-2026-12-02/). Grad-CAM's map gives the answer its regions (what
SIC and AIC reward); IDG's pixels keep their order inside them (what deletion rewards). A method that does not declare
``balanced`` runs its ``fast``, and so does IDG on a model without a layer Grad-CAM can read (:func:`preset_for`).
``fast`` is IDG 8/16 alone, 24 forward + 16 gradient passes: the cheapest IDG whose insertion and deletion stay within
noise of IDG-50/50 and are not worse than IG-50 (``python -m idg_evaluation --suite cost``), behind Grad-CAM on SIC and AIC.
``paper`` is the paper's setting for every method (IDG N = M = 50, 50 steps elsewhere). ``quality`` is ``fast``'s
steps with RankMix (the map and its IDGI map rank-averaged) inside and SmoothGrad over 16 noisy copies (σ 0.15)
around it, 16 × (8 + 16) = 384 forward and 256 gradient passes, within ten times AGI's 40, first or tied against AGI,
IDG-50/50 and Spectral IG on Lite0 and Lite1; on Lite2 behind IDG-50/50 on insertion, and behind Grad-CAM on SIC. Only
IDG's presets were chosen by measurement here; the other methods declare theirs in their files (fewer steps under
``fast`` for EG, IDG-EG, LA and Spectral IG).
Explicit ``steps``/``probe_steps`` and a request's own ``postprocess`` / ``smooth_*`` override a preset's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import Tensor

from idg_core.budget import CAM_POSTPROCESS, WorkBound, postprocess_bound
from idg_core.methods import DEFAULT_PRESET, METHODS, POST_STEPS, PRESET_BASE, PRESET_NAMES, Method, Preset, run_method
from idg_core.methods._cam import check_cam_model
from idg_core.model_calls import CallStats
from idg_core.postprocess import build_plan
from idg_core.types import AttributionResult, BaselineLike, Model, Plan

__all__ = ["DEFAULT_PRESET", "PRESETS", "PRESET_BASE", "PRESET_NAMES", "PRESET_STANDING", "PRESET_SUMMARY", "ROWS",
           "SMOOTH_PRODUCT", "Preset", "attribute", "preset_cost", "preset_for", "preset_params", "preset_post", "row_post"]

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    name: {preset: m.preset_values(preset) for preset in PRESET_NAMES} for name, m in METHODS.items()
}
"""method -> preset -> what it sets (read from each method's file; a preset a method does not declare: its
:data:`PRESET_BASE`'s, else empty)."""


def _method(method: str) -> Method:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    return METHODS[method]


def preset_params(method: str, preset: str = DEFAULT_PRESET, **given: Any) -> dict[str, Any]:
    """The method parameters ``preset`` sets for ``method``, overridden by any ``given`` that is not None."""
    values = _method(method).preset(preset)
    return {**values, **{k: v for k, v in given.items() if v is not None}}


def preset_post(method: str, preset: str = DEFAULT_PRESET) -> dict[str, Any]:
    """The post-steps (``postprocess``, ``smooth_*``) ``preset`` adds for ``method``; empty for most."""
    return _method(method).preset_post(preset)


def preset_for(method: str, preset: str, cam_layer: Callable[[], object]) -> str:
    """The preset ``method`` runs for ``preset`` on a model: ``preset`` itself, or its :data:`PRESET_BASE` where the
    preset's post-step is Grad-CAM's and ``cam_layer()`` (the model's check, :func:`idg_core.methods._cam.check_cam_model`)
    raises the ``ValueError`` saying the model has no layer Grad-CAM can read (a vision transformer)."""
    if preset_post(method, preset).get("postprocess") not in CAM_POSTPROCESS or preset not in PRESET_BASE:
        return preset
    try:
        cam_layer()
    except ValueError:
        return PRESET_BASE[preset]
    return preset


PRESET_SUMMARY: dict[str, str] = {
    "balanced": "the default: IDG 8 probe / 16 main steps over 2 noisy copies sharing the probe (noise 0.1), times "
                "Grad-CAM's map; fast where the model has no layer Grad-CAM can read, and for the other methods",
    "fast": "IDG 8 probe / 16 main steps",
    "paper": "the paper's settings: IDG 50 probe / 50 main steps, 50 steps for the other methods",
    "quality": "IDG 8 probe / 16 main steps with RankMix, SmoothGrad over 16 noisy copies (noise 0.15)",
}
"""What each preset sets for IDG, in a line (the other methods' presets are in their files and :data:`PRESETS`)."""

PRESET_STANDING: dict[str, str] = {
    "balanced": "first or tied on insertion, deletion, SIC, AIC and DiffID against AGI, IDG-50/50, Spectral IG and Grad-CAM "
                "on the 65 sample photos (EfficientNet-Lite0, Lite1, Lite2; results/region-search-2026-12-02); ahead of "
                "Grad-CAM on deletion and DiffID, tied on SIC and AIC; not yet measured on photos outside the samples",
    "fast": "insertion and deletion within noise of IDG-50/50 and ahead of IG-50 on the 65 sample photos (EfficientNet-Lite0, "
            "Lite1, Lite2); behind AGI on SIC and AIC on Lite1 and on photos outside the samples (docs/methods/presets.md)",
    "paper": "the paper's IDG-50/50, one of the references the other presets are measured against (docs/methods/presets.md)",
    "quality": "first or tied on insertion, deletion, SIC, AIC and DiffID against AGI, IDG-50/50 and Spectral IG on the 65 "
               "sample photos for Lite0 and Lite1 and on 100 photos outside them; on Lite2 behind IDG-50/50 on insertion "
               "(-0.018 +- 0.016) and ahead on SIC and AIC; ahead of fast on SIC and AIC (docs/methods/presets.md)",
}
"""Where each preset stands in the measurements that chose it, in a line (the tables: docs/methods/presets.md)."""


SMOOTH_PRODUCT = "idg@fast+SmoothGrad+cam_product:smooth_samples=2,smooth_probe=shared,smooth_std=0.1"
"""IDG fast over two noisy copies sharing its probe (noise 0.1), times Grad-CAM's map (41 forward passes): the row of the
region search (results/region-search-2026-12-02/) first or tied on all five metrics against AGI, IDG 50/50, Spectral IG
and Grad-CAM on Lite0's 65 sample photos."""
_LITE0 = ("65 sample photos, Lite0, results/region-search-2026-12-02 (insertion / deletion / SIC / AIC; fast: 0.567 / 0.121 / "
          "0.478 / 0.610): ")
ROWS: dict[str, tuple[dict[str, str], str]] = {
    "gradcam": ({"method": "gradcam"}, _LITE0 + "0.591 / 0.208 / 0.632 / 0.730, ahead of AGI, IDG 50/50 and Spectral IG on SIC "
                "and AIC, behind them on deletion; on 100 photos outside the samples against fast: ahead on SIC (+0.167 +- "
                "0.051) and AIC (+0.167 +- 0.062), tied on insertion, behind on deletion (0.200 against 0.103)"),
    "gradcam_pp": ({"method": "gradcam_pp"}, "not measured: no faithfulness run of it yet"),
    "idg@fast+XRAI": ({"method": "idg", "preset": "fast", "postprocess": "xrai"}, _LITE0 + "0.570 / 0.248 / 0.592 / 0.710, "
                      "ahead of AGI, IDG 50/50 and Spectral IG on SIC and AIC, behind every reference on deletion and DiffID"),
    "idg@fast+cam_regions": ({"method": "idg", "preset": "fast", "postprocess": "cam_regions"}, _LITE0 + "0.597 / 0.172 / "
                             "0.625 / 0.708, tied with Grad-CAM on SIC and AIC, behind IDG 50/50 and Spectral IG on deletion"),
    "idg@fast+cam_product": ({"method": "idg", "preset": "fast", "postprocess": "cam_product"}, _LITE0 + "0.603 / 0.120 / "
                             "0.573 / 0.657, first or tied against AGI, IDG 50/50 and Spectral IG on all five, behind Grad-CAM "
                             "on SIC (-0.059 +- 0.046) and AIC (-0.073 +- 0.072)"),
    SMOOTH_PRODUCT: ({"method": "idg", "preset": "fast", "smooth_samples": "2", "smooth_probe": "shared", "smooth_std": "0.1",
                      "postprocess": "cam_product"}, _LITE0 + "0.600 / 0.115 / 0.593 / 0.685, first or tied against AGI, IDG "
                     "50/50, Spectral IG and Grad-CAM on insertion, deletion, SIC, AIC and DiffID: the rule, met on Lite0, Lite1 "
                     "and Lite2 (65 photos each; results/region-search-2026-12-02/README.md); the balanced preset, the default"),
}
"""Rows beside the presets, by the evaluation's row name: the request fields that ask for each, and where it stands
(docs/methods/xrai.md has the table)."""


def preset_cost(method: str, preset: str = DEFAULT_PRESET, postprocess: str | None = None, **post: Any) -> WorkBound:
    """The most model passes one image's ``method`` costs at ``preset``, its post-steps included (``postprocess`` and
    ``post``'s ``smooth_*``: over the preset's), without the prediction the service makes first."""
    spec = _method(method)
    steps = spec.preset_post(preset) | ({"postprocess": postprocess} if postprocess else {}) | post
    return postprocess_bound(spec.bound(spec.validate(**spec.preset(preset))), steps)


def row_post(fields: Mapping[str, str]) -> dict[str, Any]:
    """The post-steps a row's request fields (:data:`ROWS`, form text) ask for, typed as :func:`attribute` takes them."""
    types: dict[str, Callable[[str], Any]] = {"smooth_samples": int, "smooth_std": float}
    return {k: types.get(k, str)(v) for k, v in fields.items() if k in POST_STEPS}


def attribute(model: Model, x: Tensor, baseline: BaselineLike, target: int | Tensor | Iterable[int], *, method: str = "idg",
              preset: str = DEFAULT_PRESET, seed: int = 0, batch_size: int | None = None, stats: CallStats | None = None,
              **given: Any) -> AttributionResult:
    """``method`` at ``preset`` with the preset's post-steps, as the service answers it: at the default preset, the
    service's default answer (``idg()`` alone runs the method's own defaults, without post-steps). ``given``: method
    parameters and post-steps (``postprocess``, ``smooth_*``) over the preset's; ``seed``: the noisy copies' draw (the
    service's ``seed``). Batched like the methods' functions (one plan per image, their points pooled). A preset whose
    Grad-CAM step the model cannot take runs its base (:func:`preset_for`; a plain ``nn.Module``'s layer is only found
    in its call: without one, the call's ``ValueError`` says so)."""
    spec = _method(method)
    preset = preset_for(method, preset, lambda: check_cam_model(model))
    post = {**spec.preset_post(preset), **{k: v for k, v in given.items() if k in POST_STEPS}}
    params = preset_params(method, preset, **{k: v for k, v in given.items() if k not in POST_STEPS})

    def plan(xi: Tensor, base: Tensor, t: int, **kwargs: Any) -> Plan:
        return build_plan(method, xi, base, t, smooth_seed=seed, **post, **kwargs)

    return run_method(plan, model, x, baseline, target, batch_size, stats, **params)
