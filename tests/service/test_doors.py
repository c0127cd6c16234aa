"""Every door passes through one layer (app.doors.layer): the Open Inference Protocol over gRPC, driven here by Triton's own
clients (``tritonclient.grpc``, sync and asyncio) against the real app's gRPC server, is counted by door, RPC and status
code in /metrics as HTTP is, its log lines name the request ID its metadata gave (which comes back in its metadata and as
the answer's ``id``), and an API key's share of the queue holds over gRPC and HTTP together. Each image of a durable job
is a call through the job door, counted and logged with the request ID of the POST that submitted it."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.doors.request_id import RequestIdFilter
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, wait_done
from tests.service.jobs.helpers import images as job_images
from tests.service.test_oip_grpc import free_port

grpcclient = pytest.importorskip("tritonclient.grpc", reason="grpcio or tritonclient is not installed (pip install -e '.[dev]')")
from tritonclient.grpc import aio as grpcclient_aio  # noqa: E402
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

ALICE, BOB = "alice-secret-1", "bob-secret-2"
EXPLAIN = {"method": "ig", "steps": 4}


def images(*files: bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("image", [len(files)], "BYTES")
    tensor.set_data_from_numpy(np.array(files, dtype=np.object_))
    return tensor


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Each sample of ``name`` in an exposition, by its labels."""
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


def infer_request(model: str, data: bytes, request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="image", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
    return request


async def test_grpc_calls_are_counted_by_door_rpc_and_status_code(tiny_app: AppFactory) -> None:
    port = free_port()
    async with serve(tiny_app(warmup=False, grpc_port=port)) as client:
        before = (await client.get("/metrics")).text
        with grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}") as c:
            await asyncio.to_thread(c.infer, "tiny", [images(image_bytes())])
            with pytest.raises(InferenceServerException) as caught:
                await asyncio.to_thread(c.infer, "nope", [images(image_bytes())])
        assert caught.value.status() == "StatusCode.NOT_FOUND"
        assert (await client.post("/predict", files={"file": ("a.png", image_bytes())})).status_code == 200
        after = (await client.get("/metrics")).text
    counted = samples(after, "idg_requests_total")
    grpc_ok = (("door", "grpc"), ("route", "ModelInfer"), ("status", "OK"))
    grpc_not_found = (("door", "grpc"), ("route", "ModelInfer"), ("status", "NOT_FOUND"))
    assert samples(before, "idg_requests_total")[grpc_ok] == 0  # created at 0 when the port opened: rate() sees the first
    assert counted[grpc_ok] == 1 and counted[grpc_not_found] == 1
    assert counted[(("door", "http"), ("route", "/predict"), ("status", "200"))] == 1  # HTTP in the same counter
    seconds = samples(after, "idg_request_seconds_count")
    assert seconds[(("door", "grpc"), ("route", "ModelInfer"))] == 2
    # the HTTP door's series under their first names, as the dashboards read them, and no gRPC call among them
    assert samples(after, "idg_http_requests_total")[(("route", "/predict"), ("status", "200"))] == 1
    assert not [labels for labels in samples(after, "idg_http_requests_total") if ("route", "ModelInfer") in labels]


async def test_a_grpc_calls_log_lines_and_answer_carry_the_request_id_of_its_metadata(
        tiny_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app(warmup=False, grpc_port=port, log_predictions=True)):
            caplog.clear()
            with grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}") as c:
                result = await asyncio.to_thread(c.infer, "tiny", [images(image_bytes())], headers={"x-request-id": "grpc-7"})
                with pytest.raises(InferenceServerException):
                    await asyncio.to_thread(c.infer, "nope", [images(image_bytes())], headers={"x-request-id": "grpc-8"})
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:  # the metadata that comes back
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                given = stub.ModelInfer(infer_request("tiny", image_bytes()), metadata=(("x-request-id", "grpc-9"),))
                answered = await given
                initial, trailing = dict(await given.initial_metadata()), dict(await given.trailing_metadata())
                refused = stub.ModelInfer(infer_request("nope", image_bytes(), request_id="oip-id-1"))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await refused
                made = stub.ModelInfer(infer_request("tiny", image_bytes()))
                made_answer = await made
                made_initial = dict(await made.initial_metadata())
    assert result.get_response().id == "grpc-7"  # the protocol's id: the request's own, else its request ID
    assert answered.id == "grpc-9" and initial["x-request-id"] == "grpc-9" and trailing["x-request-id"] == "grpc-9"
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(caught.value.trailing_metadata())["x-request-id"] == "oip-id-1"  # no metadata: the protocol's request id
    assert re.fullmatch("[0-9a-f]{32}", made_initial["x-request-id"]) and made_answer.id == made_initial["x-request-id"]
    lines = [(r.name, r.getMessage(), getattr(r, "request_id", None)) for r in caplog.records]
    mine = [line for line in lines if line[2] == "grpc-7"]
    assert [n for n, _, _ in mine] == ["app.results", "app.requests"], lines  # the prediction's result line, then the access line
    assert mine[-1][1].startswith("gRPC ModelInfer OK in "), mine
    (refusal,) = [line for line in lines if line[2] == "grpc-8"]
    assert refusal[0] == "app.requests" and refusal[1].startswith("gRPC ModelInfer NOT_FOUND in "), lines


