"""RankMix: a straight-path method's own map and its IDGI map (:mod:`idg_core.postprocess.idgi`), both from the
same gradient pass, each pixel's rank in the two saliencies averaged.

Why (``results/evaluation-rankmix/``): IDGI weighs each pixel by its squared gradient, blind to how far the pixel is
from the baseline, where IG-family maps multiply by ``x - x'``; its top pixels lie nearer the baseline, so deleting
them moves the image least, and IDGI's maps lose on the deletion metric what they win on insertion, SIC and AIC.
Averaging the two orders keeps most of both. It costs no model pass beyond the method's own.

The map it returns is a rank score, not an additive attribution: ``(1 - w) · rank(own) + w · rank(IDGI)`` per pixel
(ranks in [0, 1], 1 the most salient), spread evenly over the channels, non-negative; its sum is not ``F(x) - F(x')``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.postprocess.idgi import idgi_plan
from idg_core.types import AttributionResult, Plan

WEIGHT = 0.5
"""IDGI's weight in the average (0: the method's own order, 1: IDGI's), as measured (``results/evaluation-65/``)."""


def ranks(sal: Tensor) -> Tensor:
    """Each pixel's place in ``sal (H, W)``'s order, 0 (least) to 1 (most salient), float64, on ``sal``'s device. Equal
    values share their places' mean (a flat patch is not ordered by where its pixels lie); a map with no order at all
    (every value equal: a photo at its baseline) ranks every pixel 0."""
    flat = sal.flatten().double()
    values, order = torch.sort(flat, stable=True)
    _, group, counts = torch.unique_consecutive(values, return_inverse=True, return_counts=True)
    if len(counts) == 1:
        return torch.zeros_like(flat).view(sal.shape)
    last = counts.cumsum(0) - 1
    mean_place = (last - (counts - 1) / 2).double()  # the mean of first..last places of each run of equal values
    r = torch.empty_like(flat)
    r[order] = mean_place[group] / max(flat.numel() - 1, 1)
    return r.view(sal.shape)


def with_idgi(inner: Plan) -> Generator[Any, Any, AttributionResult]:
    """``inner`` (a straight-path method's plan) with IDGI, its attributions ``(1, 2C, H, W)``: the method's own map,
    then IDGI's (SmoothGrad around it averages both halves alike)."""
    own: list[Tensor] = []

    def keep() -> Generator[Any, Any, AttributionResult]:
        result = yield from inner
        own.append(result.attributions.clone())
        return result

    result = yield from idgi_plan(keep())
    result.attributions = torch.cat([own[0], result.attributions], dim=1)
    return result


def rank_mix(both: Tensor, weight: float = WEIGHT) -> Tensor:
    """``(1, C, H, W)``: the rank average of the two maps of ``both (1, 2C, H, W)`` (:func:`with_idgi`'s), each pixel's
    score spread evenly over the C channels, in ``both``'s dtype and device."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the RankMix weight must be in [0, 1], got {weight}")
    c = both.shape[1] // 2
    own, idgi = saliency(both[0, :c]), saliency(both[0, c:])
    mixed = (1.0 - weight) * ranks(own) + weight * ranks(idgi)
    return (mixed / c).to(both.dtype).expand(c, -1, -1).unsqueeze(0).contiguous()


def rankmix_plan(both: Plan, weight: float = WEIGHT) -> Generator[Any, Any, AttributionResult]:
    """``both`` (a :func:`with_idgi` plan, or SmoothGrad over such plans) with its two maps rank-averaged."""
    result = yield from both
    result.attributions = rank_mix(result.attributions, weight)
    return result
