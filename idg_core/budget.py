"""What a request may cost, worked out in one place: the library's plans declare their bounds here, the
service's request checks (:mod:`app.planning`) refuse what is over its limits with them, and its worker
(:mod:`app.worker`) queues and schedules by them.

Two measures:

- **model passes** (:class:`WorkBound`): images pushed through the model, and of those the images
  back-propagated; known from a method's parameters before it runs (each method's ``bound``), times the
  noisy copies of its post-steps (:func:`postprocess_bound`), plus the prediction pass and the
  faithfulness games (:func:`explanation_bound`). A finished explanation counts the passes it took
  (:func:`explanation_passes`);
- **work units** (:func:`work_units`): the same passes weighed by what they cost the device, a forward
  image 1 and an image with a gradient :data:`GRAD_UNITS`; the worker's queue estimate (``Retry-After``)
  and its measured rate are in these units.

Imports nothing but the standard library, so the library, the request checks and the worker all can.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GRAD_UNITS = 3
"""Work units of an image with a gradient; a forward-only image is 1 (a forward and backward
pass cost about three forwards)."""
PREDICT_UNITS = 1.0
"""Work units of a prediction (one forward pass)."""


def work_units(forward: int, backward: int) -> float:
    """Work units of ``forward`` images through the model, ``backward`` of them with a gradient."""
    return float(forward + (GRAD_UNITS - 1) * backward)


def row_units(rows: int, grad: bool) -> float:
    """Work units of ``rows`` images of one model call, with a gradient or not."""
    return work_units(rows, rows if grad else 0)


@dataclass(frozen=True)
class WorkBound:
    """The most one image's plan can cost, known from its parameters before it runs."""

    forward: int
    """Images pushed through the model (those with a gradient included)."""
    backward: int
    """Of those, images back-propagated."""
    host_steps: int = 0
    """Passes over every feature on the host between model calls (Guided IG's sub-steps)."""
    probe: int = 0
    """Of the forward images, those of a probe that noisy copies may share (IDG's, with ``smooth_probe="shared"``)."""

    def times(self, k: int) -> WorkBound:
        """The bound of ``k`` runs (noisy copies)."""
        return WorkBound(self.forward * k, self.backward * k, self.host_steps * k, self.probe * k)

    def shared_probe_times(self, k: int) -> WorkBound:
        """The bound of ``k`` runs that share one probe."""
        return WorkBound(self.probe + (self.forward - self.probe) * k, self.backward * k, self.host_steps * k, self.probe)

    def plus_forward(self, passes: int) -> WorkBound:
        """This bound and ``passes`` more forward-only images."""
        return WorkBound(self.forward + passes, self.backward, self.host_steps, self.probe)

    @property
    def units(self) -> float:
        return work_units(self.forward, self.backward)


CAM_POSTPROCESS = ("cam_regions", "cam_product")
"""The post-steps that run Grad-CAM on the photo (:mod:`idg_core.postprocess.cam`): :data:`CAM_PASS` more, once."""
CAM_PASS = WorkBound(1, 1)
"""Grad-CAM's passes: one forward and one backward."""


def postprocess_bound(bound: WorkBound, post: Mapping[str, Any]) -> WorkBound:
    """The method's bound with its post-steps: times the noisy copies (``smooth_samples``), their probe once where they
    share it (``smooth_probe="shared"``), plus Grad-CAM's pass once for a CAM post-step; IDGI costs nothing."""
    copies = max(1, int(post.get("smooth_samples") or 0))
    out = bound.shared_probe_times(copies) if post.get("smooth_probe") == "shared" else bound.times(copies)
    if post.get("postprocess") in CAM_POSTPROCESS:
        out = WorkBound(out.forward + CAM_PASS.forward, out.backward + CAM_PASS.backward, out.host_steps, out.probe)
    return out


def pixels_per_step(h: int, w: int, steps: int) -> int:
    """Pixels a faithfulness game moves per step so that it takes ``steps`` steps (``ceil(H·W / steps)``)."""
    if steps < 1:
        raise ValueError(f"faithfulness steps must be >= 1, got {steps}")
    return math.ceil(h * w / steps)


def score_passes(metrics: Sequence[str], h: int, w: int, steps: int) -> int:
    """Forward passes a faithfulness score costs: ``ceil(H·W / step) + 1`` per metric."""
    return len(metrics) * (math.ceil(h * w / pixels_per_step(h, w, steps)) + 1)


def explanation_bound(method: WorkBound, metrics: Sequence[str], h: int, w: int, steps: int, *, predict: bool) -> WorkBound:
    """The most a whole explanation of an ``h × w`` image can cost: the prediction pass (when ``predict``),
    the method with its post-steps (``method``: :func:`postprocess_bound` of its bound) and the faithfulness
    games (``metrics`` in ``steps`` steps)."""
    scores = score_passes(metrics, h, w, steps) if metrics else 0
    return method.plus_forward(int(predict) + scores)


def explanation_passes(predicted: bool, method_forward: int, metrics: int, score_steps: int) -> int:
    """Images a finished explanation pushed through the model: prediction, method, ``metrics`` games
    of ``score_steps`` steps (``steps + 1`` images each)."""
    return int(predicted) + method_forward + metrics * (score_steps + 1)
