"""The Open Inference Protocol (KServe v2, REST) beside the service's own routes, so KServe, Triton's
clients and other platforms can call it: ``/v2/health/live|ready``, ``/v2`` (server metadata),
``/v2/models/{name}`` (model metadata), ``/v2/models/{name}/ready`` and ``/v2/models/{name}/infer``; and Triton's
extensions: ``/v2/models/{name}/config`` (model configuration), ``/v2/models/stats`` and ``/v2/models/{name}/stats``
(inference statistics), ``POST /v2/repository/index``, and every model route under ``/versions/1`` (each model's one
version).

An inference request gives one of two inputs, batched along the first dimension:

- ``image``: ``BYTES`` of shape ``[N]``, each element an encoded image file (decoded, resized and
  cropped as /predict does);
- ``input``: pixels the model sees, ``FP32`` in [0, 1] (or ``UINT8`` in 0..255), ``[N, 3, S, S]``
  (NCHW) or ``[N, S, S, 3]`` (NHWC; told apart by the shape, or by the input's ``layout``
  parameter), ``S`` the model's crop size (its metadata says it).

Outputs: ``probabilities`` ``FP32 [N, classes]`` (its ``classification`` parameter gives the top k as
``"probability:index:label"`` strings instead) and ``predicted_class`` ``INT64 [N]``; and the
explanation set: ``attribution`` ``FP32 [N, 3, S, S]``, ``target`` ``INT64 [N]``, the output-α curve
as ``curve_alpha`` and ``curve_value`` ``FP32 [N, K]`` (the target's logit, or its probability for
guided_ig and agi: the output's ``output`` parameter says which, and its ``input`` whether the path is the
photo's or, with SmoothGrad, the first noisy copy's; NaN-padded if the images' K
differ), ``insertion`` / ``deletion`` ``FP32 [N]`` when ``faithfulness`` asks for them, and ``regions`` ``INT32
[N, S, S]`` (each pixel's region rank, 1 first) with ``postprocess`` xrai or cam_regions.

An explanation runs when the request asks for an explanation output, sets the parameter
``explain: true``, or gives any /attribute parameter (``method``, ``preset``, ``target``, ``steps``,
``faithfulness``, ...: the request's ``parameters``, checked as /attribute checks them).
Triton's reserved parameters (``priority``, ``timeout``, ``sequence_*``) are ignored. The body is JSON, or JSON then
binary data (``Content-Type`` absent, ``application/json`` or ``application/octet-stream``). Every image goes through
the service's one call (:mod:`app.service`): the same queue, batching, deadline from arrival and errors as /predict and
/attribute; errors come
in the protocol's form ``{"error": "..."}`` with the status /attribute would give. The API key
(``IDG_API_KEY``) guards every route but the two health probes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute

from app.api.deps import get_service, require_api_key
from app.api.oip import (
    HEADER_LENGTH,
    LARGE_REQUEST_BYTES,
    InferRequest,
    InferResponse,
    ModelConfig,
    ModelMetadata,
    ModelReady,
    ProtocolError,
    RepositoryModel,
    ServerLive,
    ServerMetadata,
    ServerReady,
    infer_response_parts,
    inline_schema,
    read_infer_request,
    write_infer_response,
)
from app.api.oip_inference import (
    EXTENSIONS,
    MODEL_VERSION,
    SERVER_NAME,
    Inferred,
    batch_limits,
    check_body_names,
    check_version,
    config_of,
    metadata_of,
    run_inference,
    statistics_of,
)
from app.api.requests import read_body, until_disconnected
from app.core.errors import ApiError, allow_header, documented_methods, oip_error
from app.core.image_threads import in_image_thread
from app.doors.layer import adopt_request_id
from app.schemas import ERROR_DESCRIPTIONS
from app.service import Service

log = logging.getLogger(__name__)

CONTENT_TYPES = ("application/json", "application/octet-stream")


class ProtocolRoute(APIRoute):
    """Answers every :class:`ApiError` of a v2 route, its dependencies' included (API key, not
    ready), in the protocol's error form ``{"error": "..."}``, with the status and headers it had."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as err:
                return JSONResponse(oip_error(err.message), status_code=err.status, headers=err.headers)

        return answer


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI docs of the error statuses a route answers, in the protocol's error form."""
    return {c: {"model": ProtocolError, "description": ERROR_DESCRIPTIONS[c]} for c in codes}


router = APIRouter(prefix="/v2", tags=["Open Inference Protocol (v2)"], route_class=ProtocolRoute)
guarded = [Depends(require_api_key)]
METADATA_ERRORS = errors(401, 404, 422, 503)  # 422: FastAPI documents it for any route with a path parameter
INFER_ERRORS = errors(400, 401, 404, 408, 413, 415, 422, 500, 503, 504)
INFER_DOCS = {"requestBody": {"required": True, "content": {"application/json": {"schema": inline_schema(InferRequest)}},
                              "description": "JSON; with Inference-Header-Content-Length, that many bytes of JSON followed by "
                              "the inputs' binary data (Triton's binary tensor data extension)"}}


