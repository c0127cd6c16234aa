"""Very large JSON answers never hold the event loop. /v2 infer's attributions as JSON numbers run to 100 MB for three
images of a 1024-pixel model; json.dumps of such an answer, in a thread too (the C encoder keeps the GIL), had held
the real server's event loop 2-6 s, /health/live waiting all that time. The answer is now written a piece of
``JSON_SLICE`` numbers at a time, the loop serving other requests between pieces: the same bytes as before
(checked against json.dumps), and /health/live answered at about its idle speed throughout. /attribute/batch, whose
answer with arrays and PNGs runs to 174 MB for 8 such images, is serialised an item at a time likewise."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

import app.api.oip as oip
from app.api.oip import Output, infer_response_parts, write_infer_response
from app.schemas import BatchResponse
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.reliability.server_app import Served, serve_process

CROP, IMAGES, BATCH = 1024, 3, 8
"""/v2: 3 x 3 x 1024 x 1024 attribution values, about 100 MB of JSON; /attribute/batch: 8 images with their arrays
(base64 npy) and PNGs, about 174 MB."""
LIVE_LIMIT_S = 0.5
"""Most a /health/live may take while the large answer is written and sent (beyond its idle time): it had taken 2-6 s."""
FETCH = """
import json, sys, time, httpx
started = time.perf_counter()
if sys.argv[1].endswith("/attribute/batch"):  # the image, BATCH times, explained with its arrays and PNGs
    image = open(sys.argv[2], "rb").read()
    files = [("files", ("image.png", image, "image/png"))] * int(sys.argv[3])
    fields = {"method": "ig", "steps": "4", "probe_steps": "4", "return_attribution": "true", "return_input": "true"}
    request = httpx.Request("POST", sys.argv[1], files=files, data=fields)
else:
    request = httpx.Request("POST", sys.argv[1], content=open(sys.argv[2], "rb").read(), headers={"Content-Type": "application/json"})
with httpx.Client(timeout=300) as client:
    r = client.send(request, stream=True)
    size, head, tail = 0, b"", b""
    for chunk in r.iter_bytes():
        head = head if len(head) >= 200 else (head + chunk)[:200]
        tail = (tail + chunk)[-200:]
        size += len(chunk)
    r.close()
print(json.dumps({"status": r.status_code, "bytes": size, "length": r.headers.get("content-length"),
                  "type": r.headers.get("content-type"), "head": head.decode(errors="replace"),
                  "tail": tail.decode(errors="replace"), "seconds": time.perf_counter() - started}))
"""
"""The large request, from a process of its own: reading 100 MB in this one would compete for its GIL with the probes."""


def _old_write(model: str, request_id: str, outputs: list[tuple[Output, bool]], parameters: dict[str, Any]) -> tuple[bytes, int | None]:
    """The answer as it was written before, at once with json.dumps: what the pieces must add up to."""
    chunks, described = [], []
    for out, in_binary in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": out.dims}
        params = dict(out.parameters)
        if in_binary:
            data = out.binary()
            params["binary_data_size"] = len(data)
            chunks.append(data)
        else:
            entry["data"] = out.json_data()
        if params:
            entry["parameters"] = params
        described.append(entry)
    answer = {"model_name": model, "outputs": described, "id": request_id, **({"parameters": parameters} if parameters else {})}
    header = json.dumps(answer, separators=(",", ":")).encode()
    return (header + b"".join(chunks), len(header)) if chunks else (header, None)


def test_an_answer_written_in_pieces_is_the_same_bytes_as_json_dumps_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oip, "JSON_SLICE", 1000)
    values = np.random.default_rng(0).random((2, 3, 40, 30), dtype=np.float32)
    values[0, 0, 0, :3] = [np.nan, np.inf, -0.0]
    labels = [f"0.{i}:{i}:caf\u00e9 \"{i}\"".encode() for i in range(2500)]
    outputs = [(Output("attribution", values), False), (Output("classification", items=labels, shape=[2500]), False),
               (Output("predicted_class", np.array([3, 1], dtype=np.int64)), True), (Output("none", np.zeros((0, 4))), False),
               (Output("curve_value", values[0, 0, :7], parameters={"output": "logit"}), False)]
    timing = {"total_ms": 1.5}
    for request_id in ("r-1", "\x00 a mark-like id \x00"):
        for chosen in (outputs, [o for o in outputs if not o[1]]):
            assert write_infer_response("m", request_id, chosen, timing) == _old_write("m", request_id, chosen, timing)
    pieces, _ = infer_response_parts("m", "r-1", outputs, {})
    assert len(list(pieces)) >= 7200 // 1000 + 3  # the attribution alone is 8 pieces of at most 1000 numbers


def _png() -> str:
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _live(client: httpx.Client) -> float:
    started = time.perf_counter()
    client.get("/health/live").raise_for_status()
    return time.perf_counter() - started


async def test_a_batch_answer_is_the_bytes_pydantic_writes_of_it_with_its_length(tiny_app: AppFactory) -> None:
    files = [("files", ("a.png", image_bytes(), "image/png")), ("files", ("b.png", b"not an image", "image/png")),
             ("files", ("c.png", image_bytes((9, 9, 9)), "image/png"))]
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute/batch", files=files, data={"method": "ig", "steps": "4", "return_attribution": "true"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json", r.text[:300]
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.content == BatchResponse.model_validate_json(r.content).model_dump_json().encode()  # as FastAPI wrote it whole
    body = r.json()
    assert [i["status"] for i in body["items"]] == [200, 415, 200] and (body["succeeded"], body["failed"]) == (2, 1)
    assert body["items"][2]["result"]["attribution"]["format"] == "npy" and body["items"][1]["error"]["status"] == 415


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real launcher serving a model of ``CROP`` pixels (its attributions 3 x CROP x CROP numbers each)."""
    log = tmp_path_factory.mktemp("large") / "server.log"
    with serve_process(log, IDG_TEST_MODEL="large", IDG_TEST_CROP=CROP, IDG_REQUEST_TIMEOUT_S=300) as served:
        yield served


