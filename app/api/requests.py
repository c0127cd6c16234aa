"""Reading a request body: multipart form (``file`` + fields) or JSON (base64 ``image`` + fields)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import IO, Literal, TypeVar, get_args, get_origin

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException

from app.api.multipart import FilePart, FormItems, simple_form
from app.core.errors import ApiError
from app.schemas import AttributeCommon, AttributeParams, ImageJSON

P = TypeVar("P", bound=BaseModel)
log = logging.getLogger(__name__)


_ASCII_WHITESPACE = str.maketrans("", "", " \t\n\r\f\v")


def decode_base64(text: str) -> bytes:
    """Base64 (with or without a ``data:`` URL prefix) -> bytes. Line breaks and other ASCII
    whitespace are dropped first: ``base64`` and ``base64.encodebytes`` wrap lines at 76 columns."""
    if "," in text[:100] and text.startswith("data:"):
        text = text.split(",", 1)[1]
    text = text.translate(_ASCII_WHITESPACE)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ApiError(400, "image is not valid base64", code="bad_image") from err


def first_error(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first error as one sentence; an unknown field's names the fields ``model`` (the route's body) takes."""
    e = err.errors()[0]
    where = ".".join(str(p) for p in e.get("loc", ()))
    if e.get("type") == "extra_forbidden":
        if model is None:
            return f"{where}: unknown field"
        names = sorted(f.alias or name for name, f in model.model_fields.items())
        return f"{where}: unknown field; the fields here are {', '.join(names)}"
    return f"{where}: {e.get('msg')}" if where else str(e.get("msg"))


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes with 413 (before reading, when the
    client declares its length) and a body slower than ``body_timeout_s`` (or, with a declared
    length, than ``min_upload_rate``) with 408 (closing the connection, so the slow client's socket
    is freed). A client that goes away raises Starlette's ``ClientDisconnect`` (answered and counted
    as 499 by the error handlers and the metrics)."""
    chunks: list[bytes] = []

    async def keep(chunk: bytes) -> None:
        chunks.append(chunk)

    await _read_chunks(request, limit, keep)
    body = b"".join(chunks)
    request._body = body  # noqa: SLF001 - lets request.form() parse the body read here
    return body


SPOOL_FLUSH_BYTES = 1 << 20
"""A spooled body is written out in pieces of this size, each in a thread (the event loop never writes to disk)."""


async def spool_body(request: Request, limit: int, spool: IO[bytes]) -> int:
    """The body written to ``spool`` (a file: a large job upload waits on disk, not in memory, for its turn to be
    unpacked), with :func:`read_body`'s limits; its length. ``spool`` is rewound."""
    pending: list[bytes] = []
    size = held = 0

    async def write(chunk: bytes) -> None:
        nonlocal size, held
        pending.append(chunk)
        size += len(chunk)
        held += len(chunk)
        if held >= SPOOL_FLUSH_BYTES:
            await asyncio.to_thread(spool.writelines, list(pending))
            pending.clear()
            held = 0

    await _read_chunks(request, limit, write)
    await asyncio.to_thread(spool.writelines, pending)
    spool.seek(0)
    return size


