"""The region rows' benchmark (``python -m benchmarks.run --rows-only``, :func:`benchmarks.speed.run_rows`): the
default answer measured in the same run as the reference, pytorch-grad-cam as Grad-CAM's peer on the same model and
layer, and the report's ratios computed from the figures (issue #72 item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from benchmarks.gradcam_peer import PEER_VERSION, head_apart, load_peer, peer_cam, peer_target
from benchmarks.run import render
from benchmarks.speed import DEFAULT_ROW, run_rows
from idg_core.presets import DEFAULT_PRESET
from idg_models import ImageClassifier, Preprocessing
from tests.models import Linear, small_classifier

META = {"label": "x", "date": "today", "machine": {"cpu": "c"}, "model": "m", "device": "cpu", "batch_size": 8}
PEER = f"pytorch-grad-cam {PEER_VERSION}"


def test_the_table_has_the_default_row_and_each_rows_ratios_to_it_and_to_the_peer() -> None:
    rows = [{"row": "idg@fast", "reference": True, "attr_per_s_1": 2.0, "attr_per_s_8": 3.0},
            {"row": "gradcam", "attr_per_s_1": 40.0, "attr_per_s_8": 66.0, "peer": f"{PEER} GradCAM", "peer_installed": True,
             "peer_attr_per_s_1": 25.0, "peer_attr_per_s_8": 44.0},
            {"row": "idg@fast+XRAI", "attr_per_s_1": 0.5, "attr_per_s_8": 1.5},
            {"row": "idg@fast+cam_regions", "error": "the model has no CAM layer"}]
    text = render(META, [], [], rows)
    assert ("| row | 1 image | 8 images | vs default, 1 image | vs default, 8 images | vs pytorch-grad-cam, 1 image "
            "| vs pytorch-grad-cam, 8 images | note |") in text
    assert "| `idg@fast` (the reference: the default answer when it ran) | 2.00 | 3.00 | reference | reference |  |  |  |" in text
    assert "| `gradcam` | 40.00 | 66.00 | 20.00x | 22.00x | 1.60x | 1.50x |  |" in text  # 40 / 2, 66 / 3; 40 / 25, 66 / 44
    assert f"| {PEER} GradCAM (peer of `gradcam`) | 25.00 | 44.00 | 12.50x | 14.67x |  |  |  |" in text
    assert "| `idg@fast+XRAI` | 0.50 | 1.50 | 0.25x | 0.50x |  |  |  |" in text
    assert "| `idg@fast+cam_regions` | n/a | n/a | n/a | n/a |  |  | the model has no CAM layer |" in text
    assert "peer not installed" not in text and "Attribution speed" not in text


def test_without_the_peer_the_table_says_so_instead_of_figures() -> None:
    rows = [{"row": "idg@fast", "reference": True, "attr_per_s_1": 2.0},
            {"row": "gradcam_pp", "attr_per_s_1": 30.0, "peer": f"{PEER} GradCAMPlusPlus", "peer_installed": False}]
    text = render(META, [], [], rows)
    assert "| `gradcam_pp` | 30.00 | 15.00x | peer not installed |" in text
    assert "pytorch-grad-cam was not installed for this run" in text and "(peer of" not in text


def test_run_rows_measures_the_default_first_and_each_rows_ratio_to_it(tmp_path: Path) -> None:
    model = small_classifier()
    images, targets = torch.rand(2, 3, 16, 16), [1, 7]
    rows = run_rows(model, images, targets, [1, 2], ["gradcam", "gradcam_pp"], device=torch.device("cpu"), batch_size=8,
                    peer_folder=tmp_path)  # no peer there
    assert [r["row"] for r in rows] == [DEFAULT_ROW, "gradcam", "gradcam_pp"] and f"idg@{DEFAULT_PRESET}" == DEFAULT_ROW
    default = rows[0]
    assert default["reference"] and default["attr_per_s_1"] > 0 and default["attr_per_s_2"] > 0
    for r in rows[1:]:
        assert r["peer_installed"] is False and not any(k.startswith("peer_attr") for k in r)
        for b in (1, 2):
            assert r[f"vs_default_{b}"] == pytest.approx(r[f"attr_per_s_{b}"] / default[f"attr_per_s_{b}"])
    assert "peer not installed" in render(META, [], [], rows)
    assert run_rows(model, images, targets, [1], [], device=torch.device("cpu")) == []  # no rows: not even the default


def test_a_model_without_a_cam_layer_keeps_the_default_and_the_reason(tmp_path: Path) -> None:
    model = ImageClassifier("lin", Linear().eval(), Preprocessing(8, 8), list("abcd"))
    default, cam = run_rows(model, torch.rand(1, 3, 8, 8), [2], [1], ["gradcam"], device=torch.device("cpu"), peer_folder=tmp_path)
    assert default["attr_per_s_1"] > 0 and "no spatial feature map" in cam["error"] and "attr_per_s_1" not in cam


def test_run_rows_times_pytorch_grad_cam_on_the_same_layer_where_it_is_installed() -> None:
    peer = load_peer()
    if peer is None:
        pytest.skip("pytorch-grad-cam is not installed apart (scripts/setup.sh dev puts it in .venv/peers/gradcam)")
    model = small_classifier()
    hooked, layer = peer_target(model)
    assert hooked is model and layer is model.cam_target()[1]  # called once: hooked as it is
    x = torch.rand(2, 3, 16, 16)
    with peer_cam(peer, "gradcam", hooked, layer) as cam:
        assert cam(x, [1, 7]).shape == (2, 16, 16)
    rows = run_rows(model, x, [1, 7], [1, 2], ["gradcam", "gradcam_pp"], device=torch.device("cpu"), batch_size=8)
    for r, cls in zip(rows[1:], ("GradCAM", "GradCAMPlusPlus"), strict=True):
        assert r["peer"] == f"{PEER} {cls}" and r["peer_installed"] is True
        for b in (1, 2):
            assert r[f"peer_attr_per_s_{b}"] > 0
            assert r[f"vs_peer_{b}"] == pytest.approx(r[f"attr_per_s_{b}"] / r[f"peer_attr_per_s_{b}"])
    assert all(p.grad is None for p in model.parameters())  # the peer's backward leaves no gradients behind
    assert f"| {PEER} GradCAM (peer of `gradcam`) |" in render(META, [], [], rows)


class _SharedAct(nn.Module):
    """Two convolutions sharing one ReLU module: the CAM layer (the ReLU's last call) runs twice."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.act = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()
        self.head = nn.Linear(4, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.act(self.b(self.act(self.a(x)))).mean((2, 3)))


def test_the_peer_is_not_hooked_on_a_layer_that_runs_twice_outside_lite() -> None:
    model = ImageClassifier("shared", _SharedAct().eval(), Preprocessing(8, 8), list("abc")).eval()
    assert model.cam_target()[1] is model.net.act
    with pytest.raises(ValueError, match="runs 2 times in a forward pass"):
        peer_target(model)
    with pytest.raises(ValueError, match="takes an EfficientNet-Lite"):
        head_apart(model)
