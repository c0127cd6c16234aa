"""A Gaussian blur of the finished map: the evaluation's control for SmoothGrad. Blurring a map alone
can raise removal-based scores (Gomez et al. 2023, https://arxiv.org/abs/2304.13836), so a blurred
IDG map beside IDG+SmoothGrad shows how much of SmoothGrad's gain is more than smoothing. No model pass."""

from __future__ import annotations

from idg_core.methods.eg import gaussian_blur
from idg_core.types import AttributionResult, Plan


def blur_plan(inner: Plan, sigma: float) -> Plan:
    """``inner``'s plan with its attributions blurred per channel by a Gaussian of ``sigma`` pixels."""
    if sigma < 0:
        raise ValueError(f"blur_sigma must be >= 0, got {sigma}")
    result: AttributionResult = yield from inner
    result.attributions = gaussian_blur(result.attributions[0], sigma).unsqueeze(0)
    return result
