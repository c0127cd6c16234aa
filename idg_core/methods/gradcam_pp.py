"""Grad-CAM++ (Chattopadhyay et al. 2018, https://arxiv.org/abs/1710.11063), as ``pytorch-grad-cam``'s
``GradCAMPlusPlus`` computes it (its equation 19 with the exponential output's higher derivatives as powers of the
first): ``α = G² / (2 G² + Σ_ij A · G³ + 1e-6)`` where ``G ≠ 0`` (else 0), ``w_k = Σ_ij α ReLU(G)``, then
``ReLU(Σ_k w_k A_k)`` upsampled to the input (:mod:`idg_core.methods._cam`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from idg_core.methods._cam import cam_bound, cam_params, cam_plan, check_cam_model
from idg_core.methods._common import Method, method_function
from idg_core.types import Plan

PARAMS = cam_params("gradcam_pp")
EPS = 1e-6
"""pytorch-grad-cam's guard in the denominator."""


def gradcam_pp_weights(a: Tensor, g: Tensor) -> Tensor:
    """Each channel's weight (``(K, h, w)`` -> ``(K,)``)."""
    g2 = g * g
    alpha = g2 / (2 * g2 + a.sum((1, 2), keepdim=True) * g2 * g + EPS)
    alpha = torch.where(g != 0, alpha, torch.zeros_like(alpha))
    return (torch.relu(g) * alpha).sum((1, 2))


def gradcam_pp_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); ``baseline`` is not used."""
    p = PARAMS.validate(params)
    return cam_plan(x, target, p["output"], gradcam_pp_weights, "gradcam_pp")


gradcam_pp = method_function("gradcam_pp", gradcam_pp_plan, PARAMS, """Grad-CAM++: ReLU(Σ_k w_k A_k) with
w_k = Σ_ij α_kij ReLU(∂y/∂A_kij), α = G² / (2 G² + Σ A · G³), at the model's CAM layer, upsampled bilinearly to the
input; each channel holds 1/C of it. One forward and one backward pass. ``baseline`` is ignored (None is accepted).""",
                             uses_baseline=False)

METHOD = Method(gradcam_pp, gradcam_pp_plan, PARAMS, cam_bound, "Grad-CAM++: Grad-CAM with positive-gradient weights per "
                "location (1 forward + 1 backward pass; coarse regions)", check_model=check_cam_model)
