"""Spectral Integrated Gradients (Kim, Lim, Lee and Choi, KDD 2026, https://arxiv.org/abs/2605.19607), as in
the authors' code (https://github.com/leekwoon/sig, MIT: ``SpectralIGExplainer`` over
``SpectralPathGenerator`` and ``compute_ig``): IG along a path that adds the image coarse to fine.

The difference ``Δ = x - x'`` is split into components, per channel ``Δ_c = U diag(s) Vᵀ`` (SVD) or the
2-D DCT. Component ``i`` has a strength ``r_i`` in [0, 1] (``s_i / s_1``; for the DCT one minus the
normalised frequency radius) and enters at ``α_i = (1 - w)(1 - r_i)``, rising to full by ``α_i + w``
(``w``: ``overlap``, the rise a gating schedule shapes)::

    x(α) = x' + Σ_c U_c diag(s_c ⊙ g((α - α_i) / w)) V_cᵀ,   α_k = k / (S - 1),  k = 0..S-1

so ``x(0) = x'`` and ``x(1) = x`` (up to the decomposition's rounding). The attribution is the left
Riemann sum along that path::

    SIG = Σ_{k < S-1} ∇F(x(α_k)) ⊙ (x(α_{k+1}) - x(α_k))

It telescopes: on a linear model it is ``w ⊙ Δ``, and in general ``Σ SIG ≈ F(x) - F(x')`` (completeness,
up to the sum's error). Cost: ``S - 1`` gradient passes (the authors' code takes a gradient at all ``S``
points and leaves the last unused) and one decomposition. The path is the same whether the points are
built in pixel space (here: the model normalises) or in the network's normalised space (the authors'
code): both decompositions are per channel and linear, so a channel's scale carries through.
Not ported: the authors' ``joint`` SVD over channels (normalisation would change it), and their wavelet
and Laplacian-pyramid ablations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, method_function
from idg_core.methods.params import Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query

BASES = ("svd", "dct")
SCHEDULES = ("linear", "cosine", "sigmoid", "step")
SIGMOID_GAIN = 12.0
"""The sigmoid schedule's gain (the authors' ``gating_sigmoid_k`` default)."""
PAPER = {"steps": 200, "overlap": 0.4}
"""The authors' settings (``configs/spectral_ig.yaml``: ``num_steps`` 200, ``overlap`` 0.4, SVD per channel,
linear gating, the softmax probability; their baseline ``zero`` is the black image, ``baseline="black"``)."""
FAST = {"steps": 50, "overlap": 0.4}
"""``fast`` (and ``balanced``, the default): about IG-50's cost (49 gradient passes), the authors' overlap."""

PARAMS = Params("spectral_ig", (
    Param("steps", int, FAST["steps"], "S, path points α_k = k/(S-1), endpoints included (the authors' num_steps, 200); "
          "S - 1 gradient passes", low=2, step=True),
    Param("overlap", float, PAPER["overlap"], "w, how long each component takes to enter, as a share of the path: 0 switches "
          "components on one at a time, 1 lets them all rise together from α = 0 (the straight path: IG with a left Riemann sum); "
          "the authors' 0.4", low=0.0, high=1.0),
    Param("basis", str, "svd", "The components: 'svd', the singular vectors of each channel's difference (the paper), or 'dct', "
          "its 2-D cosine frequencies (the authors' ablation)", choices=BASES),
    Param("schedule", str, "linear", "How a component rises over its overlap: the authors' gating schedules", choices=SCHEDULES),
    output_param("probability"),
))


def spectral_ig_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`spectral_ig_plan` with ``params`` (every keyword given): a gradient at every point but the last."""
    passes = int(params["steps"]) - 1
    return WorkBound(passes, passes)


