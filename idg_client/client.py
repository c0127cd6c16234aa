"""A small typed client for the service, sync and async, for scripts and monitoring pipelines.

    from idg_client import Client
    with Client("http://127.0.0.1:8000") as c:
        res = c.attribute("photo.jpg", method="idg", steps=50)
        res.overlay.save("overlay.png"); print(res.target, res.curve.alphas[:5])
        many = c.attribute_many(["a.jpg", "b.jpg"], concurrency=4)
        job = c.submit_job("photos/", method="idg", faithfulness="insertion,deletion")   # a durable job
        c.wait_job(job["id"]); answers = list(c.job_results(job["id"], summary=True))
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

log = logging.getLogger(__name__)
ImageInput = str | Path | bytes | Image.Image
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".zip")


def image_files(directory: str | Path) -> list[Path]:
    """The images in ``directory`` and below (by suffix, case-insensitive), sorted by path."""
    return sorted(p for p in Path(directory).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _job_files(images: Sequence[ImageInput] | str | Path) -> list[tuple[str, tuple[str, bytes]]]:
    """Multipart parts of a job: a directory's images, one archive (sent as ``archive``) or images."""
    if isinstance(images, str | Path):
        path = Path(images)
        if path.is_dir():
            found = image_files(path)
            if not found:
                raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {path}")
            return [("files", (str(p.relative_to(path)), p.read_bytes())) for p in found]
        if path.name.lower().endswith(ARCHIVE_SUFFIXES):
            return [("archive", (path.name, path.read_bytes()))]
        images = [path]
    return [("files", _file(image)) for image in images]


class ServiceError(Exception):
    """The service answered an error: ``status`` and its one-sentence ``message``."""

    def __init__(self, status: int, message: str, code: str = "error") -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.code = status, message, code


@dataclass(frozen=True)
class ClassScore:
    index: int
    name: str
    probability: float


@dataclass(frozen=True)
class Prediction:
    model: str
    top_k: list[ClassScore]
    raw: dict[str, Any]

    @property
    def explanation(self) -> Attribution | None:
        """The explanation of the predicted class, when ``explain_if`` held."""
        body = self.raw.get("explanation")
        return parse_attribution(body) if body else None


@dataclass(frozen=True)
class OutputCurve:
    """The output-α curve as arrays (see /docs for each field): ``values`` and ``probe_values`` are
    the target's logit or its probability, as ``output`` says."""

    output: str
    probe_alphas: np.ndarray
    probe_values: np.ndarray
    alphas: np.ndarray
    values: np.ndarray
    importance: np.ndarray
    weights: np.ndarray
    input: str = "photo"
    """``photo``, or ``noisy_copy`` where the map pools noisy copies (SmoothGrad): the samples are then the first copy's."""
    probe_input: str = "photo"
    """Whose the probe is: ``photo`` (also where the copies share one probe of the photo, ``smooth_probe=shared``), or
    ``noisy_copy`` where each copy runs its own."""


@dataclass(frozen=True)
class Regions:
    """The map's ranked regions (``postprocess="xrai"``: XRAI's; ``"cam_regions"``: Grad-CAM's blobs, ``source``):
    ``labels (H, W)`` the rank of each pixel's region (1 first) at the model's input size; per region, first to last, its
    ``gains`` (XRAI: mean saliency when added; blobs: mean Grad-CAM) and ``areas`` (pixels)."""

    order: str
    labels: np.ndarray
    gains: np.ndarray
    areas: np.ndarray
    source: str = "xrai"

    def top(self, share: float) -> np.ndarray:
        """``(H, W)`` bool: the first regions whose pixels together cover at most ``share`` of the image (at least the first)."""
        covered = np.cumsum(self.areas) / self.labels.size
        count = max(1, int(np.searchsorted(covered, share, side="right")))
        return (self.labels >= 1) & (self.labels <= count)


