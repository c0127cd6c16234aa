"""Faithfulness metrics: RISE insertion/deletion, PIC (SIC/AIC) and ROAD, with one curve type; each file declares its
metrics (:class:`Metric`) and :data:`METRICS` lists them once."""

from idg_core.metrics.curves import SKIP_RULES, Curve, Metric, Skipped, auc_trapezoid, mean_ci
from idg_core.metrics.pic import (
    AIC,
    PIC_THRESHOLDS,
    SIC,
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
from idg_core.metrics.rise import DELETION, INSERTION, deletion, gaussian_blur, insertion
from idg_core.metrics.road import ROAD_LERF, ROAD_MORF

METRICS: dict[str, Metric] = {m.name: m for m in (INSERTION, DELETION, SIC, AIC, ROAD_MORF, ROAD_LERF)}
"""Every faithfulness metric by name, in the evaluation's column order: a new metric is its file and one entry here."""

__all__ = [
    "METRICS",
    "Metric",
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