def spectral_ig_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`spectral_ig`."""
    return _plan(x, baseline, target, **PARAMS.validate(params))


def gate(strength: Tensor, alpha: Tensor, overlap: float, schedule: str) -> Tensor:
    """How much of each component is in at each path position: ``(S, *strength.shape)`` in [0, 1] for
    positions ``alpha (S,)``; a component of strength ``r`` starts at ``(1 - w)(1 - r)`` and is full ``w`` later."""
    a = alpha.to(strength.device, strength.dtype).view(-1, *([1] * strength.dim()))
    start = (1.0 - overlap) * (1.0 - strength)
    if overlap <= 1e-8:
        return (a >= start).to(strength.dtype)
    progress = ((a - start) / overlap).clamp(0.0, 1.0)
    if schedule == "linear":
        return progress
    if schedule == "cosine":
        return 0.5 - 0.5 * torch.cos(progress * math.pi)
    if schedule == "sigmoid":
        low, high = 1.0 / (1.0 + math.exp(0.5 * SIGMOID_GAIN)), 1.0 / (1.0 + math.exp(-0.5 * SIGMOID_GAIN))
        return ((torch.sigmoid(SIGMOID_GAIN * (progress - 0.5)) - low) / (high - low + 1e-10)).clamp(0.0, 1.0)
    return (progress >= 0.5).to(strength.dtype)  # step


def dct_matrix(n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """The orthonormal DCT-II matrix ``(n, n)``: rows are frequencies."""
    k = torch.arange(n, device=device, dtype=dtype).unsqueeze(1)
    i = torch.arange(n, device=device, dtype=dtype).unsqueeze(0)
    m = torch.cos(math.pi / n * (i + 0.5) * k)
    m[0] *= math.sqrt(1.0 / n)
    m[1:] *= math.sqrt(2.0 / n)
    return m


def spectral_path(diff: Tensor, alphas: Tensor, overlap: float, basis: str, schedule: str) -> Tensor:
    """The path's offsets from the baseline ``(S, C, H, W)`` at positions ``alphas (S,)`` for the difference
    ``diff (C, H, W)`` (float32 or float64; the components are worked out in its dtype)."""
    if basis == "dct":
        h, w = diff.shape[-2:]
        dh, dw = dct_matrix(h, diff.device, diff.dtype), dct_matrix(w, diff.device, diff.dtype)
        coeffs = dh @ diff @ dw.T  # (C, H, W) frequencies
        yy, xx = torch.meshgrid(torch.linspace(0.0, 1.0, h, device=diff.device, dtype=diff.dtype),
                                torch.linspace(0.0, 1.0, w, device=diff.device, dtype=diff.dtype), indexing="ij")
        radius = (xx.square() + yy.square()).sqrt()
        strength = (1.0 - radius / radius.max().clamp_min(1e-10)).clamp(0.0, 1.0)  # (H, W): low frequencies first
        scaled = coeffs.unsqueeze(0) * gate(strength, alphas, overlap, schedule).unsqueeze(1)  # (S, C, H, W)
        return dh.T @ scaled @ dw
    u, s, vh = torch.linalg.svd(diff, full_matrices=False)  # (C, H, K), (C, K), (C, K, W)
    strength = (s / s[:, :1].clamp_min(1e-10)).clamp(0.0, 1.0)
    s_at = s.unsqueeze(0) * gate(strength, alphas, overlap, schedule)  # (S, C, K)
    return torch.matmul(u.unsqueeze(0) * s_at.unsqueeze(2), vh.unsqueeze(0))


def _plan(x: Tensor, baseline: Tensor, target: int, *, steps: int, overlap: float, basis: str, schedule: str, output: Output) -> Plan:
    work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32  # no SVD in half precision
    alphas = torch.linspace(0.0, 1.0, steps, dtype=torch.float64)
    points = baseline.to(work).unsqueeze(0) + spectral_path((x - baseline).to(work), alphas, overlap, basis, schedule)
    (ans,) = yield [Query.at(points[:-1].to(x.dtype), target, grad=True, output=output, label="spectral path gradients")]
    assert ans.grads is not None
    # grads: (S - 1, C, H, W) ⊙ the path's steps, summed -> (C, H, W)
    attr = (ans.grads.to(work) * (points[1:] - points[:-1])).sum(0)
    return AttributionResult(
        attributions=attr.to(x.dtype).unsqueeze(0),
        alphas=alphas[:-1].unsqueeze(0),
        values=ans.values.detach().cpu().double().unsqueeze(0),
        output=output,
        forward_passes=steps - 1,
        backward_passes=steps - 1,
    )


spectral_ig = method_function("spectral_ig", spectral_ig_plan, PARAMS, """Spectral IG: IG along a coarse-to-fine path that adds
each channel's singular components of x - x' from the largest down,
SIG = Σ_{k<S-1} ∇F(x(α_k)) ⊙ (x(α_{k+1}) - x(α_k)). The authors' baseline is black (``baseline="black"``).""")

METHOD = Method(spectral_ig, spectral_ig_plan, PARAMS, spectral_ig_bound, "Spectral Integrated Gradients (coarse-to-fine SVD path)",
                presets={"fast": FAST, "paper": PAPER, "quality": PAPER})
