"""``scripts/page_screenshot.py`` (what makes docs/page.png) against a real server in a real headless Chromium: it picks
the page's own sample photo, compares two methods, and writes the whole page; the committed picture is one it made."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import live_server, script_module, tiny_classifier

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh dev installs it)")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()}))


@pytest.mark.slow  # ~20 s: a browser and a server
def test_the_script_writes_the_whole_page_with_both_panels_done(url: str, tmp_path: Path) -> None:
    out = tmp_path / "shots" / "page.png"
    assert script_module("page_screenshot").main(["--url", url, "--out", str(out), "--sample", "cat.jpg"]) == 0
    with Image.open(out) as shot:
        assert shot.width == 1280 and shot.height > 980  # the whole page, longer than the window, panels included


def test_the_committed_picture_is_the_scripts_size_and_shows_the_pages_own_photos() -> None:
    with Image.open(ROOT / "docs" / "page.png") as shot:
        assert shot.width == 1280 and shot.height > 980
    offered = {p.name for p in (ROOT / "app" / "static" / "samples").glob("*.jpg")}
    assert "coffee.jpg" in offered  # the photo the script picks by default is one the page still offers
