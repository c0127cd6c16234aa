"""Images in: decode bytes safely, convert any mode to RGB, resize + centre-crop to a model's input."""

from __future__ import annotations

import io
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

INTERPOLATIONS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


class ImageDecodeError(ValueError):
    """The bytes are not an image this project can read; ``reason`` is one user-facing sentence."""


class ImageTooLargeError(ImageDecodeError):
    """The image has more pixels than allowed (a decompression bomb, or just too big)."""


def decode_image(data: bytes, max_pixels: int = 50_000_000, formats: tuple[str, ...] | None = None) -> Image.Image:
    """Decode ``data`` fully (a truncated file fails here), refuse more than ``max_pixels`` pixels,
    honour EXIF orientation and return an RGB image."""
    if not data:
        raise ImageDecodeError("the uploaded file is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=formats)
            if img.width * img.height > max_pixels:
                raise ImageTooLargeError(f"the image has {img.width}x{img.height} pixels, more than the limit of {max_pixels}")
            img.load()
    except ImageDecodeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        raise ImageTooLargeError(f"the image is too large to decode safely ({err})") from err
    except Image.UnidentifiedImageError as err:
        raise ImageDecodeError("the file is not an image in a supported format (JPEG, PNG, WebP, GIF, BMP, TIFF)") from err
    except Exception as err:  # noqa: BLE001 - Pillow raises many types on malformed files
        raise ImageDecodeError(f"the image could not be decoded, it may be truncated or corrupt ({type(err).__name__}: {err})") from err
    return to_rgb(ImageOps.exif_transpose(img))


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB: 16-bit and float greys are rescaled, alpha is composited on white,
    palette, CMYK, grey and YCbCr are converted."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        if img.mode == "F":
            top = max(float(arr.max()), 1e-12)
        img = Image.fromarray((arr.clip(0, top) / top * 255).round().astype(np.uint8), mode="L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)
    return img.convert("RGB")


def resize_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str = "bilinear") -> Image.Image:
    """Resize the shorter side to ``resize_size`` and take the central ``crop_size`` square."""
    w, h = img.size
    s = resize_size / min(w, h)
    img = img.resize((max(crop_size, round(w * s)), max(crop_size, round(h * s))), INTERPOLATIONS[interpolation])
    w, h = img.size
    left, top = (w - crop_size) // 2, (h - crop_size) // 2
    return img.crop((left, top, left + crop_size, top + crop_size))


def to_tensor(img: Image.Image) -> Tensor:
    """RGB PIL image -> ``(3, H, W)`` float32 in [0, 1]."""
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255)
