"""Metrics on models and maps with known answers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from idg_core.metrics import (
    SKIP_RULES,
    Curve,
    Skipped,
    auc_trapezoid,
    blur_from_known_pixels,
    deletion,
    insertion,
    pic_curve,
    random_pixel_mask,
)


class OnePixel(nn.Module):
    """Class 0 is confident only while pixel (2, 3) of channel 0 stays bright."""

    def forward(self, x: Tensor) -> Tensor:
        v = x[:, 0, 2, 3]
        return torch.stack([20 * (v - 0.5), torch.zeros_like(v)], 1)


def _image() -> Tensor:
    x = torch.full((1, 3, 8, 8), 0.3)
    x[0, 0, 2, 3] = 1.0
    return x


def test_auc_of_known_curves() -> None:
    assert auc_trapezoid(np.array([1.0, 1.0, 1.0])) == pytest.approx(1.0)
    assert auc_trapezoid(np.linspace(0, 1, 11)) == pytest.approx(0.5)


def test_deletion_of_the_decisive_pixel_first_is_perfect() -> None:
    sal = torch.zeros(1, 8, 8)
    sal[0, 2, 3] = 1.0
    (curve,) = deletion(OnePixel(), _image(), sal, step=1, substrate=(0.0, 0.0, 0.0))
    assert curve.y[0] > 0.99 and (curve.y[1:] < 0.01).all()
    assert curve.auc < 0.01
    worst = torch.rand(1, 8, 8)
    worst[0, 2, 3] = -1.0  # decisive pixel last
    (late,) = deletion(OnePixel(), _image(), worst, step=1, substrate=(0.0, 0.0, 0.0))
    assert late.auc > 0.95


def test_insertion_of_the_decisive_pixel_first_is_perfect() -> None:
    sal = torch.zeros(1, 8, 8)
    sal[0, 2, 3] = 1.0
    (curve,) = insertion(OnePixel(), _image(), sal, step=1, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    assert curve.y[0] < 0.5 and (curve.y[1:] > 0.99).all() and curve.auc > 0.95


def test_random_maps_score_about_the_random_baseline() -> None:
    # the decisive pixel at a uniformly random rank: expected deletion AUC ~ 0.5
    maps = [torch.rand(1, 8, 8, generator=torch.Generator().manual_seed(s)) for s in range(40)]
    aucs = [deletion(OnePixel(), _image(), sal, step=1, substrate=(0.0, 0.0, 0.0))[0].auc for sal in maps]
    assert 0.35 < float(np.mean(aucs)) < 0.65


def test_steps_and_batching_give_the_same_curve() -> None:
    x, sal = torch.rand(2, 3, 16, 16), torch.rand(2, 16, 16)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 5))
    a = deletion(model, x, sal, step=16, batch_size=3)
    b = deletion(model, x, sal, step=16, batch_size=100)
    assert len(a[0].y) == 17 and np.allclose(a[0].y, b[0].y, atol=1e-6) and np.allclose(a[1].y, b[1].y, atol=1e-6)


def test_blur_keeps_known_pixels_and_interpolates_linearly() -> None:
    ramp = np.tile(np.linspace(0, 200, 16).round().astype(np.uint8)[None, :, None], (16, 1, 3))
    known = np.zeros((16, 16), dtype=bool)
    known[:, 0] = known[:, -1] = True
    out = blur_from_known_pixels(ramp, known)
    assert np.abs(out.astype(int) - ramp.astype(int)).max() <= 1


REFERENCE_THRESHOLDS = [0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.07, 0.10, 0.13, 0.21, 0.34, 0.5, 0.75]


def _reference_pic(
    model: nn.Module, img: np.ndarray, sal: np.ndarray, mask: np.ndarray, target: int, thresholds: list[float], kind: str = "sic",
) -> float:
    """A straightforward line-by-line SIC (softmax of ``target``) or AIC (1 where the top class is
    ``target``), written from the reference library's description."""
    import io

    from PIL import Image
    from scipy import interpolate

    def entropy(a: np.ndarray) -> int:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="webp", lossless=True, quality=100)
        return buf.tell()

    def blurred(a: np.ndarray, m: np.ndarray) -> np.ndarray:
        m = m.copy()
        m[[0, 0, -1, -1], [0, -1, 0, -1]] = True
        res = a.astype(np.float64) * m[..., None]
        for c in range(3):
            pts = np.argwhere(m)
            unk = np.argwhere(~m)
            res[:, :, c][tuple(unk.T)] = interpolate.griddata(
                pts, a[:, :, c][tuple(pts.T)], unk, method="linear", fill_value=a[:, :, c].mean())
        return np.round(res).astype(np.uint8)

    imgs = [blurred(img, mask)] + [blurred(img, (-sal <= np.quantile(-sal, t)) | mask) for t in thresholds] + [img]
    ent = np.array([entropy(i) for i in imgs], dtype=float)
    with torch.no_grad():
        logits = model(torch.stack([torch.from_numpy(i).permute(2, 0, 1).float() / 255 for i in imgs]))
    p = (torch.softmax(logits, 1)[:, target] if kind == "sic" else (logits.argmax(1) == target).float()).double().numpy()
    ne = np.clip((ent - ent[0]) / (ent[-1] - ent[0]), 0, 1)
    npred = np.clip((p - p[0]) / (p[-1] - p[0]), 0, 1)
    for i in range(1, len(npred)):
        npred[i] = max(npred[i], npred[i - 1])
    xs, ys = [0.0, *ne, 1.0], [0.0, *npred, 1.0]
    order = np.argsort(xs, kind="stable")
    grid = np.append(np.linspace(0, 1, 1000, endpoint=False), 1.0)
    return float(np.trapezoid(np.interp(grid, np.array(xs)[order], np.array(ys)[order]), grid))


