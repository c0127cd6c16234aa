"""Images in: decode bytes safely, convert any mode to RGB, resize + centre-crop to a model's input.

Cost is bounded by the declared size, checked from the header before any pixel is decoded: at most
``max_pixels`` pixels, ``max_side`` per side and ``max_aspect_ratio`` (longer side / shorter side).
Only the first frame of an animation or a multi-page file is decoded. Large JPEGs can be decoded
at 1/2, 1/4 or 1/8 scale (``min_side``) and :func:`resize_crop` resamples only the region its crop
needs, so memory is the decoded image plus the output, whatever the shape.
"""

from __future__ import annotations

import io
import math
import re
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

IMAGENET_MEAN = (0.485, 0.456, 0.406)
"""ImageNet mean colour in pixel space (the normalisation of ImageNet-trained models; zero after it is the
IDG authors' baseline, ``baseline="mean"``)."""
IMAGENET_STD = (0.229, 0.224, 0.225)

INTERPOLATIONS = {
    "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC, "nearest": Image.Resampling.NEAREST,
    "lanczos": Image.Resampling.LANCZOS, "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING,
}
MAX_RESIZED_PIXELS = 1 << 22
"""Up to this many pixels (12 MiB of RGB) :func:`resize_crop` resizes the whole image and crops it;
beyond (a shape over 64:1 at 256 pixels), it computes only the crop."""
DRAFT_GAP = 4
"""A JPEG is decoded at reduced scale only if its shorter side stays >= DRAFT_GAP x ``min_side``, so
the resize after it still averages >= 4 pixels per output pixel and the crop stays within a grey level of a full
decode's (measured, with a gap of 3 for comparison: docs/results/speed.md)."""
STRIP_PIXELS = 1 << 20
"""Mode conversion works in strips of about this many pixels, so it needs no full-size temporaries."""


class ImageDecodeError(ValueError):
    """The bytes are not an image this project can read; ``reason`` is one user-facing sentence."""


class ImageTooLargeError(ImageDecodeError):
    """The image is over a size limit (a decompression bomb, or just too big); ``limit`` names
    which: ``"pixels"`` (width x height) or ``"side"``."""

    def __init__(self, message: str, limit: str = "pixels") -> None:
        super().__init__(message)
        self.limit = limit


class ImageShapeError(ImageDecodeError):
    """The image's aspect ratio (longer side / shorter side) is over the limit."""


class UnsupportedImageError(ImageDecodeError):
    """The bytes are not an image in any of the accepted formats (as opposed to a broken file of one)."""


def check_size(size: tuple[int, int], max_pixels: int | None, max_side: int | None = None, max_aspect_ratio: float | None = None) -> None:
    """Refuse a ``(width, height)`` over a limit, with one sentence that names the limit."""
    w, h = size
    if max_side is not None and max(w, h) > max_side:
        raise ImageTooLargeError(f"the image is {w}x{h} pixels; a side longer than {max_side} pixels is over the limit", "side")
    if max_pixels is not None and w * h > max_pixels:
        raise ImageTooLargeError(f"the image has {w}x{h} pixels, more than the limit of {max_pixels}", "pixels")
    if max_aspect_ratio is not None and max(w, h) > max_aspect_ratio * max(1, min(w, h)):
        ratio = max(w, h) / max(1, min(w, h))
        raise ImageShapeError(f"the image is {w}x{h} pixels, an aspect ratio of {ratio:.1f}:1, over the limit of {max_aspect_ratio:g}:1")


