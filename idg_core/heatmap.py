"""Render an attribution as PNG bytes: saliency map, robust scaling, colormap, overlay."""

from __future__ import annotations

import functools
import io

import numpy as np
import torch
from torch import Tensor

from idg_core.png import FILTER_NONE, FILTER_UP, encode_png

# Anchor colours (0..255) of the colormaps, interpolated linearly to 256 entries.
_ANCHORS = {
    "inferno": [(0, 0, 4), (40, 11, 84), (101, 21, 110), (159, 42, 99), (212, 72, 66), (245, 125, 21), (250, 193, 39), (252, 255, 164)],
    "viridis": [(68, 1, 84), (70, 50, 127), (54, 92, 141), (39, 127, 142), (31, 161, 135), (74, 194, 109), (159, 218, 58), (253, 231, 37)],
    "gray": [(0, 0, 0), (255, 255, 255)],
    "coolwarm": [(59, 76, 192), (141, 176, 254), (221, 221, 221), (244, 154, 123), (180, 4, 38)],
    # Vertex AI's colour maps by name: the signed ones run negative -> zero -> positive
    "pink_green": [(208, 28, 139), (0, 0, 0), (77, 172, 38)], "red": [(0, 0, 0), (255, 0, 0)], "green": [(0, 0, 0), (0, 255, 0)],
    "red_green": [(255, 0, 0), (0, 0, 0), (0, 255, 0)], "pink_white_green": [(208, 28, 139), (247, 247, 247), (77, 172, 38)],
}
COLORMAPS = tuple(_ANCHORS)
DIVERGING = ("coolwarm", "pink_green", "red_green", "pink_white_green")
"""The colour maps whose middle is zero: a signed map's negative values take their first half."""


@functools.cache
def colour_lut(name: str) -> np.ndarray:
    """The colour map ``name`` as a read-only ``(256, 3)`` uint8 table, its anchors interpolated linearly."""
    if name not in _ANCHORS:
        raise ValueError(f"colormap must be one of {', '.join(COLORMAPS)}; got {name!r}")
    anchors = np.asarray(_ANCHORS[name], dtype=np.float64)
    pos = np.linspace(0, 1, len(anchors))
    t = np.linspace(0, 1, 256)
    lut = np.stack([np.interp(t, pos, anchors[:, c]) for c in range(3)], axis=1).astype(np.uint8)
    lut.flags.writeable = False  # shared by every call
    return lut


def saliency(attribution: Tensor, signed: bool = False) -> Tensor:
    """``(C, H, W)`` attribution -> ``(H, W)`` map: Σ_c |a| (or Σ_c a when ``signed``)."""
    if attribution.dim() != 3:
        raise ValueError(f"attribution must be (C, H, W), got shape {tuple(attribution.shape)}")
    a = attribution.detach().float().cpu()
    return a.sum(0) if signed else a.abs().sum(0)


def _check_outlier_perc(outlier_perc: float) -> None:
    if not 0 <= outlier_perc < 100:
        raise ValueError(f"outlier_perc must be in [0, 100), got {outlier_perc}")


def _scaled(values: np.ndarray, outlier_perc: float) -> np.ndarray:
    """:func:`scale` on a NumPy array, as float32 (NumPy's sort is much faster than torch's on
    one CPU thread for a map this size)."""
    _check_outlier_perc(outlier_perc)
    v = values.astype(np.float64, copy=False)
    if not np.isfinite(v).all():
        raise ValueError("the attribution is not finite (NaN or infinity): there is no heatmap of it")
    ordered = np.sort(np.abs(v), axis=None)
    cums = np.cumsum(ordered)
    total = float(cums[-1]) if cums.size else 0.0
    if total <= 0:
        return np.zeros(values.shape, dtype=np.float32)
    idx = int(np.searchsorted(cums, total * (100 - outlier_perc) / 100))
    threshold = float(ordered[min(idx, ordered.size - 1)])
    if threshold <= 0:
        threshold = float(ordered[-1])
    return np.clip(v / threshold, -1, 1).astype(np.float32)


def scale(values: Tensor, outlier_perc: float = 2.0) -> Tensor:
    """Divide by the value below which ``100 - outlier_perc`` % of the |mass| lies (Captum's
    cumulative-sum threshold) and clip to [-1, 1]. An all-zero map stays zero."""
    return torch.from_numpy(_scaled(values.detach().cpu().double().numpy(), outlier_perc))


def _photo(image: Tensor) -> np.ndarray:
    """``image (C, H, W)`` in [0, 1] as an ``(H, W, C)`` float32 array of 0..255 values."""
    return image.detach().float().cpu().clamp(0, 1).permute(1, 2, 0).numpy() * np.float32(255)


def image_png(image: Tensor) -> bytes:
    """``image (3, H, W)`` in [0, 1] (grey ``(1, H, W)`` too) as PNG bytes."""
    photo = _photo(image).round().astype(np.uint8)
    return encode_png(photo[..., 0] if photo.shape[2] == 1 else photo, FILTER_UP)


