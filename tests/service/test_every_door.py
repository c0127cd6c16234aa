"""Every door keeps the service's promises, because every door makes the same typed application call: work that
cannot finish by the request deadline (counted from arrival) is answered by the deadline, refused in that door's
own form, and counted by the layer every door passes through (``idg_requests_total{door, route, status}``) in its
protocol's terms; a bad parameter and an unknown model are refused before any work, again in the door's form.

The doors: ``/attribute`` (the JSON error contract), ``/attribute/batch`` (a status per image), ``/attribute/stream``
(an ``error`` event), ``/v2/models/{m}/infer`` (the Open Inference Protocol's ``{"error": ...}``), its ``ModelInfer``
over gRPC (a status code and its details) and a job's image (its status in the results; a deadline is retried
``MAX_ATTEMPTS`` times, each within the deadline). The worker is made slow by the test model's own delay (0.1 s per
model call) and each decode by a fixed sleep, so the timings hold on any machine, and a deadline counted from anything
later than the arrival (the queue) would show."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from httpx import AsyncClient, Response
from prometheus_client.parser import text_string_to_metric_families

import app.core.images as images
from app.core.config import Settings
from app.jobs.runner import MAX_ATTEMPTS
from idg_models import ImageClassifier
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.test_oip import b64

TIMEOUT_S = 1.0
DECODE_S = 0.6
"""Each decode sleeps this long first: a deadline counted from the queue would answer after DECODE_S + TIMEOUT_S."""
SLACK_S = 0.5  # what an answer may take beyond its deadline (the event loop, a busy CI core)
SLOW = {"method": "idg", "preset": "fast", "steps": 400, "probe_steps": 8}
"""400 gradient points in calls of 8 at 0.1 s a call: 5 s of work against a 1 s deadline."""


@dataclass(frozen=True)
class Refusal:
    """A door's refusal, read from its own form: the status, the code where the form has one, the sentence."""

    status: int
    code: str | None
    message: str


def _contract(r: Response) -> Refusal:
    """The service's JSON error contract: ``{"error": {"status", "code", "message", "request_id"}}``, its status the HTTP
    status, its request ID the answer's ``X-Request-ID``."""
    error = r.json()["error"]
    assert set(error) == {"status", "code", "message", "request_id"} and error["status"] == r.status_code, r.text
    assert error["request_id"] == r.headers["x-request-id"], r.text
    return Refusal(r.status_code, error["code"], error["message"])


def _form(params: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in params.items()}


async def attribute(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=_form(params))
    return _contract(r)


async def batch(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    files = [("files", ("a.png", image_bytes())), ("files", ("b.png", image_bytes((90, 20, 160))))]
    r = await client.post("/attribute/batch", files=files, data=_form(params))
    if r.status_code != 200:  # refused as a whole (a parameter, the model): before any image
        return _contract(r)
    items = r.json()["items"]
    refusals = {Refusal(i["status"], i["error"]["code"], i["error"]["message"]) for i in items if i["status"] != 200}
    assert len(refusals) == 1 and r.json()["failed"] == len(items), r.text  # every image, the same refusal
    assert all(i["error"]["status"] == i["status"] for i in items)
    return refusals.pop()


async def stream(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    r = await client.post("/attribute/stream", files={"file": ("a.png", image_bytes())}, data=_form(params))
    if r.status_code != 200:  # a bad request is refused before the stream opens
        return _contract(r)
    blocks = [dict(line.split(": ", 1) for line in b.splitlines()) for b in r.text.strip().split("\n\n")]
    assert blocks[0]["event"] == "accepted" and blocks[-1]["event"] == "error", r.text
    error = json.loads(blocks[-1]["data"])
    return Refusal(error["status"], error["code"], error["message"])


async def v2(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    model = params.get("model", "tiny")
    body = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [b64(image_bytes())]}],
            "parameters": {k: v for k, v in params.items() if k != "model"}}
    r = await client.post(f"/v2/models/{model}/infer", json=body)
    # the protocol's form: one sentence, the status in HTTP; the request ID beside it, as X-Request-ID says it
    assert list(r.json()) == ["error", "request_id"] and r.json()["request_id"] == r.headers["x-request-id"], r.text
    return Refusal(r.status_code, None, r.json()["error"])


GRPC_STATUS = {"DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "INVALID_ARGUMENT": 422, "RESOURCE_EXHAUSTED": 503}
"""The HTTP status each gRPC code stands for here (INVALID_ARGUMENT: a 400 or 422; RESOURCE_EXHAUSTED: busy)."""


async def v2_grpc(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    request = pb.ModelInferRequest(model_name=params.get("model", "tiny"), inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[image_bytes()]))])
    for k, v in params.items():
        if k != "model":
            setattr(request.parameters[k], "string_param" if isinstance(v, str) else "int64_param", v)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{os.environ['IDG_GRPC_PORT']}") as channel:
        try:
            await stub_of(channel).ModelInfer(request, timeout=30)  # a deadline past the service's: the service's holds
        except grpc.aio.AioRpcError as err:  # the protocol's form: a status code and its details
            return Refusal(GRPC_STATUS[err.code().name], None, err.details())
    raise AssertionError("the gRPC door answered")