@router.get("/health/live", response_model=ServerLive)
async def live() -> ServerLive:
    """200 while the process serves HTTP."""
    return ServerLive(live=True)


@router.get("/health/ready", response_model=ServerReady,
            responses={503: {"model": ServerReady, "description": "not loaded and warm yet, shutting down, or the worker is stuck"}})
async def ready(request: Request) -> JSONResponse:
    """200 once every model is loaded and warm; 503 otherwise (as /health/ready)."""
    state = request.app.state
    ok = bool(getattr(state, "ready", False)) and state.service.worker.stuck is None
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503, headers={} if ok else {"Retry-After": "5"})


@router.get("", response_model=ServerMetadata, dependencies=guarded, responses=errors(401))
async def server_metadata(request: Request) -> ServerMetadata:
    """The server's name, version and protocol extensions."""
    return ServerMetadata(name=SERVER_NAME, version=request.app.version, extensions=EXTENSIONS)


versioned_routes = [*guarded, Depends(check_version)]
VERSIONED = "/models/{name}/versions/{version}"


@router.post("/repository/index", response_model=list[RepositoryModel], dependencies=guarded, responses=errors(401, 503))
async def repository_index(service: Annotated[Service, Depends(get_service)]) -> list[RepositoryModel]:
    """Triton's repository index: every model served, its version and state (``READY``: the service serves only models
    it loaded and warmed)."""
    return [RepositoryModel(name=name, version=MODEL_VERSION, state="READY") for name in service.models]


@router.get("/models/stats", dependencies=guarded, responses=errors(401, 503))
async def all_statistics(service: Annotated[Service, Depends(get_service)]) -> dict[str, list[dict[str, Any]]]:
    """Triton's inference statistics of every model (its ``statistics`` extension): submissions (one image's prediction or
    explanation each) succeeded and failed, and their nanoseconds from arrival, in the queue and computing."""
    return {"model_stats": [statistics_of(service, name) for name in service.stats]}


@router.get(VERSIONED + "/stats", dependencies=versioned_routes, include_in_schema=False)
@router.get("/models/{name}/stats", dependencies=guarded, responses=METADATA_ERRORS)
async def statistics(name: str, service: Annotated[Service, Depends(get_service)]) -> dict[str, list[dict[str, Any]]]:
    """Triton's inference statistics of one model (see ``GET /v2/models/stats``)."""
    key, _ = service.model(name)
    return {"model_stats": [statistics_of(service, key)]}


@router.get(VERSIONED + "/config", response_model=ModelConfig, response_model_exclude_none=True, dependencies=versioned_routes,
            include_in_schema=False)
@router.get("/models/{name}/config", response_model=ModelConfig, response_model_exclude_none=True, dependencies=guarded,
            responses=METADATA_ERRORS)
async def model_config(name: str, service: Annotated[Service, Depends(get_service)]) -> ModelConfig:
    """Triton's model configuration (its ``model_configuration`` extension): the inputs and outputs as Triton's
    ``ModelConfig`` writes them, the batch dimension apart (``max_batch_size``: ``IDG_MAX_BATCH_FILES``)."""
    key, model = service.model(name)
    return config_of(key, model, service.settings.max_batch_files)


@router.get(VERSIONED, response_model=ModelMetadata, dependencies=versioned_routes, include_in_schema=False)
@router.get("/models/{name}", response_model=ModelMetadata, dependencies=guarded, responses=METADATA_ERRORS)
async def model_metadata(name: str, service: Annotated[Service, Depends(get_service)]) -> ModelMetadata:
    """The model's inputs and outputs (``-1``: any size)."""
    return metadata_of(*service.model(name))


@router.get(VERSIONED + "/ready", response_model=ModelReady, dependencies=versioned_routes, include_in_schema=False)
@router.get("/models/{name}/ready", response_model=ModelReady, dependencies=guarded, responses=METADATA_ERRORS)
async def model_ready(name: str, service: Annotated[Service, Depends(get_service)]) -> ModelReady:
    """200 when the model is loaded and the service ready (503 before, 404 for an unknown model)."""
    key, _ = service.model(name)
    return ModelReady(name=key, ready=True)


@router.post(VERSIONED + "/infer", dependencies=versioned_routes, include_in_schema=False)
@router.post("/models/{name}/infer", dependencies=guarded, openapi_extra=INFER_DOCS, responses={
    200: {"model": InferResponse, "description": "The outputs; with a binary output, the JSON (its length in "
          "Inference-Header-Content-Length) followed by the outputs' bytes", "content": {"application/octet-stream": {}}},
    **INFER_ERRORS})