class Brightness(nn.Module):
    """Confident in class 0 for detailed images: the logit grows with local contrast."""

    def forward(self, x: Tensor) -> Tensor:
        contrast = (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean(dim=(1, 2, 3))
        return torch.stack([60 * contrast - 2, torch.zeros_like(contrast)], 1)


def test_pic_matches_a_line_by_line_reference() -> None:
    rng = np.random.default_rng(0)
    img = (rng.random((32, 32, 3)) * 255).astype(np.uint8)
    sal = rng.random((32, 32))
    mask = random_pixel_mask(32, 32, seed=1)
    image = torch.from_numpy(img).permute(2, 0, 1).float() / 255
    res = pic_curve(Brightness(), image, torch.from_numpy(sal), 0, mask, kind="sic", min_confidence=0.5)
    assert isinstance(res, Curve), res
    assert res.auc == pytest.approx(_reference_pic(Brightness(), img, sal, mask, 0, REFERENCE_THRESHOLDS), abs=1e-9)
    # AIC of the same image: Brightness already calls the fully blurred rebuild class 0, as it does the
    # original, so accuracy cannot rise along the curve and the reference library skips the image
    aic = pic_curve(Brightness(), image, torch.from_numpy(sal), 0, mask, kind="aic", min_confidence=0.5)
    assert isinstance(aic, Skipped), aic
    assert (aic.rule, aic.reason, aic.value) == ("blurred_confidence", SKIP_RULES["blurred_confidence"], None)


def test_pic_skips_unconfident_and_flat_images() -> None:
    flat = torch.full((3, 16, 16), 0.5)
    mask = random_pixel_mask(16, 16)
    res = pic_curve(Brightness(), flat, torch.rand(16, 16), 0, mask)  # p(class 0) = 0.12
    assert isinstance(res, Skipped) and "below" in res.reason
    assert res.rule == "low_confidence" and res.value == pytest.approx(0.12, abs=0.01)
    res = pic_curve(Brightness(), flat, torch.rand(16, 16), 1, mask, min_confidence=0.1)
    assert isinstance(res, Skipped) and "information" in res.reason
    assert res.rule == "blurred_information" and res.value is None
    with pytest.raises(ValueError, match="kind"):
        pic_curve(Brightness(), flat, torch.rand(16, 16), 1, mask, kind="xic")


def test_sic_and_aic_from_shared_rebuilds_match_pic_curve() -> None:
    from idg_core.metrics import pic_rebuilds, pic_scores, to_uint8

    rng = np.random.default_rng(3)
    img = (rng.random((24, 24, 3)) * 255).astype(np.uint8)
    image = torch.from_numpy(img).permute(2, 0, 1).float() / 255
    sal, mask = torch.from_numpy(rng.random((24, 24))), random_pixel_mask(24, 24, seed=2)
    images, info = pic_rebuilds(to_uint8(image), sal.numpy(), mask)
    both = pic_scores(Brightness(), images, info, 0)
    for kind in ("sic", "aic"):  # this image scores on both: neither is skipped
        alone = pic_curve(Brightness(), image, sal, 0, mask, kind=kind, min_confidence=0.0)
        shared = both[kind]
        assert isinstance(alone, Curve) and isinstance(shared, Curve), (alone, shared)
        assert shared.auc == pytest.approx(alone.auc)
        assert np.array_equal(shared.x, alone.x) and np.allclose(shared.y, alone.y)
        assert shared.auc == pytest.approx(_reference_pic(Brightness(), img, sal.numpy(), mask, 0, REFERENCE_THRESHOLDS, kind), abs=1e-9)


def test_pic_of_several_rows_matches_each_alone_with_or_without_a_pool() -> None:
    """pic_many (the evaluation's and the speed benchmark's PIC) scores each row as pic_curve does, in order,
    whether the rebuilds run here or in a pool."""
    from concurrent.futures import ThreadPoolExecutor

    from idg_core.metrics import pic_many, to_uint8

    rng = np.random.default_rng(4)
    images = [torch.from_numpy((rng.random((24, 24, 3)) * 255).astype(np.uint8)).permute(2, 0, 1).float() / 255 for _ in range(3)]
    maps = [rng.random((24, 24)) for _ in images]
    masks = [random_pixel_mask(24, 24, seed=i) for i in range(3)]
    rows = ([to_uint8(i) for i in images], maps, masks, [0, 0, 0])
    inline = pic_many(Brightness(), *rows)
    with ThreadPoolExecutor(2) as pool:
        pooled = pic_many(Brightness(), *rows, pool=pool)
    for image, sal, mask, here, there in zip(images, maps, masks, inline, pooled, strict=True):
        alone = pic_curve(Brightness(), image, torch.from_numpy(sal), 0, mask, kind="sic", min_confidence=0.0)
        assert isinstance(alone, Curve) and isinstance(here["sic"], Curve) and isinstance(there["sic"], Curve)
        assert here["sic"].auc == pytest.approx(alone.auc) and there["sic"].auc == here["sic"].auc


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_pic_pool_gives_each_rebuild_process_one_blas_thread_and_scores_as_inline() -> None:
    """The evaluation's and the speed benchmark's pool: several OpenBLAS thread pools spinning at once
    made a 0.4 s rebuild take up to 144 s on 2 cores, so each process gets one BLAS thread."""
    from idg_core.metrics import pic_many, pic_pool

    assert pic_pool(1) is None and pic_pool(0) is None
    rng = np.random.default_rng(5)
    images = [(rng.random((24, 24, 3)) * 255).astype(np.uint8) for _ in range(2)]
    rows = (images, [rng.random((24, 24)) for _ in images], [random_pixel_mask(24, 24, seed=i) for i in range(2)], [0, 0])
    pool = pic_pool(2)
    assert pool is not None
    try:
        threads = pool.submit(_blas_threads).result(timeout=120)
        pooled = pic_many(Brightness(), *rows, pool=pool)
    finally:
        pool.shutdown()
    assert threads and set(threads) == {1}, threads
    inline = pic_many(Brightness(), *rows)
    for here, there in zip(inline, pooled, strict=True):
        assert isinstance(here["sic"], Curve) and isinstance(there["sic"], Curve)
        assert there["sic"].auc == here["sic"].auc
