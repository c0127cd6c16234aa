"""Grad-CAM's post-steps over any method's map (idg_core.postprocess.cam): the blobs of a CAM whose answer is known by
hand, the method's pixel order kept inside each blob, the product zero where the CAM is, both on a real model's plan
with Grad-CAM's one forward and one backward pass counted as declared (once, whatever the noisy copies), a model
without a CAM layer refused with why, and the evaluation's row names."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from idg_core.budget import CAM_POSTPROCESS, WorkBound, postprocess_bound
from idg_core.heatmap import saliency
from idg_core.methods import METHODS
from idg_core.model_calls import CallStats, run_plans
from idg_core.postprocess import build_plan
from idg_core.postprocess.cam import cam_blobs, cam_combine
from idg_evaluation.runner import parse_row
from tests.models import Linear


def _two_squares() -> np.ndarray:
    """A 12 x 12 CAM: a square of 1.0 (top left), a square of 0.6 and one of 0.55 (one band, apart), 0 elsewhere."""
    cam = np.zeros((12, 12))
    cam[1:4, 1:4], cam[7:10, 7:10], cam[1:3, 8:11] = 1.0, 0.6, 0.55
    return cam


def test_blobs_are_bands_of_the_cam_cut_into_connected_parts_ranked_by_cam_per_pixel() -> None:
    labels, count = cam_blobs(_two_squares())
    assert count == 4  # the 1.0 square; the 0.6 and 0.55 squares, one band but apart; the background
    assert (labels[1:4, 1:4] == 1).all() and (labels[7:10, 7:10] == 2).all() and (labels[1:3, 8:11] == 3).all()
    assert (labels == 4).sum() == 144 - 9 - 9 - 6
    flat, n = cam_blobs(np.zeros((5, 5)))
    assert n == 1 and (flat == 1).all()  # no positive value: one blob, the method's order alone


def test_cam_regions_ranks_blobs_first_and_the_base_maps_pixels_inside_each() -> None:
    cam = torch.from_numpy(_two_squares())
    base = torch.randn(3, 12, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out, regions = cam_combine("cam_regions", cam, base)
    assert out.shape == base.shape and torch.allclose(out[0], out[1]) and torch.allclose(out[0], out[2])
    value, sal = out.sum(0).numpy(), saliency(base).numpy()
    labels, count = cam_blobs(cam.numpy())
    for rank in range(1, count + 1):
        inside = labels == rank
        assert (np.argsort(value[inside]) == np.argsort(sal[inside])).all()  # the base map's order inside the blob
        if rank < count:
            assert value[inside].min() > value[labels == rank + 1].max()  # every pixel of a blob above the next one's
    assert value.max() == pytest.approx(1.0) and value.min() > 0
    assert regions is not None and (regions.labels.numpy() == labels).all()  # the blobs are the answer's regions
    assert regions.areas.tolist() == [9, 9, 6, 144 - 24] and regions.gains.tolist() == pytest.approx([1.0, 0.6, 0.55, 0.0])


def test_cam_product_is_the_map_times_the_cam_scaled_to_one_and_zero_where_the_cam_is_and_the_map_where_none_is() -> None:
    cam = torch.from_numpy(_two_squares())
    base = torch.randn(3, 12, 12, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out, regions = cam_combine("cam_product", cam, base)
    assert regions is None  # a product of maps: no regions
    torch.testing.assert_close(out, base * cam)  # the CAM's largest value is 1 already
    torch.testing.assert_close(cam_combine("cam_product", 2 * cam, base)[0], base * cam)
    assert (out[:, cam == 0] == 0).all()
    # a CAM without a positive value says nothing about where: the map stands alone, not zeros (a silent blank answer)
    torch.testing.assert_close(cam_combine("cam_product", torch.zeros(12, 12, dtype=torch.float64), base)[0], base)


class _HalfDark(nn.Module):
    """conv 3x3 (positive weights, no bias) -> ReLU -> mean -> linear with positive weights: the CAM layer's activations,
    and so the CAM, are zero wherever a pixel's 3 x 3 neighbourhood is black."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1, bias=False)
        self.fc = nn.Linear(2, 3)
        with torch.no_grad():
            self.conv.weight.copy_(torch.rand(self.conv.weight.shape, generator=torch.Generator().manual_seed(2)) + 0.1)
            self.fc.weight.copy_(torch.rand(self.fc.weight.shape, generator=torch.Generator().manual_seed(3)) + 0.1)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.fc(torch.relu(self.conv(x)).mean((2, 3)))
        return out


def _photo() -> Tensor:
    """12 x 12: the left half black, the right half random."""
    x = torch.rand(3, 12, 12, generator=torch.Generator().manual_seed(4))
    x[:, :, :6] = 0.0
    return x


@pytest.mark.parametrize("copies", [0, 2])
def test_on_a_model_the_cam_post_steps_combine_the_methods_map_with_gradcams_at_the_declared_cost(copies: int) -> None:
    model, x, target = _HalfDark().eval(), _photo(), 1
    base = torch.full_like(x, 0.5)  # the black half moves along the path: IG is not zero there, the CAM is
    params = METHODS["ig"].validate(steps=5)
    smooth = {"smooth_samples": copies, "smooth_std": 0.05} if copies else {}
    (own,) = run_plans(model, [build_plan("ig", x, base, target, **smooth, **params)], 64)
    (cam,) = run_plans(model, [build_plan("gradcam", x, base, target)], 64)
    up = cam.attributions[0].sum(0)
    assert (up[:, :5] == 0).all() and up.max() > 0 and (saliency(own.attributions[0])[:, :5] > 0).all()
    for kind in CAM_POSTPROCESS:
        stats = CallStats()
        (found,) = run_plans(model, [build_plan("ig", x, base, target, postprocess=kind, **smooth, **params)], 64, stats)
        declared = postprocess_bound(METHODS["ig"].bound(params), {"postprocess": kind, **smooth})
        alone = postprocess_bound(METHODS["ig"].bound(params), smooth)
        assert (declared.forward, declared.backward) == (alone.forward + 1, alone.backward + 1)  # Grad-CAM's pass, once
        assert WorkBound(stats.forward_images, stats.backward_images) == WorkBound(found.forward_passes, found.backward_passes)
        assert (found.forward_passes, found.backward_passes) == (declared.forward, declared.backward)
        sal = saliency(found.attributions[0])
        if kind == "cam_product":
            torch.testing.assert_close(found.attributions[0], own.attributions[0] * up / up.max())
            assert (sal[:, :5] == 0).all() and (sal[:, 7:] > 0).any()
        else:
            labels, count = cam_blobs(up.double().numpy())
            assert len(found.regions) == 1 and (found.regions[0].labels.numpy() == labels).all()
            mine, theirs = sal.numpy(), saliency(own.attributions[0]).numpy()
            for rank in range(1, count + 1):
                inside = labels == rank
                assert (np.argsort(mine[inside], kind="stable") == np.argsort(theirs[inside], kind="stable")).all()


def test_a_model_without_a_cam_layer_is_refused_with_why() -> None:
    x = torch.rand(3, 8, 8)
    with pytest.raises(ValueError, match="no spatial feature map"):
        run_plans(Linear(), [build_plan("ig", x, torch.zeros_like(x), 0, steps=3, postprocess="cam_product")], 64)


def test_the_evaluation_rows_parse() -> None:
    for kind in CAM_POSTPROCESS:
        method, kw = parse_row(f"idg@fast+{kind}")
        assert method == "idg" and kw["postprocess"] == kind and kw["steps"] == 16