def parse_regions(body: dict[str, Any] | None) -> Regions | None:
    """The answer's ``regions`` (None where the map has none)."""
    if not body:
        return None
    labels = np.asarray(Image.open(io.BytesIO(base64.b64decode(body["labels_png"]))), dtype=np.int32)
    rows = body["regions"]
    return Regions(body["order"], labels, np.asarray([r["gain"] for r in rows], dtype=np.float64),
                   np.asarray([r["area"] for r in rows], dtype=np.int64), body.get("source", "xrai"))


@dataclass(frozen=True)
class Attribution:
    model: str
    method: str
    target: ClassScore
    prediction: list[ClassScore]
    parameters: dict[str, Any]
    heatmap: Image.Image | None
    overlay: Image.Image | None
    attribution: np.ndarray | None
    curve: OutputCurve
    raw: dict[str, Any]

    @property
    def faithfulness(self) -> dict[str, Any] | None:
        """``{"insertion", "deletion", "steps"}`` when ``faithfulness`` was asked."""
        return self.raw.get("faithfulness")

    @property
    def regions(self) -> Regions | None:
        """XRAI's ranked regions when ``postprocess="xrai"`` was asked (:class:`Regions`), else None."""
        return parse_regions(self.raw.get("regions"))


def _file(image: ImageInput) -> tuple[str, bytes]:
    if isinstance(image, Image.Image):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        return "image.png", buf.getvalue()
    if isinstance(image, bytes):
        return "image", image
    path = Path(image)
    return path.name, path.read_bytes()


def _png(b64: str | None) -> Image.Image | None:
    return None if b64 is None else Image.open(io.BytesIO(base64.b64decode(b64)))


def _fields(params: dict[str, Any]) -> dict[str, str]:
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in params.items() if v is not None}


def _scores(rows: list[dict[str, Any]]) -> list[ClassScore]:
    return [ClassScore(r["index"], r["name"], r["probability"]) for r in rows]


def parse_prediction(body: dict[str, Any]) -> Prediction:
    body = _holding(body, "model", "top_k")
    return Prediction(body["model"], _scores(body["top_k"]), body)


def parse_attribution(body: dict[str, Any]) -> Attribution:
    body = _holding(body, "model", "method", "curve", "target", "prediction", "parameters")
    raw = body.get("attribution")
    array = np.load(io.BytesIO(base64.b64decode(raw["data"]))) if raw else None
    c = body["curve"]
    if "values" not in c:  # a server from before `values` / `output`: its "logits" were probabilities for these methods
        c = {**c, "values": c["logits"], "probe_values": c["probe_logits"],
             "output": "probability" if body["method"] in ("guided_ig", "agi") else "logit"}
    arrays = {k: np.asarray(c[k], dtype=np.float64) for k in ("probe_alphas", "probe_values", "alphas", "values", "importance", "weights")}
    noisy = c.get("input", "photo")
    curve = OutputCurve(c["output"], **arrays, input=noisy, probe_input=c.get("probe_input", noisy))  # older servers: the same
    t = body["target"]
    return Attribution(body["model"], body["method"], ClassScore(t["index"], t["name"], t["probability"]), _scores(body["prediction"]),
                       body["parameters"], _png(body.get("heatmap_png")), _png(body.get("overlay_png")), array, curve, body)


def _is_service_error(r: httpx.Response) -> bool:
    try:
        return isinstance(r.json().get("error"), dict)
    except (ValueError, AttributeError):
        return False


def _check(r: httpx.Response, ok: int = 200) -> dict[str, Any]:
    """The body of an answer of status ``ok`` (a JSON object), or the :class:`ServiceError` it is."""
    if r.status_code == ok:
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):  # an HTML page or a list: another server at this URL
            raise ServiceError(ok, f"the answer from {r.url} is not the service's JSON: is the URL the IDG service's?",
                               "not_the_service")
        return body
    try:
        err = r.json()["error"]
        raise ServiceError(r.status_code, err["message"], err.get("code", "error"))
    except (ValueError, KeyError, TypeError, IndexError):  # not the service's error contract: a proxy's, or another server's
        raise ServiceError(r.status_code, r.text[:200]) from None


