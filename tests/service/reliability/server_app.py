"""A real server process for the tests that need sockets and signals: the launcher
(``python -m app.server``) serving the tiny model, every setting from ``IDG_*`` variables.

``IDG_TEST_DELAY_S`` slows each model call (see ``TinyNet``), so requests can be caught in flight;
``IDG_TEST_MODEL=steer`` serves ``Steerable`` (named "steer", the default model), whose answers the input image steers,
beside the tiny model; ``IDG_TEST_MODEL=large`` serves it as "large" at an input of ``IDG_TEST_CROP`` pixels square (its
attributions as large as that: 3 x 1024 x 1024 numbers at 1024), beside the tiny model.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from fastapi import FastAPI

from app.core.config import Settings
from app.main import create_app
from tests.models import steerable_classifier
from tests.service.conftest import tiny_classifier

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.service.reliability.server_app:make_app"


def make_app() -> FastAPI:
    """The app ``app.server --app`` loads in the child process. With ``IDG_TEST_HOLD_START`` (a path), its start-up
    (the lifespan, where a real model loads) waits while that file exists: a process that takes its time to come up;
    with ``IDG_TEST_HOLD_PROCESS`` too, only the server process of that index (``idg-server-N``) waits."""
    if os.environ.get("IDG_TEST_MODEL") == "large":
        crop = int(os.environ.get("IDG_TEST_CROP", "1024"))
        large = steerable_classifier("large")
        large.preprocessing = replace(large.preprocessing, resize_size=crop, crop_size=crop)
        app = create_app(Settings(models=["large", "tiny"]), models={"large": large, "tiny": tiny_classifier()})
    elif os.environ.get("IDG_TEST_MODEL") == "steer":
        app = create_app(Settings(models=["steer", "tiny"]), models={"steer": steerable_classifier(), "tiny": tiny_classifier()})
    else:
        app = create_app(Settings(models=["tiny"]), models={"tiny": tiny_classifier(float(os.environ.get("IDG_TEST_DELAY_S", "0")))})
    hold = os.environ.get("IDG_TEST_HOLD_START")
    index = os.environ.get("IDG_TEST_HOLD_PROCESS")
    if hold and (index is None or multiprocessing.current_process().name == f"idg-server-{index}"):
        inner = app.router.lifespan_context

        @asynccontextmanager
        async def held(app: FastAPI) -> AsyncIterator[None]:
            while Path(hold).exists():
                await asyncio.sleep(0.05)
            async with inner(app):
                yield

        app.router.lifespan_context = held
    return app


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metric(self, name: str) -> float:
        """The value of one sample line of /metrics (``name`` with its labels), 0 when absent."""
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextmanager
def serve_process(log_path: Path, wait_ready: bool = True, **settings: object) -> Iterator[Served]:
    """Start the launcher on a free loopback port, wait until ready (or, ``wait_ready`` false, until it listens), kill it
    on the way out."""
    # one process unless asked: IDG_PROCESSES=auto would run two on a CUDA host, and these tests count one's queue
    env = {**os.environ, "IDG_WARMUP": "false", "IDG_HOST": "127.0.0.1", "IDG_PROCESSES": "1", **{k: str(v) for k, v in settings.items()}}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app.server", "--app", APP, "--port", "0"], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        port, deadline = 0, time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the server died:\n{log_path.read_text()}"
            # one process says where it listens; several, the launcher (before any listens)
            found = re.search(r"(?:Uvicorn running on http://|server processes on )127\.0\.0\.1:(\d+)",
                              log_path.read_text(errors="replace"))
            if found:
                port = int(found.group(1))
                if not wait_ready:
                    break
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        else:
            raise AssertionError(f"the server was not ready within 90 s:\n{log_path.read_text()}")
        yield Served(proc, f"http://127.0.0.1:{port}", port, log_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
