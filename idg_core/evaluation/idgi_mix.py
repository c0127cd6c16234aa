"""Issue #47's candidate against IDGI's deletion cost: a straight-path method's own map and its IDGI map,
both from the same gradient pass (SmoothGrad's noisy copies included), ranked and averaged. It costs
exactly what the method with IDGI costs; ``idgi_mix`` is IDGI's weight (0: the method's map's order,
1: IDGI's).

Also :func:`rank_shift`, what the analysis of which pixels IDGI moves reads: where the pixels of one
map's top and bottom share sit in the other map's order."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.methods import METHODS
from idg_core.postprocess import idgi_plan
from idg_core.postprocess.smoothgrad import noisy_copies, smooth_plan
from idg_core.types import AttributionResult, Plan


def ranks(sal: Tensor) -> Tensor:
    """Each pixel's place in ``sal (H, W)``'s order, 0 (least) to 1 (most salient), float64."""
    flat = sal.flatten().double()
    order = torch.argsort(flat, stable=True)
    r = torch.empty_like(flat)
    r[order] = torch.arange(flat.numel(), dtype=torch.float64) / max(flat.numel() - 1, 1)
    return r.view(sal.shape)


def _both(inner: Plan) -> Plan:
    """``inner`` with IDGI, its attributions ``(1, 2C, H, W)``: the method's own map, then IDGI's."""
    own: list[Tensor] = []

    def keep() -> Plan:
        result = yield from inner
        own.append(result.attributions.clone())
        return result

    result = yield from idgi_plan(keep())
    result.attributions = torch.cat([own[0], result.attributions], dim=1)
    return result


def idgi_mix_plan(method: str, x: Tensor, baseline: Tensor, target: int, *, idgi_mix: float, smooth_samples: int = 0,
                  smooth_std: float = 0.15, smooth_seed: int = 0, **kwargs: Any) -> Generator[Any, Any, AttributionResult]:
    """The plan of ``method`` (a straight-path method, ``kwargs`` its parameters) on ``x``, SmoothGrad over
    ``smooth_samples`` copies when > 0, returning the rank average ``(1 - idgi_mix) · rank(own) + idgi_mix ·
    rank(IDGI)`` of the two smoothed maps' saliencies, spread evenly over the channels (non-negative)."""
    if not 0.0 <= idgi_mix <= 1.0:
        raise ValueError(f"idgi_mix must be in [0, 1], got {idgi_mix}")
    kwargs.pop("postprocess", None)  # IDGI is computed here, beside the method's own map

    def one(xi: Tensor) -> Plan:
        return _both(METHODS[method].plan(xi, baseline, target, **kwargs))

    plan = smooth_plan([one(xi) for xi in noisy_copies(x, smooth_samples, smooth_std, smooth_seed)]) if smooth_samples else one(x)
    result = yield from plan
    c = result.attributions.shape[1] // 2
    own, idgi = saliency(result.attributions[0, :c]), saliency(result.attributions[0, c:])
    mixed = (1.0 - idgi_mix) * ranks(own) + idgi_mix * ranks(idgi)
    result.attributions = (mixed / c).to(x.dtype).to(x.device).expand(c, -1, -1).unsqueeze(0).contiguous()
    return result


def rank_shift(a: Tensor, b: Tensor, share: float = 0.1) -> dict[str, float]:
    """Where the top and bottom ``share`` of map ``a``'s pixels (``(H, W)`` saliencies) sit in ``b``'s order
    (mean rank in [0, 1]), how many of ``a``'s top are in ``b``'s top (overlap, [0, 1]), and the Spearman
    correlation of the two orders."""
    ra, rb = ranks(a).flatten(), ranks(b).flatten()
    top, bottom = ra >= 1.0 - share, ra < share
    rho = float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])
    return {"top_in_b": float(rb[top].mean()), "bottom_in_b": float(rb[bottom].mean()),
            "top_overlap": float((rb[top] >= 1.0 - share).double().mean()), "spearman": rho}