def _holding(body: dict[str, Any], *names: str) -> dict[str, Any]:
    """``body`` if it holds ``names``; else a :class:`ServiceError` (another server answered 200 at this URL)."""
    missing = [n for n in names if n not in body]
    if missing:
        raise ServiceError(200, f"the answer lacks {', '.join(missing)}: is the URL the IDG service's?", "not_the_service")
    return body


def _retry_after(r: httpx.Response, attempt: int, cap: float) -> float | None:
    """Seconds to wait before retrying, or None: a 503 (busy: its Retry-After, else backoff), and a
    500/502 that is not the service's JSON error, i.e. from a proxy in front of it (a Ray Serve
    replica that died with the request in flight answers plain "Internal Server Error"): the same
    request is safe to send again. The service's own JSON 500 (a failure of this request) is not retried."""
    if r.status_code in (500, 502) and not _is_service_error(r):
        return min(0.5 * 2.0**attempt, cap)
    if r.status_code != 503:
        return None
    try:
        wait = float(r.headers.get("retry-after", ""))
    except ValueError:
        wait = 0.5 * 2.0**attempt
    return min(max(wait, 0.1), cap)


class _ResultLines:
    """The lines of ``GET /jobs/{id}/results``, read one by one: ``end`` and ``after`` as :class:`JobResults` says."""

    def __init__(self) -> None:
        self.end: str | None = None
        self.after: int | None = None

    def _take(self, line: str) -> dict[str, Any] | None:
        """One line of the stream: its answer (``after`` moves to its ``seq``), or None for a blank line and for a
        followed stream's last line, which is not an answer (it sets ``end``, which no answer does, and ``after``)."""
        if not line.strip():
            return None
        row: dict[str, Any] = json.loads(line)
        if "end" in row and "seq" not in row:
            self.end, self.after = row["end"], row.get("after")
            return None
        self.after = row.get("seq", self.after)
        return row


class JobResults(_ResultLines, Iterator[dict[str, Any]]):
    """The answers of ``GET /jobs/{id}/results``, one dict per image, read as they stream (the request
    is sent at the first ``next``). Once the answers are read, a followed stream's ``end`` says why it
    ended: ``"finished"`` (every answer read), ``"deleted"`` (the job was deleted or expired meanwhile),
    ``"unavailable"`` (the service's store is unreachable: ask again with ``offset=after``); ``None``
    for a stream that was not followed, or that was cut before the service said why. ``after`` is the
    ``seq`` of the last answer sent."""

    def __init__(self, open_stream: Callable[[], AbstractContextManager[httpx.Response]]) -> None:
        super().__init__()
        self._answers = self._read(open_stream)

    def __next__(self) -> dict[str, Any]:
        return next(self._answers)

    def _read(self, open_stream: Callable[[], AbstractContextManager[httpx.Response]]) -> Iterator[dict[str, Any]]:
        with open_stream() as r:
            if r.status_code != 200:
                r.read()
                _check(r)
            lines = r.iter_lines()
            while True:
                try:
                    row = self._take(next(lines))
                except StopIteration:
                    return
                except httpx.TransportError:  # the stream was cut (a restart): ``end`` stays None; resume after ``after``
                    return
                if self.end is not None:
                    return
                if row is not None:
                    yield row


class AsyncJobResults(_ResultLines, AsyncIterator[dict[str, Any]]):
    """:class:`JobResults` for :class:`AsyncClient`: ``async for answer in ...``, then ``end`` and ``after``."""

    def __init__(self, open_stream: Callable[[], AbstractAsyncContextManager[httpx.Response]]) -> None:
        super().__init__()
        self._answers = self._read(open_stream)

    def __anext__(self) -> Awaitable[dict[str, Any]]:
        return self._answers.__anext__()

    async def _read(self, open_stream: Callable[[], AbstractAsyncContextManager[httpx.Response]]) -> AsyncIterator[dict[str, Any]]:
        async with open_stream() as r:
            if r.status_code != 200:
                await r.aread()
                _check(r)
            lines = r.aiter_lines()
            while True:
                try:
                    row = self._take(await lines.__anext__())
                except StopAsyncIteration:
                    return
                except httpx.TransportError:  # the stream was cut (a restart): ``end`` stays None; resume after ``after``
                    return
                if self.end is not None:
                    return
                if row is not None:
                    yield row


