"""ROAD: RemOve And Debias (Rong, Leemann et al., "A Consistent and Efficient Evaluation Strategy for
Attribution Methods", ICML 2022, https://arxiv.org/abs/2202.00449; reference code
``tleemann/road_evaluation``, ``road/imputations.py``; Quantus's ``ROAD``).

Removing pixels by replacing them with a constant (deletion's substrate) leaks the mask's shape to
the model: it can recognise the class from where the holes are. ROAD fills removed pixels with the
*noisy linear imputation*: each removed pixel is the weighted mean of its 8 neighbours (1/6 for the
4 direct, 1/12 for the diagonal ones, the weights of neighbours outside the image dropped), which
is one sparse linear system over the removed pixels, plus Gaussian noise (0.01 in the model's
normalised units, as the reference adds to its normalised images), solved on the CPU by a sparse LU
factorisation (SuperLU, one factorisation for all channels) of the system in a *nested-dissection*
order of the pixel grid (:func:`_dissection_rank`): the same solution as the reference's
``scipy.sparse.linalg.spsolve`` (COLAMD order) up to rounding (~1e-13 on [0, 1] pixels, a test checks
it), with less fill and less time (``benchmarks/road_solve.py``). Conjugate gradients in torch are slower, and a
two-level smoothed-aggregation preconditioner is no faster in Python and not exact (the figures: docs/results/speed.md).

Why no pivoting is needed: the negated matrix (positive diagonal s_i, off-diagonals −w) is symmetric
(the weights are symmetric in the offset) and diagonally dominant, strictly so in a row with a kept or
out-of-image neighbour; each 8-connected region of removed pixels touches a kept pixel when one is kept
at all, so it is an irreducibly diagonally dominant M-matrix: positive definite, and LU in any symmetric
order without pivoting is stable.

For each level p in :data:`LEVELS`, MoRF removes the p most salient pixels and LeRF the p least
salient; the score is the softmax probability of the class predicted on the original image.
``road_morf`` (mean over levels, lower is better) and ``road_lerf`` (higher is better). Cost per
image: ``2 × len(LEVELS)`` forward passes and as many imputations.

MoRF and LeRF are one measurement in two directions (the same imputation, levels and noise, one :func:`road` call
gives both), so this file declares both metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from idg_core.metrics.curves import Curve, Metric
from idg_core.types import Model

if TYPE_CHECKING:  # scipy is imported where a solve needs it: not at the service's start
    from scipy.sparse import csc_matrix

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""Shares of pixels removed (the ROAD paper's 10% ... 90%)."""
_WEIGHTS = (((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12), ((0, -1), 1 / 6), ((-1, -1), 1 / 12),
            ((1, 0), 1 / 6), ((-1, 0), 1 / 6))
"""The reference's neighbour weights (offset, weight)."""


_LEAF = 4
"""Blocks of at most ``_LEAF × _LEAF`` pixels are not dissected further (fastest on a 224² grid)."""


@lru_cache(maxsize=8)
def _dissection_rank(h: int, w: int) -> np.ndarray:
    """Each pixel's position (``(H·W,)`` int64, row-major pixel index) in a geometric nested-dissection
    order of the ``h × w`` grid: a block is cut by its middle row (or column, the longer side), both
    halves ordered first, recursively, and the cut last. With the 8-neighbour stencil one row or column
    separates the halves, so the factor has no fill between them (O(n log n) fill on a grid). Any subset
    of pixels taken in this order is a dissection order of its own subgraph."""
    order: list[np.ndarray] = []
    stack: list[tuple[int, int, int, int, bool]] = [(0, h, 0, w, False)]  # (r0, r1, c0, c1, emit_as_separator)
    while stack:
        r0, r1, c0, c1, separator = stack.pop()
        if r1 <= r0 or c1 <= c0:
            continue
        if separator or (r1 - r0 <= _LEAF and c1 - c0 <= _LEAF):
            order.append((np.arange(r0, r1)[:, None] * w + np.arange(c0, c1)[None, :]).ravel())
        elif r1 - r0 >= c1 - c0:
            m = (r0 + r1) // 2  # popped in reverse: top half, bottom half, then the cut row
            stack += [(m, m + 1, c0, c1, True), (m + 1, r1, c0, c1, False), (r0, m, c0, c1, False)]
        else:
            m = (c0 + c1) // 2
            stack += [(r0, r1, m, m + 1, True), (r0, r1, m + 1, c1, False), (r0, r1, c0, m, False)]
    rank = np.empty(h * w, dtype=np.int64)
    rank[np.concatenate(order)] = np.arange(h * w)
    rank.flags.writeable = False
    return rank


def _system(flat: np.ndarray, kept: np.ndarray, miss: np.ndarray, h: int, w: int) -> tuple[csc_matrix, np.ndarray]:
    """The imputation's system for ``flat (C, H·W)`` with unknown k the pixel ``miss[k]`` (the removed
    pixels, ``kept`` False there): for each, s_i v_i - Σ_n w_n v_n = 0 (s_i: the weights of its
    in-image neighbours), the kept neighbours' terms moved to the right side ``(n, C)``."""
    from scipy.sparse import coo_matrix

    var = np.full(h * w, -1, dtype=np.int64)
    var[miss] = np.arange(miss.size)
    r, col = miss // w, miss % w
    diag = np.zeros(miss.size)
    rows, cols, vals = [np.arange(miss.size)], [np.arange(miss.size)], []
    rhs = np.zeros((miss.size, flat.shape[0]))
    for (dr, dc), weight in _WEIGHTS:
        rr, cc = r + dr, col + dc
        inside = (rr >= 0) & (rr < h) & (cc >= 0) & (cc < w)
        idx, nb = np.flatnonzero(inside), rr[inside] * w + cc[inside]
        diag[idx] += weight
        known = kept[nb]
        rhs[idx[known]] += weight * flat[:, nb[known]].T
        rows.append(idx[~known])
        cols.append(var[nb[~known]])
        vals.append(np.full(int((~known).sum()), -weight))
    a = coo_matrix((np.concatenate([diag, *vals]), (np.concatenate(rows), np.concatenate(cols))), shape=(miss.size, miss.size))
    return a.tocsc(), rhs


def impute_one(img: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``img (C, H, W)`` with the pixels where ``keep (H, W)`` is False solved for (:func:`_system`),
    the removed pixels numbered in nested-dissection order (:func:`_dissection_rank`)."""
    c, h, w = img.shape
    flat, kept = img.reshape(c, -1).astype(np.float64), keep.ravel()
    removed = np.flatnonzero(~kept)
    if removed.size == 0:
        return img.copy()
    miss = removed[np.argsort(_dissection_rank(h, w)[removed], kind="stable")]
    a, rhs = _system(flat, kept, miss, h, w)
    from scipy.sparse.linalg import splu

    # the order is ours (NATURAL); positive definite, so no pivoting (a zero threshold keeps the diagonal)
    lu = splu(a, permc_spec="NATURAL", diag_pivot_thresh=0.0, options={"SymmetricMode": True})
    out = flat.copy()
    out[:, miss] = lu.solve(rhs).T
    return out.reshape(c, h, w)


def spsolve_impute(img: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """:func:`impute_one`'s answer as the reference computes it: ``scipy.sparse.linalg.spsolve``
    (SuperLU, COLAMD order, partial pivoting) with the pixels in row-major order: the check and benchmark
    reference."""
    c, h, w = img.shape
    flat, kept = img.reshape(c, -1).astype(np.float64), keep.ravel()
    miss = np.flatnonzero(~kept)
    if miss.size == 0:
        return img.copy()
    from scipy.sparse.linalg import spsolve

    a, rhs = _system(flat, kept, miss, h, w)
    out = flat.copy()
    out[:, miss] = np.asarray(spsolve(a, rhs)).reshape(miss.size, c).T
    return out.reshape(c, h, w)


def linear_impute(x: Tensor, keep: Tensor, pool: Executor | None = None) -> Tensor:
    """``x (B, C, H, W)`` with the pixels where ``keep (B, H, W)`` is False replaced by the solution of
    the neighbour-mean system (no noise), on the CPU (one solve per image, in ``pool``'s processes when
    given). Every image must keep at least one pixel."""
    if not bool(keep.flatten(1).any(1).all()):
        raise ValueError("linear_impute needs at least one kept pixel per image")
    xs, ks = x.detach().cpu().double().numpy(), keep.cpu().numpy()
    solved = pool.map(impute_one, list(xs), list(ks)) if pool else map(impute_one, xs, ks)
    return torch.from_numpy(np.stack(list(solved))).to(x.device, x.dtype)


def removal_masks(saliency: Tensor, levels: Sequence[float], most_first: bool) -> Tensor:
    """``(B, L, H, W)`` bool, True where a pixel is kept at each level: the ``round(p·H·W)`` most
    (``most_first``) or least salient pixels of ``saliency (B, H, W)`` removed, ties by index."""
    b, h, w = saliency.shape
    order = torch.argsort(saliency.flatten(1), dim=1, descending=most_first, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(h * w, device=order.device).expand(b, -1))
    counts = torch.tensor([round(p * h * w) for p in levels], device=saliency.device)
    return (rank.unsqueeze(1) >= counts.view(1, -1, 1)).view(b, len(levels), h, w)


def road(model: Model, x: Tensor, saliency: Tensor, *, std: Sequence[float], levels: Sequence[float] = LEVELS,
         noise: float = 0.01, seed: int = 0, batch_size: int = 64, pool: Executor | None = None) -> dict[str, list[Curve]]:
    """ROAD curves of ``x (B, C, H, W)`` (pixels in [0, 1]) ranked by ``saliency (B, H, W)``:
    ``{"morf": [...], "lerf": [...]}``, one :class:`Curve` per image (``x`` the levels, ``y`` the
    probabilities, ``auc`` their mean). ``std``: the model's normalisation std (noise in its units);
    ``pool``: processes for the sparse solves (the evaluation's PIC pool)."""
    b, c, h, w = x.shape
    with torch.no_grad():
        cls = model(x).argmax(1)
    sd = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[Curve]] = {}
    for name, most_first in (("morf", True), ("lerf", False)):
        keep = removal_masks(saliency.to(x.device), levels, most_first).flatten(0, 1)  # (B·L, H, W)
        xs = x.repeat_interleave(len(levels), 0)
        filled = linear_impute(xs, keep, pool)
        jitter = torch.randn(filled.shape, generator=gen).to(x.device, x.dtype) * noise * sd
        imgs = torch.where(keep.unsqueeze(1), xs, filled + jitter)
        probs = []
        with torch.no_grad():
            for i in range(0, len(imgs), batch_size):
                rows = cls.repeat_interleave(len(levels))[i : i + batch_size]
                probs.append(torch.softmax(model(imgs[i : i + batch_size]), 1).gather(1, rows.view(-1, 1)).squeeze(1))
        scores = torch.cat(probs).view(b, len(levels)).double().cpu().numpy()
        out[name] = [Curve(np.asarray(levels, dtype=np.float64), s, float(s.mean())) for s in scores]
    return out


_ROAD_COST = "18 forward passes, and 18 sparse solves on the CPU (noisy linear imputation)"
ROAD_MORF = Metric("road_morf", higher_is_better=False, runs_as="road", default=False, cost=_ROAD_COST,
                   summary="ROAD, most relevant first: the class's probability with the most salient 10-90% of the pixels "
                           "imputed from their neighbours, averaged over the levels")
ROAD_LERF = Metric("road_lerf", higher_is_better=True, runs_as="road", default=False, cost=_ROAD_COST,
                   summary="ROAD, least relevant first: as MoRF, removing the least salient pixels")
