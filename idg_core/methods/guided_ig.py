"""Guided Integrated Gradients (Kapishnikov et al. 2021, https://arxiv.org/abs/2106.09788).

Each step needs the gradient at the point the previous step reached, so one image's steps are
sequential; the points of many images (or requests) at the same step share a model call. Between
model calls a step moves features in sub-steps (host work, a pass over every feature each): at
most ``ceil(1 / fraction) + 2`` of them, with a checkpoint (an empty query list, answered at once)
after every :data:`CHECKPOINT_EVERY`, where a driver may drop the plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import NOT_FINITE, Method, method_function
from idg_core.methods.params import Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query

_EPS = 1e-9
MIN_FRACTION = 0.01
"""Smallest ``fraction``: a sub-step moves at least this share of the features, so a step takes at
most 102 sub-steps (``fraction=0`` would move one feature per sub-step: 150,528 passes at 224²)."""
CHECKPOINT_EVERY = 4
"""Sub-steps between checkpoints."""


def substep_bound(fraction: float) -> int:
    """Most sub-steps in one step: every sub-step but the last brings at least
    ``floor(fraction * (n - 1)) + 1`` of the ``n`` features to their end point for the step."""
    return math.ceil(1 / fraction) + 2


PARAMS = Params("guided_ig", (
    Param("steps", int, 50, "S, sequential gradient steps (reference library 200, IDG paper 50)", low=1, step=True),
    Param("fraction", float, 0.5, "Share of features moved per sub-step (a quantile of |gradient|; reference 0.25, IDG paper "
          "0.5); a step takes up to ceil(1/fraction) + 2 sub-steps, each a pass over every feature on the host",
          low=MIN_FRACTION, high=1.0, why="smaller shares move too few features per sub-step (up to 1/fraction passes over "
          "the image per step; 0 moves one feature at a time)"),
    Param("max_dist", float, 1.0, "How far a feature may run ahead of the straight path: 0 is IG with a left Riemann sum, "
          "1 unconstrained (reference 0.02, IDG paper 1.0)", low=0.0, high=1.0),
    output_param("probability"),
))


def guided_ig_bound(params: Mapping[str, Any]) -> WorkBound:
    """Worst-case cost of :func:`guided_ig_plan` with ``params`` (every keyword given)."""
    steps = int(params["steps"])
    return WorkBound(steps, steps, steps * substep_bound(float(params["fraction"])))


def guided_ig_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`guided_ig`."""
    return _plan(x, baseline, target, **PARAMS.validate(params))


def _lower_quantile(values: Tensor, q: float) -> Tensor:
    """``numpy.quantile(values, q, method='lower')`` for a flat tensor (inf allowed)."""
    k = int(math.floor(q * (values.numel() - 1)))
    return torch.kthvalue(values.cpu(), k + 1).values.to(values.device)


def _plan(x_in: Tensor, baseline: Tensor, target: int, *, steps: int, fraction: float, max_dist: float, output: Output) -> Plan:
    dtype = x_in.dtype
    x_in, base = x_in.double(), baseline.double()
    total = x_in - base
    attr = torch.zeros_like(x_in)
    values: list[float] = []
    l1_total = total.abs().sum()
    if float(l1_total) == 0.0:
        return AttributionResult(attributions=attr.to(dtype).unsqueeze(0))
    x = base.clone()
    for step in range(steps):
        (ans,) = yield [Query.at(x.to(dtype).unsqueeze(0), target, grad=True, output=output, label=f"step {step + 1}/{steps}")]
        assert ans.grads is not None
        grad_actual = ans.grads[0].double().clone()  # its own memory: the answer, a view of a whole call's outputs, goes now
        values.append(float(ans.values[0]))
        del ans
        if not (math.isfinite(values[-1]) and bool(torch.isfinite(grad_actual).all())):
            # a NaN gradient chooses no feature to move: the map would come back all zeros, finite and wrong
            raise ValueError(NOT_FINITE)
        grad = grad_actual.clone()
        alpha = (step + 1.0) / steps
        alpha_min, alpha_max = max(alpha - max_dist, 0.0), min(alpha + max_dist, 1.0)
        x_min, x_max = base + total * alpha_min, base + total * alpha_max
        l1_target = l1_total * (1 - alpha)
        for sub in range(substep_bound(fraction)):
            if sub and sub % CHECKPOINT_EVERY == 0:
                yield []  # a checkpoint between long host steps: the driver may drop the plan here
            x_old = x.clone()
            progress = torch.where(total != 0, (x - base) / torch.where(total != 0, total, 1), alpha_max)
            behind = progress < alpha_min
            x[behind] = x_min[behind]
            l1_current = (x - x_in).abs().sum()
            if math.isclose(float(l1_target), float(l1_current), rel_tol=_EPS, abs_tol=_EPS):
                attr += (x - x_old) * grad_actual
                break
            grad[x == x_max] = math.inf
            threshold = _lower_quantile(grad.abs().flatten(), fraction)
            chosen = (grad.abs() <= threshold) & (grad != math.inf)
            l1_chosen = ((x - x_max).abs() * chosen).sum()
            if l1_chosen <= 0:  # nothing left that may move (the reference would loop forever)
                break
            gamma = float((l1_current - l1_target) / l1_chosen)
            if gamma > 1.0:  # the chosen features reach x_max (their |gradient| is inf from now on)
                x[chosen] = x_max[chosen]
            else:
                x[chosen] = (x + (x_max - x) * gamma)[chosen]
            attr += (x - x_old) * grad_actual
            if gamma <= 1.0:
                break
    return AttributionResult(
        attributions=attr.to(dtype).unsqueeze(0),
        alphas=(torch.arange(steps, dtype=torch.float64) / steps).unsqueeze(0),
        values=torch.tensor(values, dtype=torch.float64).unsqueeze(0),
        output=output,
        forward_passes=steps,
        backward_passes=steps,
    )


guided_ig = method_function("guided_ig", guided_ig_plan, PARAMS, """Guided IG: an adaptive path that first moves the features
with the smallest |gradient|.""")

METHOD = Method(guided_ig, guided_ig_plan, PARAMS, guided_ig_bound, "Guided Integrated Gradients",
                presets={"fast": {"steps": 50}, "paper": {"steps": 50}, "quality": {"steps": 50}},
                batch_invariant=False)  # which features move follows the gradients' last bits
