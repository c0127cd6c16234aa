"""The evaluation's RankMix rows at any weight (``idgi_mix``: IDGI's weight, 0: the method's map's order, 1: IDGI's;
the library's post-step, :mod:`idg_core.postprocess.rankmix`, is the same at its fixed weight)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from torch import Tensor

from idg_core.methods import METHODS
from idg_core.postprocess.rankmix import rankmix_plan, with_idgi
from idg_core.postprocess.smoothgrad import noisy_copies, smooth_plan
from idg_core.types import AttributionResult, Plan


def idgi_mix_plan(method: str, x: Tensor, baseline: Tensor, target: int, *, idgi_mix: float, smooth_samples: int = 0,
                  smooth_std: float = 0.15, smooth_seed: int = 0, **kwargs: Any) -> Generator[Any, Any, AttributionResult]:
    """The plan of ``method`` (a straight-path method, ``kwargs`` its parameters) on ``x``, SmoothGrad over
    ``smooth_samples`` copies when > 0, returning the rank average ``(1 - idgi_mix) · rank(own) + idgi_mix ·
    rank(IDGI)`` of the two smoothed maps' saliencies, spread evenly over the channels (non-negative)."""
    if not 0.0 <= idgi_mix <= 1.0:
        raise ValueError(f"idgi_mix must be in [0, 1], got {idgi_mix}")
    kwargs.pop("postprocess", None)  # IDGI is computed here, beside the method's own map

    def one(xi: Tensor) -> Plan:
        return with_idgi(METHODS[method].plan(xi, baseline, target, **kwargs))

    plan = smooth_plan([one(xi) for xi in noisy_copies(x, smooth_samples, smooth_std, smooth_seed)]) if smooth_samples else one(x)
    return (yield from rankmix_plan(plan, idgi_mix))
