"""The web page offers XRAI's regions as outlines with an area slider and Grad-CAM as a first look (no browser needed):
its controls are in the HTML and the script sends what they ask; and the page's region code (app/static/regions.js),
run in Node where it is installed, decodes the answer's 16-bit labels_png and outlines the same pixels as the service's
visualization=outlines for every share."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from app.main import STATIC
from app.service.render import regions_answer
from app.service.visualization import edges, outline_labels
from idg_client import parse_regions
from idg_core.types import Regions

NODE = shutil.which("node") or shutil.which("nodejs")


def test_the_page_offers_region_outlines_with_an_area_slider_and_a_grad_cam_first_look() -> None:
    html = (STATIC / "index.html").read_text()
    script = (STATIC / "app.js").read_text()
    assert re.search(r'<input id="regions" type="checkbox"', html)
    assert re.search(r'<input class="area" type="range" min="1" max="100" value="30"', html)
    assert '<canvas class="regions-canvas' in html and html.index("/static/regions.js") < html.index("/static/app.js")
    assert re.search(r'<button id="first-look"[^>]*>\s*First look: Grad-CAM', html)
    assert 'form.append("postprocess", "xrai")' in script and 'run(["gradcam", $("method").value])' in script
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
