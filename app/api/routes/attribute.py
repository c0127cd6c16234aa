"""POST /attribute (one image), /attribute/stream (Server-Sent Events progress) and
/attribute/batch (several images, one status each)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter

from app.api.deps import get_service, require_api_key
from app.api.failures import alone, internal_error
from app.api.requests import body_docs, read_batch_request, read_image_request, until_disconnected
from app.core.errors import ApiError, error_detail
from app.doors.request_id import current_request_id
from app.schemas import ERROR_RESPONSES, AttributeJSON, AttributeParams, AttributeResponse, BatchItem, BatchResponse, ErrorDetail
from app.service import Service

router = APIRouter(dependencies=[Depends(require_api_key)])
DOCS = body_docs(AttributeParams, AttributeJSON)
_FIELDS = dict(AttributeParams.model_json_schema()["properties"])
_FILES = {"type": "array", "items": {"type": "string", "format": "binary"}, "description": "The images (repeat the field)"}
BATCH_DOCS = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["files"], "properties": {"files": _FILES, **_FIELDS}}}}}}


@router.post("/attribute", response_model=AttributeResponse, responses=ERROR_RESPONSES, openapi_extra=DOCS)
async def attribute(request: Request, service: Annotated[Service, Depends(get_service)]) -> AttributeResponse:
    """Attribution heatmaps and the logit-α curve for one image: multipart ``file`` + form fields
    (``curl -F file=@photo.jpg -F method=idg -F target=207``) or JSON with a base64 ``image``."""
    received = time.perf_counter()
    data, params = await read_image_request(request, AttributeParams, AttributeJSON, service.settings.max_upload_bytes)
    call = service.explain_request(params, service.context(received, until_disconnected=until_disconnected(request)))
    return await alone(service.attribute(call, data), "POST /attribute")


def _sse(event: str, payload: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(payload)}\n\n"


@router.post(
    "/attribute/stream", openapi_extra=DOCS,
    responses={
        **ERROR_RESPONSES,
        200: {"content": {"text/event-stream": {}}, "description": "events: accepted, queued, started, progress, result | error"},
    },
)
async def attribute_stream(request: Request, service: Annotated[Service, Depends(get_service)]) -> StreamingResponse:
    """The same request as /attribute, answered as Server-Sent Events: ``accepted``, ``queued``
    (position), ``started``, ``progress`` (worker round and the points it needs next), then
    ``result`` (the /attribute body) or ``error`` ({status, code, message, request_id}). Closing the
    connection cancels the work."""
    received = time.perf_counter()
    data, params = await read_image_request(request, AttributeParams, AttributeJSON, service.settings.max_upload_bytes)
    events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    context = service.context(received, until_disconnected=until_disconnected(request),
                              on_event=lambda e: events.put_nowait((e.pop("event"), e)))
    call = service.explain_request(params, context)  # a bad parameter is a 422, not a stream that opens to say so

    async def work() -> None:
        try:
            result = await service.attribute(call, data)
            events.put_nowait(("result", result.model_dump(mode="json")))
        except Exception as err:  # noqa: BLE001 - whatever fails, the stream ends with an ``error`` event
            api = err if isinstance(err, ApiError) else internal_error(err, "POST /attribute/stream")
            events.put_nowait(("error", error_detail(api.status, api.message, api.code)))  # with the request's ID

    async def stream() -> AsyncIterator[str]:
        task = asyncio.create_task(work())
        try:
            yield _sse("accepted", {"method": params.method})
            while True:
                event, payload = await events.get()
                yield _sse(event, payload)
                if event in ("result", "error"):
                    return
        finally:
            task.cancel()  # the client went away: Service.run drops the job

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/attribute/batch", response_model=BatchResponse, responses=ERROR_RESPONSES, openapi_extra=BATCH_DOCS)
async def attribute_batch(request: Request, service: Annotated[Service, Depends(get_service)]) -> StreamingResponse:
    """Several images (multipart ``files``, repeated) with one set of /attribute form fields; one
    result per image, each with its own status, so a bad image does not fail the others. The
    images go through the same queue and share model calls."""
    received = time.perf_counter()
    files, params = await read_batch_request(request, service.settings.max_upload_bytes, service.settings.max_batch_files)
    call = service.explain_request(params, service.context(received, until_disconnected=until_disconnected(request)))
    # shared by every image: one 422 for the batch

    async def one(name: str, data: bytes) -> BatchItem:
        try:
            result = await service.attribute(call, data)
            return BatchItem(filename=name, status=200, result=result)
        except Exception as err:  # noqa: BLE001 - whatever fails, it fails this item only
            api = err if isinstance(err, ApiError) else internal_error(err, f"POST /attribute/batch item {name!r}")
            return BatchItem(filename=name, status=api.status, error=ErrorDetail(status=api.status, code=api.code, message=api.message,
                                                                                   request_id=current_request_id()))

    items = await asyncio.gather(*[one(name, data) for name, data in files])
    batch = BatchResponse(items=list(items), succeeded=sum(i.status == 200 for i in items), failed=sum(i.status != 200 for i in items))
    return await _batch_answer(batch)


_ITEM = TypeAdapter(BatchItem)


async def _batch_answer(batch: BatchResponse) -> StreamingResponse:
    """The batch's JSON, its items serialised one at a time (by pydantic, as FastAPI would the whole answer: the same
    bytes) with the event loop free between them, then sent with its Content-Length. At once, 8 explained images of a
    1024-pixel model with their arrays and PNGs, 174 MB, had held the loop 0.37 s (/health/live waited)."""
    shell = batch.model_copy(update={"items": []}).model_dump_json()
    before, after = shell.split('"items":[]', 1)
    pieces = [f'{before}"items":['.encode()]
    for i, item in enumerate(batch.items):
        if i:
            pieces.append(b",")
        pieces.append(_ITEM.dump_json(item))
        await asyncio.sleep(0)
    pieces.append(f"]{after}".encode())
    return StreamingResponse(_each(pieces), media_type="application/json", headers={"Content-Length": str(sum(map(len, pieces)))})


async def _each(pieces: Iterable[bytes]) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece
