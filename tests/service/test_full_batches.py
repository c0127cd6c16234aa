"""Every batch the model config promises is served (issue #59): ``max_batch_size`` of ``/v2/models/{m}/config`` is the
most images one request may hold, and a request of that many images, predictions only or explained, is admitted whole
by an idle server over HTTP and over gRPC (each image holds one slot of the queue: predictions had a bound of 16, half
the 32 the doors accept, and 17-32 predict-only images were refused on an idle server). A busy server still refuses:
503 with Retry-After over HTTP, RESOURCE_EXHAUSTED with a ``retry-after`` in the trailing metadata over gRPC.

The device is held for real: the tiny model's call takes its lock first, so while the test holds that lock every
admitted image stays in the queue, and what the queue admits at once is seen, not guessed from timings."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from httpx import AsyncClient

from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.test_oip import b64

grpcclient = pytest.importorskip("tritonclient.grpc.aio", reason="tritonclient[grpc] is not installed (pip install -e '.[dev]')")
from tritonclient.grpc import InferInput, InferRequestedOutput  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

EXPLAIN = {"method": "idg", "steps": 4, "probe_steps": 4}


@pytest.fixture
def grpc_port(monkeypatch: pytest.MonkeyPatch) -> int:
    """The app opens the protocol's gRPC port too (IDG_GRPC_PORT, read by the settings), a free one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    monkeypatch.setenv("IDG_GRPC_PORT", str(port))
    return port


@asynccontextmanager
async def doors(app: FastAPI, port: int) -> AsyncIterator[tuple[AsyncClient, Any]]:
    """The app with its lifespan running: an HTTP client and Triton's own asyncio gRPC client on its gRPC port."""
    async with serve(app) as client:
        grpc = grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        try:
            yield client, grpc
        finally:
            await grpc.close()


@contextmanager
def device_held(app: FastAPI) -> Iterator[None]:
    """Every model call waits while inside: the tiny model's call takes its lock before it computes."""
    lock: threading.Lock = app.state.service.models["tiny"].net.lock
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


async def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.01)


def files(n: int) -> list[bytes]:
    return [image_bytes((7 * i % 256, 255 - 11 * i % 256, 90)) for i in range(n)]


async def http_infer(client: AsyncClient, n: int, explain: bool) -> tuple[int, dict[str, Any], dict[str, str]]:
    body: dict[str, Any] = {"inputs": [{"name": "image", "shape": [n], "datatype": "BYTES", "data": [b64(f) for f in files(n)]}]}
    if explain:
        body["parameters"] = EXPLAIN
    r = await client.post("/v2/models/tiny/infer", json=body)
    return r.status_code, r.json(), dict(r.headers)


async def grpc_infer(grpc: Any, n: int, explain: bool) -> Any:
    tensor = InferInput("image", [n], "BYTES")
    tensor.set_data_from_numpy(np.array(files(n), dtype=np.object_))
    outputs = [InferRequestedOutput("predicted_class")] + ([InferRequestedOutput("attribution")] if explain else [])
    return await grpc.infer("tiny", [tensor], outputs=outputs, parameters=EXPLAIN if explain else None)


async def advertised(client: AsyncClient, grpc: Any) -> int:
    """``max_batch_size`` of the model config, which both doors give alike."""
    over_http = (await client.get("/v2/models/tiny/config")).json()["max_batch_size"]
    over_grpc = (await grpc.get_model_config("tiny")).config.max_batch_size
    assert over_http == over_grpc
    return int(over_http)


def app_for(tiny_app: AppFactory) -> FastAPI:
    # the default queue bounds and batch limit (IDG_MAX_PREDICT_QUEUE 16, IDG_MAX_QUEUE 64, IDG_MAX_BATCH_FILES 32)
    return tiny_app(delay_s=0.01, batch_wait_ms=0.0, max_batch_images=8, max_round_images=512, warmup=False)


