"""Integrated Gradients (Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from torch import Tensor

from idg_core._validation import check_int, check_output
from idg_core.evaluator import EvalStats
from idg_core.methods._common import WorkBound, adaptive_samples, run_method
from idg_core.paths import ig_rule
from idg_core.types import AttributionResult, BaselineLike, Model, Output, Plan, Query


def integrated_gradients_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`integrated_gradients_plan` with ``params`` (every keyword given)."""
    steps, probe = int(params["steps"]), int(params["probe_steps"]) if params["rule"] == "adaptive" else 0
    return WorkBound(probe + steps, steps)


def integrated_gradients_plan(
    x: Tensor, baseline: Tensor, target: int, *, steps: int = 50, rule: str = "gausslegendre",
    probe_steps: int = 50, output: Output = "logit",
) -> Plan:
    """Plan for one image ``x (C, H, W)``; see :func:`integrated_gradients`."""
    check_int("steps", steps, 2 if rule in ("riemann_trapezoid", "adaptive") else 1)
    if rule == "adaptive":
        check_int("probe_steps", probe_steps, 3)
        return _adaptive_plan(x, baseline, target, steps, probe_steps, check_output(output))
    alphas, weights = ig_rule(rule, steps)
    return _plan(x, baseline, target, alphas, weights, check_output(output))


def _adaptive_plan(x: Tensor, baseline: Tensor, target: int, steps: int, probe_steps: int, output: Output) -> Plan:
    """IG at IDG's adaptive sample positions and weights (the paper's "IG adaptive" ablation)."""
    alphas, weights, pa, probe = yield from adaptive_samples(baseline, x - baseline, target, steps, probe_steps, "aligned", output)
    result = yield from _plan(x, baseline, target, alphas, weights / weights.sum(), output)
    result.probe_alphas, result.probe_logits = pa, probe.unsqueeze(0)
    result.forward_passes += probe_steps
    return result


def _plan(x: Tensor, baseline: Tensor, target: int, alphas: Tensor, weights: Tensor, output: Output) -> Plan:
    diff = x - baseline
    (ans,) = yield [Query.path(baseline, diff, alphas, target, grad=True, output=output, label="path gradients")]
    assert ans.grads is not None
    w = weights.to(x.device, x.dtype).view(-1, 1, 1, 1)
    # grads: (steps, C, H, W) -> weighted path average (C, H, W)
    avg = (ans.grads * w).sum(0)
    steps = alphas.shape[0]
    return AttributionResult(
        attributions=(avg * diff).unsqueeze(0),
        alphas=alphas.unsqueeze(0),
        logits=ans.values.detach().cpu().double().unsqueeze(0),
        weights=weights.unsqueeze(0),
        forward_passes=steps,
        backward_passes=steps,
    )


def integrated_gradients(
    model: Model,
    x: Tensor,
    baseline: BaselineLike,
    target: int | Tensor | Iterable[int],
    *,
    steps: int = 50,
    rule: str = "gausslegendre",
    probe_steps: int = 50,
    output: Output = "logit",
    batch_size: int | None = None,
    stats: EvalStats | None = None,
) -> AttributionResult:
    """IG = (x - x') ⊙ Σ_j w_j ∇F(x' + α_j (x - x')).

    Args:
        steps: quadrature points, >= 1 (>= 2 for ``riemann_trapezoid``); more is closer to the integral.
        rule: Captum's ``gausslegendre`` (default), ``riemann_left|right|middle|trapezoid``, or
            ``uniform`` (``linspace(0, 1, steps)`` with weights ``1/steps``, the IDG authors' IG), or
            ``adaptive`` (IDG's probe-and-allocate sample placement, weights normalised to sum 1;
            costs ``probe_steps`` extra forward passes).
        probe_steps: with ``rule="adaptive"`` only, the uniform probe points (>= 3).
        output: differentiate the target's ``logit`` (the paper) or its softmax ``probability``.
        batch_size: most images per model call, >= 1 (default: 8 on CPU, 128 on CUDA); points of all images are pooled.
    """
    return run_method(integrated_gradients_plan, model, x, baseline, target, batch_size, stats, steps=steps, rule=rule, probe_steps=probe_steps, output=output)
