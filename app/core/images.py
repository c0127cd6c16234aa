"""Uploaded bytes -> a model-ready tensor, with the HTTP status each failure deserves.

Limits (``IDG_MAX_IMAGE_PIXELS``, ``IDG_MAX_IMAGE_SIDE``, ``IDG_MAX_ASPECT_RATIO``) are checked
from the header before any pixel is decoded, so a refused image costs microseconds whatever it
declares. Large decodes (over ``LARGE_DECODE_PIXELS``) take one of
``IDG_MAX_CONCURRENT_DECODES`` slots, waited for on the event loop, not in a thread.
"""

from __future__ import annotations

import asyncio
import time
import weakref

import torch
from PIL import Image
from torch import Tensor

from app.core.config import Settings
from app.core.deadline import past_deadline
from app.core.errors import ApiError
from app.core.image_threads import in_image_thread
from idg_core.preprocess import (
    ImageDecodeError,
    ImageShapeError,
    ImageTooLargeError,
    UnsupportedImageError,
    decode_image,
    open_image,
)
from idg_core.types import to_device
from idg_models import ImageClassifier

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
LARGE_DECODE_PIXELS = 4_000_000
"""Decodes of more pixels than this (12 MB of RGB and up) wait for a slot."""
SETTING = {"pixels": "IDG_MAX_IMAGE_PIXELS", "side": "IDG_MAX_IMAGE_SIDE"}

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = weakref.WeakKeyDictionary()


def _api_error(err: ImageDecodeError) -> ApiError:
    if isinstance(err, ImageTooLargeError):
        return ApiError(413, f"{err} ({SETTING[err.limit]})", code="image_too_large")
    if isinstance(err, ImageShapeError):
        return ApiError(422, f"{err} (IDG_MAX_ASPECT_RATIO)", code="bad_aspect_ratio")
    if isinstance(err, UnsupportedImageError):
        return ApiError(415, str(err), code="unsupported_image")
    return ApiError(400, str(err), code="bad_image")


def decode_upload(
    data: bytes, max_pixels: int, *, max_side: int | None = None, max_aspect_ratio: float | None = None, min_side: int | None = None,
) -> Image.Image:
    """Check the limits from the header, decode the first frame fully and convert to RGB: 415 for
    what is not a supported image, 413 for too many pixels or too long a side, 422 for too
    elongated a shape, 400 for a truncated or corrupt file."""
    try:
        return decode_image(data, max_pixels, FORMATS, max_side=max_side, max_aspect_ratio=max_aspect_ratio, min_side=min_side)
    except ImageDecodeError as err:
        raise _api_error(err) from err


def decode_pixels(data: bytes, model: ImageClassifier, settings: Settings) -> int:
    """How many pixels decoding ``data`` for ``model`` will produce, from the header alone; raises
    the :class:`ApiError` of an image over a limit or not an image."""
    try:
        img = open_image(data, settings.max_image_pixels, FORMATS, max_side=settings.max_image_side,
                         max_aspect_ratio=settings.max_aspect_ratio, min_side=model.preprocessing.resize_size)
    except ImageDecodeError as err:
        raise _api_error(err) from err
    return img.width * img.height


def model_input(data: bytes, model: ImageClassifier, settings: Settings, device: torch.device) -> Tensor:
    """Uploaded bytes -> ``(3, S, S)`` in [0, 1] on ``device``, as this model expects (CPU work:
    call it off the event loop, or use :func:`load_input`)."""
    p = model.preprocessing
    img = decode_upload(data, settings.max_image_pixels, max_side=settings.max_image_side,
                        max_aspect_ratio=settings.max_aspect_ratio, min_side=p.resize_size)
    return to_device(model.prepare(img), device)  # queued behind the running model call, not waiting for it


class _Late(Exception):
    """The deadline passed before a decode started: it is not started."""


def _unless_late(deadline: float | None, data: bytes, model: ImageClassifier, settings: Settings, device: torch.device) -> Tensor:
    """:func:`model_input`, unless ``deadline`` passed while the decode waited for a thread."""
    if deadline is not None and time.monotonic() >= deadline:
        raise _Late
    return model_input(data, model, settings, device)


class _Large:
    """A decode over ``LARGE_DECODE_PIXELS``: not started, it waits for a slot on the event loop."""


def _small_now(deadline: float | None, data: bytes, model: ImageClassifier, settings: Settings, device: torch.device) -> Tensor | _Large:
    """:func:`_unless_late` for an image of at most ``LARGE_DECODE_PIXELS`` (its header read first), in the same
    thread: the common image costs the event loop one hand-over to a thread, not two."""
    if decode_pixels(data, model, settings) > LARGE_DECODE_PIXELS:
        return _Large()
    return _unless_late(deadline, data, model, settings, device)


async def _load(data: bytes, model: ImageClassifier, settings: Settings, device: torch.device, deadline: float | None) -> Tensor:
    small = await in_image_thread(_small_now, deadline, data, model, settings, device)
    if not isinstance(small, _Large):
        return small
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    slots = per_loop.setdefault(settings.max_concurrent_decodes, asyncio.Semaphore(settings.max_concurrent_decodes))
    async with slots:  # held until the decode's thread returns: this task is never cancelled (see load_input)
        return await asyncio.to_thread(_unless_late, deadline, data, model, settings, device)


async def load_input(
    data: bytes, model: ImageClassifier, settings: Settings, device: torch.device, deadline: float | None = None,
    timeout: float | None = None,
) -> Tensor:
    """:func:`model_input` in a thread; a large decode first waits for one of
    ``settings.max_concurrent_decodes`` slots (on the event loop, holding no thread). Past
    ``deadline`` (``time.monotonic()``, from the request's arrival) it answers 504 at once, naming the request's own
    ``timeout`` (seconds; the service's request timeout unless given: a gRPC call's may be shorter); a
    decode already running finishes in its thread and keeps its slot until then (a thread cannot
    be stopped, and freeing its slot early would let more decodes run than the setting allows),
    and one not yet started is not started."""
    task = asyncio.ensure_future(_load(data, model, settings, device, deadline))
    task.add_done_callback(_consume)  # a result nobody waits for any more is dropped quietly
    try:
        if deadline is None:
            return await asyncio.shield(task)
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            return await asyncio.shield(task)
    except (TimeoutError, _Late) as err:
        raise past_deadline(settings.request_timeout_s if timeout is None else timeout) from err


def _consume(task: asyncio.Future[Tensor]) -> None:
    if not task.cancelled():
        task.exception()
