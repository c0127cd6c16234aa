"""RISE deletion (Petsiuk et al. 2018, https://arxiv.org/abs/1806.07421): from the image, the most salient pixels are
replaced first by the model's mean colour; the score is the area under the class's probability (lower is better).
The game is :mod:`idg_core.metrics.rise`'s, shared with insertion."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from idg_core.metrics.curves import Curve, Metric
from idg_core.metrics.rise import RISE_COST, check_saliency, game_scores, moved_at, predicted_class, to_curves
from idg_core.preprocess import IMAGENET_MEAN
from idg_core.types import Model


def deletion(model: Model, x: Tensor, saliency: Tensor, *, substrate: Sequence[float] = IMAGENET_MEAN, step: int = 224,
             batch_size: int = 64) -> list[Curve]:
    """Deletion: from the image, replace the most salient pixels by ``substrate`` (zeros in the
    model's normalised space = its mean colour). ``x (B, C, H, W)``, ``saliency (B, H, W)``. Lower AUC is better."""
    check_saliency(x, saliency)
    finish = torch.tensor(substrate, dtype=x.dtype, device=x.device).view(1, -1, 1, 1).expand_as(x)
    return to_curves(game_scores(model, x, finish, moved_at(saliency.to(x.device), step), step, predicted_class(model, x), batch_size))


DELETION = Metric(
    "deletion", higher_is_better=False, service=True, cost=RISE_COST,
    summary="the class's probability as the most salient pixels are replaced by the mean colour (RISE); the curve's AUC")
