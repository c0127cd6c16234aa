"""The PNG writer (idg_core/png.py): what it writes, Pillow reads back exactly."""

import io

import numpy as np
import pytest
from PIL import Image

from idg_core.png import FILTER_NONE, FILTER_UP, encode_png


def _read(png: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(png))
    img.load()  # checks every chunk's CRC and the zlib stream
    return img


@pytest.mark.parametrize("row_filter", [FILTER_NONE, FILTER_UP])
@pytest.mark.parametrize("shape", [(1, 1, 3), (1, 7, 3), (9, 1, 3), (17, 23, 3), (224, 224, 3), (5, 6), (1, 1), (40, 3)])
def test_pillow_reads_back_every_pixel(row_filter: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape) + row_filter)
    pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
    pixels[0, 0] = 255  # the UP filter's differences wrap around 0 and 255
    if shape[0] > 1:
        pixels[1, 0] = 0
    img = _read(encode_png(pixels, row_filter))
    assert img.mode == ("RGB" if len(shape) == 3 else "L") and img.size == (shape[1], shape[0])
    assert np.array_equal(np.asarray(img), pixels)


def test_a_strided_view_is_written_as_its_pixels() -> None:
    base = np.arange(6 * 8 * 3, dtype=np.uint8).reshape(6, 8, 3)
    view = base[::2, 1::3]  # not contiguous
    assert np.array_equal(np.asarray(_read(encode_png(view, FILTER_UP))), view)


def test_repeated_colours_compress() -> None:
    stripes = np.zeros((224, 224, 3), dtype=np.uint8)
    stripes[:, ::2] = (252, 255, 164)
    assert len(encode_png(stripes)) < stripes.size / 50


@pytest.mark.parametrize(("pixels", "row_filter", "message"), [
    (np.zeros((2, 2, 3), dtype=np.float32), FILTER_NONE, "uint8"),
    (np.zeros((2, 2, 4), dtype=np.uint8), FILTER_NONE, "shape"),
    (np.zeros((2,), dtype=np.uint8), FILTER_NONE, "shape"),
    (np.zeros((2, 2), dtype=np.uint8), 1, "row_filter"),
])
def test_what_it_cannot_write_is_refused(pixels: np.ndarray, row_filter: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_png(pixels, row_filter)


def test_isal_compresses_where_it_is_installed() -> None:
    pytest.importorskip("isal")  # a dependency where it has wheels (pyproject.toml's marker)
    from idg_core import png

    assert (png.DEFLATE, png.LEVEL) == ("isal", 2)


def test_without_isal_the_writer_falls_back_to_zlib_and_writes_the_same_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from idg_core import png

    monkeypatch.setitem(sys.modules, "isal", None)  # as on a platform without its wheel: the import fails
    name, compress, level = png._deflater()
    assert (name, level) == ("zlib", 1)
    monkeypatch.setattr(png, "_compress", compress)
    monkeypatch.setattr(png, "LEVEL", level)
    pixels = np.random.default_rng(0).integers(0, 256, size=(31, 17, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(_read(encode_png(pixels, FILTER_UP))), pixels)
