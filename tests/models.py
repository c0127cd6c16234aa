"""Tiny models with answers that can be computed by hand."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Linear(nn.Module):
    """logits[:, c] = Σ w_c ⊙ x + b_c: every path method's attribution is w ⊙ (x - x')."""

    def __init__(self, shape: tuple[int, int, int] = (3, 8, 8), classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.randn(classes, *shape, generator=g))
        self.b = nn.Parameter(torch.randn(classes, generator=g))

    def forward(self, x: Tensor) -> Tensor:
        return torch.einsum("bchw,kchw->bk", x, self.w) + self.b


class SaturatingSum(nn.Module):
    """The IG paper's ``1 - ReLU(1 - s)`` on s = 2·mean(x); class 1 is its negative."""

    def forward(self, x: Tensor) -> Tensor:
        s = 2 * x.mean(dim=(1, 2, 3))
        f = 1 - torch.relu(1 - s)
        return torch.stack([f, -f], dim=1)


class TwoRises(nn.Module):
    """With the black baseline and x = ones, s = mean(x(α)) = α and the class-0 logit rises only on
    α ∈ [0.1, 0.2] and [0.6, 0.8] (two steep sigmoids); class 1 is constant."""

    def forward(self, x: Tensor) -> Tensor:
        s = x.mean(dim=(1, 2, 3))
        f = torch.sigmoid(80 * (s - 0.15)) + torch.sigmoid(40 * (s - 0.7))
        return torch.stack([f, torch.zeros_like(f)], dim=1)


class SmallCNN(nn.Module):
    """A seeded random CNN, 3x16x16 -> 10 classes."""

    def __init__(self, seed: int = 0, classes: int = 10) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, stride=2), nn.Softplus(),
            nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x) * 4


class Counting(nn.Module):
    """Wraps a model and records the number of images in every call."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: list[int] = []

    def forward(self, x: Tensor) -> Tensor:
        self.calls.append(int(x.shape[0]))
        return self.model(x)
