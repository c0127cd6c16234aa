"""XRAI as a post-step (idg_core.postprocess.xrai): the greedy region order on segments whose answer is known by hand, the
map's order (regions first, the base map's pixels inside each), the post-step on a real model's plan, and the segments and
region order against PAIR's own ``saliency`` package (0.2.1, installed apart by ``scripts/setup.sh dev`` into
``.venv/peers/saliency``; the comparison skips where it is absent)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from idg_core.heatmap import saliency
from idg_core.model_calls import run_plans
from idg_core.postprocess import build_plan
from idg_core.postprocess.xrai import MIN_PIXEL_DIFF, ranked_map, segment_masks, xrai, xrai_regions
from idg_evaluation.runner import parse_row
from tests.models import SmallCNN

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / ".venv" / "peers" / "saliency"
SAMPLES = Path("/work/shared/data/imagenet-samples")
PHOTO = ROOT / "samples" / "coffee.jpg"


def _quadrants() -> tuple[np.ndarray, list[np.ndarray]]:
    """A 20 x 20 saliency: top-left quadrant 3, bottom-left 1, right half 2; segments: left half, top-left, right half."""
    attr = np.full((20, 20), 2.0)
    attr[:10, :10], attr[10:, :10] = 3.0, 1.0
    left, top_left, right = (np.zeros((20, 20), dtype=bool) for _ in range(3))
    left[:, :10], top_left[:10, :10], right[:, 10:] = True, True, True
    return attr, [left, top_left, right]


def test_regions_are_added_by_gain_per_pixel_of_what_they_add() -> None:
    # densities 2, 3, 2: the top-left quadrant first (3); then the left half adds only the bottom-left (1) and the right
    # half 2: the right half second, the bottom-left last
    attr, masks = _quadrants()
    labels, gains = xrai_regions(attr, masks)
    assert gains.tolist() == [3.0, 2.0, 1.0]
    assert (labels[:10, :10] == 1).all() and (labels[:, 10:] == 2).all() and (labels[10:, :10] == 3).all()


def test_ties_go_to_the_first_segment_and_the_uncovered_pixels_come_last() -> None:
    attr = np.ones((20, 20))
    attr[15:, :] = 7.0  # the bottom rows: high, but in no segment
    first, second = np.zeros((20, 20), dtype=bool), np.zeros((20, 20), dtype=bool)
    first[:5, :], second[5:10, :] = True, True  # 100 pixels each, both density 1
    tiny = np.zeros((20, 20), dtype=bool)
    tiny[10, :MIN_PIXEL_DIFF - 1] = True  # adds fewer than MIN_PIXEL_DIFF pixels: dropped
    labels, gains = xrai_regions(attr, [tiny, second, first])
    assert gains.tolist() == [1.0, 1.0, float(attr[10:].mean())]
    assert (labels[5:10] == 1).all() and (labels[:5] == 2).all() and (labels[10:] == 3).all()


def test_the_map_ranks_regions_first_then_the_base_maps_pixels_inside_each() -> None:
    labels = np.array([[1, 1, 2], [2, 3, 3]])
    sal = np.array([[0.1, 0.5, 9.0], [0.0, 4.0, 4.0]])
    ranked = ranked_map(labels, 3, sal, "regions_then_pixels")
    # order, least to most: region 3 (two equal pixels: places 1 and 2 share 1.5), region 2 (0.0, 9.0), region 1 (0.1, 0.5)
    assert ranked.tolist() == [[5 / 6, 6 / 6, 4 / 6], [3 / 6, 1.5 / 6, 1.5 / 6]]
    plain = ranked_map(labels, 3, sal, "regions")
    assert plain.tolist() == [[1.0, 1.0, 2 / 3], [2 / 3, 1 / 3, 1 / 3]]


def test_the_post_step_keeps_the_method_cost_and_ranks_its_map_within_regions() -> None:
    model = SmallCNN().eval()
    torch.manual_seed(1)
    x, base = torch.rand(3, 40, 40), torch.zeros(3, 40, 40)
    (plain,) = run_plans(model, [build_plan("ig", x, base, 2, steps=6)], 64)
    (done,) = run_plans(model, [build_plan("ig", x, base, 2, steps=6, postprocess="xrai")], 64)
    (coarse,) = run_plans(model, [build_plan("ig", x, base, 2, steps=6, postprocess="xrai", xrai_order="regions")], 64)
    assert (done.forward_passes, done.backward_passes) == (plain.forward_passes, plain.backward_passes)
    (regions,) = done.regions
    labels, sal, mapped = regions.labels.numpy(), saliency(plain.attributions[0]).numpy(), saliency(done.attributions[0]).numpy()
    assert regions.areas.sum() == 40 * 40 and len(regions.gains) == labels.max() > 1
    assert (mapped > 0).all() and torch.equal(done.attributions[0, 0], done.attributions[0, 2])  # spread over channels
    # every pixel of a better region ranks above every pixel of a worse one; inside a region, the method's order
    for r in range(1, labels.max()):
        assert mapped[labels == r].min() > mapped[labels == r + 1].max()
    for r in range(1, labels.max() + 1):
        inside = labels == r
        assert (np.argsort(np.argsort(mapped[inside], kind="stable"), kind="stable")
                == np.argsort(np.argsort(sal[inside], kind="stable"), kind="stable")).all()
    assert torch.equal(coarse.regions[0].labels, regions.labels)
    coarse_map = saliency(coarse.attributions[0]).numpy()
    assert all(len(np.unique(coarse_map[labels == r])) == 1 for r in range(1, labels.max() + 1))
    gains = regions.gains.numpy()
    assert (np.diff(gains[:-1]) <= 0).all()  # by gain (the last region may be the remainder, with its own mean)


def test_xrai_over_smoothgrad_and_a_method_without_a_path() -> None:
    model = SmallCNN().eval()
    x, base = torch.rand(3, 32, 32), torch.zeros(3, 32, 32)
    for method, kw in (("idg", {"steps": 4, "probe_steps": 4, "smooth_samples": 2}), ("eg", {"samples": 3})):
        (res,) = run_plans(model, [build_plan(method, x, base, 0, postprocess="xrai", **kw)], 64)
        assert len(res.regions) == 1 and res.regions[0].labels.shape == (32, 32)
    with pytest.raises(ValueError, match="xrai_order must be one of"):
        build_plan("ig", x, base, 0, postprocess="xrai", xrai_order="pixels")


def test_a_large_map_finds_its_regions_on_a_bounded_grid() -> None:
    photo = torch.from_numpy(np.asarray(Image.open(PHOTO).convert("RGB").resize((400, 400)), dtype=np.float32) / 255).permute(2, 0, 1)
    attr = torch.rand(3, 400, 400, generator=torch.Generator().manual_seed(0))
    mapped, regions = xrai(photo, attr)
    assert mapped.shape == (3, 400, 400) and regions.labels.shape == (400, 400)
    assert int(regions.areas.sum()) == 400 * 400 and (regions.areas > 0).all()
    # ranks regions first: the order of the mapped values follows the labels
    values, labels = saliency(mapped).numpy(), regions.labels.numpy()
    assert values[labels == 1].min() > values[labels == 2].max()


def test_the_evaluation_names_the_row_base_plus_xrai() -> None:
    method, kw = parse_row("idg@fast+XRAI")
    assert method == "idg" and kw["postprocess"] == "xrai" and kw["steps"] == 16
    assert parse_row("ig+XRAI:xrai_order=regions") == ("ig", {"steps": 50, "postprocess": "xrai",
                                                    "xrai_order": "regions"})


@pytest.fixture(scope="module")
def pair_xrai():  # noqa: ANN201 - PAIR's module
    if not (PEER / "saliency").is_dir():
        pytest.skip("PAIR's saliency is not installed in .venv/peers/saliency (scripts/setup.sh dev installs it)")
    sys.path.insert(0, str(PEER))
    try:
        from saliency.core import xrai as pair
    finally:
        sys.path.remove(str(PEER))
    return pair


def test_segments_and_region_order_are_pairs(pair_xrai) -> None:
    # a sample photo at 96 px (PAIR segments every photo at 224 and scales the labels back, then dilates at the photo's size)
    path = sorted(SAMPLES.glob("*.JPEG"))[0] if SAMPLES.is_dir() else PHOTO
    photo = np.asarray(Image.open(path).convert("RGB").resize((96, 96)), dtype=np.float64) / 255
    ours = segment_masks(photo)
    theirs = pair_xrai._get_segments_felzenszwalb(photo)
    assert len(ours) == len(theirs) > 20
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))
    rng = np.random.default_rng(0)  # a map with structure (a bright blob) and noise
    yy, xx = np.mgrid[:96, :96]
    attr = np.exp(-((yy - 30) ** 2 + (xx - 60) ** 2) / 300.0) + 0.3 * rng.random((96, 96))
    labels, gains = xrai_regions(attr, ours)
    _, pair_ranks = pair_xrai.XRAI._xrai(attr, theirs)
    assert labels.max() > 5
    assert np.array_equal(labels, pair_ranks)
    # and through PAIR's public entry point, with the base map given (per channel; PAIR takes the channels' maximum) and
    # the same segments
    params = pair_xrai.XRAIParameters(return_xrai_segments=True)
    out = pair_xrai.XRAI().GetMaskWithDetails(photo, None, segments=theirs, base_attribution=np.repeat(attr[..., None], 3, -1),
                                              extra_parameters=params)
    assert np.array_equal(labels, out.segments)
