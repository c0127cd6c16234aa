"""Shared types: the result every method returns, and the query/answer protocol of the path evaluator.

Every attribution method is written as a *plan*: a generator that yields lists of :class:`Query`
(points to push through the model) and receives the matching list of :class:`Answer`. Whoever drives
the plans (``idg_core.model_calls.run_plans`` for the library, the service worker for HTTP requests)
is free to put the points of many plans into the same model call.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

import torch
from torch import Tensor

Model = Callable[[Tensor], Tensor]
"""``(B, C, H, W)`` float images in ``[0, 1]`` -> ``(B, num_classes)`` logits."""

Output = Literal["logit", "probability"]
BaselineLike = Tensor | Literal["black", "mean"] | str


def _empty() -> Tensor:
    return torch.empty(0)


def to_device(values: Tensor, device: torch.device) -> Tensor:
    """A host tensor (path positions, target classes, an upload) on ``device`` without waiting for
    the device. PyTorch's plain host-to-CUDA copy synchronises the stream (``memcpy_and_sync``): the
    host would wait for the previous model call to finish before it can prepare the next, so the
    GPU idles while Python launches every call. Staged through pinned memory the copy is queued
    behind the running work instead (PyTorch keeps the pinned block until the copy is done)."""
    if values.device == device:
        return values
    if device.type != "cuda" or values.device.type != "cpu":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class Regions:
    """One image's ranked regions: ``labels (H, W)`` int32, 1 the first region (the highest gain) to R the last (the
    remainder no segment reached, if any); ``gains (R,)`` float64: each region's mean saliency when it was added (PAIR's
    gain; the remainder's own mean); ``areas (R,)`` int64: its pixels at the map's size."""

    labels: Tensor
    gains: Tensor
    areas: Tensor


@dataclass
class AttributionResult:
    """What every method returns. Fields that do not apply to a method are empty tensors.

    Shapes: ``attributions (B, C, H, W)``; ``alphas``, ``values``, ``importance``, ``weights``
    ``(B, M)``; ``probe_alphas (N,)``; ``probe_values (B, N)``. ``values`` and ``probe_values``
    hold the differentiated output at the path points: the target's logit or its softmax
    probability, as ``output`` says ("" when the method has no curve).
    """

    attributions: Tensor
    alphas: Tensor = field(default_factory=_empty)
    values: Tensor = field(default_factory=_empty)
    importance: Tensor = field(default_factory=_empty)
    weights: Tensor = field(default_factory=_empty)
    probe_alphas: Tensor = field(default_factory=_empty)
    probe_values: Tensor = field(default_factory=_empty)
    forward_passes: int = 0
    backward_passes: int = 0
    output: Output | Literal[""] = ""
    """What ``values`` holds: ``logit`` or ``probability`` of the target; "" without a curve."""
    regions: list[Regions] = field(default_factory=list)
    """XRAI's ranked regions, one per image (:mod:`idg_core.postprocess.xrai`); empty without that post-step."""

    @staticmethod
    def concat(parts: list[AttributionResult]) -> AttributionResult:
        """Join per-image results (each with batch size 1) into one batched result."""
        if not parts:
            raise ValueError("parts must not be empty")
        out: dict[str, object] = {}
        for f in fields(AttributionResult):
            values = [getattr(p, f.name) for p in parts]
            if f.name in ("forward_passes", "backward_passes"):
                out[f.name] = sum(values)
            elif f.name == "output":
                out[f.name] = next((v for v in values if v), "")
            elif f.name == "regions":
                out[f.name] = [r for p in parts for r in p.regions]
            elif f.name == "probe_alphas":
                out[f.name] = values[0]
            elif all(v.numel() == 0 for v in values):
                out[f.name] = _empty()
            else:
                out[f.name] = torch.cat(values, dim=0)
        return AttributionResult(**out)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Query:
    """Points to evaluate for one image: either a straight path or explicit points.

    Path form: ``origin (C, H, W)``, ``direction (C, H, W)``, points ``origin + alphas[k] * direction``.
    Explicit form: ``origin (n, C, H, W)`` holds the points, ``direction`` is ``None``.
    """

    origin: Tensor
    direction: Tensor | None
    alphas: Tensor
    target: int
    grad: bool
    output: Output = "logit"
    full: bool = False
    """Also return every class's logits (``Answer.all_logits``)."""
    label: str = ""
    """What this step is ("probe", "main pass", "step 3/50"), for progress reports."""
    features: bool = False
    """Also the activations of the model's CAM layer and the selected output's gradient with respect to them
    (``Answer.features``, ``Answer.feature_grads``; :func:`idg_core.model_calls.run_feature_call`); with ``grad`` only."""

    @staticmethod
    def path(
        origin: Tensor, direction: Tensor, alphas: Tensor, target: int, *, grad: bool, output: Output, label: str = ""
    ) -> Query:
        return Query(origin, direction, alphas.reshape(-1), target, grad, output, False, label)

    @staticmethod
    def at(points: Tensor, target: int, *, grad: bool, output: Output, full: bool = False, label: str = "",
           features: bool = False) -> Query:
        return Query(points, None, torch.zeros(points.shape[0]), target, grad, output, full, label, features and grad)

    @property
    def n(self) -> int:
        return int(self.alphas.shape[0])

    def points(self, start: int, stop: int) -> Tensor:
        """The points ``start:stop`` as a ``(stop - start, C, H, W)`` tensor."""
        if self.direction is None:
            return self.origin[start:stop]
        out = torch.empty((stop - start, *self.origin.shape), dtype=self.origin.dtype, device=self.origin.device)
        self.write_points(start, stop, out)
        return out

    def write_points(self, start: int, stop: int, out: Tensor) -> None:
        """The points ``start:stop`` written into ``out`` (``(stop - start, C, H, W)``, a slice of a call's batch):
        ``origin + alpha * direction`` (``alpha * direction`` first, then ``+ origin``), without a tensor of their own."""
        if self.direction is None:
            out.copy_(self.origin[start:stop])
            return
        a = to_device(self.alphas[start:stop].to(self.origin.dtype), self.origin.device)
        torch.mul(self.direction.unsqueeze(0), a.view(-1, 1, 1, 1), out=out)
        out.add_(self.origin.unsqueeze(0))


@dataclass
class Answer:
    """The model's answer to one :class:`Query`.

    ``values (n,)``: the target's logit or probability; ``grads (n, C, H, W)`` or ``None``;
    ``top1 (n,)``: the arg-max class at each point; ``all_logits (n, K)`` when the query asked; ``features`` and
    ``feature_grads`` ``(n, K, h, w)`` when it asked for the CAM layer's (``Query.features``).
    """

    values: Tensor
    grads: Tensor | None
    top1: Tensor
    all_logits: Tensor | None = None
    features: Tensor | None = None
    feature_grads: Tensor | None = None


R = TypeVar("R")
PlanOf = Generator[list[Query], list[Answer], R]
"""A plan whose result is an ``R``: a prediction's, an explanation's (:mod:`idg_core.explain`)."""
Plan = PlanOf[AttributionResult]
"""A method's computation for one image; see the module docstring."""
