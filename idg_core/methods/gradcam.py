"""Grad-CAM (Selvaraju et al. 2017, https://arxiv.org/abs/1610.02391): the CAM layer's channels weighted by the spatial
mean of the target's gradient, ``ReLU(Σ_k mean(G_k) A_k)``, upsampled to the input (:mod:`idg_core.methods._cam`);
``pytorch-grad-cam``'s ``GradCAM`` on the same layer gives the same map up to its [0, 1] scaling."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from idg_core.methods._cam import cam_bound, cam_params, cam_plan, check_cam_model
from idg_core.methods._common import Method, method_function
from idg_core.types import Plan

PARAMS = cam_params("gradcam")


def gradcam_weights(a: Tensor, g: Tensor) -> Tensor:
    """Each channel's weight: its gradient's mean over the map (``(K, h, w)`` -> ``(K,)``)."""
    return g.mean((1, 2))


def gradcam_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); ``baseline`` is not used."""
    p = PARAMS.validate(params)
    return cam_plan(x, target, p["output"], gradcam_weights, "gradcam")


gradcam = method_function("gradcam", gradcam_plan, PARAMS, """Grad-CAM: ReLU(Σ_k mean_ij(∂y/∂A_k) A_k) at the model's CAM
layer (its last spatial feature map before the pooling), upsampled bilinearly to the input; each channel holds 1/C of it.
One forward and one backward pass. ``baseline`` is ignored (None is accepted).""", uses_baseline=False)

METHOD = Method(gradcam, gradcam_plan, PARAMS, cam_bound, "Grad-CAM: class activation map of the last spatial feature layer "
                "(1 forward + 1 backward pass; coarse regions)", check_model=check_cam_model)
