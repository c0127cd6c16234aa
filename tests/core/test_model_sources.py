"""Model specs, the models file and the preprocessing each source implies (no service, no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from idg_core.preprocess import squash_crop
from idg_models import Preprocessing
from idg_models.models_file import ModelSettings, read_models_file
from idg_models.sources import ModelSpec, hf_preprocessing, merge_preprocessing, parse_spec


@pytest.mark.parametrize(("spec", "expected"), [
    ("efficientnet_lite0", ModelSpec("efficientnet_lite0", "packaged")),
    ("resnet50=/w/r50.pth", ModelSpec("resnet50", "torchvision", "resnet50", "/w/r50.pth")),
    ("r=torchvision:resnet50:/w/r50.pth", ModelSpec("r", "torchvision", "resnet50", "/w/r50.pth")),
    ("pets = timm:vit_base_patch16_384:/w/pets.safetensors", ModelSpec("pets", "timm", "vit_base_patch16_384", "/w/pets.safetensors")),
    ("vit=hf:/models/vit", ModelSpec("vit", "hf", None, "/models/vit")),
    ("s=torchscript:/m/s.ts", ModelSpec("s", "torchscript", None, "/m/s.ts")),
    ("e=export:/m/e.pt2", ModelSpec("e", "export", None, "/m/e.pt2")),
])
def test_parse_spec(spec: str, expected: ModelSpec) -> None:
    assert parse_spec(spec) == expected
    assert parse_spec("e=export:/m/e.pt2").source == "export:/m/e.pt2"


@pytest.mark.parametrize(("spec", "message"), [
    ("mine", "unknown model 'mine'"),
    ("resnet50", "needs a local weights file"),
    ("mine=/m.pt", "the source must start with one of"),
    ("v=timm:vit_base_patch16_224", "write timm:ARCH:/path/to/weights"),
    ("v=hf:", "write hf:/path"),
    ("=hf:/x", "has no model name"),
    ("a/b=hf:/x", "a model name is letters, digits, '_', '.' and '-', at most 64, got 'a/b'"),  # /v2/models/a/b: no route
    ("a b=hf:/x", "got 'a b'"),
])
def test_parse_spec_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(spec)


def test_models_file_reads_and_checks(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n\n")
    f = tmp_path / "models.toml"
    f.write_text('[models.a]\ncrop_size = 384\nmean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\nlabels = "labels.txt"\nmax_batch = 8\n')
    a = read_models_file(f)["a"]
    assert (a.input_size, a.labels, a.max_batch, a.mean) == (384, ("cat", "dog"), 8, (0.5, 0.5, 0.5))
    for body, message in [
        ("[models.a]\ncolour = 1\n", "unknown key 'colour'"),
        ("[models.a]\nstd = [0.5, 0, 0.5]\n", "std must be a list of 3 finite positive numbers"),
        ("[models.a]\nstd = [inf, 0.25, 0.25]\n", "std must be a list of 3 finite positive numbers"),  # TOML's inf and nan
        ("[models.a]\nmean = [nan, 0.5, 0.5]\n", "mean must be a list of 3 finite numbers"),
        ("[models.a]\ninput_size = 0\n", "input_size must be a positive integer"),
        ('[models.a]\nnum_classes = 3\nlabels = "labels.txt"\n', "num_classes is 3 but the labels file has 2 names"),
        ('[models.a]\nlabels = "nope.txt"\n', "labels file .*nope.txt does not exist"),
        ('[models.a]\ninterpolation = "cubic"\n', "interpolation must be one of"),
        ("[models.a\n", "is not valid TOML"),
        ("[other]\n", "unknown top-level key 'other'"),
    ]:
        f.write_text(body)
        with pytest.raises(ValueError, match=message):
            read_models_file(f)
    with pytest.raises(ValueError, match="does not exist"):
        read_models_file(tmp_path / "missing.toml")


def test_hf_processor_configs_map_to_preprocessing() -> None:
    vit = hf_preprocessing({"size": {"height": 384, "width": 384}, "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3})
    assert vit == Preprocessing(384, 384, "bilinear", (0.5,) * 3, (0.5,) * 3, "squash")
    convnext = hf_preprocessing({"size": {"shortest_edge": 224}, "crop_pct": 0.875, "resample": 3})
    assert (convnext.resize_size, convnext.crop_size, convnext.interpolation, convnext.resize_mode) == (256, 224, "bicubic", "shorter")
    big = hf_preprocessing({"size": {"shortest_edge": 384}, "crop_pct": 0.875})
    assert (big.resize_size, big.crop_size, big.resize_mode) == (384, 384, "squash")  # ConvNeXt warps at >= 384
    resnet = hf_preprocessing({"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}})
    assert (resnet.resize_size, resnet.crop_size, resnet.resize_mode) == (256, 224, "shorter")
    assert hf_preprocessing({"size": 32, "do_normalize": False}).std == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="only square inputs"):
        hf_preprocessing({"size": {"height": 224, "width": 320}})


def test_models_file_overrides_the_source() -> None:
    spec = ModelSpec("m", "timm", "x", "/w")
    timm_like = Preprocessing(168, 160, "bicubic", (0.5,) * 3, (0.5,) * 3)
    out = merge_preprocessing(timm_like, ModelSettings(input_size=320, std=(0.25,) * 3), spec)
    assert (out.resize_size, out.crop_size, out.interpolation, out.std) == (336, 320, "bicubic", (0.25,) * 3)  # ratio kept
    scripted = merge_preprocessing(None, ModelSettings(input_size=224, mean=(0.0,) * 3, std=(1.0,) * 3), ModelSpec("s", "torchscript"))
    assert (scripted.resize_size, scripted.crop_size) == (256, 224)
    with pytest.raises(ValueError, match=r"give input_size, std in the models file \(IDG_MODELS_FILE\), table \[models.s\]"):
        merge_preprocessing(None, ModelSettings(mean=(0.0,) * 3), ModelSpec("s", "torchscript"))
    with pytest.raises(ValueError, match="resize_size 100 is smaller than the input size 160"):
        merge_preprocessing(timm_like, ModelSettings(resize_size=100), spec)


def test_squash_crop_ignores_the_aspect_ratio() -> None:
    img = Image.new("RGB", (400, 100), (255, 0, 0))
    img.paste((0, 0, 255), (0, 0, 100, 100))  # left quarter blue: squashed, it stays a quarter
    out = squash_crop(img, 64, 64, "bilinear")
    assert out.size == (64, 64) and out.getpixel((4, 32))[2] > 200 and out.getpixel((40, 32))[0] > 200
    assert squash_crop(img, 72, 64).size == (64, 64)


def test_load_entry_loads_a_users_model_as_the_service_would(tmp_path: Path) -> None:
    """The command-line tools take any IDG_MODELS entry: a saved TorchScript CNN with its models file
    gives the file's logits, labels and input size; a bare torchvision ARCH takes --weights."""
    import torch

    from idg_models import load_entry
    from tests.models import tiny_model_maker

    entry = tiny_model_maker().MAKERS["torchscript"](tmp_path)
    with pytest.raises(ValueError, match=r"give input_size, mean, std in the models file"):
        load_entry(entry)
    model = load_entry(entry, "none", tmp_path / "models.toml")
    assert (model.name, model.source) == ("scripted", f"torchscript:{tmp_path / 'cnn.ts'}")
    assert model.num_classes == 10 and model.class_names[2] == "bird" and model.preprocessing.crop_size == 48
    x = torch.rand(2, 3, 48, 48)
    saved = torch.jit.load(str(tmp_path / "cnn.ts"))
    torch.testing.assert_close(model(x), saved((x - 0.5) / 0.25))  # the models file's mean and std, then the file's net
    assert load_entry("resnet50", "random").source == "torchvision:resnet50:random"
    with pytest.raises(ValueError, match="needs a local weights file"):
        load_entry("resnet50")


def test_a_model_whose_logits_are_not_finite_is_refused_before_it_serves() -> None:
    """Its answers would each have been a 500 blaming reduced precision (a models file's mean/std of inf, say)."""
    import torch
    from torch import nn

    from idg_models import ImageClassifier
    from idg_models.sources import probe

    class Overflow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :3] / 0.0  # inf for every positive pixel

    model = ImageClassifier("o", Overflow(), Preprocessing(8, 8), ["a", "b", "c"]).eval()
    with pytest.raises(ValueError, match=r"the model's logits are not finite for 2 random images in \[0, 1\]"):
        probe(model)
