"""The result types every metric returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Curve:
    """A metric curve: ``x`` and ``y`` of equal length and its area under the curve."""

    x: np.ndarray
    y: np.ndarray
    auc: float


@dataclass(frozen=True)
class Skipped:
    """This image does not qualify for the metric (the reference library's skip rules); not an error."""

    reason: str


def auc_trapezoid(y: np.ndarray) -> float:
    """RISE's AUC of scores at equal spacing: ``(Σ y - y_0/2 - y_last/2) / (n - 1)``."""
    y = np.asarray(y, dtype=np.float64)
    return float((y.sum() - y[0] / 2 - y[-1] / 2) / (len(y) - 1))