def open_image(
    data: bytes, max_pixels: int | None = 50_000_000, formats: tuple[str, ...] | None = None, *,
    max_side: int | None = None, max_aspect_ratio: float | None = None, min_side: int | None = None,
) -> Image.Image:
    """Read only the header of ``data`` and check the limits (see :func:`check_size`); nothing is
    decoded yet. With ``min_side``, a JPEG much larger than that is set to decode at reduced scale
    (its shorter side stays >= ``DRAFT_GAP * min_side``): ``size`` is then the size it will have."""
    if not data:
        raise ImageDecodeError("the uploaded file is empty")
    try:
        with warnings.catch_warnings():  # with a limit of our own, Pillow's warning (past 89 megapixels) is not the limit
            warnings.simplefilter("error" if max_pixels is None else "ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=formats)
        check_size(img.size, max_pixels, max_side, max_aspect_ratio)
        if img.format == "PNG" and "transparency" in img.info and (_png_rawmode(img) or "").startswith("RGB;16"):
            raise UnsupportedImageError(_RGB16_KEYED)  # known from the header: refused before any pixel is read
        if min_side is not None and img.format in ("JPEG", "MPO"):
            _draft(img, min_side)
    except ImageDecodeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
        # Pillow's own check (past 89 megapixels) comes before ours: word it by our limit, not Pillow's
        pixels = re.search(r"Image size \((\d+) pixels\)", str(err))
        if pixels and max_pixels is not None and int(pixels[1]) > max_pixels:
            raise ImageTooLargeError(f"the image has {int(pixels[1])} pixels, more than the limit of {max_pixels}", "pixels") from err
        raise ImageTooLargeError(f"the image is too large to decode safely ({err})") from err
    except UnidentifiedImageError as err:
        known = next((name for magic, name in _SIGNATURES if data.startswith(magic) and (name != "WebP" or data[8:12] == b"WEBP")), None)
        if known is not None:  # a file of a supported format whose header is broken: corrupt, not unsupported
            raise ImageDecodeError(f"the image could not be decoded: it starts as a {known} file but its header is corrupt") from err
        raise UnsupportedImageError("the file is not an image in a supported format (JPEG, PNG, WebP, GIF, BMP, TIFF)") from err
    except Exception as err:  # noqa: BLE001 - Pillow raises many types on malformed files
        raise ImageDecodeError(f"the image could not be decoded, it may be truncated or corrupt ({type(err).__name__}: {err})") from err
    return img


_SIGNATURES = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"RIFF", "WebP"),
               (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
"""The first bytes of each supported format (WebP's RIFF also names WEBP at bytes 8-12)."""

_RGB16_KEYED = ("a 16-bit RGB PNG with a transparent colour (tRNS) is not supported (its transparent pixels cannot be "
                "told apart once read): send it as 8-bit or with an alpha channel")
_PNG_GREY_BITS = {"1": 1, "L;2": 2, "L;4": 4, "L": 8}
"""Pillow's raw modes of the grey PNGs it decodes to 0-255 (mode ``1`` or ``L``), by their bit depth."""


def _png_rawmode(img: Image.Image) -> str | None:
    """A PNG's pixel layout as Pillow parsed it from the file (``L;4``, ``I;16B``, ``RGB;16B``...), before its
    pixels are read (afterwards Pillow forgets it); None for another format."""
    rawmode = getattr(getattr(img, "png", None), "im_rawmode", None)
    tile = getattr(img, "tile", None)  # an ImageFile's (not a plain Image's): [(codec, box, offset, rawmode)] for a PNG
    if rawmode is None and tile:
        rawmode = tile[0].args
    return rawmode if isinstance(rawmode, str) else None


def _png_transparent_colour(img: Image.Image, rawmode: str) -> None:
    """Put a grey or RGB PNG's transparent colour (tRNS) on the scale of the pixels Pillow decoded, as :func:`to_rgb`
    reads it; called once the pixels are read (a tRNS chunk after the image data is read with them), with the raw
    mode Pillow parsed (not the header's bytes: Pillow takes files whose first chunk is not IHDR). Pillow keeps the
    file's own value: a 2- or 4-bit grey is decoded as 0-255 (x85, x17) while its key stayed 0-3 or 0-15, so no pixel
    matched it; a key beyond the bit depth (a malformed file) matched the low byte of unrelated pixels, where it
    should match none. A 16-bit RGB PNG is decoded to 8 bits (the high byte) with its 16-bit key, which then matched
    the low byte of other pixels (an opaque pixel turned white): its transparent pixels cannot be told apart once
    read, so it is refused, saying what to send. 16-bit grey keeps its full values (mode I;16) and its key."""
    if "transparency" not in img.info or img.mode == "P":
        return
    key = img.info["transparency"]
    if rawmode.startswith("RGB;16"):
        raise UnsupportedImageError(_RGB16_KEYED)
    bits = _PNG_GREY_BITS.get(rawmode)
    if bits == 1 and isinstance(key, int):
        img.info["transparency"] = 255 if key else 0  # its pixels read 0 or 255 (Pillow 13 gives the key so already)
    elif bits is not None and isinstance(key, int):
        top = (1 << bits) - 1
        if key > top:
            del img.info["transparency"]  # no pixel can have that value: none is transparent
        else:
            img.info["transparency"] = key * 255 // top
    elif rawmode == "RGB" and isinstance(key, tuple) and max(key) > 255:
        del img.info["transparency"]


def _draft(img: Image.Image, min_side: int) -> None:
    """Decode a JPEG at 1/8, 1/4 or 1/2 scale (libjpeg's DCT scaling) when its shorter side stays
    >= ``DRAFT_GAP * min_side``, and only at a scale that divides both sides: every reduced pixel
    then stands for exactly ``scale x scale`` pixels and the centre crop falls where it would at
    full scale (a partial last pixel would shift it)."""
    w, h = img.size
    for scale in (8, 4, 2):
        if min(w, h) >= scale * DRAFT_GAP * min_side and w % scale == 0 and h % scale == 0:
            img.draft(None, (w // scale, h // scale))
            return


IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
"""The files the command-line tools read from a folder of photos (any case)."""


def image_files(folder: Path) -> list[Path]:
    """The photos in ``folder`` (by :data:`IMAGE_SUFFIXES`), sorted by name."""
    return sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)


def decode_image(
    data: bytes, max_pixels: int | None = 50_000_000, formats: tuple[str, ...] | None = None, *,
    max_side: int | None = None, max_aspect_ratio: float | None = None, min_side: int | None = None,
) -> Image.Image:
    """Check the limits from the header (:func:`open_image`), decode the first frame fully (a
    truncated file fails here), honour EXIF orientation and return an RGB image."""
    img = open_image(data, max_pixels, formats, max_side=max_side, max_aspect_ratio=max_aspect_ratio, min_side=min_side)
    rawmode = _png_rawmode(img) if img.format == "PNG" else None
    try:
        img.load()
    except Exception as err:  # noqa: BLE001 - Pillow raises many types on malformed files
        raise ImageDecodeError(f"the image could not be decoded, it may be truncated or corrupt ({type(err).__name__}: {err})") from err
    if rawmode is not None:
        _png_transparent_colour(img, rawmode)
    ImageOps.exif_transpose(img, in_place=True)
    return to_rgb(img)


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> RGB: 16-bit greys are rescaled, alpha is composited on white (an alpha channel, a palette's
    transparent entry, or an RGB or grey image's transparent colour alike: ``info["transparency"]`` on the scale its
    pixels read, as :func:`open_image` puts a PNG's), palette, CMYK, grey and YCbCr are converted.
    32-bit float images are refused (:class:`UnsupportedImageError`): their range is not defined, and stretching each by
    its own maximum would make every constant image white. Large images are converted in strips (every step is per
    pixel), so the only full-size allocation is the RGB result."""
    if img.mode == "RGB" and "transparency" not in img.info:
        return img
    if img.mode == "F":
        raise UnsupportedImageError("32-bit float images are not supported (their value range is not defined): "
                                    "send it as 8- or 16-bit")
    w, h = img.size
    top = None
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        rows = max(1, STRIP_PIXELS // max(1, w))
        peak, low = -math.inf, math.inf
        for y in range(0, h, rows):  # a strip at a time: the only full-size allocation stays the RGB result
            strip = np.asarray(img.crop((0, y, w, min(h, y + rows))), dtype=np.float64)
            peak, low = max(peak, float(strip.max())), min(low, float(strip.min()))
        if img.mode == "I" and (low < 0 or peak > 65535):  # clipped to 0-65535 they would answer black or white images
            raise UnsupportedImageError(f"32-bit integer images with values outside 0-65535 are not supported (their value range "
                                        f"is not defined; this one holds {low:g} to {peak:g}): send it as 8- or 16-bit")
        top = 65535.0 if img.mode.startswith("I;16") or peak > 255 else 255.0
    if w * h <= STRIP_PIXELS:
        return _to_rgb(img, top)
    out = Image.new("RGB", (w, h))
    rows = max(1, STRIP_PIXELS // w)
    for y in range(0, h, rows):
        out.paste(_to_rgb(img.crop((0, y, w, min(h, y + rows))), top), (0, y))
    return out


def _to_rgb(img: Image.Image, top: float | None) -> Image.Image:
    key = img.info.get("transparency")
    if top is not None:  # 16-bit or 32-bit integer grey, rescaled by the whole image's ``top``
        arr = np.asarray(img, dtype=np.float64)
        grey = (arr.clip(0, top) / top * 255).round().astype(np.uint8)
        if isinstance(key, int):  # its transparent value, on the full-depth scale: alpha 0 where a pixel has it
            img = Image.fromarray(np.stack([grey, np.where(arr == key, 0, 255).astype(np.uint8)], axis=-1), mode="LA")
        else:
            img = Image.fromarray(grey, mode="L")
    if img.mode == "1" and isinstance(key, int):  # 0 or 255, as its pixels read
        img = img.convert("L")
        img.info["transparency"] = key
    if img.mode == "P" or (img.mode in ("RGB", "L") and "transparency" in img.info):
        img = img.convert("RGBA")  # a transparent palette entry or colour becomes alpha 0, composited below
    if img.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(white, rgba)
    return img.convert("RGB")


def resize_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str = "bilinear") -> Image.Image:
    """Resize the shorter side to ``resize_size`` and take the central ``crop_size`` square.

    When the resized image would exceed ``MAX_RESIZED_PIXELS`` (only very elongated images: 100000x1
    would become 25600000x256), only the crop is computed, straight from the source region under it
    (Pillow's ``box``: the same filter taps, equal up to rounding), so time and memory follow the
    crop, however elongated the source."""
    w, h = img.size
    s = resize_size / min(w, h)
    rw, rh = max(crop_size, round(w * s)), max(crop_size, round(h * s))
    left, top = (rw - crop_size) // 2, (rh - crop_size) // 2
    resample = INTERPOLATIONS[interpolation]
    if rw * rh > MAX_RESIZED_PIXELS:
        box = (left * w / rw, top * h / rh, (left + crop_size) * w / rw, (top + crop_size) * h / rh)
        return img.resize((crop_size, crop_size), resample, box=box)
    return img.resize((rw, rh), resample).crop((left, top, left + crop_size, top + crop_size))


def squash_crop(img: Image.Image, resize_size: int, crop_size: int, interpolation: str = "bilinear") -> Image.Image:
    """Resize the whole image to ``resize_size`` x ``resize_size`` (aspect ratio not kept, as Hugging
    Face's ViT processors and timm's ``crop_mode="squash"`` do), then take the central ``crop_size``
    square. Cost follows ``resize_size``, whatever the source's shape."""
    img = img.resize((resize_size, resize_size), INTERPOLATIONS[interpolation])
    left = (resize_size - crop_size) // 2
    return img if left == 0 else img.crop((left, left, left + crop_size, left + crop_size))


def to_tensor(img: Image.Image) -> Tensor:
    """RGB PIL image -> ``(3, H, W)`` float32 in [0, 1]."""
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8).copy()
    return torch.from_numpy(arr).permute(2, 0, 1).float().div_(255)
