"""Left-IG (Miglani et al. 2020, https://arxiv.org/abs/2010.12697), as in the IDG authors' code."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core._validation import check_float, check_int, check_output
from idg_core.evaluator import EvalStats
from idg_core.methods._common import WorkBound, run_method
from idg_core.types import AttributionResult, BaselineLike, Model, Output, Plan, Query


def left_ig_cutoff(logits: Tensor, threshold: float = 0.9) -> int:
    """First index k with ``logits[k] > threshold * max(logits)``; 1 if none or if it is 0."""
    above = torch.nonzero(logits > threshold * logits.max()).flatten()
    return max(1, int(above[0])) if above.numel() else 1


def left_ig_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`left_ig_plan` with ``params`` (every keyword given)."""
    return WorkBound(int(params["steps"]), int(params["steps"]))


def left_ig_plan(
    x: Tensor, baseline: Tensor, target: int, *, steps: int = 50, threshold: float = 0.9, output: Output = "logit"
) -> Plan:
    """Plan for one image ``x (C, H, W)``; see :func:`left_ig`."""
    check_int("steps", steps, 2)
    return _plan(x, baseline, target, steps, check_float("threshold", threshold, 0.0, 1.0), check_output(output))


def _plan(x: Tensor, baseline: Tensor, target: int, steps: int, threshold: float, output: Output) -> Plan:
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
        logits=ans.values.detach().cpu().double().unsqueeze(0),
        weights=weights.unsqueeze(0),
        forward_passes=steps,
        backward_passes=steps,
    )


def left_ig(
    model: Model,
    x: Tensor,
    baseline: BaselineLike,
    target: int | Tensor | Iterable[int],
    *,
    steps: int = 50,
    threshold: float = 0.9,
    output: Output = "logit",
    batch_size: int | None = None,
    stats: EvalStats | None = None,
) -> AttributionResult:
    """IG over the left part of the path only: gradients at ``linspace(0, 1, steps)`` up to the
    first point whose output exceeds ``threshold * max`` (exclusive; at least one), averaged, ⊙ (x - x').

    Args:
        steps: path points, >= 2.
        threshold: in [0, 1], the share of the maximum output that ends the path (0.9 in the authors' code).
    """
    return run_method(left_ig_plan, model, x, baseline, target, batch_size, stats, steps=steps, threshold=threshold, output=output)
