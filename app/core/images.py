"""Uploaded bytes -> a model-ready tensor, with the HTTP status each failure deserves."""

from __future__ import annotations

import base64
import binascii

import torch
from PIL import Image
from torch import Tensor

from app.core.errors import ApiError
from idg_core.models import ImageClassifier, ImageDecodeError, ImageTooLargeError, decode_image

FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")


def decode_upload(data: bytes, max_pixels: int) -> Image.Image:
    """Decode fully and convert to RGB: 415 for what is not a supported image, 413 for too many
    pixels, 400 for a truncated or corrupt file."""
    try:
        return decode_image(data, max_pixels=max_pixels, formats=FORMATS)
    except ImageTooLargeError as err:
        raise ApiError(413, str(err), code="image_too_large") from err
    except ImageDecodeError as err:
        status = 415 if "supported format" in str(err) else 400
        raise ApiError(status, str(err), code="unsupported_image" if status == 415 else "bad_image") from err


def decode_base64(text: str) -> bytes:
    if "," in text[:100] and text.startswith("data:"):
        text = text.split(",", 1)[1]
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ApiError(400, "image is not valid base64", code="bad_image") from err


def model_input(data: bytes, model: ImageClassifier, max_pixels: int, device: torch.device) -> Tensor:
    """Uploaded bytes -> ``(3, S, S)`` in [0, 1] on ``device``, as this model expects (CPU work:
    call it off the event loop)."""
    return model.prepare(decode_upload(data, max_pixels)).to(device)
