"""ROAD's noisy linear imputation (its vectorised sparse system) against the reference's system
written out pixel by pixel, as ``road_evaluation`` describes it; and ROAD ranking maps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse import lil_matrix
from scipy.sparse.linalg import spsolve

from idg_core.metrics.road import linear_impute, removal_masks, road
from tests.models import SmallCNN

WEIGHTS = {(1, 1): 1 / 12, (0, 1): 1 / 6, (-1, 1): 1 / 12, (1, -1): 1 / 12, (0, -1): 1 / 6, (-1, -1): 1 / 12, (1, 0): 1 / 6, (-1, 0): 1 / 6}


def _reference(img: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """For every removed pixel i: Σ_n w_n v_n - s_i v_i = 0, s_i the weights of its in-image neighbours."""
    h, w = keep.shape
    missing = [(r, c) for r in range(h) for c in range(w) if not keep[r, c]]
    index = {p: k for k, p in enumerate(missing)}
    a = lil_matrix((len(missing), len(missing)))
    b = np.zeros((len(missing), img.shape[0]))
    for k, (r, c) in enumerate(missing):
        for (dr, dc), wt in WEIGHTS.items():
            rr, cc = r + dr, c + dc
            if not (0 <= rr < h and 0 <= cc < w):
                continue
            a[k, k] -= wt
            if keep[rr, cc]:
                b[k] -= wt * img[:, rr, cc]
            else:
                a[k, index[(rr, cc)]] = wt
    out = img.copy()
    sol = spsolve(a.tocsc(), b)
    for k, (r, c) in enumerate(missing):
        out[:, r, c] = sol[k]
    return out


@pytest.mark.parametrize("share", [0.3, 0.9])
def test_the_imputation_solves_the_references_system(share: float) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 14, 11, generator=gen, dtype=torch.float64)
    keep = removal_masks(torch.rand(2, 14, 11, generator=gen), [share], most_first=True)[:, 0]
    ours = linear_impute(x, keep)
    for i in range(2):
        expected = _reference(x[i].numpy(), keep[i].numpy())
        np.testing.assert_allclose(ours[i].numpy(), expected, atol=1e-7)
    assert torch.equal(ours[keep.unsqueeze(1).expand_as(x)], x[keep.unsqueeze(1).expand_as(x)])  # kept pixels untouched


def test_masks_remove_the_most_or_least_salient_share() -> None:
    sal = torch.arange(20.0).view(1, 4, 5)
    morf = removal_masks(sal, [0.25], most_first=True)[0, 0]
    lerf = removal_masks(sal, [0.25], most_first=False)[0, 0]
    assert (~morf).sum() == 5 and bool((~morf).flatten()[-5:].all())  # the 5 largest removed
    assert (~lerf).sum() == 5 and bool((~lerf).flatten()[:5].all())


def test_road_scores_a_map_that_points_at_the_evidence_better_than_its_reverse() -> None:
    """A model whose class-0 logit is the mean brightness of the left half: removing the left half first
    (MoRF of a map that is large there) changes the score more than removing the right half."""

    class LeftHalf(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s = 40 * (x[:, :, :, :8].mean((1, 2, 3)) - 0.5)
            return torch.stack([s, -s], 1)

    x = torch.full((1, 3, 16, 16), 0.2)
    x[:, :, :, :8] = 0.9  # bright left: class 0
    good = torch.zeros(1, 16, 16)
    good[:, :, :8] = 1 + torch.rand(1, 16, 8)
    bad = 1 - good / 3
    out = road(LeftHalf(), x.repeat(2, 1, 1, 1), torch.cat([good, bad]), std=(0.25, 0.25, 0.25))
    assert out["morf"][0].auc < out["morf"][1].auc  # lower is better
    assert out["lerf"][0].auc > out["lerf"][1].auc  # higher is better
    assert len(out["morf"][0].y) == 9


def test_road_runs_on_a_small_cnn() -> None:
    model = SmallCNN().eval()
    out = road(model, torch.rand(2, 3, 16, 16), torch.rand(2, 16, 16), std=(0.2, 0.2, 0.2))
    assert all(0 <= c.auc <= 1 for k in ("morf", "lerf") for c in out[k])


def test_the_solves_may_run_in_a_process_pool_with_the_same_result() -> None:
    from concurrent.futures import ProcessPoolExecutor

    gen = torch.Generator().manual_seed(4)
    x = torch.rand(3, 3, 12, 12, generator=gen)
    keep = removal_masks(torch.rand(3, 12, 12, generator=gen), [0.5], most_first=False)[:, 0]
    with ProcessPoolExecutor(2) as pool:
        assert torch.equal(linear_impute(x, keep, pool), linear_impute(x, keep))


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 3), (17, 40), (224, 224)])
def test_the_dissection_order_is_a_permutation_of_the_pixels(shape: tuple[int, int]) -> None:
    from idg_core.metrics.road import _dissection_rank

    rank = _dissection_rank(*shape)
    assert np.array_equal(np.sort(rank), np.arange(shape[0] * shape[1]))


def _blobs(gen: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth random saliency map (sums of Gaussian bumps): removals in large connected regions,
    as an attribution map's are, the hard case for a sparse factorisation."""
    rr, cc = np.mgrid[0:h, 0:w]
    out = np.zeros((h, w))
    for _ in range(6):
        r0, c0, s = gen.uniform(0, h), gen.uniform(0, w), gen.uniform(2, max(h, w) / 3)
        out += gen.uniform(0.2, 1) * np.exp(-((rr - r0) ** 2 + (cc - c0) ** 2) / (2 * s * s))
    return out


@pytest.mark.parametrize("kind", ["uniform", "blobs"])
def test_the_ordered_factorisation_gives_spsolves_answer(kind: str) -> None:
    """The nested-dissection LU without pivoting against the plain ``spsolve`` (COLAMD, partial
    pivoting) of the same system: several random masks and levels, MoRF and LeRF, on [0, 1] images.
    The two differ by rounding only (measured ~1e-13); the bound asserted is 1e-9."""
    from idg_core.metrics.road import impute_one, spsolve_impute

    gen = np.random.default_rng(7)
    for h, w in ((31, 47), (64, 64)):
        img = gen.random((3, h, w))
        for _ in range(2):
            sal = gen.random((h, w)) if kind == "uniform" else _blobs(gen, h, w)
            masks = removal_masks(torch.from_numpy(sal)[None], [0.1, 0.5, 0.9, 0.99], most_first=bool(gen.integers(2)))[0]
            for keep in masks.numpy():
                ours, ref = impute_one(img, keep), spsolve_impute(img, keep)
                assert np.abs(ours - ref).max() <= 1e-9
                assert np.array_equal(ours[:, keep], img[:, keep])


def test_the_ordered_factorisation_on_a_224_image_at_90_percent() -> None:
    from idg_core.metrics.road import impute_one, spsolve_impute

    gen = np.random.default_rng(3)
    img = gen.random((3, 224, 224))
    keep = removal_masks(torch.from_numpy(_blobs(gen, 224, 224))[None], [0.9], most_first=True)[0, 0].numpy()
    assert np.abs(impute_one(img, keep) - spsolve_impute(img, keep)).max() <= 1e-9