async def job(client: AsyncClient, params: dict[str, Any]) -> Refusal:
    r = await client.post("/jobs", files=[("files", ("a.png", image_bytes()))], data=_form(params))
    if r.status_code != 202:  # refused at submission, before any image is stored
        return _contract(r)
    job_id = r.json()["id"]
    for _ in range(400):
        if (await client.get(f"/jobs/{job_id}")).json()["state"] == "done":
            break
        await asyncio.sleep(0.05)
    (line,) = [json.loads(x) for x in (await client.get(f"/jobs/{job_id}/results")).text.splitlines()]
    assert "result" not in line and line["error"]["status"] == line["status"], line
    return Refusal(line["status"], line["error"]["code"], line["error"]["message"])


Door = Callable[[AsyncClient, dict[str, Any]], Awaitable[Refusal]]
DOORS: dict[str, tuple[Door, int]] = {
    "/attribute": (attribute, 1), "/attribute/batch": (batch, 1), "/attribute/stream": (stream, 1), "/v2 HTTP": (v2, 1),
    "/v2 gRPC": (v2_grpc, 1), "a job's image": (job, MAX_ATTEMPTS),
}
"""Each door, and how many deadlines its answer may take (a job retries a late image)."""
COUNTED = {"/attribute": ("http", "/attribute", "504"), "/attribute/batch": ("http", "/attribute/batch", "200"),
           "/attribute/stream": ("http", "/attribute/stream", "200"), "/v2 HTTP": ("http", "/v2/models/{name}/infer", "504"),
           "/v2 gRPC": ("grpc", "ModelInfer", "DEADLINE_EXCEEDED"), "a job's image": ("job", "image", "504")}
"""How the layer every door passes through (app.doors.layer) counts a late answer of each: its door, its route, and the
status its protocol answered (a batch's and a stream's late images are in a 200's body)."""


async def _counted(client: AsyncClient, door: str, route: str, status: str) -> float:
    text = (await client.get("/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "idg_requests_total" and s.labels == {"door": door, "route": route, "status": status})


@pytest.fixture(autouse=True)
def grpc_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every app here opens the protocol's gRPC port too (IDG_GRPC_PORT, read by the settings), a free one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("IDG_GRPC_PORT", str(s.getsockname()[1]))


@pytest.fixture
def slow_decodes(monkeypatch: pytest.MonkeyPatch) -> None:
    real = images.model_input

    def slow(data: bytes, model: ImageClassifier, settings: Settings, device: torch.device) -> torch.Tensor:
        time.sleep(DECODE_S)
        return real(data, model, settings, device)

    monkeypatch.setattr(images, "model_input", slow)


@pytest.mark.parametrize("name", list(DOORS))
@pytest.mark.usefixtures("slow_decodes")
async def test_work_past_the_deadline_is_answered_by_it_in_the_doors_form(tiny_app: AppFactory, name: str) -> None:
    send, deadlines = DOORS[name]
    app = tiny_app(delay_s=0.1, request_timeout_s=TIMEOUT_S, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512,
                   warmup=False)
    async with serve(app) as client:
        began = time.monotonic()
        refusal = await send(client, SLOW)
        took = time.monotonic() - began
        assert refusal.status == 504 and refusal.code in ("deadline", None), refusal
        assert f"within its deadline of {TIMEOUT_S:g} s" in refusal.message, refusal
        assert took < deadlines * TIMEOUT_S + SLACK_S, took  # not the 5 s the work would take
        assert await _counted(client, *COUNTED[name]) == deadlines  # a job's image: each try, retried as late
        assert app.state.service.worker.depth == 0  # nothing left in the worker
        await asyncio.sleep(0.3)  # the calls already on the device (two at most, 0.1 s each) end
        calls = len(app.state.service.models["tiny"].net.calls)
        await asyncio.sleep(0.3)
        assert len(app.state.service.models["tiny"].net.calls) == calls  # and nothing more is computed for it


async def _deadline_rejections(client: AsyncClient) -> float:
    line = 'idg_rejections_total{reason="deadline"} '
    return float(next(x for x in (await client.get("/metrics")).text.splitlines() if x.startswith(line)).split()[-1])


@pytest.mark.parametrize("name", [n for n in DOORS if n != "a job's image"])
@pytest.mark.usefixtures("slow_decodes")
async def test_a_deadline_that_passes_while_decoding_is_answered_and_counted(tiny_app: AppFactory, name: str) -> None:
    # the decode (0.6 s) outlasts the whole deadline: answered by it, before any model call, and counted as the worker
    # counts a deadline it meets (it was not, for a decode: an alert on idg_rejections_total missed these)
    send, _ = DOORS[name]
    app = tiny_app(request_timeout_s=0.3, warmup=False)
    async with serve(app) as client:
        app.state.service.models["tiny"].net.calls.clear()  # the start's own pass (it finds the default's Grad-CAM layer)
        before = await _deadline_rejections(client)
        began = time.monotonic()
        refusal = await send(client, {"method": "idg", "steps": 4, "probe_steps": 4})
        assert refusal.status == 504 and "within its deadline of 0.3 s" in refusal.message, refusal
        assert time.monotonic() - began < 0.3 + SLACK_S
        assert await _deadline_rejections(client) == before + (2 if name == "/attribute/batch" else 1)
        assert app.state.service.models["tiny"].net.calls == []


@pytest.mark.usefixtures("slow_decodes")
async def test_a_grpc_calls_own_deadline_ending_in_the_decode_is_the_one_it_names(tiny_app: AppFactory) -> None:
    # the call's deadline (0.3 s, shorter than the service's 30 s) ends while its image decodes: the answer names the
    # call's deadline, not the service's
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    app = tiny_app(request_timeout_s=30.0, warmup=False)
    request = pb.ModelInferRequest(model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[image_bytes()]))])
    async with serve(app) as client, grpc.aio.insecure_channel(f"127.0.0.1:{os.environ['IDG_GRPC_PORT']}") as channel:
        before = await _deadline_rejections(client)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub_of(channel).ModelInfer(request, timeout=0.3)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # what was left of the call's 0.3 s when it reached the servicer (0.2x s idle; 0.177 s seen on a busy machine)
        said = re.fullmatch(r"the request did not finish within its deadline of (0\.\d+) s", caught.value.details())
        assert said is not None and 0 < float(said.group(1)) <= 0.3, caught.value.details()
        assert await _deadline_rejections(client) == before + 1


