"""The web page in a real headless Chromium (Debian's, driven by Playwright) against the real
app with the real default model: upload a photo, compare two methods, read what is shown; and
against a tiny-model app with an API key: the page asks for it, says "wrong key", then works."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.config import Settings
from app.main import create_app
from benchmarks.samples import ESPRESSO
from tests.service.conftest import image_bytes, live_server, tiny_classifier

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh dev installs it)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["efficientnet_lite0"], warmup=False)))


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def page(browser: object, url: str) -> Iterator[object]:
    # bypass_csp: the test's own wait_for_function evaluates strings, which the page's CSP (no eval) forbids; the page's
    # code itself needs no eval, and the checks below see it work
    page = browser.new_page(viewport={"width": 1280, "height": 980}, bypass_csp=True)
    page.goto(url)
    yield page
    page.close()


def test_upload_compare_and_read_the_page(page: object, tmp_path: Path) -> None:
    page.wait_for_function("document.querySelectorAll('#method option').length >= 5")
    assert page.locator("#method").input_value() == "idg"
    page.set_input_files("#file", str(ESPRESSO))
    page.fill("#steps", "10")
    page.select_option("#compare", "ig")
    page.click("#run")
    for method in ("idg", "ig"):
        # exact: progress reads 'prediction done; next: …'
        page.wait_for_selector(f".panel[data-method={method}] .status:text-is('done')", timeout=120_000)
    idg = page.locator(".panel[data-method=idg]")
    assert "espresso" in idg.locator(".prediction li").first.inner_text()
    assert idg.locator(".heat-img").get_attribute("src").startswith("data:image/png;base64,")
    assert idg.locator(".input-img").evaluate("img => img.naturalWidth") == 224
    assert idg.locator(".chart circle.sample").count() == 10  # IDG's samples, marked on the curve
    assert idg.locator(".chart polyline.probe").count() == 1
    assert page.locator(".panel[data-method=ig] .chart circle.sample").count() == 10
    idg.locator(".opacity").fill("25")
    assert idg.locator(".heat-img").evaluate("img => img.style.opacity") == "0.25"
    assert "forward" in idg.locator(".cost").inner_text()
    assert "Faithfulness: insertion" in idg.locator(".faithfulness").inner_text()
    shot = Path(os.environ.get("IDG_SCREENSHOT", tmp_path / "page.png"))
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000


def test_errors_are_shown_in_words(page: object) -> None:
    page.set_input_files("#file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"}])
    page.select_option("#compare", "")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])", timeout=30_000)
    assert "not an image" in page.locator("#error").inner_text()


def test_both_methods_failures_are_shown_and_the_steps_box_sets_each_methods_steps(page: object) -> None:
    # two methods refused: the second's message had replaced the first's
    page.set_input_files("#file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not a picture"}])
    page.select_option("#method", "idg")
    page.select_option("#compare", "ig")
    page.click("#run")
    page.wait_for_function("document.querySelectorAll('.panel .status').length == 2 && "
                           "[...document.querySelectorAll('.panel .status')].every(s => s.textContent == 'failed')", timeout=30_000)
    shown = page.locator("#error").inner_text()
    assert "idg: " in shown and "ig: " in shown, shown
    # the Steps box: IDG-EG's steps (its first integer parameter is paths, which it had set), AGI's max_iter
    assert page.evaluate("stepsOf['idg_eg']") == "steps" and page.evaluate("stepsOf['idg']") == "steps"
    assert page.evaluate("stepsOf['agi']") == "max_iter"


def test_a_bundled_sample_can_be_chosen(page: object) -> None:
    page.click("#samples img[alt='rocket.jpg']")
    # the sample is fetched asynchronously: wait for the preview to hold a decoded image
    page.wait_for_function("(() => { const p = document.querySelector('#preview'); "
                           "return !p.hidden && p.complete && p.naturalWidth > 0; })()", timeout=30_000)
    assert page.locator("#preview").is_visible()
    assert not page.locator("#run").is_disabled()
    assert "chosen" in (page.locator("#samples img[alt='rocket.jpg']").get_attribute("class") or "")


KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["tiny"], warmup=False, api_key=KEY), models={"tiny": tiny_classifier()}))


def _methods(page: object) -> int:
    return page.locator("#method option").count()


def test_with_an_api_key_the_page_asks_for_it_and_says_wrong_key(browser: object, keyed_url: str) -> None:
    page = browser.new_page(bypass_csp=True)
    try:
        page.goto(keyed_url)
        page.wait_for_selector("#auth:not([hidden])", timeout=30_000)
        assert "needs an API key" in page.locator("#auth-message").inner_text()
        assert _methods(page) == 0  # /models answered 401: nothing loaded yet
        page.fill("#api-key", "ключ")  # not sendable in a header: said so, nothing sent
        page.click("#api-key-submit")
        page.wait_for_function("document.querySelector('#auth-message').textContent.includes('printable ASCII')", timeout=30_000)
        assert page.evaluate("sessionStorage.getItem('idg-api-key')") is None
        page.fill("#api-key", "not-the-key")
        page.click("#api-key-submit")
        page.wait_for_function("document.querySelector('#auth-message').textContent.startsWith('Wrong key')", timeout=30_000)
        assert "the API key is wrong" in page.locator("#auth-message").inner_text()
        assert page.locator("#auth").is_visible() and _methods(page) == 0
        page.fill("#api-key", KEY)
        page.click("#api-key-submit")
        page.wait_for_function("document.querySelectorAll('#method option').length >= 5", timeout=30_000)
        assert page.locator("#auth").is_hidden()
        assert page.evaluate("sessionStorage.getItem('idg-api-key')") == KEY

        # a reload in the same tab keeps the key: no question asked
        page.reload()
        page.wait_for_function("document.querySelectorAll('#method option').length >= 5", timeout=30_000)
        assert page.locator("#auth").is_hidden()

        # a run whose key has gone wrong asks again, then retries the same request with the right key
        page.evaluate("sessionStorage.setItem('idg-api-key', 'stale')")
        page.set_input_files("#file", files=[{"name": "tiny.png", "mimeType": "image/png", "buffer": image_bytes()}])
        page.fill("#steps", "4")
        page.click("#run")
        page.wait_for_selector("#auth:not([hidden])", timeout=30_000)
        assert page.locator("#auth-message").inner_text().startswith("Wrong key")
        assert page.locator(".panel[data-method=idg] .status").inner_text() == "waiting for the API key"
        page.fill("#api-key", KEY)
        page.click("#api-key-submit")
        page.wait_for_selector(".panel[data-method=idg] .status:text-is('done')", timeout=60_000)
        assert page.locator(".panel[data-method=idg] .chart circle.sample").count() == 4
        assert page.locator("#error").is_hidden()
    finally:
        page.close()



@pytest.fixture(scope="module")
def tiny_url() -> Iterator[str]:
    yield from live_server(create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()}))


@pytest.mark.slow  # 6 s (XRAI's segmentation on 2 cores); tests/service/test_page_controls.py checks the same code fast
def test_a_grad_cam_first_look_beside_idg_and_xrai_regions_outlined_up_to_the_sliders_area(browser: object, tiny_url: str) -> None:
    page = browser.new_page(bypass_csp=True)
    try:
        page.goto(tiny_url)
        page.wait_for_function("document.querySelectorAll('#method option').length >= 5", timeout=30_000)
        page.set_input_files("#file", files=[{"name": "tiny.png", "mimeType": "image/png", "buffer": image_bytes()}])
        page.fill("#steps", "4")
        page.select_option("#regions", "xrai")
        page.click("#first-look")
        for method in ("gradcam", "idg"):
            page.wait_for_selector(f".panel[data-method={method}] .status:text-is('done')", timeout=60_000)
        assert page.locator(".panel").first.get_attribute("data-method") == "gradcam"  # the first look comes first
        idg = page.locator(".panel[data-method=idg]")
        page.wait_for_function("document.querySelector('.panel[data-method=idg] .area-value').textContent.includes('regions')",
                               timeout=30_000)
        figure = idg.locator(".regions-fig")
        assert figure.is_visible() and idg.locator(".regions-canvas").evaluate("c => c.width") == 32
        total = int(idg.locator(".area-value").inner_text().split(" of ")[1].split()[0])
        idg.locator(".area").fill("100")
        assert figure.get_attribute("data-regions") == str(total)  # the whole image: every region
        idg.locator(".area").fill("1")
        assert figure.get_attribute("data-regions") == "1"  # at least the first
        assert page.locator("#error").is_hidden()
    finally:
        page.close()