def _while_answered(served: Served, args: list[str]) -> tuple[dict[str, Any], list[float], list[tuple[float, float]]]:
    """What the large request (``FETCH`` with ``args``, in a process of its own) got, /health/live's latencies idle, and
    (latency, when) of each probe while the request ran."""
    with httpx.Client(base_url=served.url, timeout=60) as client:
        idle = []
        for _ in range(20):
            idle.append(_live(client))
            time.sleep(0.02)
        fetch = subprocess.Popen([sys.executable, "-c", FETCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        busy: list[tuple[float, float]] = []
        started = time.perf_counter()
        try:
            while fetch.poll() is None and time.perf_counter() - started < 240:
                busy.append((_live(client), time.perf_counter() - started))
                time.sleep(0.05)
        finally:
            if fetch.poll() is None:
                fetch.kill()
            out, err = fetch.communicate(timeout=30)
    got = json.loads(out) if out else {}
    assert got.get("status") == 200, (got, err[-2000:])
    return got, idle, busy


def _never_held(got: dict[str, Any], idle: list[float], busy: list[tuple[float, float]]) -> None:
    assert got["seconds"] >= 1.0 and len(busy) >= 10, (got["seconds"], len(busy))  # long enough that a stall would be seen
    worst = max(busy)
    assert worst[0] < LIVE_LIMIT_S + max(idle), (
        f"/health/live took {worst[0]:.3f} s at {worst[1]:.2f} s into a {got['seconds']:.1f} s answer of {got['bytes'] / 1e6:.0f} MB "
        f"(idle: at most {max(idle):.3f} s); slowest: {sorted(busy)[-5:]}")


@pytest.mark.slow
def test_health_live_answers_while_a_100_mb_json_answer_is_written_and_sent(large: Served, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({
        "inputs": [{"name": "image", "shape": [IMAGES], "datatype": "BYTES", "data": [_png()] * IMAGES}],
        "outputs": [{"name": "attribution"}], "parameters": {"method": "ig", "steps": 4, "probe_steps": 4}}))
    got, idle, busy = _while_answered(large, [large.url + "/v2/models/large/infer", str(request)])
    assert got["type"] == "application/json" and int(got["length"]) == got["bytes"] >= 90_000_000, got
    assert got["head"].startswith('{"model_name":"large","outputs":[{"name":"attribution","datatype":"FP32","shape":[3,3,1024,1024],'
                                  '"data":['), got["head"]
    assert got["tail"].endswith("}"), got["tail"]
    _never_held(got, idle, busy)


@pytest.mark.slow
def test_health_live_answers_while_a_large_batch_answer_is_serialised_and_sent(large: Served, tmp_path: Path) -> None:
    image = tmp_path / "image.png"
    image.write_bytes(base64.b64decode(_png()))
    got, idle, busy = _while_answered(large, [large.url + "/attribute/batch", str(image), str(BATCH)])
    assert got["type"] == "application/json" and int(got["length"]) == got["bytes"] >= 100_000_000, got
    assert got["head"].startswith('{"items":[{"filename":"image.png","status":200,"result":{'), got["head"]
    assert got["tail"].endswith(f'],"succeeded":{BATCH},"failed":0}}'), got["tail"]
    _never_held(got, idle, busy)
