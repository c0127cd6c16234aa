"""Cost presets: named settings every method declares in its file (``Method.presets``), chosen by
measuring faithfulness against cost. This module reads them back from the registry.

``paper`` is the paper's setting for every method (IDG N = M = 50, 50 steps elsewhere). ``fast``
is the cheapest IDG whose insertion and deletion stay within noise of IDG-50/50 and are not worse
than IG-50, paired per image on the 65 sample photos (``python -m idg_evaluation --suite cost``):
IDG 8 probe / 16 main steps, 24 forward + 16 gradient passes instead of 100 + 50, the cheapest setting that
passes on EfficientNet-Lite0, Lite1 and Lite2 (the tables, with the metrics' saliency ranking too:
docs/results/faithfulness.md). Only IDG was tuned for ``fast``: the other methods keep their paper settings under it.
Explicit ``steps``/``probe_steps`` override a preset.

``quality`` adds post-steps: for IDG it is ``fast``'s steps with RankMix (the map and its IDGI map rank-averaged)
inside and SmoothGrad over 16 noisy copies (σ 0.15) around it, 16 × (8 + 16) = 384 forward and 256 gradient passes,
within the cap of ten times AGI's 40. Chosen on the 65 sample photos by the report's rule
(:func:`idg_evaluation.report.first_or_tied`): within the cap, first or tied within the 95% interval on
insertion, deletion, SIC, AIC and DiffID against AGI, IDG-50/50 and Spectral IG (the tables:
docs/results/faithfulness.md). The other methods run their paper settings under it.
A request's own ``postprocess`` / ``smooth_*`` override the preset's.
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
