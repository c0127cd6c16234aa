"""The Open Inference Protocol over gRPC: KServe's ``GRPCInferenceService`` (``grpc_predict_v2.proto``) with Triton's
model configuration, repository index and statistics, as ``tritonclient.grpc`` calls it, on ``IDG_GRPC_PORT``.

A door like :mod:`app.api.routes.v2`, and no more: each call is read into the HTTP door's request
(:func:`app.api.oip.validate_request`, :func:`app.api.oip.decode_tensor`), answered by the same
:func:`app.api.oip_inference.run_inference` (the service's one call), and written from the same outputs. The differences are
the protocol's: tensors come in ``raw_input_contents`` (what tritonclient sends) or typed ``contents``, outputs go back in
``raw_output_contents``; the deadline is the call's gRPC deadline or ``IDG_REQUEST_TIMEOUT_S``, whichever is sooner,
counted from arrival; the API key comes as metadata (``x-api-key``, or ``authorization: Bearer KEY``) on every call but
``ServerLive`` and ``ServerReady``; the service's errors are status codes (:func:`status_code`); the trailing metadata
``x-idg-replica`` names the server process that answered, and ``retry-after`` (seconds) comes with a refusal that
HTTP answers with ``Retry-After`` (busy or a key's full share: RESOURCE_EXHAUSTED; shutting down: UNAVAILABLE). The
server runs on the app's event loop (``grpc.aio``), opened by the lifespan once ready and closed first on the way out.

The generated messages are tritonclient's (``tritonclient.grpc.service_pb2``: KServe's ``inference`` package, Triton's
extensions included), so nothing here is generated: the grpc extra (``.venv/bin/pip install -e '.[grpc]' torch==2.13.0``) provides
grpcio, protobuf and tritonclient.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
from fastapi import FastAPI
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc import aio
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

from app.api.deps import ready_service
from app.api.failures import internal_error
from app.api.oip import (
    DTYPES,
    LARGE_REQUEST_BYTES,
    BatchLimits,
    InferRequest,
    RequestInput,
    Scalar,
    Tensor,
    bad,
    decode_tensor,
    json_numbers,
    validate_request,
)
from app.api.oip_inference import (
    EXTENSIONS,
    MODEL_VERSION,
    SERVER_NAME,
    batch_limits,
    check_version,
    config_of,
    metadata_of,
    run_inference,
    statistics_of,
)
from app.core.config import Settings
from app.core.errors import SHUTTING_DOWN, ApiError
from app.core.image_threads import in_image_thread
from app.doors.door import GRPC, MESSAGE_TOO_LARGE, api_key_refusal, grpc_status_name
from app.doors.drain import Drain
from app.doors.keys import match
from app.doors.layer import Doors
from app.doors.replica import replica_id
from app.doors.request_id import current_request_id
from app.service import Service
from idg_models import ImageClassifier

log = logging.getLogger(__name__)

SERVICE = "inference.GRPCInferenceService"
CONTENTS = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT32": "int_contents", "INT64": "int64_contents",
            "UINT8": "uint_contents"}
"""The ``InferTensorContents`` field of each numeric type (``BYTES``: ``bytes_contents``)."""
REQUEST_ID = "x-request-id"
"""The metadata of a call's request ID: given (else the protocol's request ``id``, else made), and returned in the
answer's initial and trailing metadata."""
WORK_RPCS = frozenset({"ModelInfer"})
"""The RPCs that take the worker's queue slots (one of the API key's share of them each)."""
QUIET_RPCS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
"""The probes: counted, not logged one by one (as HTTP's)."""
RPCS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelConfig", "ModelStatistics",
        "RepositoryIndex", "ModelInfer")


def status_code(err: ApiError) -> grpc.StatusCode:
    """The gRPC status of the service's error (:func:`app.doors.door.grpc_status_name`): a busy queue or a key's full share
    is RESOURCE_EXHAUSTED (retry later), not ready or shutting down UNAVAILABLE (retry elsewhere), any other 4xx
    INVALID_ARGUMENT."""
    return grpc.StatusCode[grpc_status_name(err)]


def _scalar(p: pb.InferParameter, where: str) -> Scalar:
    choice = p.WhichOneof("parameter_choice")
    if choice is None:
        raise bad(f"{where} has no value")
    value: Scalar = getattr(p, choice)
    return value


def _set(p: pb.InferParameter, value: Scalar) -> None:
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = value


def _parameters(given: Any, where: str) -> dict[str, Scalar]:
    return {k: _scalar(v, f"{where} parameter {k!r}") for k, v in given.items()}


