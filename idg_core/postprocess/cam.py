"""Grad-CAM's regions with any method's pixels: the CAM's coarse blobs read at a glance (what SIC and AIC reward), the
method's pixel order kept inside them (what insertion and deletion reward).

- ``cam_regions``: Grad-CAM's map (upsampled to the input) cut into :data:`LEVELS` bands of its largest value, each band's
  8-connected blobs ranked by CAM per pixel (mass over area), the pixels inside each blob by the method's saliency: XRAI's
  two-level order (:func:`idg_core.postprocess.xrai.ranked_map`). Values are ranks in (0, 1], spread over the channels.
  The blobs are the result's ``regions`` (each one's gain its mean CAM), as XRAI's are.
- ``cam_product``: the method's map times the CAM scaled to [0, 1] (Guided Grad-CAM's product); zero where the CAM is.
  A CAM with no positive value (a class the layer's features do not support: often a ``target`` other than the
  prediction) says nothing about where: the method's map stands alone, not a map of zeros, as ``cam_regions`` then
  makes one blob.

Cost: Grad-CAM's one forward and one backward pass on the photo (``target``'s logit), once whatever the noisy copies,
run beside the method's first model call (:data:`idg_core.budget.CAM_PASS`); a model needs a CAM layer, as for ``gradcam``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.lockstep import lockstep
from idg_core.methods.gradcam import gradcam_plan
from idg_core.postprocess.xrai import ranked_map
from idg_core.types import AttributionResult, Plan, Regions

LEVELS = 4
"""Bands of the CAM cut at 1/4, 1/2 and 3/4 of its largest value; each band's connected parts are the blobs."""


def cam_blobs(cam: np.ndarray, levels: int = LEVELS) -> tuple[np.ndarray, int]:
    """The blobs of ``cam (H, W)`` (>= 0): each pixel's blob rank ``(H, W)`` (1 the highest mean CAM; ties by band, then
    scan order) and the number of blobs. A map without a positive value is one blob."""
    from scipy import ndimage  # only when it runs: the server starts without SciPy

    top = float(cam.max())
    band = np.minimum((cam / top * levels).astype(np.int64), levels - 1) if top > 0 else np.zeros(cam.shape, np.int64)
    labels, count = np.zeros(cam.shape, np.int64), 0
    for k in range(levels - 1, -1, -1):
        part, n = ndimage.label(band == k, structure=np.ones((3, 3)))
        labels[part > 0] = part[part > 0] + count
        count += n
    mean = np.bincount(labels.ravel(), cam.ravel(), count + 1)[1:] / np.bincount(labels.ravel(), minlength=count + 1)[1:]
    rank = np.zeros(count + 1, np.int64)
    rank[np.argsort(-mean, kind="stable") + 1] = np.arange(1, count + 1)
    return rank[labels], count


def cam_combine(kind: str, cam: Tensor, attributions: Tensor) -> tuple[Tensor, Regions | None]:
    """``attributions (C, H, W)`` combined with the upsampled ``cam (H, W)`` (>= 0) by ``kind`` (:data:`CAM_POSTPROCESS`
    of :mod:`idg_core.budget`), in ``attributions``' dtype and device; with ``cam_regions``, the blobs as ranked regions
    too (each one's gain its mean CAM), as XRAI answers its own."""
    top = float(cam.max())
    if kind == "cam_product":
        return (attributions * (cam / top).to(attributions.dtype) if top > 0 else attributions.clone()), None
    heat = cam.detach().double().cpu().numpy()
    labels, count = cam_blobs(heat)
    value = ranked_map(labels, count, saliency(attributions).detach().double().cpu().numpy(), "regions_then_pixels")
    c = attributions.shape[0]
    areas = np.bincount(labels.ravel(), minlength=count + 1)[1:]
    gains = np.bincount(labels.ravel(), heat.ravel(), count + 1)[1:] / np.maximum(areas, 1)
    regions = Regions(torch.from_numpy(labels.astype(np.int32)), torch.from_numpy(gains), torch.from_numpy(areas.astype(np.int64)))
    return torch.from_numpy(value / c).to(attributions.device, attributions.dtype).expand_as(attributions).contiguous(), regions


def cam_plan(inner: Plan, x: Tensor, target: int, kind: str) -> Generator[Any, Any, AttributionResult]:
    """``inner`` (any method's plan, with its noisy copies) and Grad-CAM on ``x (C, H, W)`` in lock-step (the CAM's
    query joins the method's first call), the map combined by :func:`cam_combine`, the CAM's passes counted."""
    done: list[AttributionResult] = yield from lockstep([inner, gradcam_plan(x, x, target)])
    result, cam = done
    combined, regions = cam_combine(kind, cam.attributions[0].sum(0), result.attributions[0])
    result.attributions = combined.unsqueeze(0)
    result.regions = [] if regions is None else [regions]
    result.forward_passes += cam.forward_passes
    result.backward_passes += cam.backward_passes
    return result
