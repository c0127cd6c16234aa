"""Any torchvision image classifier with the user's own weights (issue #73): each builder torchvision lists, random
weights saved with ``torch.save(model.state_dict(), path)`` as a user would, loaded through the ``torchvision:`` source
with the preprocessing torchvision declares for it, and giving the user's net's logits."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

from idg_models import ImageClassifier, import_torchvision, load_model, load_source, parse_spec
from idg_models.models_file import ModelSettings
from idg_models.torchvision_archs import AUX_HEADS, classification_archs, declared_preprocessing

tv = import_torchvision()
AS_TORCHVISION_WEIGHTS: dict[str, dict[str, Any]] = {
    # GoogLeNet and Inception-v3 are served as torchvision builds them for its weights (transform_input=True): the user
    # here fine-tuned from those, GoogLeNet without its auxiliary heads (as torchvision hands it out), Inception with
    "googlenet": {"transform_input": True, "aux_logits": False, "init_weights": False},
    "inception_v3": {"transform_input": True, "init_weights": False},
}
FEW = {  # arch: (classes, builder kwargs, declared (resize, crop, interpolation))
    "resnet18": (7, {}, (256, 224, "bilinear")),
    "mobilenet_v3_small": (1000, {}, (256, 224, "bilinear")),  # ImageNet's class names
    "vit_b_32": (3, {"image_size": 256}, (293, 256, "bilinear")),  # its size from the position embedding, DEFAULT's ratio
}


def _users_net(arch: str, classes: int, seed: int = 0, **kwargs: Any) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = tv.models.get_model(arch, weights=None, num_classes=classes, **{**AS_TORCHVISION_WEIGHTS.get(arch, {}), **kwargs})
    return net.eval()


def _served_as_the_user_has_it(arch: str, tmp_path: Path, classes: int = 7, **kwargs: Any) -> ImageClassifier:
    """The user's net saved as a state dict, loaded as the service loads it; asserts it gives the user's logits."""
    net = _users_net(arch, classes, **kwargs)
    path = tmp_path / f"{arch}-mine.pth"
    torch.save(net.state_dict(), path)
    model = load_source(parse_spec(f"mine=torchvision:{arch}:{path}"))
    size = model.preprocessing.crop_size
    x = torch.rand(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = net((x - model.mean) / model.std)
        ours = model(x)
    assert model.num_classes == classes and model.class_names[0] == ("tench" if classes == 1000 else "class 0")
    assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4), (arch, (ours - theirs).abs().max())
    path.unlink()
    return model


def _declared(arch: str) -> tuple[int, int, str]:
    preset = tv.models.get_model_weights(arch).DEFAULT.transforms()
    return preset.resize_size[0], preset.crop_size[0], preset.interpolation.value


@pytest.mark.parametrize("arch", FEW)
def test_a_representative_few_load_from_the_users_state_dict(arch: str, tmp_path: Path) -> None:
    classes, kwargs, declared = FEW[arch]
    model = _served_as_the_user_has_it(arch, tmp_path, classes, **kwargs)
    p = model.preprocessing
    assert (p.resize_size, p.crop_size, p.interpolation) == declared
    assert model.source == f"torchvision:{arch}:{tmp_path / f'{arch}-mine.pth'}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", classification_archs())
def test_every_classification_builder_torchvision_has_loads_from_the_users_state_dict(arch: str, tmp_path: Path) -> None:
    """All 80 of torchvision 0.28 (ViT-H/14 and RegNetY-128GF have over 600 M parameters: minutes and ~8 GB)."""
    model = _served_as_the_user_has_it(arch, tmp_path, classes=5)
    p = model.preprocessing
    if arch == "vit_h_14":  # built at 224 (weights=None): the entry made for 224, not DEFAULT's 518
        assert (p.resize_size, p.crop_size, p.interpolation) == (224, 224, "bicubic")
    else:
        assert (p.resize_size, p.crop_size, p.interpolation) == _declared(arch)
    del model
    gc.collect()


def test_the_weights_file_name_picks_torchvisions_entry_else_default_else_one_made_for_the_size() -> None:
    assert declared_preprocessing("resnet50", None, "resnet50-0676ba61.pth").resize_size == 256  # IMAGENET1K_V1's file
    assert declared_preprocessing("resnet50", None, "resnet50-11ad3fa6.pth").resize_size == 232  # IMAGENET1K_V2's
    assert declared_preprocessing("resnet50", None, "mine.pth").weights == "IMAGENET1K_V2"  # DEFAULT
    assert declared_preprocessing("vit_h_14", 224).weights == "IMAGENET1K_SWAG_LINEAR_V1"
    assert declared_preprocessing("vit_h_14", 518, "mine.pth").weights == "IMAGENET1K_SWAG_E2E_V1"
    assert declared_preprocessing("vit_b_16", 224, "vit_b_16_swag-9ac1b537.pth").weights == "IMAGENET1K_V1"  # not its size
    odd = declared_preprocessing("vit_b_16", 320)  # no weights of torchvision's for 320: DEFAULT's ratio
    assert (odd.weights, odd.resize_size, odd.crop_size, odd.interpolation) == ("IMAGENET1K_V1 scaled to 320", 366, 320, "bilinear")
    d = declared_preprocessing("efficientnet_b3")
    assert (d.resize_size, d.crop_size, d.interpolation) == (320, 300, "bicubic")


def test_unknown_architectures_and_weights_that_do_not_fit_say_what_would(tmp_path: Path) -> None:
    path = tmp_path / "r18.pth"
    torch.save(_users_net("resnet18", 4).state_dict(), path)
    with pytest.raises(ValueError, match=r"no image-classification architecture 'resnet19'; did you mean resnet18 or"):
        load_source(parse_spec(f"m=torchvision:resnet19:{path}"))
    with pytest.raises(ValueError, match=r"fasterrcnn_resnet50_fpn is not an image classifier \(it is in torchvision.models.detection\)"):
        load_source(parse_spec(f"m=torchvision:fasterrcnn_resnet50_fpn:{path}"))
    with pytest.raises(ValueError, match=r"weights do not match torchvision's resnet34: 96 tensors missing \(first: layer1.2.conv1.weight\)"
                                         r".*; they fit resnet18: write torchvision:resnet18:PATH"):
        load_source(parse_spec(f"m=torchvision:resnet34:{path}"))
    with pytest.raises(ValueError, match=r"is it a state_dict of torchvision's vit_b_32"):
        load_source(parse_spec(f"m=torchvision:vit_b_32:{path}"))
    with pytest.raises(FileNotFoundError, match=r"weights file .*nope.pth does not exist"):
        load_source(parse_spec(f"m=torchvision:resnet18:{tmp_path / 'nope.pth'}"))
    with pytest.raises(ValueError, match=r"resnet18 have a head of 4 classes but the models file says 5 \(num_classes or labels\)"):
        load_source(parse_spec(f"m=torchvision:resnet18:{path}"), ModelSettings(num_classes=5))


def test_a_checkpoint_with_the_state_dict_inside_and_module_prefixes_loads(tmp_path: Path) -> None:
    """What torchvision's reference training script saves ({"model": ...}) and what DataParallel's keys look like."""
    net = _users_net("squeezenet1_1", 6)
    path = tmp_path / "checkpoint.pth"
    torch.save({"model": {f"module.{k}": v for k, v in net.state_dict().items()}, "epoch": 3}, path)
    model = load_source(parse_spec(f"mine=torchvision:squeezenet1_1:{path}"))
    x = torch.rand(1, 3, 224, 224)
    with torch.no_grad():
        assert torch.allclose(model(x), net((x - model.mean) / model.std), atol=1e-5)


def test_load_model_takes_any_torchvision_classifier_by_name(tmp_path: Path) -> None:
    net = _users_net("shufflenet_v2_x0_5", 1000)
    torch.save(net.state_dict(), tmp_path / "s.pth")
    model = load_model("shufflenet_v2_x0_5", tmp_path / "s.pth")
    assert model.num_classes == 1000 and model.preprocessing.crop_size == 224
    with pytest.raises(ValueError, match=r"neither a packaged one .* did you mean shufflenet_v2_x0_5"):
        load_model("shufflenet_v2_x05", tmp_path / "s.pth")
    with pytest.raises(ValueError, match="needs a local weights file"):
        load_model("shufflenet_v2_x0_5")


def test_googlenet_with_its_auxiliary_heads_loads_too(tmp_path: Path) -> None:
    """The file has aux1/aux2 (a GoogLeNet trained with them): built with them, and the served logits are the main head's."""
    model = _served_as_the_user_has_it("googlenet", tmp_path, classes=3, aux_logits=True)
    assert model.net.aux1 is not None and set(AUX_HEADS) <= set(classification_archs())
