"""A faithfulness score for one map, as a plan fragment: RISE insertion and deletion
(:mod:`idg_core.metrics.rise`) with ``steps`` coarse steps, its forward passes yielded as queries so
that whoever drives the plan pools them with other work.

Cost: ``steps + 1`` forward passes per metric (the last insertion image and the first deletion image
are the photo itself), no gradient; 2 × 29 = 58 for both metrics at the default 28 steps. The AUCs
equal :func:`idg_core.metrics.insertion` / :func:`idg_core.metrics.deletion` with
``step = ceil(H·W / steps)`` pixels per step.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence

import numpy as np
import torch
from torch import Tensor

from idg_core.budget import pixels_per_step
from idg_core.heatmap import saliency
from idg_core.metrics import METRICS
from idg_core.metrics.curves import auc_trapezoid
from idg_core.metrics.rise import gaussian_blur, moved_at
from idg_core.preprocess import IMAGENET_MEAN, IMAGENET_STD
from idg_core.types import Answer, Query

FAITHFULNESS_METRICS = tuple(name for name, m in METRICS.items() if m.service)
"""What the service's ``faithfulness`` field may name (:data:`idg_core.metrics.METRICS`' ``service``)."""
DEFAULT_FAITHFULNESS_STEPS = 28


def parse_metrics(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"insertion,deletion"`` (either or both, any order) -> the metrics in canonical order; ValueError otherwise."""
    if value is None:
        return ()
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    unknown = [v for v in items if v not in FAITHFULNESS_METRICS]
    if unknown:
        raise ValueError(f"faithfulness must be insertion, deletion or both (comma-separated), got {unknown[0]!r}")
    return tuple(m for m in FAITHFULNESS_METRICS if m in items)


def game_images(start: Tensor, finish: Tensor, sal: Tensor, step: int) -> Tensor:
    """``(n, C, H, W)``: from ``start`` to ``finish`` (``(C, H, W)``), moving the ``step`` most salient
    pixels of ``sal (H, W)`` at a time (ties by index), as :mod:`idg_core.metrics.rise` does."""
    c, h, w = start.shape
    n = math.ceil(h * w / step) + 1
    ks = torch.arange(n, device=start.device).view(-1, 1, 1, 1)
    mask = (moved_at(sal.unsqueeze(0).to(start.device), step) <= ks).to(start.dtype)  # (n, 1, H, W)
    return start.unsqueeze(0) * (1 - mask) + finish.unsqueeze(0) * mask


def faithfulness_plan(
    x: Tensor, attribution: Tensor, predicted: int, *, metrics: Sequence[str] = FAITHFULNESS_METRICS,
    steps: int = DEFAULT_FAITHFULNESS_STEPS, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
) -> Generator[list[Query], list[Answer], dict[str, float]]:
    """Plan fragment (``yield from`` it): insertion / deletion AUCs of ``attribution (C, H, W)`` on
    ``x (C, H, W)``, scored as the softmax probability of ``predicted`` (the model's class on ``x``,
    as RISE does). Returns ``{"insertion": auc, "deletion": auc, "steps": n}`` for the metrics asked."""
    metrics = parse_metrics(list(metrics))
    _, h, w = x.shape
    step = pixels_per_step(h, w, steps)
    sal = saliency(attribution).to(x.device)
    games: list[tuple[str, Tensor]] = []
    for m in metrics:
        if m == "insertion":
            games.append((m, game_images(gaussian_blur(x.unsqueeze(0), mean, std)[0], x, sal, step)))
        else:
            substrate = torch.tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1).expand_as(x)
            games.append((m, game_images(x, substrate, sal, step)))
    if not games:
        return {}
    answers = yield [Query.at(imgs, predicted, grad=False, output="probability", label=f"faithfulness {m}") for m, imgs in games]
    out: dict[str, float] = {}
    for (m, imgs), ans in zip(games, answers, strict=True):
        probs = ans.values.detach().float().cpu().numpy().astype(np.float64)
        out[m] = float(auc_trapezoid(probs))
        out["steps"] = imgs.shape[0] - 1
    return out
