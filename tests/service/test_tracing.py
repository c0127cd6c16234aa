"""OpenTelemetry traces (IDG_TRACING, off by default), recorded by an in-memory exporter: one /attribute is a server span
with its route, status and request ID, and under it the upload's decoding, the job's queue wait and time in the worker
(and under that each model call), and the answer's rendering; a caller's traceparent continues its trace. A gRPC call is
such a span too (Triton's client), and each image of a durable job a span under the POST /jobs that submitted it, with
its request ID. Off unless IDG_TRACING says so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.doors import tracing
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, images, wait_done
from tests.service.test_oip_grpc import free_port

pytest.importorskip("opentelemetry.sdk", reason="OpenTelemetry's SDK is not installed (the tracing extra)")
import opentelemetry.sdk.trace as sdk_trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.enable(exporter)
    try:
        yield exporter
    finally:
        tracing.disable()


def _files() -> dict[str, tuple[str, bytes, str]]:
    return {"file": ("a.png", image_bytes(), "image/png")}


def _children(of: ReadableSpan, every: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    assert of.context is not None
    return [s for s in every if s.parent is not None and s.parent.span_id == of.context.span_id]


async def test_one_attribute_is_a_trace_of_its_stages(tiny_app: AppFactory, spans: InMemorySpanExporter) -> None:
    async with serve(tiny_app(warmup=False)) as client:
        spans.clear()
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        r = await client.post("/attribute", files=_files(), data={"steps": "8", "probe_steps": "4", "return_overlay": "false"},
                              headers={"X-Request-ID": "trace-me", "traceparent": parent})
        assert r.status_code == 200
    every = spans.get_finished_spans()
    (server,) = [s for s in every if s.name == "POST /attribute"]
    assert server.attributes is not None and server.context is not None
    assert server.attributes["http.route"] == "/attribute" and server.attributes["http.response.status_code"] == 200
    assert server.attributes["idg.request_id"] == "trace-me"
    assert format(server.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace goes on
    stages = _children(server, every)
    assert sorted(s.name for s in stages) == ["idg.decode", "idg.queue_wait", "idg.render", "idg.worker"]
    decode, queue_wait, render, worker = sorted(stages, key=lambda s: s.name)
    assert (decode.end_time or 0) <= (queue_wait.start_time or 0) and (worker.end_time or 0) <= (render.start_time or 0)
    assert queue_wait.end_time is not None and worker.start_time is not None and queue_wait.end_time <= worker.start_time
    calls = _children(worker, every)
    assert calls and all(c.name == "idg.model_call" for c in calls)
    assert worker.attributes is not None and worker.attributes["idg.model_calls"] == len(calls) >= 2  # probe and path
    assert all(worker.start_time <= (c.start_time or 0) and (c.end_time or 0) <= (worker.end_time or 0) for c in calls)


async def test_a_wall_clock_stepped_since_start_up_keeps_the_stages_in_order(tiny_app: AppFactory, spans: InMemorySpanExporter,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # NTP steps a VM's wall clock after the process started (CI saw 0.8 s): the SDK times decoding and rendering by the
    # wall clock, the worker's stages by time.monotonic(); both must read the same, stepped, wall clock
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 2_000_000_000)
    monkeypatch.setattr(sdk_trace, "time_ns", time.time_ns)
    async with serve(tiny_app(warmup=False)) as client:
        spans.clear()
        r = await client.post("/attribute", files=_files(), data={"steps": "8", "probe_steps": "4", "return_overlay": "false"})
        assert r.status_code == 200
    every = spans.get_finished_spans()
    (server,) = [s for s in every if s.name == "POST /attribute"]
    decode, queue_wait, render, worker = sorted(_children(server, every), key=lambda s: s.name)
    assert [decode.name, queue_wait.name, render.name, worker.name] == ["idg.decode", "idg.queue_wait", "idg.render", "idg.worker"]
    assert (decode.end_time or 0) <= (queue_wait.start_time or 0) and (worker.end_time or 0) <= (render.start_time or 0)
    assert (server.start_time or 0) <= (queue_wait.start_time or 0) and (worker.end_time or 0) <= (server.end_time or 0)


def test_tracing_is_off_by_default(tiny_app: AppFactory) -> None:
    app = tiny_app(warmup=False)
    assert app.state.settings.tracing is False and not tracing.enabled() and tracing.capture() is None


async def test_a_grpc_call_is_one_server_span_with_its_stages_as_children(tiny_app: AppFactory,
                                                                          spans: InMemorySpanExporter) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="grpcio or tritonclient is not installed (pip install -e '.[dev]')")
    from tritonclient.utils import InferenceServerException

    port = free_port()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    tensor = grpcclient.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image_bytes()], dtype=np.object_))
    async with serve(tiny_app(warmup=False, grpc_port=port)):
        spans.clear()
        with grpcclient.InferenceServerClient(url=f"127.0.0.1:{port}") as client:
            await asyncio.to_thread(client.infer, "tiny", [tensor], parameters={"method": "ig", "steps": 4},
                                    headers={"x-request-id": "grpc-trace", "traceparent": parent})
            with pytest.raises(InferenceServerException):
                await asyncio.to_thread(client.infer, "nope", [tensor], headers={"x-request-id": "grpc-refused"})
    every = spans.get_finished_spans()
    by_id = {(s.attributes or {}).get("idg.request_id"): s for s in every if s.name == "inference.GRPCInferenceService/ModelInfer"}
    answered, refused = by_id["grpc-trace"], by_id["grpc-refused"]
    assert answered.kind == SpanKind.SERVER and answered.context is not None and answered.attributes is not None
    assert answered.attributes["idg.door"] == "grpc" and answered.attributes["rpc.method"] == "ModelInfer"
    assert answered.attributes["idg.status"] == "OK" and answered.status.status_code == StatusCode.UNSET
    assert format(answered.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # the caller's trace goes on
    stages = _children(answered, every)
    assert {"idg.queue_wait", "idg.worker"} <= {s.name for s in stages}, [s.name for s in stages]
    (worker,) = [s for s in stages if s.name == "idg.worker"]
    assert [c.name for c in _children(worker, every)] and all(c.name == "idg.model_call" for c in _children(worker, every))
    assert refused.attributes is not None and refused.attributes["idg.status"] == "NOT_FOUND"
    assert refused.parent is None and not _children(refused, every)  # a trace of its own, and no work under it


async def test_a_jobs_images_are_spans_under_the_post_that_submitted_it_with_its_request_id(
        tiny_app: AppFactory, spans: InMemorySpanExporter, tmp_path: Path) -> None:
    async with serve(tiny_app(warmup=False, data_dir=tmp_path)) as client:
        spans.clear()
        r = await client.post("/jobs", files=images(2), data=FAST, headers={"X-Request-ID": "batch-trace"})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        await wait_done(client, job)
    every = spans.get_finished_spans()
    (post,) = [s for s in every if s.name == "POST /jobs"]
    assert post.context is not None
    answered = [s for s in every if s.name == "job image"]
    assert len(answered) == 2
    for image in answered:
        assert image.parent is not None and image.parent.span_id == post.context.span_id
        assert image.context is not None and image.context.trace_id == post.context.trace_id
        assert image.kind == SpanKind.CONSUMER and image.attributes is not None
        assert image.attributes["idg.request_id"] == "batch-trace" and image.attributes["idg.job"] == job
        assert image.attributes["idg.door"] == "job" and image.attributes["idg.status"] == "200"
        assert {"idg.queue_wait", "idg.worker"} <= {s.name for s in _children(image, every)}
    assert sorted((s.attributes or {})["idg.image"] for s in answered) == [0, 1]
