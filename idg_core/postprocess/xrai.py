"""XRAI (Kapishnikov et al., ICCV 2019, https://arxiv.org/abs/1906.02825) as a post-step over any method's map.

The photo is cut into overlapping segments (Felzenszwalb's graph segmentation at several scales, each segment dilated),
then regions are added greedily: each round takes the segment whose part not yet covered has the most attribution per
pixel (the gain), until no segment adds :data:`MIN_PIXEL_DIFF` new pixels; pixels no segment reached form a last region.
Segments, gain and order are those of PAIR's ``saliency`` package (``saliency.core.xrai``, PyPI 0.2.1): its image
normalisation, scales, sigma, minimum segment size, dilation, ``min_pixel_diff`` and ``area_threshold`` (1.0), its ties
(the first segment) and its ranks (regions by gain, the remainder last). The attribution XRAI weighs is the map's
saliency ``Σ_c |a|`` (what the metrics rank), not PAIR's channel maximum.

The map it returns ranks regions first; with ``xrai_order="regions_then_pixels"`` (the default) the pixels inside each
region keep the base map's order, so deletion and insertion still see the method's pixel order; ``"regions"`` is plain
XRAI (every pixel of a region equal). Values are ranks in (0, 1], spread evenly over the channels: not additive.

Cost: no model pass; host work only. The regions are found on a grid of at most :data:`MAX_SIDE` pixels a side (a larger
map is area-averaged to it and the region labels scaled back), so the time is bounded whatever the model's input size;
sorting the pixels at full size is the only part that grows with it (docs/methods/xrai.md has the measured seconds). It
runs on a thread of its own (:data:`HOST`) while the plan waits at checkpoints.
"""

from __future__ import annotations

from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.types import AttributionResult, Plan, Regions

SCALES = (50, 100, 150, 250, 500, 1200)
"""Felzenszwalb scales (PAIR's ``_FELZENSZWALB_SCALE_VALUES``), each one segmentation of the photo."""
SIGMA, MIN_SEGMENT, SEGMENT_SIDE, DILATION = 0.8, 150, 224, 5
"""PAIR's Gaussian pre-smoothing, smallest segment (pixels), side the photo is resized to for segmenting, and the radius
(pixels, disk) each segment is dilated by at the map's size."""
MIN_PIXEL_DIFF = 50
"""A segment that would add fewer new pixels than this is dropped (PAIR's ``min_pixel_diff``)."""
MAX_SIDE = 320
"""Largest side the regions are found at: a larger map is area-averaged to this size first (the host time's bound)."""
HOST = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idg-xrai")
"""Where XRAI's host work runs, one map at a time: off the thread that drives the model calls, which it would otherwise
hold for its whole second (scikit-image's segmentation holds the GIL for at most about 0.1 s at a time)."""
XRAI_ORDERS = ("regions_then_pixels", "regions")
"""The ``xrai_order`` values: regions first and the base map's pixel order inside each; or the regions alone."""


def segment_masks(image: np.ndarray) -> list[np.ndarray]:
    """The XRAI segments of ``image (H, W, C)`` (any range) as boolean ``(H, W)`` masks, as PAIR's
    ``_get_segments_felzenszwalb``: values scaled to [-1, 1], resized to :data:`SEGMENT_SIDE` square for the segmentation
    (cubic, anti-aliased), each scale's labels scaled back (nearest), one mask per label, each dilated by a disk of
    :data:`DILATION` pixels (done on the mask's bounding box: the same pixels, a fraction of the work)."""
    # scikit-image and SciPy only when XRAI runs: the server starts without importing them (start-up imports test)
    from scipy import ndimage
    from skimage import segmentation
    from skimage.morphology import disk
    from skimage.transform import resize

    lo, hi = float(image.min()), float(image.max())
    im = (image - lo) / (hi - lo) * 2.0 - 1.0 if hi > lo else np.zeros_like(image, dtype=np.float64)
    im = resize(im, (SEGMENT_SIDE, SEGMENT_SIDE), order=3, mode="constant", preserve_range=True, anti_aliasing=True)
    shape = image.shape[:2]
    footprint = disk(DILATION).astype(bool)
    masks = []
    for scale in SCALES:
        seg = segmentation.felzenszwalb(im, scale=scale, sigma=SIGMA, min_size=MIN_SEGMENT)
        seg = resize(seg, shape, order=0, preserve_range=True, mode="constant", anti_aliasing=False).astype(int)
        boxes = ndimage.find_objects(seg - seg.min() + 1)
        for label in range(int(seg.min()), int(seg.max()) + 1):
            mask = np.zeros(shape, dtype=bool)
            box = boxes[label - int(seg.min())] if label - int(seg.min()) < len(boxes) else None
            if box is not None:
                grown = tuple(slice(max(s.start - DILATION, 0), min(s.stop + DILATION, n)) for s, n in zip(box, shape, strict=True))
                mask[grown] = ndimage.binary_dilation(seg[grown] == label, structure=footprint)
            masks.append(mask)
    return masks