def _raw(spec: RequestInput, contents: pb.InferTensorContents) -> bytes:
    """Typed ``contents`` as the binary extension's bytes (checked as JSON ``data`` is: integers in range, finite floats)."""
    if spec.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(s)) + s for s in contents.bytes_contents)
    if spec.datatype not in CONTENTS:
        raise bad(f"input {spec.name!r}: datatype {spec.datatype} is not supported; send BYTES, FP32 or UINT8")
    items = list(getattr(contents, CONTENTS[spec.datatype]))
    return json_numbers(items, DTYPES[spec.datatype], spec.name, spec.datatype).tobytes()


def read_request(request: pb.ModelInferRequest, limits: BatchLimits) -> tuple[InferRequest, list[Tensor]]:
    """The HTTP door's inference request and its tensors, from a ``ModelInferRequest`` (400 for what it would refuse;
    ``limits`` checked from the shapes before any tensor's contents are read)."""
    req = validate_request({
        "id": request.id or None,
        "parameters": _parameters(request.parameters, "the request's"),
        "inputs": [{"name": i.name, "shape": list(i.shape), "datatype": i.datatype, "parameters": _parameters(i.parameters, "an input's")}
                   for i in request.inputs],
        "outputs": [{"name": o.name, "parameters": _parameters(o.parameters, "an output's")} for o in request.outputs] or None,
    })
    limits.check(req)
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise bad(f"raw_input_contents holds {len(raw)} tensors for {len(req.inputs)} inputs")
    tensors = []
    for i, (spec, given) in enumerate(zip(req.inputs, request.inputs, strict=True)):
        data = raw[i] if raw else _raw(spec, given.contents) if given.HasField("contents") else None
        if data is None:
            raise bad(f"input {spec.name!r} has neither contents nor raw_input_contents")
        tensors.append(decode_tensor(spec, data))
    return req, tensors


Handler = Callable[[Any, aio.ServicerContext], Awaitable[Any]]


@dataclass(frozen=True)
class Malformed:
    """Bytes that are not the call's request message: INVALID_ARGUMENT (grpc's own deserializer failure is INTERNAL)."""

    reason: str


@dataclass(frozen=True)
class TooLarge:
    """A message over ``IDG_MAX_UPLOAD_BYTES`` (``size`` its bytes; None: over grpc's own bound, :data:`GRPC_MESSAGE_CAP`,
    so grpc refused it unread): RESOURCE_EXHAUSTED, counted under its RPC and in ``idg_rejections_total``."""

    size: int | None


def _read(kind: Any, limit: int, data: bytes) -> Any:
    if len(data) > limit:  # not parsed: the service's own refusal, counted, logged and traced as every other
        return TooLarge(len(data))
    try:
        return kind.FromString(data)
    except DecodeError as err:
        return Malformed(str(err) or "it cannot be parsed")


GRPC_MESSAGE_CAP = 2
"""grpc reads messages up to this many times ``IDG_MAX_UPLOAD_BYTES`` (beyond, it refuses them unread, its own
RESOURCE_EXHAUSTED, which the service still counts and logs: :class:`TooLarge`); the service refuses those over the
limit itself, with its own message."""


async def _first(requests: AsyncIterator[Any]) -> Any:
    """The call's request message: the first the client sent (a unary client sends one). None arrived: grpc refused it
    unread (over :data:`GRPC_MESSAGE_CAP`), and has answered the call already."""
    async for request in requests:
        return request
    return TooLarge(None)


GRPC_DEADLINE_MARGIN_S = 0.05
"""How much sooner than the call's gRPC deadline the service's own ends: both fall on the event loop at the same
instant otherwise, and where grpc's cancellation came first the work was dropped uncounted (neither
``reason="deadline"`` nor ``client_disconnected`` in ``idg_rejections_total``; 1 run in 3 on a loaded 2-core VM)."""


