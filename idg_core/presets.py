"""Cost presets: named settings every method declares in its file (``Method.presets``), chosen by
measuring faithfulness against cost. This module reads them back from the registry.

``paper`` is the paper's setting for every method (IDG N = M = 50, 50 steps elsewhere). ``fast``
is the cheapest IDG whose insertion and deletion stay within noise of IDG-50/50 and are not worse
than IG-50, paired per image on the 65 sample photos (``python -m idg_core.evaluation --suite cost``;
table in ``results/cost-efficientnet_lite0/cost.md``). On EfficientNet-Lite0 (all 65 samples, IEEE fp32)
IDG 8 probe / 16 main steps is that row: against IDG-50/50 insertion −0.003 ± 0.006 and deletion −0.002 ± 0.005
(> 0 favours 8/16), against IG-50 +0.032 ± 0.017 and +0.023 ± 0.012, at 24 forward + 16 gradient passes instead
of 100 + 50; IDG 8/8 loses insertion to IDG-50/50 (−0.012 ± 0.007). On Lite1 and Lite2 (65 samples each,
``results/cost-efficientnet_lite1|2/``) 8/16 meets the rule too, and 8/8 fails it on Lite2: 8/16 is the cheapest
setting that passes on all three. Only IDG was measured for ``fast``: the
other methods keep their paper settings under it. Explicit ``steps``/``probe_steps`` override a preset.

``quality`` adds post-steps: for IDG it is ``fast``'s steps with IDGI inside and SmoothGrad over 16 noisy
copies (σ 0.15) around it, 16 × (8 + 16) = 384 forward and 256 gradient passes, within the cap of ten times
AGI's 40. Chosen by issue #31's table (all 65 sample photos, EfficientNet-Lite0 with the service's CPU
settings, 16 rows: ``results/evaluation-quality/``) by the report's rule: among rows within the cap and ahead
of AGI in the mean on insertion, deletion, SIC and AIC, the most firsts, then the best mean rank, then the
fewest passes. No row is first on all four; this one ranks 3rd, 14th, 2nd, 2nd of 16, and against AGI gains
insertion +0.037 ± 0.032, deletion +0.001 ± 0.022, SIC +0.052 ± 0.042, AIC +0.049 ± 0.056 (paired, 95%).
Deletion resists: IDG+SmoothGrad without IDGI leads it by 0.035 ± 0.016. The other methods
run their paper settings under it. A request's own ``postprocess`` / ``smooth_*`` override the preset's.
"""

from __future__ import annotations

from typing import Any

from idg_core.methods import DEFAULT_PRESET, METHODS, PRESET_NAMES, Method, Preset

__all__ = ["DEFAULT_PRESET", "PRESETS", "PRESET_NAMES", "Preset", "preset_params", "preset_post"]

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    name: {preset: dict(m.presets.get(preset, {})) for preset in PRESET_NAMES} for name, m in METHODS.items()
}
"""method -> preset -> what it sets (read from each method's file; a preset a method does not declare is empty)."""


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
