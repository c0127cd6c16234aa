"""Faithfulness metrics, one file per metric, as a method is: each file declares its metric (:class:`Metric`: name,
direction, cost) and :data:`METRICS` lists them once. The machinery two metrics share is a module of its own:
:mod:`~idg_core.metrics.rise` (insertion, deletion), :mod:`~idg_core.metrics.pic` (SIC, AIC); ROAD's MoRF and LeRF
are one measurement in two directions, both in :mod:`~idg_core.metrics.road`; DiffID is derived from insertion and
deletion. :mod:`~idg_core.metrics.curves` holds :class:`Metric` and the result types.

Adding a metric: write ``metrics/<name>.py`` ending in ``<NAME> = Metric(...)``, and add it to :data:`METRICS`."""

from idg_core.metrics.aic import AIC
from idg_core.metrics.curves import SKIP_RULES, Curve, Metric, Skipped, auc_trapezoid, mean_ci
from idg_core.metrics.deletion import DELETION, deletion
from idg_core.metrics.diffid import DIFFID, diffid
from idg_core.metrics.insertion import INSERTION, insertion
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
from idg_core.metrics.rise import gaussian_blur
from idg_core.metrics.road import ROAD_LERF, ROAD_MORF
from idg_core.metrics.sic import SIC

METRICS: dict[str, Metric] = {m.name: m for m in (INSERTION, DELETION, SIC, AIC, DIFFID, ROAD_MORF, ROAD_LERF)}
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
    "diffid",
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
