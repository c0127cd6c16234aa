"""Bounded memory and time per image, whatever its shape; one bad image fails alone.

Extreme shapes (100000x1 and 1x100000 and the like, in every accepted format), declared-size bombs,
many-frame animations and legal images near the limits go through the real app (tiny model) in a
child process capped at 5 GiB of address space, so that a regression fails the test instead of
the machine: each shape is refused with a 4xx naming the limit within 2 s, and no request grows
the process's peak RSS by 1 GB or more."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import resource
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi import FastAPI
from PIL import Image

import app.core.images as images
from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import AppFactory, image_bytes, serve, tiny_classifier

ROOT = Path(__file__).resolve().parents[3]
CAP_BYTES = 5 << 30
GB = 1 << 30
COLOR = (200, 30, 60)  # never TinyNet's poison (pure magenta)


def _solid(fmt: str, size: tuple[int, int], mode: str = "RGB", **save: Any) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, (*COLOR, 128)[: len(mode)]).save(buf, format=fmt, **save)
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width x height`` but holds a few bytes of pixel data (a bomb's header)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _animation(fmt: str, frames: int) -> bytes:
    seq = [Image.new("RGB", (64, 64), (i % 250, (7 * i) % 250, 90)) for i in range(frames)]
    buf = io.BytesIO()
    seq[0].save(buf, format=fmt, save_all=True, append_images=seq[1:])
    return buf.getvalue()


# (name, how to make the upload, expected status, words the message must contain)
REFUSED: list[tuple[str, tuple[Any, ...], int, str]] = [
    ("png-100000x1", ("PNG", (100000, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("png-1x100000", ("PNG", (1, 100000)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("png-40000x1", ("PNG", (40000, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("gif-65535x1", ("GIF", (65535, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("gif-1x65535", ("GIF", (1, 65535)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("bmp-100000x1", ("BMP", (100000, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("bmp-1x100000", ("BMP", (1, 100000)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("tiff-100000x1", ("TIFF", (100000, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("tiff-1x100000", ("TIFF", (1, 100000)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("jpeg-65500x1", ("JPEG", (65500, 1)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("jpeg-1x65500", ("JPEG", (1, 65500)), 413, "IDG_MAX_IMAGE_SIDE"),
    ("webp-16383x1", ("WEBP", (16383, 1)), 422, "IDG_MAX_ASPECT_RATIO"),  # WebP's own limit is 16383
    ("webp-1x16383", ("WEBP", (1, 16383)), 422, "IDG_MAX_ASPECT_RATIO"),
    ("png-10000x1", ("PNG", (10000, 1)), 422, "aspect ratio of 10000.0:1"),
    ("png-2001x100", ("PNG", (2001, 100)), 422, "over the limit of 20:1"),
    ("png-declares-16384x16384", ("header", (16384, 16384)), 413, "IDG_MAX_IMAGE_PIXELS"),
    ("png-declares-100000x100000", ("header", (100000, 100000)), 413, "IDG_MAX_IMAGE_PIXELS"),
]
ACCEPTED: list[tuple[str, tuple[Any, ...]]] = [
    ("photo-500x375", ("photo",)),
    ("png-2000x100-at-the-aspect-limit", ("PNG", (2000, 100))),
    ("png-rgba-16384x2400-near-the-pixel-and-side-limits", ("PNG", (16384, 2400), "RGBA", {"compress_level": 1})),
    ("webp-rgba-6000x6600-near-the-pixel-limit", ("WEBP", (6000, 6600), "RGBA", {"lossless": True, "method": 0})),
    ("gif-1000-frames", ("anim", "GIF", 1000)),
    ("webp-300-frames", ("anim", "WEBP", 300)),
    ("tiff-300-pages", ("anim", "TIFF", 300)),
    ("apng-300-frames", ("anim", "PNG", 300)),
]


def _make(spec: tuple[Any, ...]) -> bytes:
    if spec[0] == "photo":
        return image_bytes(size=(500, 375), fmt="JPEG")
    if spec[0] == "header":
        return _png_header(*spec[1])
    if spec[0] == "anim":
        return _animation(spec[1], spec[2])
    fmt, size, *rest = spec
    return _solid(fmt, size, *(rest[:1] or ["RGB"]), **(rest[1] if len(rest) > 1 else {}))


def _vm_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


async def _child_requests() -> dict[str, dict[str, Any]]:
    app = create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()})
    out: dict[str, dict[str, Any]] = {}
    async with serve(app) as client:
        for name, spec, *_ in REFUSED + ACCEPTED:
            data = _make(spec)
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to the current RSS
            before = _vm_kib("VmRSS")
            start = time.perf_counter()
            r = await client.post("/predict", files={"file": ("upload", data, "application/octet-stream")})
            seconds = time.perf_counter() - start
            out[name] = {"status": r.status_code, "body": r.json(), "seconds": seconds,
                         "growth_bytes": (_vm_kib("VmHWM") - before) * 1024, "upload_bytes": len(data)}
            del data
    return out


def run_child() -> None:
    """Entry point of the capped child: every case through the real app; JSON on stdout."""
    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))
    logging.disable(logging.WARNING)
    print(json.dumps(asyncio.run(_child_requests())))  # noqa: T201 - the child's result, read by the parent from its stdout


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, Any]]:
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure the peak memory of one request")
    code = "from tests.service.reliability.test_image_limits import run_child; run_child()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("name", "status", "words"), [(n, s, w) for n, _, s, w in REFUSED], ids=[n for n, *_ in REFUSED])
def test_extreme_shapes_are_refused_quickly_naming_the_limit(
    measured: dict[str, dict[str, Any]], name: str, status: int, words: str,
) -> None:
    got = measured[name]
    assert got["status"] == status, got["body"]
    assert got["body"]["error"]["status"] == status and words in got["body"]["error"]["message"]
    assert got["seconds"] < 2.0, f"{name} took {got['seconds']:.2f} s to refuse"
    assert got["growth_bytes"] < GB, f"{name} grew the peak RSS by {got['growth_bytes'] / GB:.2f} GB"


@pytest.mark.parametrize("name", [n for n, _ in ACCEPTED])
def test_legal_images_near_the_limits_stay_under_a_gigabyte(measured: dict[str, dict[str, Any]], name: str) -> None:
    got = measured[name]
    assert got["status"] == 200, got["body"]
    assert got["growth_bytes"] < GB, f"{name} grew the peak RSS by {got['growth_bytes'] / GB:.2f} GB"
    assert got["seconds"] < 30.0  # generous: decoding 40 megapixels takes about 1 s here
    if "frames" in name or "pages" in name:  # only the first frame is decoded
        assert got["seconds"] < 2.0, f"{name} took {got['seconds']:.2f} s"


def test_only_the_first_frame_is_decoded() -> None:
    frames = [Image.new("RGB", (40, 30), c) for c in [(250, 10, 10), (10, 250, 10), (10, 10, 250)]]
    for fmt in ("GIF", "WEBP", "TIFF", "PNG"):
        buf = io.BytesIO()
        frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:], **({"lossless": True} if fmt == "WEBP" else {}))
        r, g, b = images.decode_upload(buf.getvalue(), 10_000).getpixel((5, 5))
        assert r > 200 and g < 60 and b < 60, (fmt, (r, g, b))


async def test_extreme_shapes_fail_alone_in_a_batch_and_end_a_stream(tiny_app: AppFactory) -> None:
    strip = _solid("PNG", (100000, 1))
    async with serve(tiny_app()) as client:
        files = [("files", ("strip.png", strip)), ("files", ("good.png", image_bytes()))]
        r = await client.post("/attribute/batch", files=files, data={"steps": "4", "probe_steps": "4"})
        assert r.status_code == 200, r.text
        assert [i["status"] for i in r.json()["items"]] == [413, 200]
        r = await client.post("/attribute/stream", files={"file": ("strip.png", strip)})
        last = r.text.strip().split("\n\n")[-1]
        assert last.startswith("event: error") and '"status": 413' in last and "IDG_MAX_IMAGE_SIDE" in last


def _failing_app() -> FastAPI:
    """The real app whose preprocessing runs out of memory on images 37 pixels wide."""
    clf = tiny_classifier()
    prepare = clf.prepare

    def flaky(img: Image.Image) -> torch.Tensor:
        if img.width == 37:
            raise MemoryError
        return prepare(img)

    clf.prepare = flaky  # type: ignore[method-assign]
    return create_app(Settings(models=["tiny"], warmup=False), models={"tiny": clf})


async def test_an_unexpected_error_fails_only_its_own_image(caplog: pytest.LogCaptureFixture) -> None:
    app = _failing_app()
    doomed, good = image_bytes(size=(37, 40)), image_bytes()
    internal = {"status": 500, "code": "internal", "message": "internal error: MemoryError"}
    async with serve(app) as client:  # a re-raised exception would surface here, in the client
        for route, fields in (("/predict", {}), ("/attribute", {"steps": "4", "probe_steps": "4"})):
            r = await client.post(route, files={"file": ("a.png", doomed)}, data=fields)
            assert r.status_code == 500 and r.json() == {"error": {**internal, "request_id": r.headers["x-request-id"]}}, r.text
        r = await client.post("/attribute/stream", files={"file": ("a.png", doomed)})
        event = {**internal, "request_id": r.headers["x-request-id"]}  # the stream's error event names its request too
        assert r.status_code == 200 and r.text.strip().split("\n\n")[-1] == f"event: error\ndata: {json.dumps(event)}"
        files = [("files", ("doomed.png", doomed)), ("files", ("good.png", good))]
        r = await client.post("/attribute/batch", files=files, data={"steps": "4", "probe_steps": "4"})
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert [i["status"] for i in items] == [500, 200] and items[0]["error"] == {**internal, "request_id": r.headers["x-request-id"]}
        r = await client.post("/predict", files={"file": ("b.png", good)})
        assert r.status_code == 200  # the service is fine
    logged = [rec for rec in caplog.records if rec.exc_info and rec.exc_info[0] is MemoryError]
    assert len(logged) == 4, [rec.getMessage() for rec in logged]  # once per failure, with its traceback


async def test_large_decodes_take_turns_and_small_ones_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    big = _solid("PNG", (2100, 2100), "L")  # 4.4 megapixels: over LARGE_DECODE_PIXELS
    assert images.LARGE_DECODE_PIXELS < 2100 * 2100
    real = images.model_input
    lock, small_done = threading.Lock(), threading.Event()
    state = {"active": 0, "most": 0, "small_first": []}

    def spy(data: bytes, model: Any, settings: Settings, device: torch.device) -> torch.Tensor:
        if data != big:
            out = real(data, model, settings, device)
            small_done.set()
            return out
        with lock:
            state["active"] += 1
            state["most"] = max(state["most"], state["active"])
        # the first large decode holds the only slot until the small image is done: a small image
        # stuck behind it would make this wait time out
        state["small_first"].append(small_done.wait(10))
        try:
            return real(data, model, settings, device)
        finally:
            with lock:
                state["active"] -= 1

    monkeypatch.setattr(images, "model_input", spy)
    app = create_app(Settings(models=["tiny"], warmup=False, max_concurrent_decodes=1), models={"tiny": tiny_classifier()})
    async with serve(app) as client:
        async def post(data: bytes, delay: float) -> int:
            await asyncio.sleep(delay)
            return (await client.post("/predict", files={"file": ("a.png", data)})).status_code

        codes = await asyncio.gather(*[post(big, 0) for _ in range(3)], post(image_bytes(), 0.2))
    assert codes == [200, 200, 200, 200]
    assert state["most"] == 1  # large decodes took turns
    assert state["small_first"] == [True, True, True]


async def test_a_small_image_costs_the_event_loop_one_hand_over_to_a_thread_and_a_large_one_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The header is read in the thread that then decodes a small image; a large one comes back to wait for a slot."""
    real, calls = asyncio.to_thread, []

    async def counting(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        calls.append(func.__name__)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(images.asyncio, "to_thread", counting)
    model, settings = tiny_classifier(), Settings(models=["tiny"], warmup=False)
    x = await images.load_input(image_bytes(), model, settings, torch.device("cpu"))
    assert x.shape == (3, 32, 32) and calls == ["_small_now"]
    calls.clear()
    big = await images.load_input(_solid("PNG", (2100, 2100), "L"), model, settings, torch.device("cpu"))
    assert big.shape == (3, 32, 32) and calls == ["_small_now", "_unless_late"]
