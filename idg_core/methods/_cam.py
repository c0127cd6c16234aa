"""What Grad-CAM and Grad-CAM++ share: one model call with a gradient that also returns the CAM layer's activations
``A (K, h, w)`` and the target's gradient ``G`` with respect to them (``Query.features``:
:func:`idg_core.model_calls.run_feature_call`), channel weights from them, ``ReLU(Σ_k w_k A_k)``, and that map upsampled
to the input's size, bilinear with half-pixel centres (as ``pytorch-grad-cam``'s ``cv2.resize``).

The map is per pixel, like every method's: each of the ``C`` channels holds ``cam / C``, so the sum over channels (what
the heatmap and the evaluation's pixel ranking read) is the CAM itself, non-negative. ``pytorch-grad-cam`` min-max
scales its map to [0, 1] before the upsampling; upsampling commutes with that scaling, so the order of the pixels is
the same; the values here keep the model's units (``output`` per unit of activation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods.params import Params, output_param
from idg_core.model_calls import NO_CAM_LAYER
from idg_core.types import AttributionResult, Model, Output, Plan, Query

Weigh = Callable[[Tensor, Tensor], Tensor]
"""``(A, G)``, each ``(K, h, w)`` -> the channel weights ``(K,)``."""


def cam_params(name: str) -> Params:
    """A CAM method's parameters: only which output is differentiated (pytorch-grad-cam's ``ClassifierOutputTarget``
    takes the logit)."""
    return Params(name, (output_param("logit"),))


def cam_bound(params: Mapping[str, Any]) -> WorkBound:
    """One forward and one backward pass, whatever the parameters."""
    return WorkBound(1, 1)


def check_cam_model(model: Model) -> None:
    """A ``ValueError`` saying why where ``model`` has no CAM layer (no spatial feature map before its pooling), as far as
    it can be known before a call: a model with ``cam_target()`` finds its layer (once); a plain ``nn.Module``'s is
    found in its call."""
    find = getattr(model, "cam_target", None)
    if callable(find):
        find()
    elif not isinstance(model, torch.nn.Module):
        raise ValueError(NO_CAM_LAYER)


def cam_plan(x: Tensor, target: int, output: Output, weigh: Weigh, name: str) -> Plan:
    """The CAM of one image ``x (C, H, W)`` for ``target``, channel weights by ``weigh``."""
    (ans,) = yield [Query.at(x.unsqueeze(0), target, grad=True, output=output, features=True, label=f"{name}: layer gradients")]
    assert ans.features is not None and ans.feature_grads is not None
    a, g = ans.features[0].float(), ans.feature_grads[0].float()
    cam = torch.relu((weigh(a, g).view(-1, 1, 1) * a).sum(0))
    up = F.interpolate(cam[None, None], size=tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[0, 0]
    per_channel = (up / x.shape[0]).to(x.device, x.dtype)
    return AttributionResult(attributions=per_channel.expand(x.shape).unsqueeze(0).contiguous(), forward_passes=1, backward_passes=1)


