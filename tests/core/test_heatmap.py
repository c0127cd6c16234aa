import io

import numpy as np
import pytest
import torch
from PIL import Image

from idg_core.heatmap import attribution_npy, heatmap_and_overlay_png, heatmap_png, image_png, overlay_png, saliency, scale


def _decode(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)))


def test_all_zero_attribution_renders() -> None:
    png = heatmap_png(torch.zeros(3, 10, 12))
    arr = _decode(png)
    assert arr.shape == (10, 12, 3) and (arr == arr[0, 0]).all()
    photo = torch.rand(3, 10, 12)
    over = _decode(overlay_png(photo, torch.zeros(3, 10, 12)))
    assert np.abs(over.astype(int) - (photo.permute(1, 2, 0).numpy() * 255).round()).max() <= 1


def test_saliency_sums_each_channels_magnitude_and_signed_keeps_sign() -> None:
    """|attribution| summed over channels, as the metrics define it: +1 and -3 in two channels of a pixel are 4, not 2
    (their sum's magnitude would rank a pixel with opposite channels below one with a single small value)."""
    a = torch.zeros(3, 2, 2)
    a[0, 0, 0], a[1, 0, 0], a[2, 1, 1] = 1.0, -3.0, 2.0
    assert saliency(a).tolist() == [[4.0, 0.0], [0.0, 2.0]]
    assert saliency(a, signed=True).tolist() == [[-2.0, 0.0], [0.0, 2.0]]


def test_scale_clips_the_outlier_mass() -> None:
    v = torch.tensor([1.0] * 98 + [1000.0, 1000.0])
    s = scale(v, outlier_perc=2.0)
    assert s.max() == 1.0 and s[0] == pytest.approx(1.0 / 1000.0)
    s = scale(torch.tensor([1.0] * 99 + [1.0]), outlier_perc=2.0)
    assert torch.allclose(s, torch.ones(100))


def test_hottest_pixel_is_brightest_in_the_heatmap() -> None:
    a = torch.zeros(3, 8, 8)
    a[:, 3, 5] = 1.0
    arr = _decode(heatmap_png(a, outlier_perc=0)).astype(int).sum(2)
    assert np.unravel_index(arr.argmax(), arr.shape) == (3, 5)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="colormap"):
        heatmap_png(torch.zeros(3, 2, 2), colormap="rainbow")
    with pytest.raises(ValueError, match="opacity"):
        overlay_png(torch.zeros(3, 2, 2), torch.zeros(3, 2, 2), opacity=2)
    with pytest.raises(ValueError, match="attribution"):
        heatmap_png(torch.zeros(2, 2))
    for bad in (float("nan"), float("inf")):
        attr = torch.ones(3, 4, 4)
        attr[1, 2, 3] = bad
        with pytest.raises(ValueError, match="not finite"):
            heatmap_png(attr)
        with pytest.raises(ValueError, match="not finite"):
            overlay_png(torch.zeros(3, 4, 4), attr)


@pytest.mark.parametrize(("peak", "dtype"), [(1.0, "float16"), (65504.0, "float16"), (7e4, "float32"), (-3e38, "float32"),
                                           (4e-4, "float16"), (-5e-5, "float32"), (1e-7, "float32"), (0.0, "float16")])
def test_the_raw_array_is_float16_only_where_it_keeps_every_value_to_its_precision(peak: float, dtype: str) -> None:
    # never an infinity, and never a small value lost to float16's subnormal steps (its smallest normal is ~6.1e-5)
    attr = (torch.rand(3, 4, 5, generator=torch.Generator().manual_seed(0)) + 1) * (abs(peak) / 4)  # peak/4 .. peak/2
    attr[1, 2, 3] = peak
    data, kind = attribution_npy(attr)
    arr = np.load(io.BytesIO(data))
    assert kind == dtype == arr.dtype.name and arr.shape == (3, 4, 5) and np.isfinite(arr).all()
    assert np.all(np.abs(arr.astype(np.float64) - attr.double().numpy()) <= np.abs(attr.double().numpy()) * 2.0**-11)


def test_a_normal_peak_over_values_below_float16s_normal_range_comes_back_float32() -> None:
    """One pixel at 1e-4 over ~1e-7 noise: float16 would keep the peak and round the rest to steps of ~6e-8."""
    attr = torch.randn(3, 8, 8, generator=torch.Generator().manual_seed(1)) * 1e-7
    attr[0, 0, 0] = 1e-4
    data, kind = attribution_npy(attr)
    arr = np.load(io.BytesIO(data))
    assert kind == "float32" and np.array_equal(arr, attr.numpy())


def test_the_input_png_is_the_image() -> None:
    image = torch.rand(3, 6, 7)
    png = Image.open(io.BytesIO(image_png(image)))
    assert png.size == (7, 6) and png.mode == "RGB"
    assert np.abs(np.asarray(png).astype(float) / 255 - image.permute(1, 2, 0).numpy()).max() <= 0.5 / 255 + 1e-6


def test_scale_is_the_cumulative_mass_threshold_of_a_float64_sort() -> None:
    """The NumPy scaling against the definition written out in torch, on a map with ties and signs."""
    g = torch.Generator().manual_seed(3)
    v = torch.randn(40, 50, generator=g).round(decimals=1)
    for perc in (0.0, 2.0, 37.5):
        mags = v.abs().flatten().double().sort().values
        cums = mags.cumsum(0)
        threshold = float(mags[min(int(torch.searchsorted(cums, cums[-1] * (100 - perc) / 100)), mags.numel() - 1)])
        assert torch.allclose(scale(v, perc), (v.double() / threshold).clamp(-1, 1).float(), atol=0, rtol=1e-6)


@pytest.mark.parametrize("signed", [False, True])
def test_heatmap_and_overlay_together_are_the_two_alone(signed: bool) -> None:
    g = torch.Generator().manual_seed(4)
    image, attr = torch.rand(3, 17, 23, generator=g), torch.randn(3, 17, 23, generator=g)
    heat, over = heatmap_and_overlay_png(image, attr, opacity=0.4, signed=signed, outlier_perc=5.0)
    assert heat == heatmap_png(attr, signed=signed, outlier_perc=5.0)
    assert over == overlay_png(image, attr, opacity=0.4, signed=signed, outlier_perc=5.0)
    assert heatmap_and_overlay_png(image, attr, heatmap=False, overlay=False) == (None, None)
    with pytest.raises(ValueError, match="opacity"):
        heatmap_and_overlay_png(image, attr, heatmap=False, opacity=1.5)
