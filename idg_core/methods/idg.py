"""Integrated Decision Gradients with adaptive sampling (Walker et al., AAAI 2024,
https://ojs.aaai.org/index.php/AAAI/article/view/28336), Algorithm 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, adaptive_samples, method_function
from idg_core.methods.params import Param, Params, output_param
from idg_core.paths import PLACEMENTS
from idg_core.types import AttributionResult, Output, Plan, PlanOf, Query, to_device

Sampling = tuple[Tensor, Tensor, Tensor, Tensor]
"""IDG's samples from its probe: ``alphas, weights, probe_alphas, probe_values``."""

IMPORTANCE = ("finite_difference", "exact")
FAST = {"probe_steps": 8, "steps": 16}
"""The ``fast`` preset and the method's own defaults: the cheapest steps whose insertion and deletion stay within noise
of IDG-50/50 on the 65 sample photos, 24 forward + 16 gradient passes (docs/methods/presets.md)."""
BALANCED = {**FAST, "smooth_samples": 2, "smooth_probe": "shared", "smooth_std": 0.1, "postprocess": "cam_product"}
"""The ``balanced`` preset, the service's default answer: ``fast`` over two noisy copies (noise 0.1) sharing its probe,
times Grad-CAM's map, 41 forward + 33 gradient passes (8 probe + 2 x 16, and Grad-CAM's one). The only setting within
50 passes first or tied on insertion, deletion, SIC, AIC and DiffID against AGI, IDG-50/50, Spectral IG and Grad-CAM on
the 65 sample photos (:func:`idg_evaluation.report.first_or_tied`; results/region-search-2026-12-02/). On a model without
a layer Grad-CAM can read it runs ``fast`` (:data:`idg_core.methods.PRESET_BASE`)."""
PAPER = {"probe_steps": 50, "steps": 50}
QUALITY = {**FAST, "postprocess": "rankmix", "smooth_samples": 16, "smooth_std": 0.15}
"""The ``quality`` preset: IDG 8/16 + RankMix (the map and its IDGI map rank-averaged) + SmoothGrad over 16 noisy copies,
384 forward / 256 gradient passes (within AGI's 40 x 10 = 400), chosen on the 65 sample photos by the rule of
:func:`idg_evaluation.report.first_or_tied`: first or tied on insertion, deletion, SIC, AIC and DiffID against AGI, IDG
and SIG, on Lite0; it meets that rule on Lite1 too and is behind IDG-50/50 on Lite2's insertion (the tables:
docs/methods/presets.md, docs/results/faithfulness.md)."""


def idg_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`idg_plan` with ``params`` (every keyword given): N probe forwards and M gradients."""
    steps, probe = int(params["steps"]), 0 if params["uniform"] else int(params["probe_steps"])
    return WorkBound(probe + steps, steps, probe=probe)


PARAMS = Params("idg", (
    Param("steps", int, FAST["steps"], "M, gradient samples; more refine the integral, each costs a forward and a backward pass "
          "(default: the fast preset; the paper uses 50)", low=2, step=True),
    Param("probe_steps", int, FAST["probe_steps"], "N, uniform forward-only probe points of the output-α curve, endpoints "
          "included (default: the fast preset; the paper uses 50)", low=3, step=True),
    Param("placement", str, "aligned", "Where interval k's samples go: 'aligned' inside interval k, 'authors' with the "
          "published code's leftward drift after the first empty interval (comparison runs only)", choices=PLACEMENTS),
    Param("importance", str, "finite_difference", "Importance factor dF/dα: the paper's finite difference or the exact chain "
          "rule ∇F·(x - x'), at no extra cost", choices=IMPORTANCE),
    Param("uniform", bool, False, "Skip the probe: M points linspace(0, 1, M) with equal weights 1/M (no adaptive sampling)"),
    output_param("logit"),
), inert=lambda v: {"probe_steps", "placement"} if v["uniform"] else set())


def idg_plan(x: Tensor, baseline: Tensor, target: int, sampling: Sampling | None = None, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`idg`. ``sampling``: the
    samples of a probe already run (:func:`idg_probe`, on the image the noisy copies are drawn around), used instead of
    this plan's own."""
    return _plan(x, baseline, target, sampling=sampling, **PARAMS.validate(params))


def idg_probe(x: Tensor, baseline: Tensor, target: int, **params: Any) -> PlanOf[Sampling]:
    """The probe of :func:`idg_plan` alone: a plan whose result is its samples (``alphas, weights, probe_alphas,
    probe_values``), for noisy copies of ``x`` to share (SmoothGrad's ``smooth_probe="shared"``)."""
    p = PARAMS.validate(params)
    if p["uniform"]:
        raise ValueError("smooth_probe='shared' needs IDG's probe; uniform=True has none")
    return adaptive_samples(baseline, x - baseline, target, p["steps"], p["probe_steps"], p["placement"], p["output"])


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
    x: Tensor, baseline: Tensor, target: int, *, steps: int, probe_steps: int,
    placement: str, importance: str, uniform: bool, output: Output, sampling: Sampling | None = None,
) -> Plan:
    diff = x - baseline
    forward = 0
    result = AttributionResult(attributions=torch.empty(0))
    if sampling is not None:  # a shared probe's: counted where it ran
        alphas, weights, result.probe_alphas, probe = sampling
        result.probe_values = probe.unsqueeze(0)
    elif uniform:
        alphas = torch.linspace(0, 1, steps, dtype=torch.float64)
        weights = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    else:
        alphas, weights, result.probe_alphas, probe = yield from adaptive_samples(
            baseline, diff, target, steps, probe_steps, placement, output)
        result.probe_values = probe.unsqueeze(0)
        forward = probe_steps
    (main,) = yield [Query.path(baseline, diff, alphas, target, grad=True, output=output, label="main pass")]
    assert main.grads is not None
    # On a GPU the step's one wait for the device: its values on the host, once, before this step queues kernels of its
    # own; the coefficients go back without a wait (a plain copy, or a second .cpu() after the kernels below, would wait
    # for those kernels, which queue behind the next model call)
    values = main.values.detach().to("cpu", torch.float64)
    factors = importance_factors(values, alphas, main.grads, diff, importance)
    coef = to_device((factors * weights / steps).to(x.dtype), x.device)
    # grads: (M, C, H, W) weighted by IF_j * w_j / M and summed -> (C, H, W)
    attr = (main.grads * coef.view(-1, 1, 1, 1)).sum(0) * diff
    result.attributions = attr.unsqueeze(0)
    result.alphas = alphas.unsqueeze(0)
    result.values = values.unsqueeze(0)
    result.output = output
    result.importance = factors.unsqueeze(0)
    result.weights = weights.unsqueeze(0)
    result.forward_passes = forward + steps
    result.backward_passes = steps
    return result


idg = method_function("idg", idg_plan, PARAMS, """Integrated Decision Gradients with adaptive sampling:
IDG = mean_j(∇F(x(α_j)) · IF_j · w_j) ⊙ (x - x'), with the samples placed where the output moves.""")

METHOD = Method(idg, idg_plan, PARAMS, idg_bound, "Integrated Decision Gradients with adaptive sampling",
                presets={"balanced": BALANCED, "fast": FAST, "paper": PAPER, "quality": QUALITY}, straight_path=True, probe=idg_probe)
