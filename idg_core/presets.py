"""Cost presets: named step counts, chosen by measuring faithfulness against cost.

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
"""

from __future__ import annotations

from typing import Any, Literal, get_args

Preset = Literal["fast", "paper"]
PRESET_NAMES: tuple[str, ...] = get_args(Preset)
DEFAULT_PRESET: Preset = "fast"

# method -> preset -> the step parameters it sets
PRESETS: dict[str, dict[str, dict[str, int]]] = {
    "idg": {"fast": {"probe_steps": 8, "steps": 16}, "paper": {"probe_steps": 50, "steps": 50}},
    "ig": {"fast": {"steps": 50}, "paper": {"steps": 50}},
    "left_ig": {"fast": {"steps": 50}, "paper": {"steps": 50}},
    "guided_ig": {"fast": {"steps": 50}, "paper": {"steps": 50}},
    "agi": {"fast": {"max_iter": 20}, "paper": {"max_iter": 20}},
}


def preset_params(method: str, preset: str = DEFAULT_PRESET, **given: Any) -> dict[str, Any]:
    """The preset's step parameters for ``method``, overridden by any ``given`` that is not None."""
    if preset not in PRESET_NAMES:
        raise ValueError(f"preset must be one of {', '.join(PRESET_NAMES)}; got {preset!r}")
    if method not in PRESETS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(PRESETS)}")
    return {**PRESETS[method][preset], **{k: v for k, v in given.items() if v is not None}}