@pytest.mark.parametrize("name", list(DOORS))
@pytest.mark.parametrize(("params", "status", "says"), [
    ({"method": "idg", "steps": 0}, 422, "steps"),
    ({"model": "big"}, 404, "unknown model 'big'"),
], ids=["bad parameter", "unknown model"])
async def test_a_bad_request_is_refused_before_any_work_in_the_doors_form(
    tiny_app: AppFactory, name: str, params: dict[str, Any], status: int, says: str,
) -> None:
    send, _ = DOORS[name]
    app = tiny_app(warmup=False)
    async with serve(app) as client:
        app.state.service.models["tiny"].net.calls.clear()  # the start's own pass (it finds the default's Grad-CAM layer)
        refusal = await send(client, params)
        assert refusal.status == status and says in refusal.message, refusal
        assert app.state.service.models["tiny"].net.calls == []  # refused before any model call


@pytest.mark.parametrize("name", [n for n in DOORS if n != "a job's image"])
async def test_a_full_queue_is_refused_at_once_in_the_doors_form(tiny_app: AppFactory, name: str) -> None:
    send, _ = DOORS[name]
    app = tiny_app(delay_s=0.05, max_queue=1, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512, warmup=False)
    async with serve(app) as client:
        blocker = asyncio.create_task(attribute(client, SLOW))  # holds the one attribution slot for 2.5 s
        try:
            await _until(lambda: app.state.service.worker.depth == 1)
            began = time.monotonic()
            refusal = await send(client, {"method": "idg", "steps": 4, "probe_steps": 4})
            assert time.monotonic() - began < SLACK_S  # at once, not after the slot frees
            assert refusal.status == 503 and refusal.code in ("busy", None) and "busy" in refusal.message, refusal
        finally:
            blocker.cancel()


async def test_a_jobs_image_waits_for_a_full_queue_and_is_answered_once_it_frees(tiny_app: AppFactory) -> None:
    # a job's image that finds the queue full is not refused: it goes back to the store and is tried again
    app = tiny_app(delay_s=0.05, max_queue=1, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512, warmup=False)
    async with serve(app) as client:
        blocker = asyncio.create_task(attribute(client, SLOW))
        await _until(lambda: app.state.service.worker.depth == 1)
        r = await client.post("/jobs", files=[("files", ("a.png", image_bytes()))], data=_form({"steps": 4, "probe_steps": 4}))
        assert r.status_code == 202, r.text
        for _ in range(250):  # the runner claimed the image, found the queue full and gave it back
            if 'idg_durable_job_images_total{outcome="retried"} 1.0' in (await client.get("/metrics")).text:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the job's image was not given back")
        assert not blocker.done()  # it was refused while the queue was full
        blocker.cancel()
        job_id = r.json()["id"]
        for _ in range(300):
            if (await client.get(f"/jobs/{job_id}")).json()["state"] == "done":
                break
            await asyncio.sleep(0.05)
        (line,) = [json.loads(x) for x in (await client.get(f"/jobs/{job_id}/results")).text.splitlines()]
        assert line["status"] == 200, line


async def _until(done: Callable[[], bool], limit_s: float = 10.0) -> None:
    for _ in range(int(limit_s / 0.02)):
        if done():
            return
        await asyncio.sleep(0.02)