async def infer(name: str, request: Request, service: Annotated[Service, Depends(get_service)]) -> Response:
    """Classify the images of ``image`` or ``input``, and explain them when asked (see the module's docs)."""
    received = time.perf_counter()
    if request.headers.get("content-encoding", "identity").lower() != "identity":
        raise ApiError(415, "compressed request bodies are not supported: send the body without Content-Encoding",
                       code="unsupported_media_type")
    _check_content_type(request.headers.get("content-type"))
    key, model = service.model(name)
    body = await read_body(request, service.settings.max_upload_bytes)
    read = partial(read_infer_request, body, request.headers.get(HEADER_LENGTH), batch_limits(service, model))
    req, tensors = await in_image_thread(read) if len(body) >= LARGE_REQUEST_BYTES else read()
    adopt_request_id(req.id)  # no X-Request-ID: the protocol's id names the request (its log lines, its X-Request-ID)
    check_body_names(req, name, key)
    inferred = await run_inference(service, key, model, req, tensors,
                                   service.context(received, until_disconnected=until_disconnected(request)))
    if inferred.large:  # attributions in JSON, 105 MB for 32 images: written a piece at a time, the loop serving the rest between
        return await _large_answer(inferred, received)
    payload, header_length = _answer(inferred, received)
    if header_length is None:
        return Response(payload, media_type="application/json")
    return Response(payload, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(header_length)})


SENT_BLOCK = 1 << 20
"""Bytes of a large answer handed to the server at once (its JSON pieces joined up to this size)."""


async def _large_answer(inferred: Inferred, received: float) -> StreamingResponse:
    """A large answer, written on the event loop a piece at a time (:data:`app.api.oip.JSON_SLICE` values), other requests
    served between the pieces, then sent in blocks with its Content-Length."""
    pieces, chunks = infer_response_parts(inferred.key, inferred.req.id, inferred.outputs(),
                                          {"total_ms": round((time.perf_counter() - received) * 1000, 3)})
    header = await _joined(pieces)
    headers = {"Content-Length": str(sum(map(len, header)) + sum(map(len, chunks)))}
    if chunks:
        headers["Inference-Header-Content-Length"] = str(sum(map(len, header)))

    async def body() -> AsyncIterator[bytes]:
        for block in [*header, *chunks]:
            yield block

    return StreamingResponse(body(), media_type="application/octet-stream" if chunks else "application/json", headers=headers)


async def _joined(pieces: Iterator[bytes]) -> list[bytes]:
    """``pieces`` made one at a time with the event loop free between them, joined in blocks of :data:`SENT_BLOCK`."""
    blocks: list[bytes] = []
    block: list[bytes] = []
    size = 0
    for piece in pieces:
        block.append(piece)
        size += len(piece)
        if size >= SENT_BLOCK:
            blocks.append(b"".join(block))
            block, size = [], 0
        await asyncio.sleep(0)
    if block:
        blocks.append(b"".join(block))
    return blocks


def _check_content_type(given: str | None) -> None:
    """415 unless the body is JSON (``application/json``) or the binary extension's JSON and bytes
    (``application/octet-stream``); no Content-Type is read as JSON, as Triton's clients send none."""
    if given is None:
        return
    kind = given.split(";", 1)[0].strip().lower()
    if kind not in CONTENT_TYPES:
        raise ApiError(415, f"Content-Type {kind or given!r} is not an inference request: send {' or '.join(CONTENT_TYPES)}",
                       code="unsupported_media_type")


def _answer(inferred: Inferred, received: float) -> tuple[bytes, int | None]:
    """The answer's body (and its JSON header's length when an output is binary)."""
    return write_infer_response(inferred.key, inferred.req.id, inferred.outputs(),
                                {"total_ms": round((time.perf_counter() - received) * 1000, 3)})


@router.api_route(VERSIONED + "{rest:path}", methods=["GET", "POST"], include_in_schema=False)
async def versioned(name: str, version: str, rest: str) -> None:
    """Any other version, or a route that has none: say so in the protocol's form."""
    await check_version(name, version)
    raise ApiError(404, f"/v2/models/{name}{rest} is not a route of the Open Inference Protocol here: see /v2/models/NAME",
                   code="not_found")


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"], include_in_schema=False)
async def unknown(rest: str, request: Request) -> None:
    """Any other /v2 path: a 404 in the protocol's form; a documented path with another method (``POST
    /v2/health/live``), which this catch-all takes before the router can answer it, a 405 with its ``Allow``."""
    documented = documented_methods(request.app, request.scope["path"])
    if documented and request.method not in documented:
        raise ApiError(405, f"{request.method} is not a method of /v2/{rest}: use {' or '.join(sorted(documented))}",
                       headers={"Allow": allow_header(documented)}, code="method_not_allowed")
    raise ApiError(404, f"/v2/{rest} is not a route of the Open Inference Protocol here: see /v2/models/NAME", code="not_found")


