"""What a person sees of a map, with the names Vertex AI's users know (docs/methods/visualization.md): the heatmap and
overlay as coloured ``pixels`` or as the ``outlines`` of the top regions covering a share of the image, which
``polarity`` of the attribution, clipped at which percentiles, through which colour map. A request that gives none of
these fields is rendered by :func:`idg_core.heatmap.heatmap_and_overlay_png` exactly as before they existed."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from app.core.errors import ApiError
from app.schemas import AttributeCommon
from idg_core.heatmap import DIVERGING, blend, colour_lut, heatmap_and_overlay_png, scale
from idg_core.png import FILTER_NONE, FILTER_UP, encode_png
from idg_core.types import Regions

CLIP_FIELDS = ("clip_percent_lowerbound", "clip_percent_upperbound")


def restyled(params: AttributeCommon) -> bool:
    """Whether the request asks for anything but the heatmap as it always was."""
    return (params.visualization != "pixels" or params.polarity is not None or params.color_map is not None
            or params.overlay_type != "original" or any(getattr(params, f) is not None for f in CLIP_FIELDS))


def check_visualization(params: AttributeCommon) -> None:
    """422 for fields that contradict each other (each field's own range is the schema's)."""
    given = params.model_fields_set
    if params.signed and params.polarity in ("positive", "negative"):
        raise ApiError(422, f"signed=true shows both signs (polarity=both), polarity={params.polarity} one: give one of them",
                       code="invalid_parameter")
    clip = [f for f in CLIP_FIELDS if getattr(params, f) is not None]
    if clip and "outlier_perc" in given:
        raise ApiError(422, f"outlier_perc and {' and '.join(clip)} are two ways to scale the heatmap: give one of them",
                       code="invalid_parameter")
    lower, upper = clip_bounds(params)
    if clip and lower >= upper:
        raise ApiError(422, f"clip_percent_lowerbound ({lower:g}) must be below clip_percent_upperbound ({upper:g})",
                       code="invalid_parameter")
    if "outline_share" in given and params.visualization != "outlines":
        raise ApiError(422, "outline_share is the share of the image outlined: it needs visualization=outlines",
                       code="invalid_parameter")


def clip_bounds(params: AttributeCommon) -> tuple[float, float]:
    """The clip percentiles asked for, an unset one at its end of the range."""
    lower, upper = params.clip_percent_lowerbound, params.clip_percent_upperbound
    return 0.0 if lower is None else lower, 100.0 if upper is None else upper


def polarity_map(attr: Tensor, polarity: str | None, signed: bool) -> np.ndarray:
    """``attr (C, H, W)`` -> the ``(H, W)`` float64 values shown: the signed channel sum's positive part, its negative
    part (kept negative), or all of it (``both``); unset, the magnitude Σ_c |a_c| (the signed sum with ``signed``)."""
    a = attr.detach().double().cpu().numpy()
    if polarity is None:
        return a.sum(0) if signed else np.abs(a).sum(0)
    total = a.sum(0)
    return {"positive": np.maximum(total, 0), "negative": np.minimum(total, 0), "both": total}[polarity]


def clip_scaled(values: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """``values`` scaled to [-1, 1] by their magnitudes' percentiles: 0 at and below the ``lower`` one (below zero when
    ``lower`` is 0: nothing hidden), full (±1) from the ``upper`` one, linear between; the sign kept."""
    mags = np.abs(values)
    lo, hi = (float(v) for v in np.percentile(mags, [lower, upper]))
    lo = lo if lower > 0 else 0.0
    unit = (mags > lo).astype(np.float64) if hi <= lo else np.clip((mags - lo) / (hi - lo), 0, 1)
    scaled: np.ndarray = (np.sign(values) * unit).astype(np.float32)
    return scaled


def colours(scaled: np.ndarray, color_map: str) -> np.ndarray:
    """Scaled ``(H, W)`` values in [-1, 1] -> ``(H, W, 3)`` uint8: a two-sided map (:data:`DIVERGING`) from its middle,
    negative values on its first half; a one-sided map shows the magnitude."""
    unit = (scaled + 1) / 2 if color_map in DIVERGING else np.abs(scaled)
    out: np.ndarray = colour_lut(color_map)[np.rint(unit * 255).astype(np.intp)]
    return out


def outline_labels(values: np.ndarray, share: float, regions: Regions | None) -> np.ndarray:
    """``(H, W)`` int: the outlined regions' labels, 0 elsewhere. XRAI's ``regions``: the first regions whose pixels
    together cover at most ``share`` of the image (at least the first; the Python client's ``Regions.top``), each its own
    label. Without them: the ``share`` of pixels strongest in ``|values|`` smoothed over about 1/28 of the image's side
    (so that they form blobs, not specks), one label; pixels of no attribution are never outlined."""
    if regions is not None:
        labels = regions.labels.numpy().astype(np.int64)
        covered = np.cumsum(regions.areas.numpy()) / labels.size
        count = max(1, int(np.searchsorted(covered, share, side="right")))
        return np.where(labels <= count, labels, 0)
    strength = _smoothed(np.abs(values), max(1, min(values.shape) // 56))
    flat = strength.ravel()
    keep = np.zeros(flat.size, dtype=bool)
    keep[np.argsort(-flat, kind="stable")[:max(1, round(share * flat.size))]] = True
    return (keep & (flat > 0)).reshape(values.shape).astype(np.int64)


def _smoothed(values: np.ndarray, radius: int) -> np.ndarray:
    """A box filter of ``2 radius + 1`` pixels applied twice along each axis (close to a Gaussian), edges repeated."""
    for axis in (0, 1, 0, 1):
        pad = [(radius, radius) if a == axis else (0, 0) for a in (0, 1)]
        sums = np.cumsum(np.pad(values, pad, mode="edge"), axis=axis)
        sums = np.concatenate([np.zeros_like(np.take(sums, [0], axis=axis)), sums], axis=axis)
        n = values.shape[axis]
        width = 2 * radius + 1
        values = (np.take(sums, np.arange(width, width + n), axis=axis) - np.take(sums, np.arange(n), axis=axis)) / width
    return values


def edges(labels: np.ndarray, width: int) -> np.ndarray:
    """``(H, W)`` bool: the labelled pixels within ``width`` steps (4-neighbour) of a pixel of another label or of the
    image's border: each region's outline, drawn inside it."""
    h, w = labels.shape
    padded = np.pad(labels, width, constant_values=-1)
    inner = labels > 0
    for dy in range(-width, width + 1):
        for dx in range(-width + abs(dy), width - abs(dy) + 1):
            inner &= padded[width + dy:width + dy + h, width + dx:width + dx + w] == labels
    return (labels > 0) & ~inner


def backdrop(image: Tensor, overlay_type: str) -> np.ndarray:
    """``image (C, H, W)`` in [0, 1] as the ``(H, W, 3)`` uint8 picture the overlay draws over: the photo itself, or its
    luma (ITU-R BT.601 weights) in grey with ``grayscale``."""
    photo = np.rint(image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    if photo.shape[2] == 1:
        return np.repeat(photo, 3, axis=2)
    if overlay_type == "grayscale":
        luma = np.rint(photo.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)).clip(0, 255).astype(np.uint8)
        return np.repeat(luma[..., None], 3, axis=2)
    return photo.copy()


def masked(photo: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``photo (H, W, 3)`` uint8 times ``weight (H, W)`` in [0, 1]: black where the map says nothing (Vertex AI's
    ``mask_black``)."""
    out: np.ndarray = np.rint(photo * weight[..., None].astype(np.float32)).clip(0, 255).astype(np.uint8)
    return out


def visual_pngs(image: Tensor, attr: Tensor, params: AttributeCommon, regions: Regions | None = None) -> tuple[bytes | None, bytes | None]:
    """The heatmap and overlay PNGs the request asked for (``return_heatmap``, ``return_overlay``), from the photo
    ``image (C, H, W)`` in [0, 1] and its finite map ``attr (C, H, W)``, XRAI's ``regions`` where the map has them.

    ``pixels``: each pixel's scaled value through the colour map; the overlay blends it over the photo as always
    (``opacity`` x sqrt|scaled|). ``outlines``: the heatmap keeps the colours inside the outlined regions (the colour
    of zero elsewhere) and the overlay is the photo; both draw the outline of the regions together (not of each
    region, whose inner borders would clutter the picture) in the colour map's full colour, about 1/112 of the side wide.
    ``overlay_type`` (Vertex AI's) changes what the overlay is drawn on: the photo in grey (``grayscale``); the photo
    kept by the map's weight, sqrt|scaled| (inside the outlined regions with outlines), black elsewhere and no colours
    (``mask_black``); or nothing, the overlay being the heatmap (``none``)."""
    heatmap, overlay = params.return_heatmap, params.return_overlay
    if not restyled(params):
        return heatmap_and_overlay_png(image, attr, heatmap=heatmap, overlay=overlay, opacity=params.opacity, signed=params.signed,
                                       outlier_perc=params.outlier_perc)
    values = polarity_map(attr, params.polarity, params.signed)
    if any(getattr(params, f) is not None for f in CLIP_FIELDS):
        scaled = clip_scaled(values, *clip_bounds(params))
    else:
        scaled = scale(torch.from_numpy(values), params.outlier_perc).numpy()
    two_signs = params.polarity == "both" or (params.polarity is None and params.signed)
    color_map = params.color_map or ("coolwarm" if two_signs else "inferno")
    kind = params.overlay_type
    if params.visualization == "pixels":
        heat = colours(scaled, color_map)
        if not overlay:
            over = None
        elif kind == "none":
            over = heat
        elif kind == "mask_black":
            over = masked(backdrop(image, kind), np.sqrt(np.abs(scaled)))
        else:  # the photo, or its grey, under the colours with blend's weights
            grey = torch.from_numpy(backdrop(image, kind)).permute(2, 0, 1).float() / 255 if kind == "grayscale" else image
            over = blend(grey, scaled, heat, params.opacity)
        return encode_png(heat, FILTER_NONE) if heatmap else None, encode_png(over, FILTER_UP) if over is not None else None
    labels = outline_labels(values, params.outline_share, regions)
    line = edges((labels > 0).astype(np.int64), max(1, round(min(labels.shape) / 112)))  # their union's outline
    full = colours(np.array([[-1.0 if params.polarity == "negative" else 1.0]]), color_map)[0, 0]
    heat = colours(np.where(labels > 0, scaled, 0).astype(np.float32), color_map)
    heat[line] = full
    if kind == "none":
        photo = heat.copy()
    elif kind == "mask_black":
        photo = masked(backdrop(image, kind), (labels > 0).astype(np.float32))
    else:
        photo = backdrop(image, kind)
    photo[line] = full
    return encode_png(heat, FILTER_NONE) if heatmap else None, encode_png(photo, FILTER_UP) if overlay else None
