"""OpenTelemetry traces, off by default: ``IDG_TRACING=true`` turns them on (the ``tracing`` extra: opentelemetry-sdk and
its OTLP/HTTP exporter). Each call through a door (an HTTP request, a gRPC call, a job's image: :mod:`app.doors.layer`) is
a server span (its door, route, status and request ID; a caller's W3C ``traceparent`` continues its trace), and under
it each worker job the request ran: ``idg.queue_wait`` (admitted until the worker took it), ``idg.worker`` (taken until
answered) and, under that, one ``idg.model_call`` per model call that held its rows; beside them ``idg.decode`` and
``idg.render`` (an upload decoded, an answer rendered, in the image threads). Spans go over OTLP/HTTP where the SDK's
own variables say (``OTEL_EXPORTER_OTLP_ENDPOINT``, default http://localhost:4318, ``OTEL_EXPORTER_OTLP_HEADERS``...),
in batches off the request path.

The worker's spans are written when its job ends, from the times it kept (``time.monotonic``), so tracing adds no work
to a model call; with tracing off nothing here runs but a check of :func:`enabled`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

_tracer: Any = None  # an opentelemetry Tracer while enabled
_provider: Any = None


def enable(exporter: Any = None) -> None:
    """Trace this process: spans to ``exporter`` (a test's in-memory one), else over OTLP/HTTP in batches."""
    global _tracer, _provider
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError as err:
        raise RuntimeError("IDG_TRACING=true needs OpenTelemetry: .venv/bin/pip install -e '.[tracing]' torch==2.13.0") from err
    provider = TracerProvider(resource=Resource.create({"service.name": "idg-service"}))
    if exporter is None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as err:
            raise RuntimeError("IDG_TRACING=true needs the OTLP exporter: .venv/bin/pip install -e '.[tracing]' torch==2.13.0") from err
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("idg")


def disable() -> None:
    """Stop tracing (what was recorded is flushed)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def enabled() -> bool:
    return _tracer is not None


def capture() -> Any:
    """The current trace context (a request's, on the event loop) for spans recorded later elsewhere, or None."""
    if _tracer is None:
        return None
    from opentelemetry import context

    return context.get_current()


STAGES = {"_small_now": "idg.decode", "render": "idg.render", "_rendered": "idg.render"}
"""Span names of the image-thread functions (app.core.image_threads.in_image_thread): decoding an upload, rendering an answer."""


@contextlib.contextmanager
def span(name: str) -> Iterator[None]:
    """A span of the current request (a no-op with tracing off)."""
    if _tracer is None:
        yield
        return
    with _tracer.start_as_current_span(name):
        yield


def stage(fn: Callable[..., Any]) -> str:
    """The span name of an image-thread function: :data:`STAGES`, else ``idg.<its name>``."""
    name = getattr(fn, "__name__", "call")
    return STAGES.get(name, "idg." + name.strip("_"))


def _to_unix_ns() -> Callable[[float], int]:
    """``time.monotonic()`` -> Unix time in ns, as spans want it, by the wall clock now: the spans the SDK times itself
    (decoding, rendering) read the wall clock when they happen, so an offset taken once at start-up would put a job's
    spans apart from them by however far the wall clock has since been stepped or slewed (NTP on a VM: most of a second)."""
    offset = time.time_ns() - time.monotonic_ns()
    return lambda monotonic_s: int(monotonic_s * 1e9) + offset


def record_job(parent: Any, kind: str, model: str, enqueued: float, started: float | None, finished: float,
               calls: Sequence[tuple[float, float, int]], error: str | None) -> None:
    """A worker job's spans under ``parent`` (:func:`capture` when it was submitted): its queue wait, its time in the
    worker and its model calls (``(began, ended, images)``, ``time.monotonic``)."""
    if _tracer is None or parent is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    taken = started if started is not None else finished
    _ns = _to_unix_ns()
    attrs = {"idg.kind": kind, "idg.model": model}
    _tracer.start_span("idg.queue_wait", context=parent, start_time=_ns(enqueued), attributes=attrs).end(_ns(taken))
    work = _tracer.start_span("idg.worker", context=parent, start_time=_ns(taken), attributes={**attrs, "idg.model_calls": len(calls)})
    inside = trace.set_span_in_context(work, parent)
    for began, ended, images in calls:
        _tracer.start_span("idg.model_call", context=inside, start_time=_ns(began), attributes={"idg.call_images": images}).end(_ns(ended))
    if error is not None:
        work.set_status(Status(StatusCode.ERROR, error))
    work.end(_ns(finished))


@contextlib.contextmanager
def server_span(name: str, carrier: Mapping[str, str] | None, attributes: Mapping[str, Any], consumer: bool = False) -> Iterator[Any]:
    """The server span of one call through a door (:meth:`app.doors.layer.Doors.handle`), current while it runs, its parent
    the caller's ``traceparent`` in ``carrier`` (HTTP headers, gRPC metadata, a job's submitting request's): the span, or
    None with tracing off. ``consumer``: a job's image, taken up after its request was answered (a consumer span). Its
    status is :func:`end_server_span`'s, never an exception's."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    kind = SpanKind.CONSUMER if consumer else SpanKind.SERVER
    with _tracer.start_as_current_span(name, context=extract(dict(carrier or {})), kind=kind, attributes=dict(attributes),
                                       record_exception=False, set_status_on_exception=False) as span:
        yield span


def end_server_span(span: Any, name: str, attributes: Mapping[str, Any], error: bool) -> None:
    """Name ``span`` (a :func:`server_span`, or None) as the call ended up (``POST /jobs/{id}``), add ``attributes``, and
    mark it an error where the server failed."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.update_name(name)
    span.set_attributes(dict(attributes))
    if error:
        span.set_status(Status(StatusCode.ERROR))


def carrier() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``), to continue it elsewhere (a job's images); empty with
    tracing off."""
    if _tracer is None:
        return {}
    from opentelemetry.propagate import inject

    out: dict[str, str] = {}
    inject(out)
    return out
