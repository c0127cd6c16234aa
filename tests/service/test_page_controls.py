"""The web page offers XRAI's regions as outlines with an area slider and Grad-CAM as a first look (no browser needed):
its controls are in the HTML and the script sends what they ask; and the page's region code (app/static/regions.js),
run in Node where it is installed, decodes the answer's 16-bit labels_png and outlines the same pixels as the service's
visualization=outlines for every share.

Its Display group (issue #72 item 5: polarity, colour map, clip percentiles, pixels or outlines, the overlay's backdrop)
in a real headless Chromium against a tiny-model server that records each POST /attribute/stream's form as it arrived:
the default request is the one the page always sent, a choice sends exactly its fields and changes the picture shown,
and what the service would refuse is said on the page and not sent."""

from __future__ import annotations

import base64
import email.parser
import email.policy
import io
import json
import re
import shutil
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from app.core.config import Settings
from app.main import STATIC, create_app
from app.schemas import AttributeCommon
from app.service.render import regions_answer
from app.service.visualization import edges, outline_labels
from idg_client import parse_regions
from idg_core.heatmap import COLORMAPS
from idg_core.methods import DEFAULT_PRESET, PRESET_NAMES
from idg_core.postprocess.compose import REGION_POSTPROCESS
from idg_core.types import Regions
from tests.service.conftest import live_server, tiny_classifier

NODE = shutil.which("node") or shutil.which("nodejs")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (scripts/setup.sh dev installs it)")


def test_the_page_offers_region_outlines_with_an_area_slider_and_a_grad_cam_first_look() -> None:
    html = (STATIC / "index.html").read_text()
    script = (STATIC / "app.js").read_text()
    assert _options(html, "regions") == ["", *REGION_POSTPROCESS]  # none first, then each post-step that answers regions
    assert re.search(r'<input class="area" type="range" min="1" max="100" value="30"', html)
    assert '<canvas class="regions-canvas' in html and html.index("/static/regions.js") < html.index("/static/app.js")
    assert re.search(r'<button id="first-look"[^>]*>\s*First look: Grad-CAM', html)
    assert 'form.append("postprocess", $("regions").value)' in script and 'run(["gradcam", $("method").value])' in script
    assert "decodeLabels(d.regions.labels_png)" in script and 'slider.addEventListener("input", draw)' in script


def _regions(side: int, seed: int) -> Regions:
    """Ranked regions at ``side`` pixels as XRAI makes them: blocks of uneven size, numbered 1 (first) on, every pixel in one."""
    rng = np.random.default_rng(seed)
    rows, cols = (np.searchsorted(np.sort(rng.choice(np.arange(1, side), size=5, replace=False)), np.arange(side), side="right")
                  for _ in range(2))  # 6 bands of uneven width each way
    labels = rng.permutation(36)[rows[:, None] * 6 + cols[None, :]] + 1  # 36 blocks, ranked at random
    areas = np.bincount(labels.ravel())[1:]
    return Regions(torch.from_numpy(labels.astype(np.int32)), torch.linspace(1, 0, len(areas), dtype=torch.float64),
                   torch.from_numpy(areas.astype(np.int64)))


