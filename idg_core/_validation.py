"""Argument checks shared by every method; each raises ``ValueError`` naming the argument and value."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from idg_core.paths import resolve_baseline
from idg_core.types import BaselineLike


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_float(name: str, value: object, low: float, high: float, *, low_open: bool = False, why: str = "") -> float:
    """``value``, finite, in ``[low, high]`` (``(low, high]`` with ``low_open``); ``why`` ends the message. Infinity is
    no parameter's value, even where ``high`` is: an infinite LA ``spatial_range`` would run long and answer a map of zeros."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not _inside(float(value), low, high, low_open):
        bounds = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"{name} must be a number in {bounds}, got {value!r}" + (f": {why}" if why else ""))
    return float(value)


def _inside(value: float, low: float, high: float, low_open: bool) -> bool:
    return (low < value if low_open else low <= value) and value <= high


def check_choice(name: str, value: object, choices: Iterable[str]) -> str:
    options = tuple(choices)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}; got {value!r}")
    return str(value)


def prepare_batch(
    x: Tensor, baseline: BaselineLike, target: int | Tensor | Iterable[int], mean: Sequence[float] | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """Check ``x (B, C, H, W)``, broadcast the baseline to it (``mean``: the model's normalisation
    mean, for ``"mean"``; see :func:`idg_core.paths.resolve_baseline`) and return one target per image."""
    if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a float tensor of shape (B, C, H, W), got {shape}")
    if x.shape[0] == 0:
        raise ValueError("x must hold at least one image, got batch size 0")
    if not torch.isfinite(x).all():
        raise ValueError("x must be finite, got NaN or infinite values")
    x = x.detach()  # an input that requires grad would fail deep in torch
    base = resolve_baseline(baseline, x, mean)
    if not torch.isfinite(base).all():  # a NaN baseline would answer a NaN map
        raise ValueError("baseline must be finite, got NaN or infinite values")
    if target is None or isinstance(target, (str, bytes, float)):
        raise ValueError(f"target must be a class index, a list of them or an integer tensor, got {target!r}")
    targets = torch.as_tensor(target).reshape(-1).tolist() if not isinstance(target, int) else [target]
    if len(targets) == 1 and x.shape[0] > 1:
        targets = targets * x.shape[0]
    if len(targets) != x.shape[0]:
        raise ValueError(f"target must give one class per image ({x.shape[0]}), got {len(targets)}")
    for t in targets:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"target must be a non-negative class index, got {t!r}")
    return x, base, targets
