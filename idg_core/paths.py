"""Path maths in one place: baselines, quadrature rules (alphas and weights), IDG's adaptive rule.

Every rule returns ``(alphas, weights)`` as float64 tensors on the CPU; the path point for ``alpha``
is ``baseline + alpha * (x - baseline)``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from idg_core import preprocess
from idg_core.types import BaselineLike, to_device

log = logging.getLogger(__name__)

IG_RULES = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "uniform", "adaptive")
PLACEMENTS = ("aligned", "authors")


def resolve_baseline(baseline: BaselineLike, x: Tensor, mean: Sequence[float] | None = None) -> Tensor:
    """``"black"`` (zeros), ``"mean"`` or a tensor broadcastable to ``x``.

    ``"mean"`` is the model's normalisation ``mean`` (per channel, pixels in [0, 1]): zero in the
    model's normalised space, the IDG authors' baseline. That is the ImageNet mean colour for
    models normalised with ImageNet statistics and grey for EfficientNet-Lite; without ``mean``
    (a model that does not say), the ImageNet mean colour. The methods pass their model's
    ``preprocessing.mean`` when it has one, and so do the service and the evaluation."""
    if isinstance(baseline, str):
        if baseline == "black":
            return torch.zeros_like(x)
        if baseline == "mean":
            if x.shape[-3] != 3:
                raise ValueError(f"baseline 'mean' needs 3-channel images, got {x.shape[-3]} channels")
            if mean is None:
                mean = preprocess.IMAGENET_MEAN
            colour = to_device(torch.tensor(tuple(mean), dtype=x.dtype), x.device).view(3, 1, 1)
            return colour.expand_as(x).clone()
        raise ValueError(f"baseline must be 'black', 'mean' or a tensor, got {baseline!r}")
    if not isinstance(baseline, Tensor):
        raise ValueError(f"baseline must be 'black', 'mean' or a tensor, got {type(baseline).__name__}")
    try:
        return torch.broadcast_to(baseline.to(x.device, x.dtype), x.shape).clone()
    except RuntimeError as err:
        raise ValueError(f"baseline of shape {tuple(baseline.shape)} does not broadcast to {tuple(x.shape)}") from err


def ig_rule(rule: str, steps: int) -> tuple[Tensor, Tensor]:
    """Captum's quadrature rules over [0, 1], plus ``uniform`` (the IDG authors' IG:
    ``linspace(0, 1, steps)`` with equal weights ``1 / steps``)."""
    n = steps
    if rule == "gausslegendre":
        nodes, gl_weights = np.polynomial.legendre.leggauss(n)
        return torch.from_numpy(0.5 * (nodes + 1)), torch.from_numpy(0.5 * gl_weights)
    if rule == "riemann_left":
        return torch.arange(n, dtype=torch.float64) / n, torch.full((n,), 1 / n, dtype=torch.float64)
    if rule == "riemann_right":
        return torch.arange(1, n + 1, dtype=torch.float64) / n, torch.full((n,), 1 / n, dtype=torch.float64)
    if rule == "riemann_middle":
        return (torch.arange(n, dtype=torch.float64) + 0.5) / n, torch.full((n,), 1 / n, dtype=torch.float64)
    if rule == "riemann_trapezoid":
        w = torch.full((n,), 1 / (n - 1), dtype=torch.float64)
        w[0] = w[-1] = 0.5 / (n - 1)
        return torch.linspace(0, 1, n, dtype=torch.float64), w
    if rule == "uniform":
        return torch.linspace(0, 1, n, dtype=torch.float64), torch.full((n,), 1 / n, dtype=torch.float64)
    raise ValueError(f"rule must be one of {', '.join(IG_RULES[:-1])} here ('adaptive' needs the path: "
                     f"see idg_core.methods.ig); got {rule!r}")


def probe_alphas(probe_steps: int) -> Tensor:
    """IDG's uniform probe: ``alpha_k = k / (N - 1)``, endpoints included."""
    return torch.linspace(0, 1, probe_steps, dtype=torch.float64)


