"""A minimal PNG writer for 8-bit grey and RGB arrays, with zlib doing the compression.

Why not Pillow: for what the service answers it is faster and, for heatmaps, smaller (measured:
docs/results/speed.md). Pillow chooses a row filter by itself, which on a heatmap (a
few hundred exact colours) costs time and bytes; here the caller names the filter that suits the
picture. The output is a standard PNG: every reader, Pillow's included, decodes it.

The compression is ISA-L's deflate (the ``isal`` package, a dependency where it has wheels) when installed, else zlib's: the same
zlib stream format, several times faster on these pictures at sizes within a few percent (measured:
docs/results/speed.md), and it releases the GIL while it compresses, as zlib does. With zlib, writing the PNGs is an
answer's largest host cost after decoding the upload.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
FILTER_NONE, FILTER_UP = 0, 2
"""Row filters (PNG spec, section 9): ``NONE`` suits heatmaps, whose colours repeat exactly; ``UP`` (each
byte minus the one above it) suits photos and overlays (sizes: docs/results/speed.md)."""


def _deflater() -> tuple[str, Callable[[bytes, int], bytes], int]:
    """The compressor's name, its ``compress(data, level)`` and the level: ISA-L's 2 (as fast as its 1 here, a few percent
    smaller; its levels are 0-3), or zlib's 1 where isal has no wheel (higher levels cost more time than they save)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return "zlib", zlib.compress, 1
    return "isal", isal_zlib.compress, 2


DEFLATE, _compress, LEVEL = _deflater()
_COLOUR_TYPE = {1: 0, 3: 2}  # channels -> PNG colour type (grey, RGB)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(array: np.ndarray, row_filter: int = FILTER_NONE) -> bytes:
    """``array``: ``(H, W)`` grey or ``(H, W, 3)`` RGB, uint8, as PNG bytes, every row filtered with
    ``row_filter`` (:data:`FILTER_NONE` or :data:`FILTER_UP`)."""
    if array.dtype != np.uint8:
        raise ValueError(f"a PNG is written from uint8 pixels, got {array.dtype}")
    channels = 1 if array.ndim == 2 else array.shape[2] if array.ndim == 3 else 0
    if channels not in _COLOUR_TYPE:
        raise ValueError(f"a PNG is written from (H, W) or (H, W, 3) pixels, got shape {array.shape}")
    if row_filter not in (FILTER_NONE, FILTER_UP):
        raise ValueError(f"row_filter must be FILTER_NONE or FILTER_UP, got {row_filter}")
    height, width = array.shape[:2]
    rows = np.ascontiguousarray(array).reshape(height, width * channels)
    raw = np.empty((height, width * channels + 1), dtype=np.uint8)
    raw[:, 0] = row_filter
    raw[:, 1:] = rows
    if row_filter == FILTER_UP and height > 1:
        np.subtract(rows[1:], rows[:-1], out=raw[1:, 1:])  # modulo 256, as the spec wants; the first row has nothing above
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOUR_TYPE[channels], 0, 0, 0)
    return SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", _compress(raw.tobytes(), LEVEL)) + _chunk(b"IEND", b"")
