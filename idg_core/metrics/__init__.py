"""Faithfulness metrics: RISE insertion/deletion and PIC (SIC/AIC), with one curve type."""

from idg_core.metrics.curves import SKIP_RULES, Curve, Skipped, auc_trapezoid, mean_ci
from idg_core.metrics.pic import (
    PIC_THRESHOLDS,
    blur_from_known_pixels,
    original_confidence,
    pic_curve,
    pic_many,
    pic_pool,
    pic_rebuilds,
    pic_scores,
    random_pixel_mask,
    to_uint8,
    webp_size,
)
from idg_core.metrics.rise import deletion, gaussian_blur, insertion

__all__ = [
    "PIC_THRESHOLDS",
    "Curve",
    "SKIP_RULES",
    "Skipped",
    "auc_trapezoid",
    "blur_from_known_pixels",
    "deletion",
    "gaussian_blur",
    "insertion",
    "mean_ci",
    "original_confidence",
    "pic_curve",
    "pic_many",
    "pic_pool",
    "pic_rebuilds",
    "pic_scores",
    "random_pixel_mask",
    "to_uint8",
    "webp_size",
]
