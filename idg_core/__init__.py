"""idg_core: Integrated Decision Gradients and the baselines it is compared against.

Models are callables ``(B, C, H, W)`` images in [0, 1] -> ``(B, num_classes)`` logits; every method
takes a batch of images with one target each and returns an :class:`AttributionResult`.
"""

import logging

from idg_core.heatmap import heatmap_png, overlay_png, saliency
from idg_core.methods import (
    METHODS,
    InvalidParameter,
    Method,
    agi,
    eg,
    gradcam,
    gradcam_pp,
    guided_ig,
    idg,
    idg_eg,
    ig,
    la,
    left_ig,
    spectral_ig,
)
from idg_core.model_calls import CallStats, default_batch_size, evaluate_queries, run_plans
from idg_core.paths import allocate_samples, ig_rule, place_samples, resolve_baseline
from idg_core.types import Answer, AttributionResult, Model, Plan, Query

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "METHODS",
    "Answer",
    "AttributionResult",
    "CallStats",
    "InvalidParameter",
    "default_batch_size",
    "Method",
    "Model",
    "Plan",
    "Query",
    "agi",
    "allocate_samples",
    "eg",
    "evaluate_queries",
    "gradcam",
    "gradcam_pp",
    "guided_ig",
    "heatmap_png",
    "idg",
    "idg_eg",
    "ig",
    "ig_rule",
    "la",
    "left_ig",
    "overlay_png",
    "place_samples",
    "resolve_baseline",
    "run_plans",
    "saliency",
    "spectral_ig",
]
