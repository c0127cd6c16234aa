"""The real app with its lifespan running, driven by httpx.AsyncClient."""

from __future__ import annotations

import importlib.util
import io
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType

import pytest
import uvicorn
from fastapi import FastAPI
from httpx import ASGITransport, AsyncClient
from PIL import Image

from app.core.config import Settings
from app.main import create_app
from tests.models import tiny_classifier


def image_bytes(
    color: tuple[int, int, int] = (40, 120, 200), size: tuple[int, int] = (48, 40), fmt: str = "PNG", mode: str = "RGB",
) -> bytes:
    img = Image.new("RGB", size, color)
    for i in range(min(size)):
        img.putpixel((i, i), (255 - color[0], 255 - color[1], 255 - color[2]))
    if mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[AsyncClient]:
    async with (
        app.router.lifespan_context(app),
        AsyncClient(transport=ASGITransport(app=app), base_url="http://test", timeout=120) as client,
    ):
        yield client


AppFactory = Callable[..., FastAPI]


@pytest.fixture
def tiny_app() -> AppFactory:
    def make(delay_s: float = 0.0, **settings: object) -> FastAPI:
        base = {"models": ["tiny"], "warmup": True, "batch_wait_ms": 20.0}
        return create_app(Settings(**(base | settings)), models={"tiny": tiny_classifier(delay_s)})

    return make


def script_module(name: str) -> ModuleType:
    """The checkout's ``scripts/<name>.py`` loaded as a module (scripts/ is no package), for a test to call its functions."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def live_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with a real uvicorn on a free loopback port (lifespan included); yield its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # idle connections kept as app.server.build keeps them (uvicorn's default 5 s races httpx's pool: a request lost)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_keep_alive=app.state.settings.keep_alive_timeout_s)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)
