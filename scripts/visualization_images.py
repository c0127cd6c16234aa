"""Make the pictures of docs/methods/visualization.md: one photo under each row of its table, as the service answers it.

    .venv/bin/python scripts/visualization_images.py                  # starts a server (the default model), writes the PNGs
    .venv/bin/python scripts/visualization_images.py --url http://127.0.0.1:8000 --out /tmp/vis   # a running server (make run)

For each row (``idg@fast``, ``idg@fast+XRAI``, ``idg@fast+XRAI:xrai_order=regions`` and Grad-CAM's first look) it asks
POST /attribute twice for the same photo, as ``visualization=pixels`` and as ``visualization=outlines`` (the top regions
covering ``outline_share`` 0.3 of the image), and saves each answer's ``overlay_png`` as ``ROW-pixels.png`` and
``ROW-outlines.png``, reduced to a 128-colour palette so that each stays small (about 30 KB at 224 pixels). The requests
are the docs' own fields, so the pictures are what a user of the page or of curl sees.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import logging
import sys
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from page_screenshot import served  # noqa: E402 - the server of this checkout, as the page's picture starts it

log = logging.getLogger("visualization_images")
ROWS: dict[str, dict[str, str]] = {
    "idg_fast": {},
    "idg_fast_xrai": {"postprocess": "xrai"},
    "idg_fast_xrai_regions": {"postprocess": "xrai", "xrai_order": "regions"},
    "gradcam": {"method": "gradcam"},
}
VIEWS: dict[str, dict[str, str]] = {"pixels": {}, "outlines": {"visualization": "outlines", "outline_share": "0.3"}}


def small_png(b64: str, colours: int = 128) -> bytes:
    """The answer's base64 PNG as a palette PNG of ``colours`` colours (no dithering: it compresses better)."""
    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=colours, dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def make(url: str, photo: Path, out: Path, timeout_s: float = 600) -> list[Path]:
    """Every row's two pictures of ``photo`` from the server at ``url``, written under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with httpx.Client(base_url=url, timeout=timeout_s) as client:
        for row, fields in ROWS.items():
            for view, shown in VIEWS.items():
                data: dict[str, Any] = {**fields, **shown, "return_heatmap": "false"}
                r = client.post("/attribute", files={"file": (photo.name, photo.read_bytes())}, data=data)
                r.raise_for_status()
                body = r.json()
                path = out / f"{row}-{view}.png"
                path.write_bytes(small_png(body["overlay_png"]))
                log.info("%s: %s (%s, %d bytes)", path.name, body["target"]["name"], body["method"], path.stat().st_size)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one of this checkout, with the default model)")
    p.add_argument("--photo", type=Path, default=ROOT / "samples" / "coffee.jpg")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "methods" / "visualization")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(served())
        make(url, args.photo, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
