"""Shared by the job tests: submitting, waiting, reading results."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from httpx import AsyncClient

from app.jobs.store import Store
from tests.service.conftest import image_bytes


def images(n: int, start: int = 0) -> list[tuple[str, tuple[str, bytes, str]]]:
    """``n`` distinct small PNGs as repeated multipart ``files``."""
    return [("files", (f"img{i:04d}.png", image_bytes(((37 * i) % 256, (91 * i) % 256, 120)), "image/png"))
            for i in range(start, start + n)]


FAST = {"method": "ig", "steps": "4", "return_overlay": "false"}
"""A cheap attribution: 1 prediction pass + 4 gradient points on the tiny model."""


async def submit(client: AsyncClient, files: list[Any], **fields: str) -> dict[str, Any]:
    r = await client.post("/jobs", files=files, data=FAST | fields)
    assert r.status_code == 202, r.text
    return r.json()


async def wait_done(client: AsyncClient, job_id: str, limit_s: float = 60) -> dict[str, Any]:
    for _ in range(int(limit_s / 0.05)):
        r = await client.get(f"/jobs/{job_id}")
        if r.status_code == 503:  # the store busy or unreachable for now: a client tries again, as Retry-After says
            assert int(r.headers["retry-after"]) > 0, r.text
            await asyncio.sleep(0.05)
            continue
        status = r.json()
        if status["state"] == "done":
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} not done within {limit_s} s: {status}")


async def results(client: AsyncClient, job_id: str, **params: Any) -> list[dict[str, Any]]:
    r = await client.get(f"/jobs/{job_id}/results", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in r.text.splitlines()]


@contextmanager
def writes_meanwhile(store: Store, job_id: str) -> Iterator[list[float]]:
    """Another writer in a thread of its own for as long as the block runs (``callback_sent`` on ``job_id``, again and
    again): the seconds each of its writes waited, to hold a long operation to taking turns."""
    waits: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            began = time.monotonic()
            store.callback_sent(job_id, "delivered")
            waits.append(time.monotonic() - began)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        yield waits
    finally:
        stop.set()
        thread.join()
