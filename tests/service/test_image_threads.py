"""Decodes and renders run in the app's own image threads (IDG_IMAGE_THREADS, app.core.image_threads): never more at
once than the setting, never in asyncio's default pool, one per core the process has by default."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest

import app.assembly
import app.core.images
import app.service.service
from app.core.image_threads import PROCESSES_ON_HOST, image_threads, in_image_thread, processes_on_host
from app.core.images import LARGE_DECODE_PIXELS
from tests.service.conftest import AppFactory, image_bytes, serve


class Watch:
    """Wraps functions to record, for each call, its name and thread, and the most calls running at once."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.calls: list[tuple[str, str]] = []
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def watched(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.running += 1
                self.peak = max(self.peak, self.running)
                self.calls.append((fn.__name__, threading.current_thread().name))
            try:
                time.sleep(self.hold_s)  # long enough that a pool of several threads would run them side by side
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.running -= 1
        return watched


async def _attributions_and_predictions(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch, threads: int) -> Watch:
    watch = Watch(hold_s=0.02)
    monkeypatch.setattr(app.core.images, "model_input", watch.wrap(app.core.images.model_input))
    monkeypatch.setattr(app.service.service, "render", watch.wrap(app.service.service.render))
    served = tiny_app(image_threads=threads)
    async with serve(served) as client:
        photo = image_bytes()
        attributions = [client.post("/attribute", files={"file": ("a.png", photo, "image/png")},
                                    data={"method": "ig", "steps": "4"}) for _ in range(8)]
        predictions = [client.post("/predict", files={"file": ("a.png", photo, "image/png")}) for _ in range(4)]
        answers = await asyncio.gather(*attributions, *predictions)
    assert [r.status_code for r in answers] == [200] * 12, [r.text for r in answers if r.status_code != 200]
    names = [name for name, _ in watch.calls]
    assert names.count("model_input") >= 12 and names.count("render") >= 8  # the warm-up's requests come on top
    return watch


async def test_with_one_image_thread_every_decode_and_render_runs_in_it_one_at_a_time(
        tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = await _attributions_and_predictions(tiny_app, monkeypatch, threads=1)
    assert watch.peak == 1
    assert {thread for _, thread in watch.calls} == {"idg-image_0"}


async def test_with_three_image_threads_no_more_than_three_run_at_once(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    watch = await _attributions_and_predictions(tiny_app, monkeypatch, threads=3)
    assert 2 <= watch.peak <= 3  # twelve requests at once, each decode held 20 ms: the pool runs them side by side
    assert {thread for _, thread in watch.calls} <= {"idg-image_0", "idg-image_1", "idg-image_2"}


@pytest.mark.parametrize(("setting", "cores", "processes", "want"), [
    ("auto", 2, 1, 2),  # one process on the 2-core VM: a thread per core
    ("auto", 2, 2, 1),  # two processes share the two cores
    ("auto", 16, 2, 8),  # a 16-core GPU host with auto's two processes
    ("auto", 1, 4, 1),  # never none
    (3, 16, 2, 3),  # a count is the count
])
def test_auto_gives_each_process_one_image_thread_per_core_it_has(
        setting: int | Literal["auto"], cores: int, processes: int, want: int) -> None:
    n, why = image_threads(setting, cores, processes)
    assert n == want
    assert why == ("IDG_IMAGE_THREADS" if setting != "auto" else f"auto: {cores} host core(s) / {processes} server process(es)")


def test_a_process_outside_a_launcher_is_alone_on_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROCESSES_ON_HOST, raising=False)
    assert processes_on_host() == 1
    monkeypatch.setenv(PROCESSES_ON_HOST, "2")
    assert processes_on_host() == 2
    monkeypatch.setenv(PROCESSES_ON_HOST, "two")
    assert processes_on_host() == 1


def _thread_name() -> str:
    return threading.current_thread().name


async def test_once_the_app_stops_or_fails_to_start_its_image_threads_are_closed(
        tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    async with serve(tiny_app(image_threads=1)):
        inside = await in_image_thread(_thread_name)
    after = await in_image_thread(_thread_name)
    assert inside == "idg-image_0"
    assert not after.startswith("idg-image")  # asyncio's own pool: nothing is sent to a closed one

    async def no_jobs(*args: object) -> None:
        raise RuntimeError("the jobs database cannot be reached")

    monkeypatch.setattr(app.assembly, "start_jobs", no_jobs)  # start-up fails after the pool opened
    with pytest.raises(RuntimeError, match="cannot be reached"):
        async with serve(tiny_app(image_threads=1)):
            pass
    assert not (await in_image_thread(_thread_name)).startswith("idg-image")


async def test_a_decode_over_the_large_limit_runs_outside_the_image_threads(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large decodes wait for their own slots and run in asyncio's pool: in the image threads they would hold up every
    small photo behind them."""
    watch = Watch(hold_s=0.0)
    monkeypatch.setattr(app.core.images, "model_input", watch.wrap(app.core.images.model_input))
    side = int(LARGE_DECODE_PIXELS ** 0.5) + 8
    async with serve(tiny_app(image_threads=1)) as client:
        watch.calls.clear()  # the warm-up's
        large = await client.post("/predict", files={"file": ("big.png", image_bytes(size=(side, side)), "image/png")})
        small = await client.post("/predict", files={"file": ("small.png", image_bytes(), "image/png")})
    assert large.status_code == 200 and small.status_code == 200, (large.text, small.text)
    assert [thread.startswith("idg-image") for _, thread in watch.calls] == [False, True]


async def test_auto_counts_the_processes_the_launcher_said_share_the_host(
        tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(PROCESSES_ON_HOST, "64")  # more processes than this machine has cores: one thread each
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app()):
            name = await in_image_thread(_thread_name)
    said = [r.getMessage() for r in caplog.records if "image thread(s)" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 image thread(s) ") and said[0].endswith(" / 64 server process(es))"), said
    assert name == "idg-image_0"
