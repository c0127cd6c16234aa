"""OpenTelemetry traces (IDG_TRACING, off by default), recorded by an in-memory exporter: one /attribute is a server span
with its route, status and request ID, and under it the upload's decoding, the job's queue wait and time in the worker
(and under that each model call), and the answer's rendering; a caller's traceparent continues its trace. Off unless IDG_TRACING says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.core import tracing
from tests.service.conftest import AppFactory, image_bytes, serve

pytest.importorskip("opentelemetry.sdk", reason="OpenTelemetry's SDK is not installed (the tracing extra)")
from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


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


def test_tracing_is_off_by_default(tiny_app: AppFactory) -> None:
    app = tiny_app(warmup=False)
    assert app.state.settings.tracing is False and not tracing.enabled() and tracing.capture() is None