def allocate_samples(probe_logits: Tensor, steps: int) -> Tensor:
    """How many of the ``steps`` samples each probe interval gets (Algorithm 1, step 2).

    ``probe_logits (N,)``; returns ``counts (N,)`` int64 with ``counts[0] == 0`` (slot k >= 1 is the
    interval ``[alpha_{k-1}, alpha_k]``) and ``counts.sum() == steps`` always. Slopes are min-max
    normalised, the first set to 0, shares truncated; leftovers go one each to empty intervals with
    the largest fractional share (the authors' rule), then to any interval by fractional share. A
    flat curve (all slopes equal) is spread uniformly, where the authors' code divides by zero. A curve with a
    NaN or an infinity is refused (``ValueError``, saying so): no allocation of it means anything.

    A handful of values (N probe points), so plain Python floats, not tensors: a torch op costs microseconds of
    dispatch, and this runs once per explanation on the service's worker thread, where torch's dispatch would be its largest
    single cost (measured: docs/results/speed.md).
    """
    logits = probe_logits.detach().to("cpu", torch.float64).reshape(-1).tolist()
    n = len(logits)
    bad = sum(not math.isfinite(v) for v in logits)
    if bad:  # the rule would spread such a curve uniformly (NaN) or cast NaN shares to int64's minimum (infinity)
        raise ValueError(f"the model's output is not finite (NaN or infinity) at {bad} of the {n} probe points: it overflowed "
                         "on this image; a model in bf16 may need fp32 (IDG_PRECISION, or precision in the models file)")
    slopes = [0.0] + [(b - a) * (n - 1) for a, b in zip(logits, logits[1:], strict=False)]
    low, high = min(slopes), max(slopes)
    spread = high - low
    norm = [(v - low) / spread for v in slopes] if spread > 0 else [1.0] * n
    norm[0] = 0.0
    total = _sum(norm)
    if total <= 0:
        norm = [0.0] + [1.0] * (n - 1)
        total = _sum(norm)
    share = [v / total * steps for v in norm]
    counts = [0] + [math.floor(v) for v in share[1:]]
    left = steps - sum(counts)
    frac = [-1.0] + [v - c for v, c in zip(share[1:], counts[1:], strict=True)]
    empty_first = [f if c == 0 else -2.0 for f, c in zip(frac, counts, strict=True)]
    for k in _descending(empty_first)[:left]:
        if empty_first[k] < -0.5 or left == 0:
            break
        counts[k] += 1
        left -= 1
    order = _descending(frac)[: n - 1]
    while left > 0:
        for k in order:
            if left == 0:
                break
            counts[k] += 1
            left -= 1
    assert sum(counts) == steps and counts[0] == 0
    return torch.tensor(counts, dtype=torch.int64)


def _sum(values: list[float]) -> float:
    """Summed as torch sums (its order of additions, so its rounding): the shares, and the allocation, are then
    bit for bit those of the rule written in torch."""
    return float(torch.tensor(values, dtype=torch.float64).sum())


def _descending(values: list[float]) -> list[int]:
    """Indices of ``values`` from the largest, ties in index order (``torch.argsort(descending=True, stable=True)``)."""
    return sorted(range(len(values)), key=lambda k: -values[k])


def place_samples(counts: Tensor, probe_steps: int, placement: str = "aligned") -> tuple[Tensor, Tensor]:
    """Sample positions and weights from the allocation (Algorithm 1, step 3).

    ``aligned``: the ``n_k`` samples of interval k lie inside ``[(k-1)Δ, kΔ]`` at
    ``start_k + jΔ/n_k``, weight ``Δ/n_k``. ``authors``: the published code, which advances the
    interval start only past intervals that received samples, so after the first empty interval the
    samples drift left (kept for comparison runs only).
    """
    delta = 1.0 / (probe_steps - 1)
    alphas: list[float] = []
    weights: list[float] = []
    next_start = 0.0
    for k, nk in enumerate(counts.tolist()):
        if nk == 0:
            continue
        start = (k - 1) * delta if placement == "aligned" else next_start
        alphas += [start + j * delta / nk for j in range(nk)]
        weights += [delta / nk] * nk
        next_start += delta
    return torch.tensor(alphas, dtype=torch.float64), torch.tensor(weights, dtype=torch.float64)

