"""``scripts/visualization_images.py`` (what makes docs/methods/visualization.md's pictures) against a real server: one
small PNG per row and view, the same names as the committed pictures, which the page shows and each stays small."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import image_bytes, live_server, script_module, tiny_classifier

ROOT = Path(__file__).resolve().parents[2]
PICTURES = ROOT / "docs" / "methods" / "visualization"
LIMIT = 60_000
"""Bytes a committed picture may take."""


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()}))


@pytest.mark.slow  # 6 s: 8 requests, 4 of them with XRAI's segmentation
def test_the_script_makes_every_rows_pictures_small(url: str, tmp_path: Path) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(image_bytes(size=(64, 48)))
    written = script_module("visualization_images").make(url, photo, tmp_path / "out")
    assert sorted(p.name for p in written) == sorted(p.name for p in PICTURES.glob("*.png"))
    for path in written:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.mode == "P" and image.size == (32, 32)  # the tiny model's input


def test_the_committed_pictures_are_small_and_the_page_shows_each() -> None:
    page = (ROOT / "docs" / "methods" / "visualization.md").read_text()
    shown = set(re.findall(r"\(visualization/([\w-]+\.png)\)", page))
    names = {p.name for p in PICTURES.glob("*.png")}
    assert shown == names and len(names) == 8
    for name in names:
        assert (PICTURES / name).stat().st_size < LIMIT, name
        with Image.open(PICTURES / name) as image:
            assert image.size == (224, 224), name  # EfficientNet-Lite0's input, the default model
