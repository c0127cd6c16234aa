"""Expected Gradients (Erion et al., "Improving performance of deep learning models with axiomatic
attribution priors and expected gradients", Nature Machine Intelligence 2021,
https://arxiv.org/abs/1906.10670): IG with the baseline drawn from a distribution and the path
position drawn uniformly, one gradient per draw::

    EG = mean_j (x - x'_j) ⊙ ∇F(x'_j + α_j (x - x'_j)),   x'_j ~ D,  α_j ~ U(0, 1)

Its sum is ``F(x) - mean_j F(x'_j)`` in expectation (completeness in expectation). The reference
implementations (``path_explain``, the LA authors' ``AttributionPriorExplainer``) draw ``x'`` from the
training set; no data set ships with this project, so ``D`` is made from the image itself:
Gaussian-blurred copies of it (σ drawn in [1, :data:`MAX_BLUR`] pixels, Sturmfels et al., Distill
2020, "blurred baseline") or uniform noise images.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from idg_core.budget import WorkBound
from idg_core.methods._common import Method, method_function
from idg_core.methods.params import Param, Params, output_param
from idg_core.types import AttributionResult, Output, Plan, Query

REFERENCES = ("blur", "noise")
MAX_BLUR = 32.0
"""Largest σ (pixels) of a blurred reference: at 224² it leaves little more than the colour layout."""


def gaussian_blur(x: Tensor, sigma: float) -> Tensor:
    """``x (C, H, W)`` blurred by a separable Gaussian of ``sigma`` pixels (reflected borders)."""
    if sigma <= 0:
        return x.clone()
    radius = max(1, min(math.ceil(3 * sigma), x.shape[-1] - 1, x.shape[-2] - 1))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = (k / k.sum()).to(x.device, x.dtype)
    c = x.shape[0]
    img = F.pad(x.unsqueeze(0), (radius, radius, radius, radius), mode="reflect")
    img = F.conv2d(img, k.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
    img = F.conv2d(img, k.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
    return img[0]


def reference_images(x: Tensor, kind: str, count: int, seed: int) -> Tensor:
    """``count`` references ``(count, C, H, W)`` for ``x (C, H, W)``: ``blur`` (x blurred, σ drawn
    uniformly in [1, MAX_BLUR]) or ``noise`` (uniform in [0, 1]); reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "noise":
        return torch.rand((count, *x.shape), generator=gen).to(x.device, x.dtype)
    sigmas = 1.0 + (MAX_BLUR - 1.0) * torch.rand(count, generator=gen, dtype=torch.float64)
    return torch.stack([gaussian_blur(x, float(s)) for s in sigmas])


PARAMS = Params("eg", (
    Param("samples", int, 32, "Draws of (reference, α), one gradient each; the estimate's noise falls as 1/sqrt(samples)",
          low=1, step=True),
    Param("references", str, "blur", "Where references come from: 'blur', the image blurred (σ in [1, 32] px), or 'noise', "
          "uniform noise images", choices=REFERENCES),
    Param("seed", int, 0, "Seed of the draws", low=0),
    output_param("logit"),
))


def eg_bound(params: Mapping[str, Any]) -> WorkBound:
    """Cost of :func:`eg_plan` with ``params`` (every keyword given): one gradient per sample."""
    return WorkBound(int(params["samples"]), int(params["samples"]))


def eg_plan(x: Tensor, baseline: Tensor, target: int, **params: Any) -> Plan:
    """Plan for one image ``x (C, H, W)`` (``params``: :data:`PARAMS`, checked now); see :func:`eg`.
    ``baseline`` is not used: the references are drawn."""
    return _plan(x, target, **PARAMS.validate(params))


def _plan(x: Tensor, target: int, *, samples: int, references: str, seed: int, output: Output) -> Plan:
    refs = reference_images(x, references, samples, seed)  # (k, C, H, W)
    alphas = torch.rand(samples, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    diffs = x.unsqueeze(0) - refs
    points = refs + alphas.to(x.device, x.dtype).view(-1, 1, 1, 1) * diffs
    (ans,) = yield [Query.at(points, target, grad=True, output=output, label="expected-gradient draws")]
    assert ans.grads is not None
    # grads: (k, C, H, W) ⊙ diffs, averaged over the draws -> (C, H, W)
    attr = (ans.grads * diffs).mean(0)
    return AttributionResult(attributions=attr.unsqueeze(0), forward_passes=samples, backward_passes=samples)


eg = method_function("eg", eg_plan, PARAMS, """Expected Gradients: EG = mean_j (x - x'_j) ⊙ ∇F(x'_j + α_j (x - x'_j))
with references x'_j drawn from the image's blurred copies (or noise) and α_j ~ U(0, 1). ``baseline`` is
ignored (None is accepted).""", uses_baseline=False)

METHOD = Method(eg, eg_plan, PARAMS, eg_bound, "Expected Gradients: IG over drawn references and path positions",
                presets={"fast": {"samples": 32}, "paper": {"samples": 50}, "quality": {"samples": 50}})
