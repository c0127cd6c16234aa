"""The packaged EfficientNet-Lite0 and torchvision architectures from local weight files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from idg_core import idg
from idg_core.models import decode_image, imagenet_class_names, imagenet_wnids, load_model, torchvision_classifier

SAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "imagenet-samples"


@pytest.fixture(scope="module")
def lite0() -> torch.nn.Module:
    return load_model("efficientnet_lite0")


def test_class_names_match_the_shared_table() -> None:
    names, wnids = imagenet_class_names(), imagenet_wnids()
    assert len(names) == 1000 and names[0] == "tench" and wnids[207] == "n02099601"


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared samples not beside the checkout")
def test_lite0_classifies_real_photos(lite0: torch.nn.Module) -> None:
    wnids = imagenet_wnids()
    files = sorted(SAMPLES.glob("*.JPEG"))[:12]
    x = torch.stack([lite0.prepare(decode_image(f.read_bytes())) for f in files])
    assert x.shape[1:] == (3, 224, 224) and 0 <= x.min() and x.max() <= 1
    with torch.no_grad():
        pred = lite0(x).argmax(1).tolist()
    right = sum(wnids[p] == f.name.split("_")[0] for p, f in zip(pred, files, strict=True))
    assert right >= 9


@pytest.mark.skipif(not SAMPLES.is_dir(), reason="shared samples not beside the checkout")
def test_idg_on_a_real_photo_is_finite_and_focused(lite0: torch.nn.Module) -> None:
    f = next(SAMPLES.glob("n01440764_*"))
    x = lite0.prepare(decode_image(f.read_bytes())).unsqueeze(0)
    res = idg(lite0, x, "mean", 0, steps=8, probe_steps=8)
    assert torch.isfinite(res.attributions).all() and res.attributions.abs().sum() > 0


def test_torchvision_weights_from_a_local_file(tmp_path: Path) -> None:
    model = torchvision_classifier("resnet50", None)
    path = tmp_path / "r50.pth"
    torch.save(model.net.state_dict(), path)
    again = load_model("resnet50", path)
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.allclose(model(x), again(x))


def test_mismatched_or_missing_weights_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model("resnet101", tmp_path / "nope.pth")
    small = torchvision_classifier("resnet50", None)
    path = tmp_path / "r50.pth"
    torch.save(small.net.state_dict(), path)
    with pytest.raises(ValueError, match="do not match resnet101"):
        load_model("resnet101", path)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="could not be read"):
        load_model("resnet50", junk)
    with pytest.raises(ValueError, match="model must be one of"):
        load_model("vgg_nope")