@pytest.mark.skipif(NODE is None, reason="needs Node.js to run the page's script outside a browser")
@pytest.mark.parametrize(("side", "seed"), [(32, 0), (224, 1), (300, 2)])
def test_the_pages_outlines_are_the_services(tmp_path: Path, side: int, seed: int) -> None:
    regions = _regions(side, seed)
    answer = regions_answer(regions, {"postprocess": "xrai", "xrai_order": "regions_then_pixels"}).model_dump()  # served, 16 bits
    shares = [0.01, 0.1, 0.3, 0.55, 1.0]
    runner = tmp_path / "run.js"
    runner.write_text(
        f"const r = require({json.dumps(str(STATIC / 'regions.js'))});\n"
        "(async () => {\n"
        f"  const answer = {json.dumps(answer)};\n"
        "  const decoded = await r.decodeLabels(answer.labels_png);\n"
        "  const out = {width: decoded.width, height: decoded.height, labels: Array.from(decoded.labels), shown: []};\n"
        f"  for (const share of {json.dumps(shares)}) {{\n"
        "    const count = r.topCount(answer.regions.map((x) => x.share), share);\n"
        f"    const width = Math.max(1, Math.round(Math.min(decoded.width, decoded.height) / 112));\n"
        "    out.shown.push({count, edge: Array.from(r.outlineMask(decoded, count, width))});\n"
        "  }\n"
        "  console.log(JSON.stringify(out));\n"
        "})();\n")
    done = subprocess.run([str(NODE), str(runner)], capture_output=True, text=True, timeout=60, check=True)
    page = json.loads(done.stdout)
    labels = regions.labels.numpy()
    assert (page["width"], page["height"]) == (side, side)
    assert (np.asarray(page["labels"]).reshape(side, side) == labels).all()  # every rank, to 16 bits
    client = parse_regions(answer)
    assert client is not None
    for share, shown in zip(shares, page["shown"], strict=True):
        outlined = outline_labels(np.zeros(labels.shape), share, regions)  # what visualization=outlines draws
        assert shown["count"] == outlined.max() and ((outlined > 0) == client.top(share)).all()
        width = max(1, round(side / 112))
        assert (np.asarray(shown["edge"], dtype=bool).reshape(side, side) == edges((outlined > 0).astype(np.int64), width)).all()


# --- the Display group (issue #72 item 5) ---

def _choices(field: str) -> set[str]:
    """The values the service's /attribute takes for ``field`` (its Literal, None left out)."""
    annotation = AttributeCommon.model_fields[field].annotation
    literal = next(a for a in (annotation, *typing.get_args(annotation)) if typing.get_origin(a) is typing.Literal)
    return set(typing.get_args(literal))


def _options(html: str, select: str) -> list[str]:
    """The values of the options of ``<select id=select>`` (an option without value: its text)."""
    block = re.search(rf'<select id="{select}"[^>]*>(.*?)</select>', html, re.S)
    assert block is not None, select
    return [value if value is not None else text.strip() for value, text in
            ((m.group(1), m.group(2)) for m in re.finditer(r'<option(?: value="([^"]*)")?[^>]*>([^<]*)</option>', block.group(1)))]


def test_the_display_group_offers_what_the_service_takes_with_the_servers_defaults_first() -> None:
    html = (STATIC / "index.html").read_text()
    assert re.search(r'<fieldset id="display"[^>]*>\s*<legend>Display</legend>', html)
    polarity, colours, shown = _options(html, "polarity"), _options(html, "color-map"), _options(html, "visualization")
    assert polarity[0] == "" and set(polarity[1:]) == _choices("polarity")  # unset first: the magnitude
    assert colours[0] == "" and sorted(colours[1:]) == sorted(COLORMAPS)  # unset first: the service's choice
    assert shown == ["pixels", "outlines"] and set(shown) == _choices("visualization")
    if "overlay_type" in AttributeCommon.model_fields:
        overlays = _options(html, "overlay-type")
        assert overlays[0] == "original" and set(overlays) == _choices("overlay_type")
    for box in ("clip-lower", "clip-upper"):  # empty: unset
        assert re.search(rf'<input id="{box}" type="number" min="0" max="100" step="any" placeholder="unset">', html)
    assert re.search(r'<input id="outline-share" type="number" min="1" max="100" value="30"', html)


def test_the_cost_list_the_page_starts_with_offers_the_services_presets_with_its_default_first() -> None:
    html = (STATIC / "index.html").read_text()
    presets = _options(html, "preset")  # replaced from GET /models once it answers; this is what shows until then
    assert presets[0] == DEFAULT_PRESET and sorted(presets) == sorted(PRESET_NAMES)
    block = re.search(r'<select id="preset"[^>]*>(.*?)</select>', html, re.S)
    assert block is not None
    assert re.search(rf'<option value="{DEFAULT_PRESET}">{DEFAULT_PRESET} \(default\)</option>', block.group(1))
    assert block.group(1).count("(default)") == 1  # no other option still called the default


