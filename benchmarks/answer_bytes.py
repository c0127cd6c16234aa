"""The network bytes of one /attribute answer: PNGs (the default) against the raw attribution tensor (issue #64 item 5).

Runs the service in this process (``app.main.create_app`` with the default settings: the default model, preset and
answer) and posts ``samples/coffee.jpg`` to ``/attribute`` once per answer shape: the default (heatmap and overlay
PNGs), the heatmap alone, the raw attribution alone (``return_attribution``, a base64 float32 ``.npy``), and the
default with the raw attribution. It records the upload's bytes, the answer body's bytes, each base64 field's bytes,
and the body's gzip size (what a compressing proxy would send). No network: the requests go through httpx's ASGI
transport. Run: ``python -m benchmarks.answer_bytes`` (results/benchmarks/answer-bytes-<date>.md and .json, or --out).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import logging
import platform
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from httpx import ASGITransport, AsyncClient

from app.core.config import Settings
from app.main import create_app

log = logging.getLogger(__name__)

PHOTO = Path("samples/coffee.jpg")
SHAPES: dict[str, dict[str, str]] = {
    "default (heatmap + overlay PNGs)": {},
    "heatmap PNG only": {"return_overlay": "false"},
    "raw attribution only (float32 .npy)": {"return_heatmap": "false", "return_overlay": "false", "return_attribution": "true"},
    "default + raw attribution": {"return_attribution": "true"},
}


async def measure() -> dict[str, Any]:
    photo = PHOTO.read_bytes()
    rows = []
    with tempfile.TemporaryDirectory(prefix="idg-answer-bytes-") as data_dir:  # the job store's file: not in the checkout
        settings = Settings(data_dir=Path(data_dir))
        rows = await _answers(settings, photo)
    return {"measured": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "platform": platform.platform(), "photo": str(PHOTO),
            "upload_bytes": len(photo), "model": settings.models[0], "rows": rows}


async def _answers(settings: Settings, photo: bytes) -> list[dict[str, Any]]:
    app = create_app(settings)
    rows = []
    async with (app.router.lifespan_context(app),
                AsyncClient(transport=ASGITransport(app=app), base_url="http://in-process", timeout=600) as client):
        for name, fields in SHAPES.items():
            r = await client.post("/attribute", files={"file": (PHOTO.name, photo, "image/jpeg")}, data=fields)
            r.raise_for_status()
            body = r.json()
            parts = {k: len(v) for k, v in body.items() if isinstance(v, str) and len(v) > 1000}
            if isinstance(body.get("attribution"), dict):
                parts["attribution.data"] = len(body["attribution"]["data"])
            rows.append({"answer": name, "fields": fields, "body_bytes": len(r.content),
                         "body_gzip_bytes": len(gzip.compress(r.content, 6)), "base64_fields_bytes": parts,
                         "model": body.get("model"), "preset": body.get("parameters", {}).get("preset")})
            log.info("%s: %d bytes (gzip %d), fields %s", name, rows[-1]["body_bytes"], rows[-1]["body_gzip_bytes"], parts)
    return rows


def markdown(info: dict[str, Any]) -> str:
    lines = [f"# Bytes of one /attribute answer ({info['photo']}, {info['upload_bytes']:,} bytes uploaded)", "",
             f"Measured {info['measured']} in-process (`python -m benchmarks.answer_bytes`: `create_app` at the default "
             f"settings, model `{info['model']}`, httpx's ASGI transport), {info['platform']}.", "",
             "| answer | form fields | body bytes | gzip bytes | base64 fields |", "|---|---|---|---|---|"]
    for row in info["rows"]:
        fields = ", ".join(f"{k}={v}" for k, v in row["fields"].items()) or "(none)"
        parts = ", ".join(f"{k} {v:,}" for k, v in row["base64_fields_bytes"].items())
        lines.append(f"| {row['answer']} | {fields} | {row['body_bytes']:,} | {row['body_gzip_bytes']:,} | {parts} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(f"results/benchmarks/answer-bytes-{datetime.now(UTC):%Y-%m-%d}"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="answer-bytes %(asctime)s %(message)s", datefmt="%H:%M:%S")
    info = asyncio.run(measure())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "answer-bytes.json").write_text(json.dumps(info, indent=1) + "\n")
    (args.out / "answer-bytes.md").write_text(markdown(info))
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
