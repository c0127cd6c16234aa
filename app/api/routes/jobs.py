"""Durable explanation jobs: POST /jobs (many images, one set of /attribute parameters) -> 202;
GET /jobs/{id} (state, counts, ETA); GET /jobs/{id}/results (JSON Lines, resumable); DELETE
/jobs/{id} (cancel and free); GET /jobs (paged). The store and the runner are in :mod:`app.jobs`."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from app.api.deps import get_service, require_api_key
from app.api.requests import closing_delimiter, first_error, spool_body, unclosed_form
from app.core.config import Settings
from app.core.errors import ApiError
from app.doors import tracing
from app.doors.keys import Key
from app.doors.request_id import current_request_id
from app.jobs.archive import Bounds, is_archive, read_archive
from app.jobs.callbacks import MAX_HOST, redacted, url_problem
from app.jobs.runner import JobRunner, job_status
from app.jobs.store import (
    JOB_DONE,
    MAX_INT,
    OPERATION_DEADLINE,
    JobInfo,
    QuotaExceeded,
    ResultRow,
    Store,
    StoreBusy,
    StoreFull,
    StoreUnavailable,
)
from app.schemas import ERROR_RESPONSES, EXPLAIN_IF_PATTERN, AttributeParams, ErrorResponse
from app.service import Service
from app.service.explain_if import ConditionError, parse_condition

log = logging.getLogger(__name__)
T = TypeVar("T")
router = APIRouter(dependencies=[Depends(require_api_key)], tags=["jobs"])
STORE_RETRY_AFTER_S = 5
"""``Retry-After`` of the 503 a request gets while the job store is unreachable."""
RESULTS_CHUNK = 32
FOLLOW_POLL_S = 0.5
JOB_FIELDS = ("explain_if", "callback_url")
"""Form fields of POST /jobs beside /attribute's."""
_PARAMS = dict(AttributeParams.model_json_schema()["properties"])
URL_CHAR = r"[^\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"
"""A character a callback URL may hold: not a control character nor one Python's ``str.isspace`` takes (what
:func:`app.jobs.callbacks.url_problem` refuses; JSON Schema's ``\\s`` differs from it, ``\\ufeff`` and ``\\x1c`` for two)."""
_REG_NAME = r"-A-Za-z0-9_~!$&'()*+,;=%"  # RFC 3986's reg-name characters but the dot (an IDN goes as its xn-- form)
_PORT = r"0*([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])?"  # 0 to 65535, or none
CALLBACK_PATTERN = (rf"^[Hh][Tt][Tt][Pp][Ss]?://([{_REG_NAME}:.]*@)?"  # user:password@, in RFC 3986's characters
                    rf"(?=[{_REG_NAME}.]{{1,{MAX_HOST}}}([:/?#]|$))[{_REG_NAME}]{{0,63}}(\.[{_REG_NAME}]{{0,63}})*"
                    rf"(:{_PORT})?([/?#]{URL_CHAR}*)?$")
"""The callback URLs the route takes, as JSON Schema says it (issue 59: the schema had taken control characters, a
port past 65535 and hosts longer than DNS allows, which the route refuses): http(s), an ASCII host of 1 to
``MAX_HOST`` characters in labels of at most 63, an optional port within 65535 and credentials, then any characters
but spaces and control characters. Stricter than the route in one respect, by decision: a host in Unicode or an IPv6
literal (``[::1]``), which the route takes, is outside it."""
SUBMIT_DOCS = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {"type": "object", "properties": {
    "files": {"type": "array", "items": {"type": "string", "format": "binary"},
              "description": "The images (repeat the field); a tar (.tar, .tar.gz, .tar.bz2, .tar.xz) or zip file is unpacked"},
    "archive": {"type": "string", "format": "binary", "description": "One tar or zip archive of images, instead of files"},
    "explain_if": {"type": "string", "pattern": EXPLAIN_IF_PATTERN,
                   "description": "Explain an image only when this holds of its prediction (see /predict); "
                   "else its answer is the prediction alone"},
    "callback_url": {"type": "string", "maxLength": 2048, "pattern": CALLBACK_PATTERN,
                     "description": "http(s) URL to POST the job's status to (JSON) when it ends, signed with "
                     "IDG_CALLBACK_SECRET (X-IDG-Timestamp, X-IDG-Signature: sha256=HMAC of timestamp.body) and tried up "
                     "to 5 times (1, 2, 4, 8 s apart) until answered below 500"},
    **_PARAMS}}}}}}




