"""Performance Information Curves (Kapishnikov et al. 2019, XRAI, https://arxiv.org/abs/1906.02825), following the
reference library's conventions: the machinery shared by :mod:`~idg_core.metrics.sic` and
:mod:`~idg_core.metrics.aic`, which declare the two metrics. Both read the same rebuilds and one batched forward pass,
so :func:`pic_scores` and :func:`pic_many` compute them together.

An image is rebuilt from a few known pixels (a fixed 1% random mask plus the most salient
fraction) by per-channel linear interpolation; its information is the byte size of its lossless
WebP encoding. The curve plots the normalised prediction against the normalised information.
Cost per image: one forward pass for the confidence check, then ``len(thresholds) + 2`` (15) in one batch, plus the same number of
CPU-bound rebuilds (Delaunay interpolation) and WebP encodings, which dominate.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import Executor, ProcessPoolExecutor

import numpy as np
import torch
from PIL import Image
from threadpoolctl import threadpool_limits

from idg_core.metrics.curves import SKIP_RULES, Curve, Skipped
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
    points, unknown = np.argwhere(known), np.argwhere(~known)
    from scipy import interpolate  # here: its import is a noticeable part of the service's start, which never rebuilds an image

    # one Delaunay triangulation serves all channels (griddata would build one per channel)
    interp = interpolate.LinearNDInterpolator(points, image[tuple(points.T)].astype(np.float64), fill_value=np.nan)
    filled = interp(unknown)  # (n_unknown, C); NaN outside the convex hull
    mean = image.reshape(-1, image.shape[2]).mean(0)
    filled = np.where(np.isnan(filled), mean[None, :], filled)
    out[tuple(unknown.T)] = filled
    rounded: np.ndarray = np.round(out).clip(0, 255).astype(np.uint8)
    return rounded


def to_uint8(image: torch.Tensor) -> np.ndarray:
    """``(3, H, W)`` in [0, 1] -> ``(H, W, 3)`` uint8, the form PIC works in."""
    return (image.detach().cpu().clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def pic_rebuilds(
    image: np.ndarray, saliency: np.ndarray, mask: np.ndarray, thresholds: Sequence[float] = PIC_THRESHOLDS,
) -> tuple[list[np.ndarray], list[int]]:
    """The CPU-bound half of PIC (picklable, for a process pool): the fully blurred image, one
    rebuild per threshold, the original; and the WebP size of each. SIC and AIC share them."""
    neg = -saliency
    images = [blur_from_known_pixels(image, mask)]
    for t in thresholds:
        keep = (neg <= np.quantile(neg, t)) | mask
        images.append(blur_from_known_pixels(image, keep))
    images.append(image)
    return images, [webp_size(i) for i in images]


def original_confidence(model: Model, image: torch.Tensor, target: int) -> float:
    """Softmax of ``target`` on the image as PIC sees it (8-bit)."""
    x = torch.from_numpy(to_uint8(image)).permute(2, 0, 1).float().unsqueeze(0).to(image.device) / 255
    with torch.no_grad():
        return float(torch.softmax(model(x), 1)[0, target])


def pic_scores(
    model: Model, images: list[np.ndarray], info: list[int], target: int, device: torch.device | str = "cpu",
    *, kinds: Sequence[str] = ("sic", "aic"), points: int = 1000,
) -> dict[str, Curve | Skipped]:
    """The model half of PIC: one batched forward pass over the rebuilds, then a curve per kind."""
    for kind in kinds:
        if kind not in ("sic", "aic"):
            raise ValueError(f"kind must be 'sic' or 'aic', got {kind!r}")
    batch = torch.stack([torch.from_numpy(i).permute(2, 0, 1).float() / 255 for i in images]).to(device)
    with torch.no_grad():
        logits = model(batch)
    probs = torch.softmax(logits, 1)[:, target]
    info_arr = np.asarray(info, dtype=np.float64)
    out: dict[str, Curve | Skipped] = {}
    for kind in kinds:
        pred = probs if kind == "sic" else (logits.argmax(1) == target).to(probs.dtype)
        out[kind] = _curve(info_arr, pred.cpu().double().numpy(), points)
    return out


def _one_blas_thread() -> None:
    """Pool initializer: one BLAS thread per rebuild process. Each rebuild's interpolator calls
    LAPACK (scipy's OpenBLAS) per triangle; with one OpenBLAS pool per process, their spinning
    threads outnumber the cores and the processes wait on each other, a rebuild then taking
    ten to hundreds of times as long."""
    threadpool_limits(1)


def pic_pool(workers: int) -> ProcessPoolExecutor | None:
    """A process pool for PIC's rebuilds (:func:`pic_many`), or None to run them inline (``workers <= 1``)."""
    return ProcessPoolExecutor(workers, initializer=_one_blas_thread) if workers > 1 else None


def pic_many(
    model: Model, images: Sequence[np.ndarray], maps: Sequence[np.ndarray], masks: Sequence[np.ndarray], targets: Sequence[int],
    device: torch.device | str = "cpu", pool: Executor | None = None,
) -> list[dict[str, Curve | Skipped]]:
    """SIC and AIC for several (uint8 image, saliency map, known-pixel mask, target) rows: the
    CPU-bound rebuilds in ``pool`` when one is given (else here), then the model half per row."""
    rebuilt = pool.map(pic_rebuilds, images, maps, masks) if pool else map(pic_rebuilds, images, maps, masks)
    return [pic_scores(model, imgs, info, t, device) for (imgs, info), t in zip(rebuilt, targets, strict=True)]


def _curve(info: np.ndarray, pred: np.ndarray, points: int) -> Curve | Skipped:
    if info[0] >= info[-1]:
        return Skipped(SKIP_RULES["blurred_information"], "blurred_information")
    if pred[0] >= pred[-1]:
        return Skipped(SKIP_RULES["blurred_confidence"], "blurred_confidence")
    x = np.clip((info - info[0]) / (info[-1] - info[0]), 0, 1)
    y = np.maximum.accumulate(np.clip((pred - pred[0]) / (pred[-1] - pred[0]), 0, 1))
    x, y = np.concatenate([[0.0], x, [1.0]]), np.concatenate([[0.0], y, [1.0]])
    order = np.argsort(x, kind="stable")
    grid = np.append(np.linspace(0, 1, points, endpoint=False), 1.0)
    curve_y = np.interp(grid, x[order], y[order])
    return Curve(grid, curve_y, float(np.trapezoid(curve_y, grid)))


def pic_curve(
    model: Model, image: torch.Tensor, saliency: torch.Tensor, target: int, mask: np.ndarray, *, kind: str = "sic",
    thresholds: Sequence[float] = PIC_THRESHOLDS, min_confidence: float = 0.8, points: int = 1000,
) -> Curve | Skipped:
    """SIC (``kind="sic"``: softmax of ``target``) or AIC (``"aic"``: 1 if argmax is ``target``)
    for one image ``(3, H, W)`` in [0, 1] and its ``(H, W)`` saliency. Returns :class:`Skipped`
    where the reference library would skip the image."""
    if kind not in ("sic", "aic"):
        raise ValueError(f"kind must be 'sic' or 'aic', got {kind!r}")
    original = original_confidence(model, image, target)
    if original < min_confidence:  # checked first: it spares the rebuilds
        return Skipped(f"the original prediction {original:.2f} is below {min_confidence}", "low_confidence", original)
    images, info = pic_rebuilds(to_uint8(image), saliency.detach().cpu().double().numpy(), mask, thresholds)
    return pic_scores(model, images, info, target, image.device, kinds=(kind,), points=points)[kind]


PIC_COST = "16 forward passes, and 15 CPU rebuilds (Delaunay interpolation) with their WebP encodings, which dominate"
"""What SIC and AIC cost per image (together: they share the rebuilds and the passes)."""
