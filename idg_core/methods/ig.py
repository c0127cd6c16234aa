"""Integrated Gradients (Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, adaptive_samples, method_function
from idg_core.methods.params import InvalidParameter, Param, Params, output_param
from idg_core.paths import IG_RULES, ig_rule
from idg_core.types import AttributionResult, Output, Plan, Query, to_device


def _joint(values: dict[str, Any]) -> None:
    if values["rule"] in ("riemann_trapezoid", "adaptive") and values["steps"] < 2:
        raise InvalidParameter("steps", f"steps must be >= 2 with rule={values['rule']}, got {values['steps']}")


PARAMS = Params("ig", (
    Param("steps", int, 50, "Quadrature points (at least 2 for riemann_trapezoid and adaptive); more are closer to the integral",
          low=1, step=True),
    Param("rule", str, "gausslegendre", "Quadrature rule: Captum's names; 'uniform' is linspace(0, 1, steps) with weights 1/steps "
          "(the IDG authors' IG); 'adaptive' uses IDG's probe-and-allocate placement (probe_steps more forward passes)",
          choices=IG_RULES),
    Param("probe_steps", int, 50, "With rule 'adaptive' only: uniform probe points of the output-α curve", low=3, step=True),
    output_param("logit"),
), joint=_joint, inert=lambda v: set() if v["rule"] == "adaptive" else {"probe_steps"})


def ig_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`ig_plan` with ``params`` (every keyword given)."""
    steps, probe = int(params["steps"]), int(params["probe_steps"]) if params["rule"] == "adaptive" else 0
    return WorkBound(probe + steps, steps)


def ig_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`ig`."""
    p = PARAMS.validate(params)
    if p["rule"] == "adaptive":
        return _adaptive_plan(x, baseline, target, p["steps"], p["probe_steps"], p["output"])
    alphas, weights = ig_rule(p["rule"], p["steps"])
    return _plan(x, baseline, target, alphas, weights, p["output"])


def _adaptive_plan(x: Tensor, baseline: Tensor, target: int, steps: int, probe_steps: int, output: Output) -> Plan:
    """IG at IDG's adaptive sample positions and weights (the paper's "IG adaptive" ablation)."""
    alphas, weights, pa, probe = yield from adaptive_samples(baseline, x - baseline, target, steps, probe_steps, "aligned", output)
    result = yield from _plan(x, baseline, target, alphas, weights / weights.sum(), output)
    result.probe_alphas, result.probe_values = pa, probe.unsqueeze(0)
    result.forward_passes += probe_steps
    return result


def _plan(x: Tensor, baseline: Tensor, target: int, alphas: Tensor, weights: Tensor, output: Output) -> Plan:
    diff = x - baseline
    (ans,) = yield [Query.path(baseline, diff, alphas, target, grad=True, output=output, label="path gradients")]
    assert ans.grads is not None
    values = ans.values.detach().to("cpu", torch.float64)  # on a GPU the one wait, before this step's kernels (see idg._plan)
    w = to_device(weights.to(x.dtype), x.device).view(-1, 1, 1, 1)
    # grads: (steps, C, H, W) -> weighted path average (C, H, W)
    avg = (ans.grads * w).sum(0)
    steps = alphas.shape[0]
    return AttributionResult(
        attributions=(avg * diff).unsqueeze(0),
        alphas=alphas.unsqueeze(0),
        values=values.unsqueeze(0),
        output=output,
        weights=weights.unsqueeze(0),
        forward_passes=steps,
        backward_passes=steps,
    )


ig = method_function("ig", ig_plan, PARAMS, """Integrated Gradients: IG = (x - x') ⊙ Σ_j w_j ∇F(x' + α_j (x - x')).""")

METHOD = Method(ig, ig_plan, PARAMS, ig_bound, "Integrated Gradients",
                presets={"fast": {"steps": 50}, "paper": {"steps": 50}, "quality": {"steps": 50}}, straight_path=True)