class InferenceService:
    """The RPCs of ``GRPCInferenceService`` this service answers (the others answer UNIMPLEMENTED)."""

    def __init__(self, app: FastAPI) -> None:
        self.state = app.state
        self.version = app.version
        self.doors: Doors = app.state.doors

    def handlers(self) -> grpc.GenericRpcHandler:
        methods: dict[str, tuple[Handler, Any, bool]] = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest, False),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest, False),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest, True),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest, True),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest, True),
            "ModelConfig": (self.model_config, pb.ModelConfigRequest, True),
            "ModelStatistics": (self.model_statistics, pb.ModelStatisticsRequest, True),
            "RepositoryIndex": (self.repository_index, pb.RepositoryIndexRequest, True),
            "ModelInfer": (self.model_infer, pb.ModelInferRequest, True),
        }
        # stream-unary on the server's side (a unary client's call is the same on the wire): the handler runs even when
        # grpc refuses the message unread, so that refusal is counted under its RPC as every other (a unary handler is
        # never called then)
        limit = self.state.settings.max_upload_bytes
        return grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.stream_unary_rpc_method_handler(self._guarded(name, fn, key), request_deserializer=partial(_read, kind, limit),
                                                       response_serializer=lambda m: m.SerializeToString())
            for name, (fn, kind, key) in methods.items()})

    def _guarded(self, name: str, fn: Handler, needs_key: bool) -> Handler:
        """``fn`` through the door (:meth:`app.doors.layer.Doors.handle`: the request ID, its share of the queue for the API
        key of a ``ModelInfer``, the count, the access log line, the span), behind the API key (``needs_key``), with the
        service's errors as status codes and any other failure a logged INTERNAL (never UNKNOWN)."""
        quiet = name in QUIET_RPCS

        async def call(requests: AsyncIterator[Any], context: aio.ServicerContext) -> Any:
            request = await _first(requests)
            metadata = {k.lower(): v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
            given = metadata.get(REQUEST_ID) or getattr(request, "id", None) or None  # the metadata's, else the protocol's id
            with self.doors.handle(GRPC, name, request_id=given, carrier=metadata, name=f"{SERVICE}/{name}", line=f"gRPC {name}",
                                   quiet=quiet, attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": name}) as door:
                door.fields["rpc"] = name
                # which server process answered (as X-IDG-Replica says over HTTP) and the request's ID, whatever the status
                trailing = (("x-idg-replica", replica_id()), (REQUEST_ID, door.request_id))
                context.set_trailing_metadata(trailing)
                if not (isinstance(request, TooLarge) and request.size is None):  # grpc answered that one already
                    await context.send_initial_metadata(((REQUEST_ID, door.request_id),))
                drain: Drain = self.state.drain  # counted as in flight: a shutdown's drain waits for the call within its grace
                with drain.track() as task:  # and cancels it when the grace is over
                    try:
                        if isinstance(request, TooLarge):
                            self.doors.metrics.rejections.labels(MESSAGE_TOO_LARGE).inc()
                            limit = self.state.settings.max_upload_bytes
                            size = f"more than {GRPC_MESSAGE_CAP * limit}" if request.size is None else str(request.size)
                            raise ApiError(413, f"the {name}Request message has {size} bytes, over the limit of {limit} bytes "
                                           "(IDG_MAX_UPLOAD_BYTES): send fewer or smaller images per call", code=MESSAGE_TOO_LARGE)
                        if isinstance(request, Malformed):
                            raise bad(f"the request is not a {name}Request message: {request.reason}")
                        if needs_key:
                            refusal = api_key_refusal(GRPC, self.state.keys, metadata)
                            if refusal is not None:
                                raise refusal
                            if name in WORK_RPCS:  # the key's share of the queue, its HTTP calls' and jobs' with it
                                given_key = GRPC.given_key(metadata)
                                door.admit(None if given_key is None else match(self.state.keys, given_key))
                        answer = await fn(request, context)
                        door.status = GRPC.success
                        return answer
                    except ApiError as err:
                        failure = err
                    except asyncio.CancelledError:
                        if not drain.absorb_abort(task):
                            raise
                        failure = ApiError(503, SHUTTING_DOWN, code="shutting_down")
                    except Exception as err:  # noqa: BLE001 - a bug: logged with its traceback, answered INTERNAL
                        failure = internal_error(err, f"gRPC {name}")
                code = status_code(failure)
                door.status = code.name
                wait = failure.headers.get("Retry-After")  # a refusal's wait, as HTTP's Retry-After says it
                return await context.abort(code, failure.message, trailing if wait is None else (*trailing, ("retry-after", wait)))

        return call

    def _service(self) -> Service:
        return ready_service(self.state)

    async def server_live(self, request: pb.ServerLiveRequest, context: aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request: pb.ServerReadyRequest, context: aio.ServicerContext) -> pb.ServerReadyResponse:
        state = self.state
        ready = bool(getattr(state, "ready", False)) and not state.draining and state.service.worker.stuck is None
        return pb.ServerReadyResponse(ready=ready)

    async def model_ready(self, request: pb.ModelReadyRequest, context: aio.ServicerContext) -> pb.ModelReadyResponse:
        """Ready: the service is, the model is one it serves, and the version is its one (else false, as Triton answers)."""
        service = self._service()
        return pb.ModelReadyResponse(ready=request.name in service.models and request.version in ("", MODEL_VERSION))

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: aio.ServicerContext) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=self.version, extensions=EXTENSIONS)

    async def _model(self, name: str, version: str) -> tuple[Service, str, ImageClassifier]:
        service = self._service()
        if not name:  # not the default model, as /attribute without one: the protocol names its model
            raise ApiError(404, f"name a model: {', '.join(service.models)}", code="unknown_model")
        await check_version(name, version or MODEL_VERSION)
        key, model = service.model(name)
        return service, key, model

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: aio.ServicerContext) -> pb.ModelMetadataResponse:
        _, key, model = await self._model(request.name, request.version)
        meta = metadata_of(key, model)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta.name, versions=meta.versions, platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs])

    async def model_config(self, request: pb.ModelConfigRequest, context: aio.ServicerContext) -> pb.ModelConfigResponse:
        service, key, model = await self._model(request.name, request.version)
        config = config_of(key, model, service.settings.max_batch_files).model_dump(exclude_none=True)
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

    async def model_statistics(self, request: pb.ModelStatisticsRequest,
                               context: aio.ServicerContext) -> pb.ModelStatisticsResponse:
        """One model's statistics, or every model's when the request names none."""
        service = self._service()
        if request.name:
            await check_version(request.name, request.version or MODEL_VERSION)
        names = [service.model(request.name)[0]] if request.name else list(service.stats)
        return pb.ModelStatisticsResponse(model_stats=[
            json_format.ParseDict(statistics_of(service, n), pb.ModelStatistics()) for n in names])

    async def repository_index(self, request: pb.RepositoryIndexRequest,
                               context: aio.ServicerContext) -> pb.RepositoryIndexResponse:
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(name=n, version=MODEL_VERSION, state="READY") for n in self._service().models])

    async def model_infer(self, request: pb.ModelInferRequest, context: aio.ServicerContext) -> pb.ModelInferResponse:
        """Classify (and explain) the images of ``image`` or ``input``: :func:`app.api.oip_inference.run_inference`, the HTTP
        door's call, within the gRPC deadline or the service's, whichever is sooner."""
        received = time.perf_counter()
        remaining = context.time_remaining()
        service, key, model = await self._model(request.model_name, request.model_version)
        read = partial(read_request, request, batch_limits(service, model))
        req, tensors = await in_image_thread(read) if request.ByteSize() >= LARGE_REQUEST_BYTES else read()
        if remaining is not None:  # end the work just before grpc cancels the call, so the service's deadline answers it
            remaining = max(remaining - GRPC_DEADLINE_MARGIN_S, 0.0)
        timeout = service.settings.request_timeout_s if remaining is None else min(service.settings.request_timeout_s, remaining)
        inferred = await run_inference(service, key, model, req, tensors, service.context(received, timeout=max(timeout, 1e-3)))

        def answer() -> pb.ModelInferResponse:
            # the request's id, or none given, its request ID (as the HTTP door's answer says)
            response = pb.ModelInferResponse(model_name=key, model_version=MODEL_VERSION, id=req.id or current_request_id() or "")
            for out, _ in inferred.outputs():
                tensor = response.outputs.add(name=out.name, datatype=out.datatype, shape=out.dims)
                for k, v in out.parameters.items():
                    _set(tensor.parameters[k], v)
                response.raw_output_contents.append(out.binary())
            _set(response.parameters["total_ms"], round((time.perf_counter() - received) * 1000, 3))
            return response

        return await asyncio.to_thread(answer) if inferred.large else answer()


async def start_grpc(app: FastAPI, settings: Settings) -> aio.Server:
    """Open the protocol's gRPC port (``IDG_GRPC_PORT`` on ``IDG_HOST``) on the running event loop. Every server process
    binds it with ``SO_REUSEPORT`` (grpc's default on Linux), as they share the HTTP port; messages up to
    ``IDG_MAX_UPLOAD_BYTES`` are read (larger: RESOURCE_EXHAUSTED, the service's own up to :data:`GRPC_MESSAGE_CAP` times
    that, grpc's beyond; both counted), answers of any size written."""
    cap = min(GRPC_MESSAGE_CAP * settings.max_upload_bytes, 2**31 - 1)
    server = aio.server(options=[("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", cap),
                                 ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((InferenceService(app).handlers(),))
    app.state.doors.init_routes(GRPC, list(RPCS))
    address = f"[{settings.host}]:{settings.grpc_port}" if ":" in settings.host else f"{settings.host}:{settings.grpc_port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as err:
        raise RuntimeError(f"cannot listen for gRPC on {address} (IDG_GRPC_PORT): {err}") from err
    await server.start()
    log.info("Open Inference Protocol over gRPC on %s", address)
    return server
