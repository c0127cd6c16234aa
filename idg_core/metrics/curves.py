"""What every metric shares: its registry entry (:class:`Metric`, declared in the metric's own file) and the result
types it returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Metric:
    """A faithfulness metric, declared once at the end of its file and listed in :data:`idg_core.metrics.METRICS`,
    which the service's faithfulness score, the evaluation and the docs read."""

    name: str
    """The value's name in results (``insertion``, ``road_morf``)."""
    higher_is_better: bool
    cost: str
    """What one image costs: model passes and CPU work."""
    summary: str
    runs_as: str = ""
    """The evaluation's name for what computes it, where one computation gives several metrics (``road``: MoRF and
    LeRF); empty: ``name``."""
    service: bool = False
    """The service's ``faithfulness`` field may ask for it."""
    default: bool = True
    """The evaluation computes it unless told otherwise (ROAD is asked for: it is the slowest)."""
    derived_from: tuple[str, ...] = ()
    """The metrics whose per-image scores this one is computed from by :attr:`combine` (``diffid``: insertion and
    deletion), with no model pass of its own; empty: it is measured."""
    combine: Callable[..., float] | None = None
    """For a derived metric: its value from the scores of :attr:`derived_from`, in that order."""

    def __post_init__(self) -> None:
        if bool(self.derived_from) != (self.combine is not None):
            raise ValueError(f"metric {self.name!r}: derived_from and combine go together")

    def of(self, scores: Mapping[str, Any]) -> float | None:
        """This metric's score in one image's ``scores`` (by metric name): the stored value, or for a derived metric
        its sources combined; None where a score is absent."""
        if not self.derived_from:
            value: float | None = scores.get(self.name)
            return value
        sources = [scores.get(name) for name in self.derived_from]
        if self.combine is None or any(v is None for v in sources):
            return None
        return self.combine(*sources)

    @property
    def run_name(self) -> str:
        return self.runs_as or self.name

    @property
    def arrow(self) -> str:
        return "↑" if self.higher_is_better else "↓"


@dataclass(frozen=True)
class Curve:
    """A metric curve: ``x`` and ``y`` of equal length and its area under the curve."""

    x: np.ndarray
    y: np.ndarray
    auc: float


SKIP_RULES: dict[str, str] = {
    "low_confidence": "the original prediction is below the minimum confidence",
    "blurred_information": "the fully blurred image carries as much information as the original",
    "blurred_confidence": "the fully blurred image is predicted as confidently as the original",
    "not_requested": "PIC was not requested",
}
"""Why an image is skipped, by rule name: the reference library's PIC rules, and ours."""


@dataclass(frozen=True)
class Skipped:
    """This image does not qualify for the metric (the reference library's skip rules); not an error.
    ``rule`` names the rule (a key of :data:`SKIP_RULES`), ``value`` is the number that tripped it
    (the original prediction for ``low_confidence``), ``reason`` says both in one sentence."""

    reason: str
    rule: str = "other"
    value: float | None = None


def auc_trapezoid(y: np.ndarray) -> float:
    """RISE's AUC of scores at equal spacing: ``(Σ y - y_0/2 - y_last/2) / (n - 1)``."""
    y = np.asarray(y, dtype=np.float64)
    return float((y.sum() - y[0] / 2 - y[-1] / 2) / (len(y) - 1))


def mean_ci(values: list[float]) -> tuple[float, float, int]:
    """Mean, half-width of the normal 95% interval, and n."""
    arr = np.asarray([v for v in values if v is not None], dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan"), 0
    half = 1.96 * arr.std(ddof=1) / np.sqrt(arr.size) if arr.size > 1 else float("nan")
    return float(arr.mean()), float(half), int(arr.size)