@pytest.mark.parametrize("door", ["http", "grpc"])
async def test_a_predict_only_batch_of_max_batch_size_is_admitted_whole_on_an_idle_server(
    tiny_app: AppFactory, grpc_port: int, door: str,
) -> None:
    app = app_for(tiny_app)
    async with doors(app, grpc_port) as (client, grpc):
        n = await advertised(client, grpc)
        assert n == 32 and app.state.settings.max_predict_queue == 16  # the defaults the issue met
        worker = app.state.service.worker
        with device_held(app):  # nothing finishes: every image the queue admits stays in it
            call = asyncio.create_task(http_infer(client, n, False) if door == "http" else grpc_infer(grpc, n, False))
            await until(lambda: worker.depth == n or call.done())
            assert worker.depth == n, call.result()  # all n at once (the 17th had been refused: 503)
        if door == "http":
            status, answer, _ = await call
            assert status == 200, answer
            outputs = {o["name"]: o for o in answer["outputs"]}
            assert outputs["predicted_class"]["shape"] == [n] and outputs["probabilities"]["shape"] == [n, 1000]
        else:
            assert (await call).as_numpy("predicted_class").shape == (n,)


@pytest.mark.parametrize("door", ["http", "grpc"])
async def test_an_explained_batch_of_max_batch_size_is_answered_on_an_idle_server(
    tiny_app: AppFactory, grpc_port: int, door: str,
) -> None:
    app = app_for(tiny_app)
    async with doors(app, grpc_port) as (client, grpc):
        n = await advertised(client, grpc)
        if door == "http":
            status, answer, _ = await http_infer(client, n, True)
            assert status == 200, answer
            assert {o["name"]: o["shape"] for o in answer["outputs"]}["attribution"] == [n, 3, 32, 32]
        else:
            assert (await grpc_infer(grpc, n, True)).as_numpy("attribution").shape == (n, 3, 32, 32)


async def test_a_busy_server_still_refuses_with_retry_after_over_both_doors(tiny_app: AppFactory, grpc_port: int) -> None:
    app = app_for(tiny_app)
    async with doors(app, grpc_port) as (client, grpc):
        n = await advertised(client, grpc)
        worker = app.state.service.worker
        with device_held(app):
            full = asyncio.create_task(http_infer(client, n, False))  # a whole batch fills the prediction queue
            await until(lambda: worker.depth == n or full.done())
            assert worker.depth == n, full.result()
            status, answer, headers = await http_infer(client, 1, False)
            assert status == 503 and "busy" in answer["error"], answer
            assert int(headers["retry-after"]) >= 1
            with pytest.raises(InferenceServerException) as refused:  # Triton's client: the status and the sentence
                await grpc_infer(grpc, 1, False)
            assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED" and "busy" in refused.value.message()
            code, trailing = await raw_grpc_infer(grpc_port)  # the trailing metadata, which Triton's client does not show
            assert code == "RESOURCE_EXHAUSTED" and int(trailing["retry-after"]) >= 1, trailing
        status, answer, _ = await full  # the batch admitted first is answered once the device goes on
        assert status == 200, answer


async def raw_grpc_infer(port: int) -> tuple[str, dict[str, str]]:
    """One image's ModelInfer on grpcio's own stub: the refusal's status code name and its trailing metadata."""
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    request = pb.ModelInferRequest(model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=files(1)))])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            await stub_of(channel).ModelInfer(request, timeout=30)
        except grpc.aio.AioRpcError as err:
            return err.code().name, {k: v for k, v in err.trailing_metadata() or () if isinstance(v, str)}
    raise AssertionError("the gRPC door answered a busy server")


def test_a_prediction_bound_below_the_largest_batch_is_raised_to_it_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    from app.core import config

    monkeypatch.setattr(config, "_WARNED", set())
    monkeypatch.setenv("IDG_MAX_PREDICT_QUEUE", "4")
    monkeypatch.setenv("IDG_MAX_QUEUE", "8")
    monkeypatch.setenv("IDG_MAX_BATCH_FILES", "12")
    with caplog.at_level("WARNING", logger="app.core.config"):
        settings = config.load_settings()
    assert settings.max_predict_queue == 4 and settings.predict_queue == 12
    assert "IDG_MAX_PREDICT_QUEUE=4 is raised to IDG_MAX_BATCH_FILES=12" in caplog.text
    assert "IDG_MAX_QUEUE=8 is below IDG_MAX_BATCH_FILES=12: an explained batch of more than 8 images is always refused" in caplog.text
    monkeypatch.setenv("IDG_MAX_PREDICT_QUEUE", "40")
    assert config.load_settings().predict_queue == 40  # a larger bound is kept