def _form(content_type: bytes, body: bytes) -> list[tuple[str, str]]:
    """A multipart/form-data body's fields in order, the file by its file name."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(b"Content-Type: " + content_type + b"\r\n\r\n" + body)
    fields = []
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        fields.append((str(name), filename if filename is not None else part.get_payload(decode=True).decode()))
    return fields


class _Recorder:
    """ASGI middleware: each POST /attribute/stream's form fields as the server received them, in ``forms``."""

    def __init__(self, app: Any, forms: list[list[tuple[str, str]]]) -> None:
        self.app, self.forms = app, forms

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/attribute/stream":
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def recorded() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    self.forms.append(_form(dict(scope["headers"])[b"content-type"], bytes(body)))
            return message

        await self.app(scope, recorded, send)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[list[tuple[str, str]]]]]:
    forms: list[list[tuple[str, str]]] = []
    app = create_app(Settings(models=["tiny"], warmup=False, data_dir=tmp_path_factory.mktemp("data")), models={"tiny": tiny_classifier()})
    app.add_middleware(_Recorder, forms=forms)
    for url in live_server(app):
        yield url, forms


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, served: tuple[str, list[list[tuple[str, str]]]]) -> Iterator[Any]:
    """The page with the cat photo chosen, nothing sent yet."""
    url, forms = served
    page = browser.new_page(bypass_csp=True)
    page.set_default_timeout(10_000)  # a page that never shows what a test waits for fails in seconds, not half a minute
    page.goto(url)
    page.wait_for_selector("#model option[value=tiny]", state="attached")
    page.click("#samples img[alt='cat.jpg']")
    page.wait_for_selector("#run:not([disabled])")
    forms.clear()
    yield page
    page.close()


# what the page sends with no control changed, field by field in its order (tiny's defaults): the Cost list's preset is
# the one GET /models marks as the default, the service's own (balanced: its Grad-CAM product and noisy copies included)
DEFAULT_FORM = [("file", "cat.jpg"), ("model", "tiny"), ("method", "idg"), ("return_input", "true"), ("return_overlay", "false"),
                ("preset", DEFAULT_PRESET), ("faithfulness", "insertion,deletion")]


def _explain(page: Any) -> Any:
    """Click Explain and wait for IDG's panel; the panel."""
    page.click("#run")
    panel = page.locator(".panel[data-method=idg]")
    page.wait_for_selector(".panel[data-method=idg] .status:text-matches('^(done|failed)$')", timeout=60_000)
    return panel


def _pixels(panel: Any, image: str) -> np.ndarray:
    """The RGB pixels of the panel's ``image`` (a data URL the page set)."""
    src = panel.locator(image).get_attribute("src")
    assert src.startswith("data:image/png;base64,")
    with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as im:
        return np.asarray(im.convert("RGB"))


@needs_chromium
def test_the_default_request_sends_none_of_the_display_fields(page: Any, served: tuple[str, list[Any]]) -> None:
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "done"
    assert served[1] == [DEFAULT_FORM]  # the same fields, values and order as before the Display group
    assert page.locator("#preset").input_value() == DEFAULT_PRESET  # the option GET /models marks as the default
    # the default's noisy copies share the photo's probe: the curve says which line and dots are whose
    assert "the photo's probe" in panel.locator(".chart .curve-input").text_content()
    assert page.locator("#outline-share").is_disabled()  # pixels: no share to outline
    assert panel.locator(".opacity").input_value() == "60"


@needs_chromium
def test_polarity_colour_map_and_clip_send_exactly_their_fields_and_change_the_overlay(page: Any, served: tuple[str, list[Any]]) -> None:
    before = _pixels(_explain(page), ".heat-img")
    page.select_option("#polarity", "positive")
    page.select_option("#color-map", "green")
    page.fill("#clip-lower", "50")
    page.fill("#clip-upper", "99")
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "done"
    chosen = [("polarity", "positive"), ("color_map", "green"), ("clip_percent_lowerbound", "50"), ("clip_percent_upperbound", "99")]
    assert served[1] == [DEFAULT_FORM, DEFAULT_FORM + chosen]  # outlier_perc never beside the clip bounds
    after = _pixels(panel, ".heat-img")
    assert after.shape == before.shape and (after != before).any()
    assert (after[..., [0, 2]] == 0).all() and after[..., 1].any()  # 'green': black to green, inferno's reds gone
    assert (after[..., 1] == 0).mean() >= 0.5  # nothing shown at and below the 50th percentile
    assert (before[..., 0] > 0).any()