async def _read_chunks(request: Request, limit: int, each: Callable[[bytes], Awaitable[None]]) -> None:
    """Every chunk of the body to ``each``, within the limits of :func:`read_body`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body has {int(declared)} bytes, more than the limit of {limit}", code="too_large")
    settings = request.app.state.settings
    timeout = settings.body_timeout_s
    if declared is not None and declared.isdigit():
        timeout = max(timeout, int(declared) / settings.min_upload_rate)
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"the request body is larger than the limit of {limit} bytes", code="too_large")
                await each(chunk)
    except TimeoutError as err:
        request.app.state.metrics.read_timeouts.labels("body").inc()
        log.info("request body to %s did not arrive within %g s (%d bytes came); answering 408", request.url.path, timeout, size)
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s ({size} bytes came)",
                       headers={"Connection": "close"}, code="body_timeout") from err


def until_disconnected(request: Request) -> Callable[[], Awaitable[None]]:
    """A coroutine function that returns once the client of ``request`` (whose body was read) has
    gone away: the server's next ASGI message for it is then ``http.disconnect`` (uvicorn sends it
    when the connection is lost, or once the answer is sent). One wait per request: polling
    ``request.is_disconnected()`` cost the event loop time for every waiting request, every poll
    (measured: docs/results/speed.md)."""
    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.2)  # more body after the body was read: not expected; never a busy loop

    return wait


async def read_image_request(request: Request, params_cls: type[P], json_cls: type[ImageJSON], limit: int) -> tuple[bytes, P]:
    """Image bytes and validated parameters, from a multipart or a JSON body."""
    ctype = request.headers.get("content-type", "").lower()
    body = await read_body(request, limit)
    if ctype.startswith("application/json"):
        try:
            payload = json_cls.model_validate_json(body)
            check_json_types(json.loads(body), json_cls)
        except ValidationError as err:
            raise ApiError(422, first_error(err, json_cls), code="invalid_parameter") from err
        fields = payload.model_dump(exclude={"image"}, exclude_unset=True, exclude_none=True)  # null: not given
        return _not_empty(decode_base64(payload.image)), _validate(params_cls, fields)
    if ctype.startswith("multipart/form-data"):
        items = simple_form(body, request.headers.get("content-type", ""), max_files=2, max_fields=64)
        if items is None:  # not the common form: Starlette's parser reads it, and words what is wrong
            close = closing_delimiter(request.headers.get("content-type", ""))
            if close and close not in body:  # its parser drops a part left open
                raise unclosed_form(close)
            try:
                form = await request.form(max_files=2, max_fields=64)
            except Exception as err:  # noqa: BLE001 - any multipart parse failure is the client's
                raise ApiError(400, f"the multipart body could not be parsed: {err}", code="bad_request") from err
            items = [(k, v if isinstance(v, str) else FilePart(v.filename or "", await v.read())) for k, v in form.multi_items()]
        uploads = [v for k, v in items if k == "file"]
        if len(uploads) > 1:  # which one would count is no rule a client should have to guess (the last had, silently)
            raise ApiError(422, f"file: given {len(uploads)} times; send one image a request (several: POST /attribute/batch)",
                           code="invalid_parameter")
        upload = uploads[0] if uploads else None
        if not isinstance(upload, FilePart):
            raise ApiError(422, "file: send the image as a multipart file field named 'file'", code="missing_file")
        return _not_empty(upload.data), _validate(params_cls, form_fields(items, "file"))
    raise ApiError(
        415, "send multipart/form-data with the image in a 'file' field, or application/json with a base64 'image'",
        code="unsupported_media_type",
    )


_FILE_PART = re.compile(rb"^content-disposition:[^\r\n]*\bfilename\*?=", re.IGNORECASE | re.MULTILINE)
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)


def closing_delimiter(content_type: str) -> bytes | None:
    """A multipart body's close delimiter (``--BOUNDARY--``), by its ``content_type``; None without a boundary."""
    m = _BOUNDARY.search(content_type)
    return b"--" + m[1].encode("latin-1") + b"--" if m else None


def unclosed_form(close: bytes) -> ApiError:
    """The 400 of a multipart body that ends without its close delimiter: a multipart parser drops the part left open,
    and the request had gone on without it."""
    return ApiError(400, f"the multipart body could not be parsed: it ends without its closing boundary ({close.decode('latin-1')})",
                    code="bad_request")


def count_file_parts(body: bytes, content_type: str) -> int:
    """How many parts of a multipart body are files (a ``Content-Disposition`` header with a
    ``filename``, as the parser decides), reading only each part's headers; 0 without a boundary."""
    m = _BOUNDARY.search(content_type)
    if not m:
        return 0
    delimiter = b"--" + m.group(1).encode("latin-1")
    count, pos = 0, body.find(delimiter)
    while pos != -1:
        end = body.find(b"\r\n\r\n", pos)
        if _FILE_PART.search(body[pos:end if end != -1 else len(body)][:16384]):
            count += 1
        pos = body.find(b"\r\n" + delimiter, pos + len(delimiter))
    return count


_JSON_KINDS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _kinds(annotation: object) -> set[type]:
    """The JSON value types a field's annotation takes (None apart)."""
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return {type(a) for a in args}
    if args:  # X | None, Optional[X], Union[...]
        return set().union(*(_kinds(a) for a in args if a is not type(None)))
    return {annotation} if isinstance(annotation, type) else set()