FLOAT16_MAX = float(np.finfo(np.float16).max)
FLOAT16_TINY = float(np.finfo(np.float16).tiny)
"""float16's smallest normal value (2**-14, ~6.1e-5): below it the spacing is a fixed 2**-24 (~6e-8)."""


def attribution_npy(attribution: Tensor) -> tuple[bytes, str]:
    """``attribution`` as the bytes of a NumPy ``.npy`` file (read with ``numpy.load``) and its dtype:
    float16 (half the size) when it keeps every value to float16's precision (2**-11 of the value), else float32:
    every nonzero magnitude must lie in float16's normal range. Above it a value turns into an infinity (a model
    with large logits or gradients easily exceeds ±65504); below it, float16's fixed steps of ~6e-8 lose the value
    (a map of values around 1e-7 would come back as zeros, and values below 6e-5 beside a normal peak would lose most of
    their precision)."""
    values = attribution.detach().float().cpu().numpy()
    mags = np.abs(values)
    nonzero = mags[mags > 0]
    fits = nonzero.size == 0 or (float(nonzero.min()) >= FLOAT16_TINY and float(nonzero.max()) <= FLOAT16_MAX)
    dtype = "float16" if fits else "float32"
    buf = io.BytesIO()
    np.save(buf, values.astype(dtype))
    return buf.getvalue(), dtype


def _colour(scaled: np.ndarray, signed: bool, colormap: str | None) -> np.ndarray:
    """Scaled ``(H, W)`` values in [-1, 1] -> ``(H, W, 3)`` uint8 through the colormap."""
    lut = colour_lut(colormap or ("coolwarm" if signed else "inferno"))
    unit = (scaled + 1) / 2 if signed else scaled
    return lut[np.rint(unit * 255).astype(np.intp)]


def colorize(attribution: Tensor, *, signed: bool = False, colormap: str | None = None, outlier_perc: float = 2.0) -> np.ndarray:
    """``(C, H, W)`` attribution -> ``(H, W, 3)`` uint8 heatmap; signed maps use a diverging map."""
    return _colour(_scaled(saliency(attribution, signed).numpy(), outlier_perc), signed, colormap)


def heatmap_png(attribution: Tensor, *, signed: bool = False, colormap: str | None = None, outlier_perc: float = 2.0) -> bytes:
    """The heatmap alone, as PNG bytes."""
    return encode_png(colorize(attribution, signed=signed, colormap=colormap, outlier_perc=outlier_perc), FILTER_NONE)


def blend(image: Tensor, scaled: np.ndarray, heat: np.ndarray, opacity: float) -> np.ndarray:
    """``heat`` over ``image`` with per-pixel weight ``opacity`` x sqrt(|scaled|), as uint8."""
    weight = np.sqrt(np.abs(scaled))[..., None] * np.float32(opacity)
    photo = _photo(image)
    if photo.shape[2] == 1:
        photo = np.repeat(photo, 3, axis=2)
    blended = photo * (1 - weight) + heat * weight
    out: np.ndarray = np.rint(blended).clip(0, 255).astype(np.uint8)
    return out


def _check_overlay(image: Tensor, attribution: Tensor, opacity: float) -> None:
    if not 0 <= opacity <= 1:
        raise ValueError(f"opacity must be in [0, 1], got {opacity}")
    if image.dim() != 3 or image.shape[1:] != attribution.shape[1:]:
        raise ValueError(f"image must be (3, H, W) matching the attribution, got {tuple(image.shape)}")


def overlay_png(
    image: Tensor, attribution: Tensor, *, opacity: float = 0.6, signed: bool = False,
    colormap: str | None = None, outlier_perc: float = 2.0,
) -> bytes:
    """The heatmap blended over ``image (3, H, W)`` in [0, 1]; each pixel's blend weight is
    ``opacity`` times the square root of its scaled saliency (attribution maps are sparse), so
    unimportant pixels show the photo."""
    _, png = heatmap_and_overlay_png(image, attribution, heatmap=False, opacity=opacity, signed=signed, colormap=colormap,
                                     outlier_perc=outlier_perc)
    assert png is not None
    return png


def heatmap_and_overlay_png(
    image: Tensor, attribution: Tensor, *, heatmap: bool = True, overlay: bool = True, opacity: float = 0.6,
    signed: bool = False, colormap: str | None = None, outlier_perc: float = 2.0,
) -> tuple[bytes | None, bytes | None]:
    """:func:`heatmap_png` and :func:`overlay_png` (each only if asked) from one saliency map and one
    scaling: what an answer with both costs, at about half of calling the two."""
    if overlay:
        _check_overlay(image, attribution, opacity)
    scaled = _scaled(saliency(attribution, signed).numpy(), outlier_perc)
    heat = _colour(scaled, signed, colormap)
    heat_png = encode_png(heat, FILTER_NONE) if heatmap else None
    return heat_png, (encode_png(blend(image, scaled, heat, opacity), FILTER_UP) if overlay else None)
