"""A model's calibration record: whether bf16 keeps its faithfulness, and the paired numbers behind the decision.

The record only; :mod:`idg_models.calibrate` measures it (``idg-calibrate``). It lives below the models
(:class:`~idg_models.ImageClassifier` holds one) so that the classifier needs nothing of the measurement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch

DEFAULT_CURVE_STEPS = 112
"""Steps of each insertion and deletion curve (pixels moved per step: the input's pixels / steps)."""
KEEP_METRICS = ("insertion", "deletion")
"""The metrics the keep rule reads (SIC and AIC, where measured, are reported only)."""


class Paired(NamedTuple):
    """Mean of (candidate − reference) per image, signed so that > 0 favours the candidate, the
    half-width of its normal 95% interval and the number of images (a JSON list of three)."""

    mean: float
    half_width: float
    n: int

    @property
    def within_noise_or_better(self) -> bool:
        """The interval includes 0 or lies above it (False with fewer than two images: no interval)."""
        return self.n >= 2 and bool(self.mean + self.half_width >= 0)


@dataclass(frozen=True)
class Calibration:
    """One model's calibration: the decision (``"bf16"`` or ``"fp32"``) and the numbers behind it."""

    model: str
    source: str
    weights_sha256: str
    decision: str
    insertion: Paired
    deletion: Paired
    photos: int
    folder: str
    fp32: dict[str, float] = field(default_factory=dict)
    """Mean insertion and deletion AUC in IEEE fp32."""
    bf16: dict[str, float] = field(default_factory=dict)
    """The same in bf16."""
    method: str = "idg"
    preset: str = "fast"
    curve_steps: int = DEFAULT_CURVE_STEPS
    fold_bn: bool = True
    device: str = "cpu"
    torch_version: str = torch.__version__
    date: str = ""
    seconds: float = 0.0

    @property
    def bf16_kept(self) -> bool:
        return self.decision == "bf16"

    @property
    def rule(self) -> str:
        return "bf16 only where both paired 95% intervals (bf16 - fp32; insertion, deletion) include 0 or favour bf16"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["insertion"], out["deletion"] = self.insertion._asdict(), self.deletion._asdict()
        out["rule"] = self.rule
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "calibration") -> Calibration:
        """A :meth:`to_json` dict; a ``ValueError`` sentence naming ``where`` for anything else."""
        try:
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            for metric in KEEP_METRICS:
                known[metric] = Paired(float(data[metric]["mean"]), float(data[metric]["half_width"]), int(data[metric]["n"]))
            cal = cls(**known)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{where} is not a calibration written by idg-calibrate ({type(err).__name__}: {err})") from err
        if cal.decision not in ("bf16", "fp32"):
            raise ValueError(f"{where}: decision must be bf16 or fp32, got {cal.decision!r}")
        return cal

    def summary(self) -> str:
        """One line: the decision and both intervals."""
        return (f"{self.model}: {self.decision} (bf16 - fp32 on {self.photos} photos: insertion {_cell(self.insertion)}, "
                f"deletion {_cell(self.deletion, lower=True)})")


def _cell(p: Paired, lower: bool = False) -> str:
    digits = 4 if max(abs(p.mean), 0 if math.isnan(p.half_width) else p.half_width) >= 5e-4 else 6  # rounding-level ones stay visible
    if p.n < 2 or math.isnan(p.half_width):
        return f"{p.mean:+.{digits}f} (n={p.n}, no interval)"
    return f"{p.mean:+.{digits}f} ± {p.half_width:.{digits}f}" + (" (> 0: bf16 deletes better)" if lower else "")
