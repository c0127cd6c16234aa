"""The web page in a real headless Chromium (Debian's, driven by Playwright) against the real
app with the real default model: upload a photo, compare two methods, read what is shown."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import live_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
JAY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "imagenet-samples" / "n01580077_jay.JPEG"
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None or not JAY.is_file(), reason="needs Debian's chromium and the shared samples")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["efficientnet_lite0"], warmup=False)))


@pytest.fixture(scope="module")
def page(url: str) -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 980})
        page.goto(url)
        yield page
        browser.close()


def test_upload_compare_and_read_the_page(page: object, tmp_path: Path) -> None:
    page.wait_for_function("document.querySelectorAll('#method option').length >= 5")
    assert page.locator("#method").input_value() == "idg"
    page.set_input_files("#file", str(JAY))
    page.fill("#steps", "10")
    page.select_option("#compare", "ig")
    page.click("#run")
    for method in ("idg", "ig"):
        page.wait_for_selector(f".panel[data-method={method}] .status:text('done')", timeout=120_000)
    idg = page.locator(".panel[data-method=idg]")
    assert "jay" in idg.locator(".prediction li").first.inner_text()
    assert idg.locator(".heat-img").get_attribute("src").startswith("data:image/png;base64,")
    assert idg.locator(".input-img").evaluate("img => img.naturalWidth") == 224
    assert idg.locator(".chart circle.sample").count() == 10  # IDG's samples, marked on the curve
    assert idg.locator(".chart polyline.probe").count() == 1
    assert page.locator(".panel[data-method=ig] .chart circle.sample").count() == 10
    idg.locator(".opacity").fill("25")
    assert idg.locator(".heat-img").evaluate("img => img.style.opacity") == "0.25"
    assert "forward" in idg.locator(".cost").inner_text()
    shot = Path(os.environ.get("IDG_SCREENSHOT", tmp_path / "page.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_errors_are_shown_in_words(page: object) -> None:
    page.set_input_files("#file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"}])
    page.select_option("#compare", "")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert "not an image" in page.locator("#error").inner_text()


def test_a_bundled_sample_can_be_chosen(page: object) -> None:
    page.click("#samples img[alt='n02391049_zebra.jpg']")
    # the sample is fetched asynchronously: wait for the preview to hold a decoded image
    page.wait_for_function("(() => { const p = document.querySelector('#preview'); return !p.hidden && p.complete && p.naturalWidth > 0; })()",
                           timeout=30_000)
    assert page.locator("#preview").is_visible()
    assert not page.locator("#run").is_disabled()
    assert "chosen" in (page.locator("#samples img[alt='n02391049_zebra.jpg']").get_attribute("class") or "")