def check_json_types(raw: object, model: type[BaseModel], json_said: bool = True) -> None:
    """422 for a JSON value of another type than its field's, which pydantic would convert ("8" for 8,
    0 for false, "yes" for true): JSON's types as the schema states them (an integer may be 8.0). The Open
    Inference Protocol's parameters are checked so too (``json_said`` False: they are typed in gRPC as in JSON)."""
    if not isinstance(raw, dict):
        return
    for name, value in raw.items():
        field = model.model_fields.get(name)
        if field is None or value is None or name == "image":
            continue
        kinds = _kinds(field.annotation)
        takes = tuple(t for k in kinds for t in _JSON_KINDS.get(k, (k,)))
        fits = isinstance(value, takes) and (isinstance(value, bool) == (bool in kinds))
        if not fits and int in kinds and isinstance(value, float) and value.is_integer():
            fits = True
        if kinds and not fits:
            names = sorted({"boolean" if k is bool else "integer" if k is int else "number" if k is float else "string" for k in kinds})
            kinds_said = " or ".join(names)
            expected = f"a JSON {kinds_said}" if json_said else f"{'an' if kinds_said[0] in 'aeiou' else 'a'} {kinds_said}"
            raise ApiError(422, f"{name}: expected {expected}, got {json.dumps(value)[:40]}", code="invalid_parameter")


def _not_empty(data: bytes) -> bytes:
    """The image bytes; 400 now for none (not in a stream that opened to say so)."""
    if not data:
        raise ApiError(400, "the uploaded file is empty", code="bad_image")
    return data


def form_fields(form: FormData | FormItems, files: str) -> dict[str, object]:
    """The form's fields but ``files`` (an empty one is not given); 422 for a field sent twice (one
    value each: which one would count is no rule a client should have to guess)."""
    fields: dict[str, object] = {}
    for k, v in form.multi_items() if isinstance(form, FormData) else form:
        if k == files or (isinstance(v, str) and v == ""):
            continue
        if k in fields:
            raise ApiError(422, f"{k}: given more than once", code="invalid_parameter")
        fields[k] = v
    return fields


def _validate(cls: type[P], fields: Mapping[str, object]) -> P:
    try:
        return cls.model_validate(fields)
    except ValidationError as err:
        raise ApiError(422, first_error(err, cls), code="invalid_parameter") from err


def body_docs(params_cls: type[BaseModel], json_cls: type[BaseModel]) -> dict[str, object]:
    """OpenAPI ``requestBody`` describing both content types (the route reads the body itself)."""
    form = params_cls.model_json_schema()
    form_props = {"file": {"type": "string", "format": "binary", "description": "The image file (JPEG, PNG, WebP, GIF, BMP, TIFF)"}}
    form_props.update(form.get("properties", {}))
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": form_props}},
                "application/json": {"schema": json_cls.model_json_schema(ref_template="#/components/schemas/{model}")},
            },
        }
    }


async def read_batch_request(request: Request, limit: int, max_files: int) -> tuple[list[tuple[str, bytes]], AttributeCommon]:
    """``files`` (repeated multipart field) and the shared /attribute fields."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise ApiError(415, "send multipart/form-data with the images in repeated 'files' fields", code="unsupported_media_type")
    body = await read_body(request, limit)
    # counted here: the parser's own limit is a 400 told apart only by its text
    if count_file_parts(body, request.headers.get("content-type", "")) > max_files:
        raise ApiError(413, f"a batch holds at most {max_files} images", code="too_large")
    try:
        form = await request.form(max_files=max_files, max_fields=64)
    except HTTPException as err:  # Starlette turns multipart errors into 400s with the parser's message
        raise ApiError(400, f"the multipart body could not be parsed: {err.detail}", code="bad_request") from err
    uploads = [u for u in form.getlist("files") if not isinstance(u, str)]
    if not uploads:
        raise ApiError(422, "files: send one or more images as multipart file fields named 'files'", code="missing_file")
    images = [(u.filename or f"image{i}", await u.read()) for i, u in enumerate(uploads)]
    return images, _validate(AttributeParams, form_fields(form, "files"))
