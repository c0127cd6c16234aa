"""SmoothGrad (Smilkov et al. 2017, https://arxiv.org/abs/1706.03825) and VarGrad (Adebayo et al.
2018) around any method's plan: the method runs on ``samples`` noisy copies ``x + N(0, std²)``
(pixel units, images in [0, 1]) and the maps are averaged (``smoothgrad``) or their variance taken
(``vargrad``). The copies' plans run in lock-step, so their points share the same model calls; the
cost is ``samples`` times the method's, or, where the copies share the method's probe of the image itself
(:func:`shared_probe_plan`), the probe once and ``samples`` times the rest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from idg_core.lockstep import lockstep
from idg_core.types import AttributionResult, Plan, PlanOf

SMOOTH_KINDS = ("smoothgrad", "vargrad")


def noisy_copies(x: Tensor, samples: int, std: float, seed: int) -> Tensor:
    """``(samples, C, H, W)``: ``x + N(0, std²)``, reproducible from ``seed`` (drawn on the CPU)."""
    gen = torch.Generator().manual_seed(seed)
    noise = torch.randn((samples, *x.shape), generator=gen, dtype=torch.float32) * std
    return x.unsqueeze(0) + noise.to(x.device, x.dtype)


def smooth_plan(plans: list[Plan], kind: str = "smoothgrad") -> Plan:
    """Drive ``plans`` (one per noisy copy) in lock-step, each round yielding all their queries
    together; pool the maps. The result keeps the first copy's curve and the summed cost."""
    if kind not in SMOOTH_KINDS:
        raise ValueError(f"smooth_kind must be one of {', '.join(SMOOTH_KINDS)}, got {kind!r}")
    if not plans:
        raise ValueError("smooth_samples must be >= 1")
    done: list[AttributionResult] = yield from lockstep(plans)
    maps = torch.stack([r.attributions for r in done])  # (samples, 1, C, H, W)
    pooled = maps.mean(0) if kind == "smoothgrad" else maps.var(0, unbiased=False)
    first = done[0]
    first.attributions = pooled
    first.forward_passes = sum(r.forward_passes for r in done)
    first.backward_passes = sum(r.backward_passes for r in done)
    return first


def shared_probe_plan(probe: PlanOf[Any], probe_passes: int, copies: Callable[[Any], list[Plan]],
                      kind: str = "smoothgrad") -> Plan:
    """Run ``probe`` (on the image itself, ``probe_passes`` forward images), then the noisy copies' plans
    ``copies(its result)`` as :func:`smooth_plan`: the copies place their samples where the image's own output moves,
    and the probe is paid once (counted here)."""
    sampling = yield from probe
    result: AttributionResult = yield from smooth_plan(copies(sampling), kind)
    result.forward_passes += probe_passes
    return result
