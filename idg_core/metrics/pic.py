"""Performance Information Curves, SIC and AIC (Kapishnikov et al. 2019, XRAI,
https://arxiv.org/abs/1906.02825), following the reference library's conventions.

An image is rebuilt from a few known pixels (a fixed 1% random mask plus the most salient
fraction) by per-channel linear interpolation; its information is the byte size of its lossless
WebP encoding. The curve plots the normalised prediction against the normalised information.
Cost per image: one forward pass for the confidence check, then ``len(thresholds) + 2`` (15) in one batch, plus the same number of
CPU-bound rebuilds (Delaunay interpolation) and WebP encodings, which dominate.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image
from scipy import interpolate

from idg_core.metrics.curves import Curve, Skipped
from idg_core.types import Model

PIC_THRESHOLDS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.10, 0.13, 0.21, 0.34, 0.5, 0.75)


def random_pixel_mask(height: int, width: int, fraction: float = 0.01, seed: int = 0) -> np.ndarray:
    """The fixed random mask of known pixels (use the same one for every method on an image)."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(height * width, dtype=bool)
    mask[rng.choice(height * width, size=int(round(fraction * height * width)), replace=False)] = True
    return mask.reshape(height, width)


def webp_size(image: np.ndarray) -> int:
    """Bytes of the lossless WebP encoding of an ``(H, W, 3)`` uint8 image: its information."""
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="WEBP", lossless=True, quality=100)
    return buf.tell()


def blur_from_known_pixels(image: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Rebuild ``(H, W, C)`` uint8 from the ``known`` pixels plus the four corners by per-channel
    linear interpolation (unreachable pixels get the channel mean)."""
    known = known.copy()
    h, w = known.shape
    known[[0, 0, h - 1, h - 1], [0, w - 1, 0, w - 1]] = True
    if known.all():
        return image.copy()
    out = image.astype(np.float64) * known[..., None]
    points = np.argwhere(known)
    unknown = np.argwhere(~known)
    mean = image.reshape(-1, image.shape[2]).mean(0)
    for ch in range(image.shape[2]):
        values = image[:, :, ch][tuple(points.T)].astype(np.float64)
        out[:, :, ch][tuple(unknown.T)] = interpolate.griddata(points, values, unknown, method="linear", fill_value=mean[ch])
    return np.round(out).clip(0, 255).astype(np.uint8)


def _rebuilds(image: np.ndarray, saliency: np.ndarray, mask: np.ndarray, thresholds: Sequence[float]) -> tuple[list[np.ndarray], list[int]]:
    neg = -saliency
    images = [blur_from_known_pixels(image, mask)]
    for t in thresholds:
        keep = (neg <= np.quantile(neg, t)) | mask
        images.append(blur_from_known_pixels(image, keep))
    images.append(image)
    return images, [webp_size(i) for i in images]


def pic_curve(
    model: Model, image: torch.Tensor, saliency: torch.Tensor, target: int, mask: np.ndarray, *, kind: str = "sic",
    thresholds: Sequence[float] = PIC_THRESHOLDS, min_confidence: float = 0.8, points: int = 1000,
) -> Curve | Skipped:
    """SIC (``kind="sic"``: softmax of ``target``) or AIC (``"aic"``: 1 if argmax is ``target``)
    for one image ``(3, H, W)`` in [0, 1] and its ``(H, W)`` saliency. Returns :class:`Skipped`
    where the reference library would skip the image."""
    if kind not in ("sic", "aic"):
        raise ValueError(f"kind must be 'sic' or 'aic', got {kind!r}")
    arr = (image.detach().cpu().clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    with torch.no_grad():
        original = float(torch.softmax(model(torch.from_numpy(arr).permute(2, 0, 1).float().unsqueeze(0).to(image.device) / 255), 1)[0, target])
    if original < min_confidence:  # checked first: it spares the rebuilds
        return Skipped(f"the original prediction {original:.2f} is below {min_confidence}")
    images, info = _rebuilds(arr, saliency.detach().cpu().double().numpy(), mask, thresholds)
    batch = torch.stack([torch.from_numpy(i).permute(2, 0, 1).float() / 255 for i in images]).to(image.device)
    with torch.no_grad():
        logits = model(batch)
    probs = torch.softmax(logits, 1)[:, target]
    pred = probs if kind == "sic" else (logits.argmax(1) == target).to(probs.dtype)
    pred = pred.cpu().double().numpy()
    info_arr = np.asarray(info, dtype=np.float64)
    if info_arr[0] >= info_arr[-1]:
        return Skipped("the fully blurred image carries as much information as the original")
    if pred[0] >= pred[-1]:
        return Skipped("the fully blurred image is predicted as confidently as the original")
    x = np.clip((info_arr - info_arr[0]) / (info_arr[-1] - info_arr[0]), 0, 1)
    y = np.maximum.accumulate(np.clip((pred - pred[0]) / (pred[-1] - pred[0]), 0, 1))
    x, y = np.concatenate([[0.0], x, [1.0]]), np.concatenate([[0.0], y, [1.0]])
    order = np.argsort(x, kind="stable")
    grid = np.append(np.linspace(0, 1, points, endpoint=False), 1.0)
    curve_y = np.interp(grid, x[order], y[order])
    return Curve(grid, curve_y, float(np.trapezoid(curve_y, grid)))
