"""RISE's game (Petsiuk et al. 2018, https://arxiv.org/abs/1806.07421), shared by :mod:`~idg_core.metrics.insertion`
and :mod:`~idg_core.metrics.deletion`, which declare the two metrics.

Pixels are ranked by saliency (|attribution| summed over channels) and moved ``step`` at a time
from a start image to a finish image; the score is the softmax probability of the class the model
predicts on the original image. Cost per image: ``ceil(H·W / step) + 1`` forward passes (225 for
224×224 with step 224), pushed through the model in batches of ``batch_size`` images, several
images' steps together.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor

from idg_core.metrics.curves import Curve, auc_trapezoid
from idg_core.preprocess import IMAGENET_MEAN, IMAGENET_STD
from idg_core.types import Model


def gaussian_blur(x: Tensor, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                  kernel: int = 11, sigma: float = 5.0) -> Tensor:
    """RISE's insertion start: ``(B, C, H, W)`` pixels -> Gaussian blur (``kernel``×``kernel``,
    ``sigma``) with zero padding *in normalised space*, returned in pixel space."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    r = torch.arange(kernel, dtype=x.dtype, device=x.device) - kernel // 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    k2 = (g[:, None] * g[None, :]) / (g.sum() ** 2)
    c = x.shape[1]
    weight = k2.expand(c, 1, kernel, kernel).contiguous()
    blurred = F.conv2d((x - m) / s, weight, padding=kernel // 2, groups=c)
    return blurred * s + m


def moved_at(saliency: Tensor, step: int) -> Tensor:
    """``(B, 1, H, W)``: the game step at which each pixel of ``saliency (B, H, W)`` moves, the
    ``step`` most salient first (ties broken by index, stable): pixel p moves at ceil((rank+1)/step)."""
    b, h, w = saliency.shape
    order = torch.argsort(saliency.flatten(1), dim=1, descending=True, stable=True)
    pos = torch.empty_like(order)
    pos.scatter_(1, order, torch.arange(h * w, device=order.device).expand(b, -1))
    return (pos // step + 1).view(b, 1, h, w)


def game_scores(model: Model, start: Tensor, finish: Tensor, moved: Tensor, step: int, cls: Tensor, batch_size: int) -> Tensor:
    """Probabilities of ``cls`` along the game for each image (``moved``: :func:`moved_at`): ``(B, n_steps + 1)``."""
    b, c, h, w = start.shape
    n = math.ceil(h * w / step) + 1
    out = torch.empty(b * n, device=start.device)  # row j is image j // n at step j % n
    with torch.no_grad():
        for lo in range(0, b * n, batch_size):
            rows = torch.arange(lo, min(lo + batch_size, b * n), device=start.device)
            idx, ks = rows // n, (rows % n).view(-1, 1, 1, 1)
            mask = (moved[idx] <= ks).to(start.dtype)  # (chunk, 1, H, W): 1 where moved
            imgs = start[idx] * (1 - mask) + finish[idx] * mask
            out[rows] = torch.softmax(model(imgs), 1).gather(1, cls[idx].view(-1, 1)).squeeze(1)
    return out.view(b, n)


def to_curves(scores: Tensor) -> list[Curve]:
    """One :class:`Curve` per row of :func:`game_scores`' ``(B, n_steps + 1)``, at equal spacing on [0, 1]."""
    n = scores.shape[1]
    x = np.linspace(0, 1, n)
    return [Curve(x, s.cpu().numpy().astype(np.float64), auc_trapezoid(s.cpu().numpy())) for s in scores]


def predicted_class(model: Model, x: Tensor) -> Tensor:
    """The class the model predicts on each image of ``x``: the one the game scores."""
    with torch.no_grad():
        return model(x).argmax(1)


def check_saliency(x: Tensor, saliency: Tensor) -> None:
    """``saliency`` is one ``(H, W)`` map per image of ``x (B, C, H, W)``: checked, since a ``(B, 1, W)`` one would
    broadcast silently."""
    if x.dim() != 4 or not isinstance(saliency, Tensor) or tuple(saliency.shape) != (x.shape[0], x.shape[2], x.shape[3]):
        got = tuple(saliency.shape) if isinstance(saliency, Tensor) else type(saliency).__name__
        raise ValueError(f"saliency must be (B, H, W) = {(x.shape[0], *x.shape[2:])} for x of shape {tuple(x.shape)}, got {got}")


RISE_COST = "one forward pass per step: H·W / step + 1 (225 at 224×224 and 224 px per step)"
"""What insertion and deletion each cost per image."""