class _JobWait:
    """The rule of ``wait_job``, for both clients: each poll's status (or the transport error that stood in for
    it) in, the last status out once the job is done; ``TimeoutError`` past ``timeout``, and the error itself when
    the service has not answered for ``unreachable_s``."""

    def __init__(self, job_id: str, timeout: float | None, unreachable_s: float,
                 on_progress: Callable[[dict[str, Any]], None] | None) -> None:
        self.job_id, self.timeout, self.unreachable_s, self.on_progress = job_id, timeout, unreachable_s, on_progress
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.answered = time.monotonic()  # the last time the service answered: past unreachable_s without one, give up

    def polled(self, status: dict[str, Any] | None, err: httpx.TransportError | None = None) -> dict[str, Any] | None:
        if err is not None:
            if time.monotonic() - self.answered > self.unreachable_s:  # never came back (or never was there): say so
                raise err
            # the server restarts: the job is kept, ask again
        elif status is not None:
            self.answered = time.monotonic()
            if self.on_progress is not None:
                self.on_progress(status)
            if status["state"] == "done":
                return status
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError(f"job {self.job_id} not done within {self.timeout} s")
        return None


class Client:
    """Synchronous client. ``retries``: how often a 503 (busy) is retried, honouring Retry-After, and a
    proxy's plain 500/502 (a replica lost with the request in flight) with backoff."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: str | None = None, timeout: float = 300.0,
                 retries: int = 5, max_wait: float = 30.0, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"x-api-key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, transport=transport)
        self.retries, self.max_wait = retries, max_wait

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, image: ImageInput, fields: dict[str, Any]) -> dict[str, Any]:
        name, data = _file(image)
        for attempt in range(self.retries + 1):
            r = self._http.post(path, files={"file": (name, data)}, data=_fields(fields))
            wait = _retry_after(r, attempt, self.max_wait)
            if wait is None or attempt == self.retries:
                return _check(r)
            log.info("service busy; retrying %s in %.1f s", path, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def predict(self, image: ImageInput, *, model: str | None = None, top_k: int = 5, explain_if: str | None = None,
                **explain: Any) -> Prediction:
        """``explain_if`` (e.g. ``"confidence < 0.6"``): the answer's ``explanation`` is the predicted class's
        attribution when it holds; ``explain``: its method, preset, faithfulness."""
        return parse_prediction(self._post("/predict", image, {"model": model, "top_k": top_k, "explain_if": explain_if, **explain}))

    def attribute(self, image: ImageInput, *, method: str = "idg", **params: Any) -> Attribution:
        """``params``: any /attribute field (target, steps, probe_steps, baseline, return_attribution, ...)."""
        return parse_attribution(self._post("/attribute", image, {"method": method, **params}))

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            r = self._http.request(method, path, **kwargs)
            wait = _retry_after(r, attempt, self.max_wait)
            if wait is None or attempt == self.retries:
                return r
            log.info("service busy; retrying %s %s in %.1f s", method, path, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def submit_job(self, images: Sequence[ImageInput] | str | Path, *, method: str = "idg", explain_if: str | None = None,
                   callback_url: str | None = None, **params: Any) -> dict[str, Any]:
        """Submit a durable job (POST /jobs): a directory of images, a tar/zip archive, or a list of
        images, with any /attribute field in ``params``; ``explain_if`` explains an image only when it
        holds of its prediction; ``callback_url`` is POSTed the job's status when it ends. Returns the
        job's status (``id``, ``url``, ``results_url``)."""
        fields = _fields({"method": method, "explain_if": explain_if, "callback_url": callback_url, **params})
        r = self._send("POST", "/jobs", files=_job_files(images), data=fields)
        return _holding(_check(r, ok=202), "id", "total", "url")

    def job(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/{id}: state, done / failed / pending of total, eta_s."""
        return _holding(_check(self._send("GET", f"/jobs/{job_id}")), "id", "state", "done", "failed", "total")

    def jobs(self, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """GET /jobs: a page of jobs, newest first (``jobs``, ``total``, ``next``)."""
        return _holding(_check(self._send("GET", "/jobs", params={"offset": offset, "limit": limit})), "jobs", "total")

    def delete_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job and delete it with its answers."""
        return _check(self._send("DELETE", f"/jobs/{job_id}"))

    def wait_job(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None, unreachable_s: float = 120.0,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll until the job is done (``on_progress`` gets each status); its last status. A poll the
        service cannot answer (a restart) is retried until ``timeout``, or until it has not answered for
        ``unreachable_s`` (then the last ``httpx.TransportError``: a server that is not there had been waited for
        forever)."""
        wait = _JobWait(job_id, timeout, unreachable_s, on_progress)
        while True:
            try:
                done = wait.polled(self.job(job_id))
            except httpx.TransportError as err:
                done = wait.polled(None, err)
            if done is not None:
                return done
            time.sleep(poll_s)

    def job_results(self, job_id: str, *, offset: int = 0, summary: bool = False, follow: bool = False) -> JobResults:
        """The job's answers, one dict per image, in the order they were stored (JSON Lines, read as
        they stream); ``offset`` resumes after that many, ``summary`` leaves out the images,
        ``follow`` waits for the answers still to come; once read, a followed stream's ``end`` says why
        it ended (``finished``, ``deleted``, ``unavailable``)."""
        params: dict[str, str | int] = {"offset": offset, "summary": str(summary).lower(), "follow": str(follow).lower()}
        return JobResults(lambda: self._stream_retried(f"/jobs/{job_id}/results", params, None if follow else self._http.timeout))

    @contextmanager
    def _stream_retried(self, path: str, params: dict[str, str | int], timeout: Any) -> Iterator[httpx.Response]:
        """A streamed GET, its 503 (busy, the store unreachable) retried as :meth:`_send` retries, honouring Retry-After."""
        for attempt in range(self.retries + 1):
            with self._http.stream("GET", path, params=params, timeout=timeout) as r:
                wait = _retry_after(r, attempt, self.max_wait) if attempt < self.retries else None
                if wait is None:
                    yield r
                    return
                r.read()
            time.sleep(wait)

    def attribute_many(self, images: Sequence[ImageInput], *, concurrency: int = 4, method: str = "idg",
                       **params: Any) -> list[Attribution | ServiceError]:
        """Attribute every image with at most ``concurrency`` requests in flight; a failed image
        gives its :class:`ServiceError` in its place instead of stopping the others."""

        def one(image: ImageInput) -> Attribution | ServiceError:
            try:
                return self.attribute(image, method=method, **params)
            except ServiceError as err:
                return err

        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            return list(pool.map(one, images))


class AsyncClient:
    """The same calls, ``await``-able, jobs included (``job_results`` is an async iterator: ``async for``);
    ``attribute_many`` bounds concurrency with a semaphore."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, api_key: str | None = None, timeout: float = 300.0,
                 retries: int = 5, max_wait: float = 30.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        headers = {"x-api-key": api_key} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout, transport=transport)
        self.retries, self.max_wait = retries, max_wait

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, image: ImageInput, fields: dict[str, Any]) -> dict[str, Any]:
        name, data = _file(image)
        for attempt in range(self.retries + 1):
            r = await self._http.post(path, files={"file": (name, data)}, data=_fields(fields))
            wait = _retry_after(r, attempt, self.max_wait)
            if wait is None or attempt == self.retries:
                return _check(r)
            log.info("service busy; retrying %s in %.1f s", path, wait)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def predict(self, image: ImageInput, *, model: str | None = None, top_k: int = 5, explain_if: str | None = None,
                      **explain: Any) -> Prediction:
        return parse_prediction(await self._post("/predict", image, {"model": model, "top_k": top_k, "explain_if": explain_if, **explain}))

    async def attribute(self, image: ImageInput, *, method: str = "idg", **params: Any) -> Attribution:
        return parse_attribution(await self._post("/attribute", image, {"method": method, **params}))

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            r = await self._http.request(method, path, **kwargs)
            wait = _retry_after(r, attempt, self.max_wait)
            if wait is None or attempt == self.retries:
                return r
            log.info("service busy; retrying %s %s in %.1f s", method, path, wait)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable")

    async def submit_job(self, images: Sequence[ImageInput] | str | Path, *, method: str = "idg", explain_if: str | None = None,
                         callback_url: str | None = None, **params: Any) -> dict[str, Any]:
        """:meth:`Client.submit_job` (the files are read before the request is sent)."""
        fields = _fields({"method": method, "explain_if": explain_if, "callback_url": callback_url, **params})
        r = await self._send("POST", "/jobs", files=_job_files(images), data=fields)
        return _holding(_check(r, ok=202), "id", "total", "url")

    async def job(self, job_id: str) -> dict[str, Any]:
        """GET /jobs/{id}: state, done / failed / pending of total, eta_s."""
        return _holding(_check(await self._send("GET", f"/jobs/{job_id}")), "id", "state", "done", "failed", "total")

    async def jobs(self, offset: int = 0, limit: int = 50) -> dict[str, Any]:
        """GET /jobs: a page of jobs, newest first (``jobs``, ``total``, ``next``)."""
        return _holding(_check(await self._send("GET", "/jobs", params={"offset": offset, "limit": limit})), "jobs", "total")

    async def delete_job(self, job_id: str) -> dict[str, Any]:
        """Cancel a job and delete it with its answers."""
        return _check(await self._send("DELETE", f"/jobs/{job_id}"))

    async def wait_job(self, job_id: str, *, poll_s: float = 1.0, timeout: float | None = None, unreachable_s: float = 120.0,
                       on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """:meth:`Client.wait_job`, sleeping without blocking the event loop."""
        wait = _JobWait(job_id, timeout, unreachable_s, on_progress)
        while True:
            try:
                done = wait.polled(await self.job(job_id))
            except httpx.TransportError as err:
                done = wait.polled(None, err)
            if done is not None:
                return done
            await asyncio.sleep(poll_s)

    def job_results(self, job_id: str, *, offset: int = 0, summary: bool = False, follow: bool = False) -> AsyncJobResults:
        """:meth:`Client.job_results`: ``async for answer in client.job_results(id, follow=True)``."""
        params: dict[str, str | int] = {"offset": offset, "summary": str(summary).lower(), "follow": str(follow).lower()}
        return AsyncJobResults(lambda: self._stream_retried(f"/jobs/{job_id}/results", params, None if follow else self._http.timeout))

    @asynccontextmanager
    async def _stream_retried(self, path: str, params: dict[str, str | int], timeout: Any) -> AsyncIterator[httpx.Response]:
        for attempt in range(self.retries + 1):
            async with self._http.stream("GET", path, params=params, timeout=timeout) as r:
                wait = _retry_after(r, attempt, self.max_wait) if attempt < self.retries else None
                if wait is None:
                    yield r
                    return
                await r.aread()
            await asyncio.sleep(wait)

    async def attribute_many(self, images: Iterable[ImageInput], *, concurrency: int = 4, method: str = "idg",
                             **params: Any) -> list[Attribution | ServiceError]:
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(image: ImageInput) -> Attribution | ServiceError:
            async with gate:
                try:
                    return await self.attribute(image, method=method, **params)
                except ServiceError as err:
                    return err

        return list(await asyncio.gather(*[one(i) for i in images]))