@needs_chromium
@pytest.mark.parametrize(("lower", "upper", "said"), [
    ("80", "60", "Clip from % (80) must be below Clip to % (60)"),
    ("70", "70", "Clip from % (70) must be below Clip to % (70)"),
    ("", "0", "Clip to % is a percentile above 0 up to 100, not 0"),  # with an empty lower bound, 0 to 0
])
def test_clip_bounds_the_service_would_refuse_are_said_on_the_page_and_not_sent(
        page: Any, served: tuple[str, list[Any]], lower: str, upper: str, said: str) -> None:
    page.fill("#clip-lower", lower)
    page.fill("#clip-upper", upper)
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    assert said in page.locator("#error").inner_text()
    assert page.locator(".panel").count() == 0
    page.fill("#clip-lower", "10")  # put right, the next click is sent: the refused one never was
    page.fill("#clip-upper", "90")
    assert _explain(page).locator(".status").inner_text() == "done"
    assert page.locator("#error").is_hidden()
    assert served[1] == [DEFAULT_FORM + [("clip_percent_lowerbound", "10"), ("clip_percent_upperbound", "90")]]


@needs_chromium
def test_outlines_without_regions_send_the_share_and_show_the_services_outlined_overlay(page: Any, served: tuple[str, list[Any]]) -> None:
    page.select_option("#visualization", "outlines")
    assert page.locator("#outline-share").is_enabled()
    page.fill("#outline-share", "20")
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "done"
    sent = [(k, "true" if k == "return_overlay" else v) for k, v in DEFAULT_FORM]  # the service draws the outlined photo
    assert served[1] == [sent + [("visualization", "outlines"), ("outline_share", "0.2")]]
    shown, photo = _pixels(panel, ".heat-img"), _pixels(panel, ".input-img")
    outline = (shown != photo).any(axis=2)
    assert 0 < outline.mean() < 0.5  # the photo, with a line around the strongest pixels' blobs
    assert (shown[outline] == (252, 255, 164)).all()  # in inferno's full colour
    assert panel.locator(".opacity").input_value() == "100" and panel.locator(".regions-fig").is_hidden()


@needs_chromium
@pytest.mark.parametrize("regions", ["xrai", "cam_regions"])
def test_outlines_with_regions_stay_the_pages_outlines_and_area_slider(page: Any, served: tuple[str, list[Any]], regions: str) -> None:
    page.select_option("#regions", regions)
    page.select_option("#visualization", "outlines")
    assert page.locator("#outline-share").is_disabled()  # each panel's area slider sets the share
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "done"
    assert served[1] == [DEFAULT_FORM + [("postprocess", regions)]]
    page.wait_for_selector(".panel[data-method=idg] .regions-fig:not([hidden])")
    assert "regions" in panel.locator(".area-value").inner_text()


@needs_chromium
def test_the_overlay_backdrop_is_sent_when_changed_and_shows_the_services_overlay(page: Any, served: tuple[str, list[Any]]) -> None:
    if "overlay_type" not in AttributeCommon.model_fields:
        pytest.skip("the service has no overlay_type")
    page.select_option("#overlay-type", "none")
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "done"
    sent = [(k, "true" if k == "return_overlay" else v) for k, v in DEFAULT_FORM]
    assert served[1] == [sent + [("overlay_type", "none")]]
    assert (_pixels(panel, ".heat-img") == _pixels(panel, ".raw-img")).all()  # 'none': the overlay is the heatmap alone


@needs_chromium
def test_a_refusal_of_a_display_field_shows_the_services_message(page: Any, served: tuple[str, list[Any]]) -> None:
    page.locator("#color-map").evaluate("s => s.add(new Option('jet', 'jet'))")  # a name the service does not have
    page.select_option("#color-map", "jet")
    panel = _explain(page)
    assert panel.locator(".status").inner_text() == "failed"
    assert served[1] == [DEFAULT_FORM + [("color_map", "jet")]]
    said = page.locator("#error").inner_text()
    assert said.startswith("idg: color_map: Input should be 'inferno'"), said  # the 422's own words