async def test_a_tenant_flooding_over_grpc_is_held_to_its_share_while_anothers_http_call_is_answered(
        tiny_app: AppFactory) -> None:
    port = free_port()
    # IDG_KEY_SHARE 0.5 of IDG_MAX_QUEUE 4: 2 requests in flight per key, over every door together
    app = tiny_app(delay_s=0.05, warmup=False, grpc_port=port, api_keys=f"alice:{ALICE},bob:{BOB}", max_queue=4)
    async with serve(app) as client, grpcclient_aio.InferenceServerClient(url=f"127.0.0.1:{port}") as alice:

        async def flood_one() -> str:
            try:
                await alice.infer("tiny", [images(image_bytes())], headers={"x-api-key": ALICE}, parameters=EXPLAIN)
            except InferenceServerException as err:
                return f"{err.status()} {err.message()}"
            return "OK"

        async def bob_explains() -> tuple[int, str, float]:
            started = time.perf_counter()
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, headers={"X-API-Key": BOB},
                                  data={k: str(v) for k, v in EXPLAIN.items()} | {"return_overlay": "false"})
            return r.status_code, r.json().get("error", {}).get("code", ""), time.perf_counter() - started

        usual = (await bob_explains())[2]
        flood = [asyncio.create_task(flood_one()) for _ in range(12)]  # three times the whole queue
        while app.state.doors.in_flight.get("alice", 0) < 2:  # alice holds her share
            await asyncio.sleep(0.005)
        status, code, seconds = await bob_explains()
        flooded = await asyncio.gather(*flood)
        metrics = (await client.get("/metrics", headers={"X-API-Key": BOB})).text
    assert status == 200, code  # without the share over gRPC, alice's flood filled the queue and bob got 503 busy
    assert seconds < 3 * usual + 1.0, (seconds, usual)
    refusals = [f for f in flooded if f != "OK"]
    assert 2 <= flooded.count("OK") < 12 and refusals, flooded
    assert all(f.startswith("StatusCode.RESOURCE_EXHAUSTED") and "its share of the queue" in f for f in refusals), refusals
    counted = samples(metrics, "idg_requests_total")
    assert counted[(("door", "grpc"), ("route", "ModelInfer"), ("status", "RESOURCE_EXHAUSTED"))] == len(refusals)
    assert app.state.doors.in_flight == {"alice": 0, "bob": 0}  # every slot given back


async def test_each_job_image_is_a_call_through_the_job_door(tiny_app: AppFactory, caplog: pytest.LogCaptureFixture,
                                                              tmp_path: Path) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app(warmup=False, data_dir=tmp_path)) as client:
            before = (await client.get("/metrics")).text
            r = await client.post("/jobs", files=job_images(2), data=FAST, headers={"X-Request-ID": "nightly-7"})
            assert r.status_code == 202, r.text
            job = r.json()["id"]
            await wait_done(client, job)
            for _ in range(200):  # an image's call ends when its task resumes after the store has its answer: a loop turn
                metrics = (await client.get("/metrics")).text  # after the job reads done (answers are written together)
                if samples(metrics, "idg_request_seconds_count").get((("door", "job"), ("route", "image"))) == 2:
                    break
                await asyncio.sleep(0.01)
    counted = samples(metrics, "idg_requests_total")
    for status in ("200", "500", "503", "504"):  # created at 0 at the start: rate() sees the first of each
        assert samples(before, "idg_requests_total")[(("door", "job"), ("route", "image"), ("status", status))] == 0
    assert counted[(("door", "job"), ("route", "image"), ("status", "200"))] == 2
    assert counted[(("door", "http"), ("route", "/jobs"), ("status", "202"))] == 1
    assert samples(metrics, "idg_request_seconds_count")[(("door", "job"), ("route", "image"))] == 2
    access = sorted(r.getMessage() for r in caplog.records if r.name == "app.requests" and getattr(r, "request_id", None) == "nightly-7")
    assert len(access) == 3 and access[0].startswith("POST /jobs 202 in "), access  # the submission, then each image
    assert [a.split(" in ")[0] for a in access[1:]] == [f"job {job} image 0 200", f"job {job} image 1 200"], access


async def test_an_oip_requests_own_id_names_it_over_http_where_no_x_request_id_does(
        tiny_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    body = {"id": "oip-41", "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                        "data": [base64.b64encode(image_bytes()).decode()]}]}
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app(warmup=False, log_predictions=True)) as client:
            caplog.clear()
            own = await client.post("/v2/models/tiny/infer", json=body)
            both = await client.post("/v2/models/tiny/infer", json=body | {"id": "oip-42"}, headers={"X-Request-ID": "h-42"})
            unsafe = await client.post("/v2/models/tiny/infer", json=body | {"id": "has space"})
    assert own.status_code == 200 and own.headers["x-request-id"] == "oip-41" and own.json()["id"] == "oip-41"
    assert both.headers["x-request-id"] == "h-42" and both.json()["id"] == "oip-42"  # the header names the request
    assert re.fullmatch("[0-9a-f]{32}", unsafe.headers["x-request-id"]) and unsafe.json()["id"] == "has space"
    named = [(r.name, r.getMessage()) for r in caplog.records if getattr(r, "request_id", None) == "oip-41"]
    assert [n for n, _ in named] == ["app.results", "app.requests"], named  # its result line, then its access line
    assert named[-1][1].startswith("POST /v2/models/tiny/infer 200 in "), named
    assert not [r for r in caplog.records if getattr(r, "request_id", None) == "oip-42"]
