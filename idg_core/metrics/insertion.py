"""RISE insertion (Petsiuk et al. 2018, https://arxiv.org/abs/1806.07421): from a blurred copy of the image, the most
salient pixels are put back first; the score is the area under the class's probability (higher is better). The game
is :mod:`idg_core.metrics.rise`'s, shared with deletion."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from idg_core.metrics.curves import Curve, Metric
from idg_core.metrics.rise import RISE_COST, check_saliency, game_scores, gaussian_blur, moved_at, predicted_class, to_curves
from idg_core.preprocess import IMAGENET_MEAN, IMAGENET_STD
from idg_core.types import Model


def insertion(model: Model, x: Tensor, saliency: Tensor, *, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
              step: int = 224, batch_size: int = 64) -> list[Curve]:
    """Insertion: from the blurred image, put back the most salient pixels first. Higher AUC is better."""
    check_saliency(x, saliency)
    moved = moved_at(saliency.to(x.device), step)
    return to_curves(game_scores(model, gaussian_blur(x, mean, std), x, moved, step, predicted_class(model, x), batch_size))


INSERTION = Metric(
    "insertion", higher_is_better=True, service=True, cost=RISE_COST,
    summary="the class's probability as the most salient pixels are put back into a blurred copy (RISE); the curve's AUC")
