"""What a person sees (docs/methods/visualization.md): polarity, clip percentiles, colour maps and outlines of the top
regions, checked on small maps whose answer is known; through every door of /attribute's body, a bad value is a 422
that says what was wrong; a request that gives none of the fields is rendered byte for byte as before."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from app.schemas import AttributeParams
from app.service.visualization import edges, outline_labels, visual_pngs
from idg_client import parse_attribution
from idg_core.heatmap import colour_lut, heatmap_and_overlay_png
from idg_core.types import Regions
from tests.service.conftest import AppFactory, image_bytes, serve


def _params(**fields: Any) -> AttributeParams:
    return AttributeParams.model_validate(fields)


def _pngs(image: torch.Tensor, attr: torch.Tensor, regions: Regions | None = None, **fields: Any) -> tuple[np.ndarray, np.ndarray]:
    heat, over = visual_pngs(image, attr, _params(**fields), regions)
    assert heat is not None and over is not None
    return _decoded(heat), _decoded(over)


def _decoded(png: bytes | str) -> np.ndarray:
    data = base64.b64decode(png) if isinstance(png, str) else png
    return np.asarray(Image.open(io.BytesIO(data))).astype(np.int64)


def _map(values: np.ndarray) -> torch.Tensor:
    """A ``(3, H, W)`` map whose channel sum is ``values`` (all of it in the first channel)."""
    attr = torch.zeros(3, *values.shape)
    attr[0] = torch.from_numpy(values.astype(np.float32))
    return attr


PHOTO = torch.rand(3, 10, 10, generator=torch.Generator().manual_seed(1))


def test_no_visualization_field_renders_as_before_and_the_same_choices_made_explicit_agree() -> None:
    attr = torch.randn(3, 16, 12, generator=torch.Generator().manual_seed(0))
    image = torch.rand(3, 16, 12, generator=torch.Generator().manual_seed(2))
    before = heatmap_and_overlay_png(image, attr, opacity=0.6, signed=False, outlier_perc=2.0)
    assert visual_pngs(image, attr, _params()) == before
    assert visual_pngs(image, attr, _params(color_map="inferno")) == before  # through the new path: the same bytes
    signed = heatmap_and_overlay_png(image, attr, opacity=0.6, signed=True, outlier_perc=2.0)
    assert visual_pngs(image, attr, _params(signed=True)) == signed
    assert visual_pngs(image, attr, _params(polarity="both")) == signed
    assert visual_pngs(image, attr, _params(signed=True, color_map="coolwarm")) == signed
    assert visual_pngs(image, attr, _params(return_heatmap=False)) == (None, before[1])


def test_the_clip_percentiles_hide_the_pixels_below_and_saturate_those_above() -> None:
    values = np.arange(1, 101, dtype=np.float64).reshape(10, 10)  # percentile 50 is 50.5, percentile 90 is 90.1
    heat, over = _pngs(PHOTO, _map(values), clip_percent_lowerbound=50, clip_percent_upperbound=90, color_map="gray")
    grey = heat[..., 0]
    assert ((grey == 0) == (values <= 50)).all()  # nothing shown at and below the lower percentile
    assert ((grey == 255) == (values >= 91)).all()  # full colour from the upper one
    photo = np.rint(PHOTO.permute(1, 2, 0).numpy() * 255)
    assert (over[values <= 50] == photo[values <= 50]).all()  # the overlay shows the photo where nothing is shown
    # only the upper bound: nothing hidden but the zeros, the top tenth saturated, the rest in proportion
    grey = _pngs(PHOTO, _map(values), clip_percent_upperbound=90, color_map="gray")[0][..., 0]
    assert (grey > 0).all() and (grey[values >= 91] == 255).all()
    assert (grey == colour_lut("gray")[np.rint(np.minimum(values / 90.1, 1) * 255).astype(int), 0]).all()


def test_polarity_shows_one_sign_or_both() -> None:
    values = np.zeros((10, 10))
    values[:, :5] = np.linspace(1, 5, 50).reshape(10, 5)  # for the class on the left
    values[:, 5:] = -np.linspace(1, 5, 50).reshape(10, 5)  # against it on the right
    attr = _map(values)
    positive, negative = values > 0, values < 0
    heat = _pngs(PHOTO, attr, polarity="negative", color_map="gray")[0][..., 0]
    assert (heat[positive] == 0).all() and (heat[negative] > 0).all()
    heat = _pngs(PHOTO, attr, polarity="positive", color_map="gray")[0][..., 0]
    assert (heat[negative] == 0).all() and (heat[positive] > 0).all()
    heat = _pngs(PHOTO, attr, polarity="both", color_map="red_green")[0]  # red for negative, green for positive
    assert (heat[negative][:, 1] == 0).all() and (heat[negative][:, 0] > 0).all()
    assert (heat[positive][:, 0] == 0).all() and (heat[positive][:, 1] > 0).all()
    heat = _pngs(PHOTO, attr, polarity="negative", color_map="pink_green")[0]  # a two-sided map: negative on its pink side
    assert (heat[negative][:, 0] > heat[negative][:, 1]).all() and (heat[positive] == 0).all()  # zero is its black middle
    heat = _pngs(PHOTO, attr, color_map="gray")[0][..., 0]  # unset: the magnitude, both sides shown
    assert (heat[positive] > 0).all() and (heat[negative] > 0).all()


def test_a_colour_map_sets_the_colours_deterministically() -> None:
    values = np.arange(100, dtype=np.float64).reshape(10, 10)
    attr = _map(values)
    red = _pngs(PHOTO, attr, color_map="red", outlier_perc=0)[0]
    assert (red[..., 1:] == 0).all() and red[9, 9, 0] == 255 and red[0, 0, 0] == 0
    index = np.rint(values / values.max() * 255).astype(int)  # outlier_perc=0: scaled by the largest value
    assert (red == colour_lut("red")[index]).all()
    green = _pngs(PHOTO, attr, color_map="green", outlier_perc=0)[0]
    assert (green[..., [0, 2]] == 0).all() and (green[..., 1] == red[..., 0]).all()
    once = visual_pngs(PHOTO, attr, _params(color_map="viridis"))
    assert once == visual_pngs(PHOTO, attr, _params(color_map="viridis")) and once != visual_pngs(PHOTO, attr, _params())


def _regions(labels: np.ndarray) -> Regions:
    areas = np.bincount(labels.ravel())[1:]
    return Regions(torch.from_numpy(labels.astype(np.int32)), torch.linspace(1, 0, len(areas), dtype=torch.float64),
                   torch.from_numpy(areas.astype(np.int64)))


@pytest.mark.parametrize("share", [0.01, 0.05, 0.1, 0.25, 0.3, 0.5, 0.9, 1.0])
def test_outlines_cover_the_chosen_share_within_one_region(share: float) -> None:
    rng = np.random.default_rng(3)
    labels = rng.permutation(np.repeat(np.arange(1, 9), [30, 10, 50, 5, 60, 20, 80, 145])).reshape(20, 20)
    regions = _regions(labels)
    outlined = outline_labels(np.zeros((20, 20)), share, regions)
    covered = (outlined > 0).mean()
    count = int(outlined.max())
    assert set(np.unique(outlined[outlined > 0]).tolist()) == set(range(1, count + 1))  # the first regions
    assert ((outlined > 0) == (labels <= count)).all()  # whole
    areas = regions.areas.numpy() / 400
    assert covered <= share + 1e-12 or count == 1  # at most the share (at least the first region)
    assert count == 8 or share - covered < areas[count]  # short of it by less than the next region
    # no regions: the strongest pixels, smoothed into blobs, cover the share to a pixel
    values = rng.random((20, 20)) + 0.1
    covered = (outline_labels(values, share, None) > 0).mean()
    assert abs(covered - share) <= 1 / 400


def test_outlines_are_drawn_on_each_regions_border() -> None:
    labels = np.zeros((8, 8), dtype=np.int64)
    labels[1:5, 1:4], labels[1:5, 4:7] = 1, 2  # two regions side by side
    ring = edges(labels, 1)
    assert ring[1:5, 1:7].sum() == 2 * 10 and not ring[labels == 0].any()  # each 4 x 3 region's 10-pixel border
    assert not ring[2:4, 2].any() and not ring[2:4, 5].any()  # their insides kept
    assert (edges(labels, 2) >= ring).all()


async def test_outlines_of_xrai_regions_through_the_service(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                              data={"method": "ig", "steps": "4", "postprocess": "xrai", "visualization": "outlines",
                                    "outline_share": "0.3", "color_map": "red", "return_input": "true"})
        assert r.status_code == 200, r.text
        body = r.json()
        regions = parse_attribution(body).regions
        assert regions is not None
        top = regions.top(0.3)  # the Python client's reading of the answer's regions: the same first regions
        photo, over = _decoded(body["input_png"]), _decoded(body["overlay_png"])
        drawn = (over != photo).any(axis=2)
        assert drawn.any() and not drawn[~top].any()  # outlines inside the outlined regions only, the photo elsewhere
        assert (over[drawn] == [255, 0, 0]).all()  # in the colour map's full colour
        padded = np.pad(top, 1)
        border = top & ~(padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
        assert (drawn | (photo == [255, 0, 0]).all(axis=2))[border].all()  # the regions' outer border is drawn
        heat = _decoded(body["heatmap_png"])
        assert (heat[~top] == 0).all()  # the heatmap: nothing outside the outlined regions (red's zero is black)
        plain = await client.post("/attribute", files={"file": ("a.png", image_bytes())},
                                  data={"method": "ig", "steps": "4", "visualization": "outlines", "return_input": "true"})
        assert plain.status_code == 200 and plain.json()["regions"] is None  # without XRAI: the map's strongest pixels


def test_overlay_type_draws_over_the_photo_its_grey_a_black_mask_or_nothing() -> None:
    values = np.zeros((10, 10))
    values[2:5, 3:7] = 1.0  # one strong block, nothing elsewhere
    attr, photo = _map(values), np.rint(PHOTO.permute(1, 2, 0).numpy() * 255)
    heat, original = _pngs(PHOTO, attr, color_map="red", outlier_perc=0)
    strong = values > 0
    assert (original[~strong] == photo[~strong]).all() and (original[strong] != photo[strong]).any()  # as always
    _, grey = _pngs(PHOTO, attr, color_map="red", outlier_perc=0, overlay_type="grayscale")
    luma = np.rint(photo @ np.array([0.299, 0.587, 0.114]))
    assert (np.abs(grey[~strong] - luma[~strong][:, None]) <= 1).all()  # grey where the map says nothing
    assert (grey[strong][:, 0] > grey[strong][:, 1]).all()  # red over it where it speaks
    _, mask = _pngs(PHOTO, attr, color_map="red", outlier_perc=0, overlay_type="mask_black")
    assert (mask[~strong] == 0).all() and (np.abs(mask[strong] - photo[strong]) <= 1).all()  # the photo, black elsewhere
    _, alone = _pngs(PHOTO, attr, color_map="red", outlier_perc=0, overlay_type="none")
    assert (alone == heat).all()  # the heatmap alone
    _, outlined = _pngs(PHOTO, attr, color_map="red", visualization="outlines", outline_share=0.12, overlay_type="mask_black")
    inside = outline_labels(values, 0.12, None) > 0
    assert inside.any() and (outlined[~inside] == 0).all()  # outlines: black outside the outlined blobs
    assert visual_pngs(PHOTO, attr, _params(overlay_type="original")) == visual_pngs(PHOTO, attr, _params())  # the default


BAD = [  # (fields, what the 422 says)
    ({"visualization": "contours"}, "visualization: Input should be 'pixels' or 'outlines'"),
    ({"polarity": "sideways"}, "polarity: Input should be 'positive', 'negative' or 'both'"),
    ({"color_map": "rainbow"}, "color_map: Input should be"),
    ({"clip_percent_upperbound": "0"}, "clip_percent_upperbound: Input should be greater than 0"),
    ({"clip_percent_lowerbound": "100"}, "clip_percent_lowerbound: Input should be less than 100"),
    ({"clip_percent_lowerbound": "80", "clip_percent_upperbound": "60"}, "clip_percent_lowerbound (80) must be below"),
    ({"clip_percent_lowerbound": "70", "outlier_perc": "1"}, "outlier_perc and clip_percent_lowerbound are two ways"),
    ({"signed": "true", "polarity": "positive"}, "signed=true shows both signs"),
    ({"outline_share": "0.2"}, "outline_share is the share of the image outlined: it needs visualization=outlines"),
    ({"visualization": "outlines", "outline_share": "1.5"}, "outline_share: Input should be less than or equal to 1"),
    ({"overlay_type": "sepia"}, "overlay_type: Input should be 'original', 'grayscale', 'mask_black' or 'none'"),
]


async def test_bad_values_are_a_422_that_says_what_was_wrong_at_every_door(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        for fields, says in BAD:
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"steps": "2", **fields})
            assert r.status_code == 422 and says in r.json()["error"]["message"], (fields, r.text)
        for fields, says in BAD[5:8]:  # the same request schema at the other doors: one 422 before any work
            for route, files in (("/attribute/stream", {"file": ("a.png", image_bytes())}),
                                 ("/attribute/batch", {"files": ("a.png", image_bytes())}),
                                 ("/jobs", {"files": ("a.png", image_bytes())})):
                r = await client.post(route, files=files, data={"steps": "2", **fields})
                assert r.status_code == 422 and says in r.json()["error"]["message"], (route, fields, r.text)
        # the Open Inference Protocol answers tensors, not PNGs: the fields are not its parameters
        image = {"name": "image", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(image_bytes()).decode()]}
        r = await client.post("/v2/models/tiny/infer", json={"inputs": [image], "parameters": {"polarity": "positive"}})
        assert r.status_code == 422 and "parameter 'polarity' is not" in r.text, r.text


async def test_the_batch_door_renders_the_fields_as_the_single_one(tiny_app: AppFactory) -> None:
    fields = {"method": "ig", "steps": "4", "polarity": "positive", "color_map": "red", "clip_percent_lowerbound": "50"}
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute/batch", files=[("files", ("a.png", image_bytes()))], data=fields)
        one = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
    assert r.status_code == 200 and one.status_code == 200, r.text
    heat = _decoded(r.json()["items"][0]["result"]["heatmap_png"])
    assert (heat[..., 1:] == 0).all() and (heat[..., 0] == 0).mean() >= 0.5  # red; the lower half of the magnitudes hidden
    assert (_decoded(one.json()["heatmap_png"])[..., 1:] == 0).all()