def xrai_regions(attr: np.ndarray, masks: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """PAIR's ``XRAI._xrai`` (its defaults) on the saliency ``attr (H, W)`` and the boolean ``masks``: the rank of each
    pixel's region ``(H, W)`` int32 (1 first) and each region's gain ``(R,)``. Each segment's uncovered sum and count are
    kept and lowered as pixels are covered (a sparse product per round over the pixels just covered), not recounted
    over the image each round; near ties are settled as PAIR settles them, on its own arithmetic."""
    from scipy import sparse

    a = attr.astype(np.float64).ravel()
    n = len(masks)
    if n:
        flat = [np.flatnonzero(m) for m in masks]
        indptr = np.r_[0, np.cumsum([len(f) for f in flat])]
        rows = sparse.csr_matrix((np.ones(int(indptr[-1])), np.concatenate(flat), indptr), shape=(n, a.size))
        cols = rows.tocsc()
        sums, counts = rows @ a, np.asarray(rows.sum(1)).ravel()
    alive = np.ones(n, dtype=bool)
    covered = np.zeros(a.size, dtype=bool)
    order = np.zeros(a.size, dtype=np.int64)  # the round that covered each pixel, 1-based
    gains: list[float] = []
    while n:
        alive &= counts >= MIN_PIXEL_DIFF
        if not alive.any():
            break
        density = np.where(alive, sums / np.maximum(counts, 1), -np.inf)
        top = float(density.max())
        near = np.flatnonzero(alive & (density >= top - 1e-9 * max(abs(top), 1.0)))
        best, gain = int(near[0]), top
        if len(near) > 1:  # PAIR's own means, the first strictly greatest
            exact = [a[(masks[k].ravel()) & ~covered].mean() for k in near]
            pick = int(np.argmax(exact))
            best, gain = int(near[pick]), float(exact[pick])
        pixels = rows.indices[rows.indptr[best]:rows.indptr[best + 1]]
        new = pixels[~covered[pixels]]
        covered[new] = True
        order[new] = len(gains) + 1
        gains.append(gain)
        hit = cols[:, new]
        sums -= hit @ a[new]
        counts -= np.asarray(hit.sum(1)).ravel()
        alive[best] = False
    by_gain = np.argsort(-np.asarray(gains), kind="stable")  # PAIR: sorted(key=-gain), stable
    rank = np.zeros(len(gains) + 1, dtype=np.int32)
    rank[by_gain + 1] = np.arange(1, len(gains) + 1, dtype=np.int32)
    ranked = [gains[i] for i in by_gain]
    if not covered.all():
        rank[0] = len(gains) + 1
        ranked.append(float(a[~covered].mean()))
    return rank[order].reshape(attr.shape), np.asarray(ranked, dtype=np.float64)


def ranked_map(labels: np.ndarray, count: int, sal: np.ndarray, order: str) -> np.ndarray:
    """Each pixel's place in (0, 1] (1 the first) when pixels are ranked by their region's rank in ``labels (H, W)``
    (1 to ``count``), then, for ``regions_then_pixels``, by ``sal (H, W)`` (>= 0) inside the region (equal values in a
    region share the mean of their places; values within 1e-13 of the map's largest count as equal: one sort of one float64
    key, region offset plus the saliency scaled into [0, 1)); for ``regions``, the region's place alone,
    ``(count + 1 - rank) / count``."""
    if order == "regions":
        return ((count + 1 - labels) / count).astype(np.float64)
    top = float(sal.max())
    key = torch.from_numpy((count - labels.ravel()).astype(np.float64) + sal.ravel() / (top * (1 + 1e-9) if top > 0 else 1.0))
    ordered, keys = torch.sort(key)  # the last region first, then its least salient pixel
    ks = ordered.numpy()
    starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    sizes = np.diff(np.r_[starts, ks.size])
    value = np.empty(ks.size)
    value[keys.numpy()] = (np.repeat(starts + (sizes - 1) / 2.0, sizes) + 1) / ks.size
    return value.reshape(labels.shape)


def xrai(image: Tensor, attributions: Tensor, order: str = "regions_then_pixels") -> tuple[Tensor, Regions]:
    """The XRAI map of ``attributions (C, H, W)`` over ``image (C, H, W)`` (same size) and its regions. The map ranks
    every pixel by its region, then (``regions_then_pixels``) by the base saliency inside it: its pixel values are
    places in that order in (0, 1] (equal saliencies in a region share their mean place), spread evenly over the
    channels, in ``attributions``' dtype and device."""
    if order not in XRAI_ORDERS:
        raise ValueError(f"xrai_order must be one of {', '.join(XRAI_ORDERS)}, got {order!r}")
    if image.dim() != 3 or attributions.dim() != 3 or image.shape[1:] != attributions.shape[1:]:
        raise ValueError(f"XRAI needs an image and a map of the same size, got {tuple(image.shape)} and {tuple(attributions.shape)}")
    c, h, w = attributions.shape
    sal = saliency(attributions).double().numpy()
    side = max(h, w)
    if side > MAX_SIDE:  # regions on a bounded grid (area means), their labels scaled back (nearest)
        small = max(1, round(MAX_SIDE * h / side)), max(1, round(MAX_SIDE * w / side))
        cut = torch.nn.functional.interpolate(image.detach().float().cpu()[None], size=small, mode="area")[0].double().numpy()
        mean = torch.nn.functional.interpolate(torch.from_numpy(sal)[None, None], size=small, mode="area")[0, 0].numpy()
        labels, gains = xrai_regions(mean, segment_masks(cut.transpose(1, 2, 0)))
        rows, cols = np.arange(h) * small[0] // h, np.arange(w) * small[1] // w
        labels = labels[rows[:, None], cols[None, :]]
    else:
        labels, gains = xrai_regions(sal, segment_masks(image.detach().double().cpu().numpy().transpose(1, 2, 0)))
    value = ranked_map(labels, len(gains), sal, order)
    out = torch.from_numpy(value / c).to(attributions.device, attributions.dtype)
    areas = np.bincount(labels.ravel(), minlength=len(gains) + 1)[1:]
    regions = Regions(torch.from_numpy(labels.astype(np.int32)), torch.from_numpy(gains), torch.from_numpy(areas.astype(np.int64)))
    return out.expand(c, h, w).contiguous(), regions


def xrai_plan(inner: Plan, image: Tensor, order: str = "regions_then_pixels") -> Generator[Any, Any, AttributionResult]:
    """``inner`` (any method's plan, with its other post-steps) with its map replaced by XRAI's over ``image (C, H, W)``
    (:func:`xrai`) and the regions in ``result.regions``. No model pass: the host work runs on :data:`HOST`, and the plan
    yields empty checkpoints meanwhile, so whoever drives it (the service's worker) runs other plans' model calls."""
    result = yield from inner
    work = HOST.submit(xrai, image.detach(), result.attributions[0].detach(), order)
    while True:
        try:
            mapped, regions = work.result(timeout=0.001)
            break
        except TimeoutError:
            yield []  # a checkpoint: the driver may run other plans' calls, or drop this one
    result.attributions = mapped.unsqueeze(0)
    result.regions = [regions]
    return result