class JobStatus(BaseModel):
    id: str = Field(..., description="The job's id")
    state: Literal["queued", "running", "done"] = Field(..., description="queued (no image started), running, done (every image answered)")
    total: int = Field(..., description="Images in the job")
    done: int = Field(..., description="Images answered (status 200)")
    failed: int = Field(..., description="Images answered with an error (its status and message are in the results)")
    pending: int = Field(..., description="Images not answered yet")
    created: float = Field(..., description="Submitted at (Unix time)")
    started: float | None = Field(None, description="First image started at (Unix time)")
    finished: float | None = Field(None, description="Last image answered at (Unix time)")
    eta_s: float | None = Field(None, description="Seconds until done at the job's pace so far (null before its first answer)")
    url: str = Field(..., description="This status")
    results_url: str = Field(..., description="The answers, as JSON Lines")
    parameters: dict[str, Any] = Field(..., description="The /attribute fields given at submission")
    explain_if: str | None = Field(None, description="The condition, when one was given")
    callback_url: str | None = Field(None, description="POSTed this status when the job ends (any credentials in it shown as ***)")
    callback_outcome: str | None = Field(None, description="What the callback got, once sent: delivered / refused / failed, "
                                         "with the HTTP status or error and the attempts")
    tenant: str | None = Field(None, description="The name of the API key that submitted it (IDG_API_KEYS; null without keys)")
    request_id: str | None = Field(None, description="The X-Request-ID of the request that submitted it (given or made): the "
                                   "service's log lines for the job's images carry it")


class JobList(BaseModel):
    jobs: list[JobStatus] = Field(..., description="Newest first")
    total: int = Field(..., description="Jobs stored")
    offset: int = Field(..., description="Jobs skipped (newest first)")
    limit: int = Field(..., description="Most jobs on this page")
    next: str | None = Field(None, description="The next page (by cursor: stable when jobs are submitted meanwhile), null at the end")


class JobDeleted(BaseModel):
    id: str = Field(..., description="The job's id")
    deleted: bool = Field(..., description="Always true: the job, its images and its answers are gone (no route finds them; "
                          "their rows are freed in the background, after a restart too)")
    dropped_in_flight: int = Field(..., description="Its images this process had in the worker (dropped before the next model call)")


Responses = dict[int | str, dict[str, Any]]
NO_JOB: Responses = {404: {"model": ErrorResponse, "description": "No such job (never submitted, deleted, or past its retention)"}}
KEYED: Responses = {**{c: ERROR_RESPONSES[c] for c in (401, 422)},
                   503: {"model": ErrorResponse, "description": "Starting, or the job store is unreachable for now (code "
                         "store_unavailable): retry after Retry-After seconds"}}
SUBMIT_ERRORS: Responses = {**{c: ERROR_RESPONSES[c] for c in (400, 401, 404, 408, 415, 422)}, 503: KEYED[503],
                 413: {"model": ErrorResponse, "description": "Too large: the body, an image (too_large), the job's images "
                       "(too_many_images), or the bytes the key's jobs would hold in the store (quota_exceeded: "
                       "IDG_JOBS_MAX_BYTES_PER_KEY)"},
                 507: {"model": ErrorResponse, "description": "The job store is full (storage_full: IDG_JOBS_MAX_BYTES)"}}


async def get_runner(request: Request) -> JobRunner:
    runner = getattr(request.app.state, "jobs", None)
    if runner is None:
        raise ApiError(503, "the service is starting: the job store is not open yet", headers={"Retry-After": "5"}, code="not_ready")
    return runner


Runner = Annotated[JobRunner, Depends(get_runner)]


