"""Left-IG (Miglani et al. 2020, https://arxiv.org/abs/2010.12697), as in the IDG authors' code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, method_function
from idg_core.methods.params import Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query


def left_ig_cutoff(logits: Tensor, threshold: float = 0.9) -> int:
    """First index k with ``logits[k] > threshold * max(logits)``; 1 if none or if it is 0."""
    above = torch.nonzero(logits > threshold * logits.max()).flatten()
    return max(1, int(above[0])) if above.numel() else 1


PARAMS = Params("left_ig", (
    Param("steps", int, 50, "Path points linspace(0, 1, steps); gradients up to the cut-off are averaged", low=2, step=True),
    Param("threshold", float, 0.9, "The path ends at the first point whose output exceeds threshold × its maximum "
          "(0.9 in the IDG authors' code)", low=0.0, high=1.0),
    output_param("logit"),
))


def left_ig_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`left_ig_plan` with ``params`` (every keyword given)."""
    return WorkBound(int(params["steps"]), int(params["steps"]))


def left_ig_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`left_ig`."""
    return _plan(x, baseline, target, **PARAMS.validate(params))


def _plan(x: Tensor, baseline: Tensor, target: int, *, steps: int, threshold: float, output: Output) -> Plan:
    diff = x - baseline
    alphas = torch.linspace(0, 1, steps, dtype=torch.float64)
    (ans,) = yield [Query.path(baseline, diff, alphas, target, grad=True, output=output, label="path gradients")]
    assert ans.grads is not None
    cut = left_ig_cutoff(ans.values, threshold)
    weights = torch.zeros(steps, dtype=torch.float64)
    weights[:cut] = 1.0 / cut
    return AttributionResult(
        attributions=(ans.grads[:cut].mean(0) * diff).unsqueeze(0),
        alphas=alphas.unsqueeze(0),
        values=ans.values.detach().cpu().double().unsqueeze(0),
        output=output,
        weights=weights.unsqueeze(0),
        forward_passes=steps,
        backward_passes=steps,
    )


left_ig = method_function("left_ig", left_ig_plan, PARAMS, """Left-IG: IG over the left part of the path only: gradients
at linspace(0, 1, steps) up to the first point whose output exceeds threshold × max (exclusive; at least one),
averaged, ⊙ (x - x').""")

METHOD = Method(left_ig, left_ig_plan, PARAMS, left_ig_bound, "Left-IG: IG up to 90% of the maximum logit",
                presets={"fast": {"steps": 50}, "paper": {"steps": 50}, "quality": {"steps": 50}}, straight_path=True)
