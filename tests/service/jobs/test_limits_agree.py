"""The body timeout and the size limits agree: a job upload of declared length may take as long as it
takes at IDG_MIN_UPLOAD_RATE (a 100 MB job at 1 MB/s was cut at 60 s with a 408 though 300 MB were
allowed); an upload of undeclared length, or one slower than the rate, still gets its 408."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from httpx import AsyncClient

from tests.service.conftest import AppFactory, serve
from tests.service.jobs.helpers import FAST, images

BODY_S, RATE = 0.3, 2_000


async def _multipart(client: AsyncClient) -> tuple[bytes, str]:
    request = client.build_request("POST", "/jobs", files=images(6), data=FAST)
    return request.read(), request.headers["content-type"]


async def _trickled(body: bytes, seconds: float) -> AsyncIterator[bytes]:
    pieces = 10
    step = -(-len(body) // pieces)
    for i in range(pieces):
        await asyncio.sleep(seconds / pieces)
        yield body[i * step:(i + 1) * step]


async def test_a_declared_upload_slower_than_the_body_timeout_but_at_the_minimum_rate_is_taken(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(body_timeout_s=BODY_S, min_upload_rate=RATE)) as client:
        body, ctype = await _multipart(client)
        allowed = len(body) / RATE
        assert allowed > 3 * BODY_S, allowed  # the rate gives this body far more than the plain timeout
        headers = {"content-type": ctype, "content-length": str(len(body))}
        r = await client.post("/jobs", content=_trickled(body, allowed / 2), headers=headers)
        assert r.status_code == 202, r.text
        late = await client.post("/jobs", content=_trickled(body, allowed * 2), headers=headers)
        assert late.status_code == 408 and late.json()["error"]["code"] == "body_timeout", late.text
        chunked = await client.post("/jobs", content=_trickled(body, allowed / 2), headers={"content-type": ctype})
        assert chunked.status_code == 408, chunked.text  # no declared length: the plain timeout