async def _stored(store: Store, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` on ``store``, in a thread, answered within the store's timeout from now (waiting for a thread
    included); 503 with ``Retry-After`` while the store is unreachable or busy."""
    token = OPERATION_DEADLINE.set(time.monotonic() + store.timeout_s)  # asyncio.to_thread carries it to the thread
    try:
        return await asyncio.to_thread(call, *args)
    except StoreUnavailable as err:
        raise _store_refusal(busy=isinstance(err, StoreBusy)) from err
    finally:
        OPERATION_DEADLINE.reset(token)


def _store_refusal(busy: bool = False) -> ApiError:
    """The 503 of an operation the store did not do (unreachable, or busy with this server's other work)."""
    why = "busy with this server's other work" if busy else "unreachable for now"
    return ApiError(503, f"the job store is {why} (nothing was changed): try again shortly",
                    headers={"Retry-After": str(STORE_RETRY_AFTER_S)}, code="store_unavailable")


def _key(request: Request) -> Key | None:
    """The API key the request came with (``require_api_key`` found it); None where no keys are configured."""
    key: Key | None = getattr(request.state, "key", None)
    return key


async def _own_job(request: Request, runner: JobRunner, job_id: str) -> JobInfo:
    """The job, if it exists and the request's key may see it: another tenant's job is as unknown as a missing one."""
    info = await _stored(runner.store, runner.store.get_job, job_id)
    key = _key(request)
    if info is None or (key is not None and not key.sees(info.tenant)):
        raise _unknown(job_id)
    return info


def _unknown(job_id: str) -> ApiError:
    return ApiError(404, f"no job {job_id!r} (never submitted, deleted, or past its retention)", code="unknown_job")


def _base_url(request: Request) -> str:
    """Where the links start: ``IDG_PUBLIC_URL``, else nothing (paths), never the request's Host header."""
    public: str | None = request.app.state.settings.public_url
    return public or ""


@router.post("/jobs", status_code=202, response_model=JobStatus, responses=SUBMIT_ERRORS, openapi_extra=SUBMIT_DOCS)
async def submit_job(request: Request, service: Annotated[Service, Depends(get_service)], runner: Runner) -> JSONResponse:
    """Submit many images (multipart ``files``, repeated, or one tar/zip ``archive``) with the form
    fields of /attribute (and ``explain_if``, ``callback_url``); answered in the background at a
    lower priority than requests. 202 with the job's id, ``url`` and ``results_url``.

    The body is spooled as it arrives (in memory up to :data:`SPOOL_MEMORY_BYTES`, then on disk in ``IDG_DATA_DIR``)
    and waits for one of ``IDG_JOBS_UNPACK_AT_ONCE`` turns, held while it is parsed, unpacked and stored: six uploads
    of 287 MB at once had held 5.6 GB of memory. At most :data:`WAITING_PER_TURN` submissions per turn are received
    or wait at once (beyond, 503 ``busy`` at once), a turn is waited for at most :data:`TURN_WAIT_S`, and a client
    gone meanwhile stores nothing."""
    settings = service.settings
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise ApiError(415, "send multipart/form-data with the images in repeated 'files' fields or one tar/zip 'archive'",
                       code="unsupported_media_type")
    turns = _turns(request, settings)
    if turns.waiting >= WAITING_PER_TURN * settings.jobs_unpack_at_once:
        raise ApiError(503, f"{turns.waiting} job submissions are being received or wait their turn here: try again shortly",
                       headers={"Retry-After": str(STORE_RETRY_AFTER_S)}, code="busy")
    turns.waiting += 1
    try:
        with _spool(settings) as spool:
            await _received(spool_body(request, settings.jobs_max_upload_bytes, spool))
            try:
                async with asyncio.timeout(TURN_WAIT_S):
                    await turns.semaphore.acquire()
            except TimeoutError as err:
                raise ApiError(503, f"no turn at unpacking a job came within {TURN_WAIT_S:g} s: try again shortly",
                               headers={"Retry-After": str(STORE_RETRY_AFTER_S)}, code="busy") from err
            try:
                if await request.is_disconnected():  # nobody would learn the job's id
                    raise ClientDisconnect()
                images, fields = await _parse_job_form(request, settings, spool)
                return await _submitted(request, service, runner, images, fields)
            finally:
                turns.semaphore.release()
    finally:
        turns.waiting -= 1


async def _submitted(request: Request, service: Service, runner: JobRunner, images: list[tuple[str, bytes]],
                     fields: dict[str, Any]) -> JSONResponse:
    """The job of ``images`` with the form's ``fields`` checked and stored: its 202."""
    settings = service.settings
    explain_if, callback_url = fields.pop("explain_if", None), fields.pop("callback_url", None)
    try:
        params = AttributeParams.model_validate(fields)
    except ValidationError as err:
        raise ApiError(422, first_error(err), code="invalid_parameter") from err
    service.check_attribute(params)  # a bad parameter is one 422 now, not an error per image later
    if explain_if is not None:
        try:
            parse_condition(explain_if)
        except ConditionError as err:
            raise ApiError(422, str(err), code="invalid_parameter") from err  # it names explain_if itself
    _check_callback(callback_url)
    if not runner.store.reachability.up:  # unreachable at its last operation: at once, not after the store's timeout
        raise _store_refusal()
    tenant = key.name if (key := _key(request)) is not None else None
    stored = {"attribute": params.model_dump(mode="json", exclude_unset=True), "explain_if": explain_if}
    if trace := tracing.carrier():  # IDG_TRACING: each image's span continues this request's trace (app.jobs.runner)
        stored["trace"] = trace
    try:
        info = await _stored(runner.store, runner.store.create_job, uuid.uuid4().hex, stored, callback_url, images,
                             settings.jobs_max_bytes, tenant, current_request_id(), settings.jobs_max_bytes_per_key)
    except QuotaExceeded as err:
        raise ApiError(413, str(err), code="quota_exceeded") from err
    except StoreFull as err:
        raise ApiError(507, str(err), code="storage_full") from err
    runner.wake()
    service.metrics.jobs_submitted.labels(tenant or "").inc()
    log.info("job %s submitted by %s: %d image(s)", info.id, tenant or "a caller (no API keys configured)", len(images))
    body = job_status(info, _base_url(request))
    return JSONResponse(body, status_code=202, headers={"Location": body["url"]})


SPOOL_MEMORY_BYTES = 1 << 20
"""A job upload's body stays in memory up to this size while it waits for its turn; a larger one is on disk."""
WAITING_PER_TURN = 4
"""Job submissions received or waiting at once per turn (``IDG_JOBS_UNPACK_AT_ONCE``): what bounds the disk the waiting
bodies take (4 x 2 x 300 MB at the defaults)."""
TURN_WAIT_S = 60.0
"""Most seconds a received submission waits for its turn; then 503 ``busy``."""


@dataclass
class _Turns:
    semaphore: asyncio.Semaphore
    waiting: int = 0


def _turns(request: Request, settings: Settings) -> _Turns:
    """The process's turns at parsing, unpacking and storing a job (``IDG_JOBS_UNPACK_AT_ONCE``), and how many
    submissions are being received or wait for one."""
    state = request.app.state
    if getattr(state, "job_turns", None) is None:
        state.job_turns = _Turns(asyncio.Semaphore(settings.jobs_unpack_at_once))
    turns: _Turns = state.job_turns
    return turns


@contextmanager
def _spool(settings: Settings) -> Iterator[IO[bytes]]:
    """A spooled file for a job's body: on disk in ``IDG_DATA_DIR`` past :data:`SPOOL_MEMORY_BYTES`, or in the system's
    temporary folder where that folder cannot be made (a PostgreSQL store needs no data folder of its own)."""
    folder: str | None = str(settings.data_dir)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        log.warning("cannot make %s for job uploads (%s); spooling them in %s", settings.data_dir, err, tempfile.gettempdir())
        folder = None
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES, mode="w+b", dir=folder, prefix="upload-") as spool:
        yield spool


async def _received(reading: Awaitable[int]) -> int:
    """The spooled body's length; a disk that cannot take it is a 507, not a 500."""
    try:
        return await reading
    except OSError as err:
        raise ApiError(507, f"no room to receive the upload here ({err.strerror or err}): try again later or send less",
                       code="storage_full") from err


async def _parse_job_form(request: Request, settings: Settings, spool: IO[bytes]) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
    """The images (archives unpacked, within bounds) and the other form fields, from the spooled body, in the process's
    turn; a body that stops before its closing boundary is a 400 (the parser drops the part left open: the job had
    been stored without it)."""
    limit = settings.jobs_max_images
    close = closing_delimiter(request.headers.get("content-type", "")) or b""
    spool.seek(0, 2)
    size = spool.tell()
    spool.seek(max(0, size - len(close) - 64))
    if close and close not in spool.read():
        raise unclosed_form(close)
    spool.seek(0)

    async def body() -> AsyncGenerator[bytes, None]:
        while chunk := await asyncio.to_thread(spool.read, SPOOL_MEMORY_BYTES):
            yield chunk

    try:
        items = await MultiPartParser(request.headers, body(), max_files=limit, max_fields=64).parse()
    except MultiPartException as err:
        if err.message.startswith("Too many files"):
            raise ApiError(413, f"a job holds at most {limit} images (IDG_JOBS_MAX_IMAGES)", code="too_many_images") from err
        raise ApiError(400, f"the multipart body could not be parsed: {err.message}", code="bad_request") from err
    try:
        return await _job_images(items, settings), \
            {k: v for k, v in items.multi_items() if k not in ("files", "archive") and isinstance(v, str) and v != ""}
    finally:
        await items.close()


async def _job_images(form: FormData, settings: Settings) -> list[tuple[str, bytes]]:
    """The form's images: each file, and each archive's images (within the job's bounds)."""
    limit = settings.jobs_max_images
    images: list[tuple[str, bytes]] = []
    unpacked = 0  # bytes of the job's images so far: all its uploads together stay within IDG_JOBS_MAX_UPLOAD_BYTES
    files = form.getlist("files")
    for i, upload in enumerate([*files, *form.getlist("archive")]):
        if not isinstance(upload, UploadFile):
            raise ApiError(422, "files / archive: send files, not text fields", code="missing_file")
        data = await upload.read()
        if not data:  # as /attribute answers an empty upload: nothing of the job is stored
            raise ApiError(400, f"the uploaded file {upload.filename or i!r} is empty", code="bad_image")
        if i >= len(files) and not is_archive(data):  # taken for an image, it had been a job of one broken image
            raise ApiError(422, f"the uploaded archive could not be read: {upload.filename or i!r} is not a tar (plain, gzip, "
                           "bzip2 or xz) or zip archive (send images as 'files')", code="bad_archive")
        if is_archive(data):
            bounds = Bounds(limit - len(images), settings.max_upload_bytes, settings.jobs_max_upload_bytes - unpacked)
            found = await asyncio.to_thread(read_archive, data, bounds)
            images += found
            unpacked += sum(len(d) for _, d in found)
        else:
            if len(data) > settings.max_upload_bytes:
                raise ApiError(413, f"{upload.filename!r} has {len(data)} bytes, more than the limit of {settings.max_upload_bytes} "
                               "per image (IDG_MAX_UPLOAD_BYTES)", code="too_large")
            images.append((upload.filename or f"image{i}", data))
            unpacked += len(data)
        if len(images) > limit:
            raise ApiError(413, f"a job holds at most {limit} images (IDG_JOBS_MAX_IMAGES)", code="too_many_images")
    if not images:
        raise ApiError(422, "files: send one or more images as multipart file fields named 'files' (or a tar/zip 'archive')",
                       code="missing_file")
    return images


def _check_callback(url: str | None) -> None:
    if url is not None and (problem := url_problem(url)) is not None:
        raise ApiError(422, f"callback_url {problem}: got {redacted(url)[:100]!r}", code="invalid_parameter")


@router.get("/jobs/{job_id}", response_model=JobStatus, responses={**KEYED, **NO_JOB})
async def get_job(job_id: str, request: Request, runner: Runner) -> dict[str, Any]:
    """The job's ``state`` (queued, running, done), ``done`` / ``failed`` / ``pending`` of ``total``
    images, ``eta_s`` (from the job's own pace so far), its parameters and URLs."""
    return job_status(await _own_job(request, runner, job_id), _base_url(request))


@router.get("/jobs/{job_id}/results", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {}}, "description": "one JSON object per line"}, **KEYED, **NO_JOB})
async def job_results(
    job_id: str, request: Request, runner: Runner,
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Skip the first N answers (resume after the last 'seq' read)")] = 0,
    summary: Annotated[bool, Query(description="Only the scores and classes: no heatmaps, curve or arrays")] = False,
    follow: Annotated[bool, Query(description="Keep the stream open until the job is done, sending answers as "
                                      "they come; the last line says why it ended: "
                                      "{\"end\": \"finished\"|\"deleted\"|\"unavailable\", \"after\": seq}")] = False,
) -> StreamingResponse:
    """The answers as JSON Lines, in the order they were stored, numbered by ``seq`` from 1:
    ``{"seq", "index" (the image's place in the submission), "filename", "status", "finished" (when
    its answer was stored, Unix time), "replica" (the X-IDG-Replica that answered it), "explained",
    "prediction", "target", "faithfulness", "result" (the /attribute body)}``, or for an image that
    failed ``{"seq", "index", "filename", "status", "finished", "replica", "error"}``. ``offset=N``
    resumes after ``seq`` N.
    With ``follow=true`` the last line says why the stream ended, ``{"end": reason, "after": seq}``:
    ``finished`` (every answer sent), ``deleted`` (the job was deleted, or expired, while followed) or
    ``unavailable`` (the store is unreachable: resume with ``offset`` = ``after``)."""
    store = runner.store
    await _own_job(request, runner, job_id)

    async def lines() -> AsyncIterator[bytes]:
        after = offset
        try:
            while True:
                rows = await asyncio.to_thread(store.results, job_id, after, RESULTS_CHUNK, summary)
                for row in rows:
                    yield _line(row, summary)
                if rows:
                    after = rows[-1].seq
                    continue
                if not follow:
                    return
                info = await asyncio.to_thread(store.get_job, job_id)
                if info is None or (info.state == JOB_DONE and info.answered <= after):
                    yield _end(END_DELETED if info is None else END_FINISHED, after)
                    return
                await asyncio.sleep(FOLLOW_POLL_S)
        except StoreUnavailable as err:  # the status is sent: the stream ends here, resumable after the last seq read
            log.warning("job %s: results stream ended after seq %d, the store is unreachable: %s", job_id, after, err)
            if follow:
                yield _end(END_UNAVAILABLE, after)

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"Cache-Control": "no-cache"})


END_FINISHED, END_DELETED, END_UNAVAILABLE = "finished", "deleted", "unavailable"
"""Why a followed results stream ended (its last line, ``{"end": reason, "after": last seq sent}``)."""


def _end(reason: str, after: int) -> bytes:
    return (json.dumps({"end": reason, "after": after}, separators=(",", ":")) + "\n").encode()


def _line(row: ResultRow, summary: bool) -> bytes:
    """One JSON line, spliced from the stored JSON texts (an answer with its PNGs is not parsed again)."""
    head = (f'{{"seq":{row.seq},"index":{row.index},"filename":{json.dumps(row.filename)},"status":{row.status},'
            f'"finished":{json.dumps(row.finished)},"replica":{json.dumps(row.replica)},')
    tail = "" if summary or row.status != 200 else f',"result":{row.result or "null"}'
    return (head + row.summary[1:-1] + tail + "}\n").encode()


@router.delete("/jobs/{job_id}", response_model=JobDeleted, responses={**KEYED, **NO_JOB})
async def delete_job(job_id: str, request: Request, runner: Runner) -> dict[str, Any]:
    """Cancel the job (its images in the worker are dropped before the next model call) and delete
    it with its images and answers: gone at once for every route, its rows freed in the background."""
    info = await _own_job(request, runner, job_id)
    dropped = runner.cancel_job(job_id)
    if not await _stored(runner.store, runner.store.delete_job, job_id):  # one row marked: answers at once
        raise _unknown(job_id)
    runner.purge_soon()  # its images and answers (272 MB had held this answer 8 s) freed behind it
    log.info("job %s (of %s) deleted by %s", job_id, info.tenant, getattr(_key(request), "name", "a caller"))
    return {"id": job_id, "deleted": True, "dropped_in_flight": dropped}


CURSOR = r"^\d{1,12}(\.\d{1,20})?_[0-9a-f]{1,64}$"
"""A page's place: the (created, id) of the last job of the page before."""


def _cursor(job: JobInfo) -> str:
    return f"{job.created!r}_{job.id}"


@router.get("/jobs", response_model=JobList, responses=KEYED)
async def list_jobs(
    request: Request, runner: Runner,
    offset: Annotated[int, Query(ge=0, le=MAX_INT, description="Skip this many jobs (after the cursor, if one is given)")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=100, pattern=CURSOR, description="Where the page starts: the cursor of "
                                        "the previous page's `next` (jobs submitted since do not shift the pages)")] = None,
) -> dict[str, Any]:
    """The jobs, newest first, ``limit`` at a time; ``next`` is the URL of the next page (null at the end),
    by cursor: pages do not shift (no job repeated or skipped) when jobs are submitted or deleted between them."""
    before = None
    if cursor is not None:
        created, job_id = cursor.split("_", 1)
        before = (float(created), job_id)
    key = _key(request)
    tenant = None if key is None or key.admin else key.name
    jobs, total = await _stored(runner.store, runner.store.list_jobs, offset, limit + 1, before, tenant)
    base = _base_url(request)
    more, jobs = len(jobs) > limit, jobs[:limit]
    return {"jobs": [job_status(j, base) for j in jobs], "total": total, "offset": offset, "limit": limit,
            "next": f"{base}/jobs?cursor={_cursor(jobs[-1])}&limit={limit}" if more else None}
