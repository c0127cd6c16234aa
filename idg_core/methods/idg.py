"""Integrated Decision Gradients with adaptive sampling (Walker et al., AAAI 2024,
https://ojs.aaai.org/index.php/AAAI/article/view/28336), Algorithm 1."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core._validation import check_choice, check_int, check_output
from idg_core.evaluator import EvalStats
from idg_core.methods._common import WorkBound, adaptive_samples, run_method
from idg_core.paths import PLACEMENTS
from idg_core.presets import PRESETS
from idg_core.types import AttributionResult, BaselineLike, Model, Output, Plan, Query

IMPORTANCE = ("finite_difference", "exact")
FAST = PRESETS["idg"]["fast"]  # the default step counts: the measured `fast` preset (idg_core.presets)


def idg_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`idg_plan` with ``params`` (every keyword given): N probe forwards and M gradients."""
    steps, probe = int(params["steps"]), 0 if params["uniform"] else int(params["probe_steps"])
    return WorkBound(probe + steps, steps)


def idg_plan(
    x: Tensor,
    baseline: Tensor,
    target: int,
    *,
    steps: int = FAST["steps"],
    probe_steps: int = FAST["probe_steps"],
    placement: str = "aligned",
    importance: str = "finite_difference",
    uniform: bool = False,
    output: Output = "logit",
) -> Plan:
    """Plan for one image ``x (C, H, W)``; see :func:`idg`."""
    check_int("steps", steps, 2)
    check_int("probe_steps", probe_steps, 3)
    check_choice("placement", placement, PLACEMENTS)
    check_choice("importance", importance, IMPORTANCE)
    if not isinstance(uniform, bool):
        raise ValueError(f"uniform must be a bool, got {uniform!r}")
    return _plan(x, baseline, target, steps, probe_steps, placement, importance, uniform, check_output(output))


def importance_factors(values: Tensor, alphas: Tensor, grads: Tensor, diff: Tensor, importance: str) -> Tensor:
    """IF_j = dF/dα at α_j: finite difference ``(l_j - l_{j-1}) / (α_j - α_{j-1})`` with IF_0 = 0,
    or ``exact`` = ∇F(x(α_j)) · (x - x'). Returns ``(M,)`` float64 on the CPU."""
    if importance == "exact":
        # grads: (M, C, H, W) · diff (C, H, W) -> (M,)
        return (grads.double() * diff.double()).flatten(1).sum(1).cpu()
    v = values.detach().double().cpu()
    fd = torch.zeros_like(v)
    fd[1:] = (v[1:] - v[:-1]) / (alphas[1:] - alphas[:-1])
    return fd


def _plan(
    x: Tensor, baseline: Tensor, target: int, steps: int, probe_steps: int,
    placement: str, importance: str, uniform: bool, output: Output,
) -> Plan:
    diff = x - baseline
    forward = 0
    result = AttributionResult(attributions=torch.empty(0))
    if uniform:
        alphas = torch.linspace(0, 1, steps, dtype=torch.float64)
        weights = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    else:
        alphas, weights, result.probe_alphas, probe = yield from adaptive_samples(baseline, diff, target, steps, probe_steps, placement, output)
        result.probe_logits = probe.unsqueeze(0)
        forward = probe_steps
    (main,) = yield [Query.path(baseline, diff, alphas, target, grad=True, output=output, label="main pass")]
    assert main.grads is not None
    factors = importance_factors(main.values, alphas, main.grads, diff, importance)
    coef = (factors * weights / steps).to(x.device, x.dtype)
    # grads: (M, C, H, W) weighted by IF_j * w_j / M and summed -> (C, H, W)
    attr = (main.grads * coef.view(-1, 1, 1, 1)).sum(0) * diff
    result.attributions = attr.unsqueeze(0)
    result.alphas = alphas.unsqueeze(0)
    result.logits = main.values.detach().cpu().double().unsqueeze(0)
    result.importance = factors.unsqueeze(0)
    result.weights = weights.unsqueeze(0)
    result.forward_passes = forward + steps
    result.backward_passes = steps
    return result


def idg(
    model: Model,
    x: Tensor,
    baseline: BaselineLike,
    target: int | Tensor | Iterable[int],
    *,
    steps: int = FAST["steps"],
    probe_steps: int = FAST["probe_steps"],
    batch_size: int | None = None,
    placement: str = "aligned",
    importance: str = "finite_difference",
    uniform: bool = False,
    output: Output = "logit",
    stats: EvalStats | None = None,
) -> AttributionResult:
    """IDG = mean_j(∇F(x(α_j)) · IF_j · w_j) ⊙ (x - x'), samples placed where the logit moves.

    Args:
        steps: M, gradient samples, >= 2. More samples refine the integral; cost M forward+backward.
            Default: the ``fast`` preset (:mod:`idg_core.presets`); the paper uses 50.
        probe_steps: N, uniform forward-only probe points (endpoints included), >= 3; cost N forwards.
            Default: the ``fast`` preset; the paper uses 50.
        placement: ``aligned`` puts interval k's samples inside interval k; ``authors`` reproduces the
            published code's leftward drift after the first empty interval (comparison runs only).
        importance: ``finite_difference`` (the paper) or ``exact`` (∇F·(x - x'), no extra cost).
        uniform: True skips the probe: M points ``linspace(0, 1, M)`` with equal weights 1/M.
        output: ``logit`` (the paper) or softmax ``probability``.
        batch_size: most images per model call, >= 1 (default: 8 on CPU, 128 on CUDA); probe and main points of all images are pooled.
    """
    return run_method(
        idg_plan, model, x, baseline, target, batch_size, stats, steps=steps, probe_steps=probe_steps,
        placement=placement, importance=importance, uniform=uniform, output=output,
    )
