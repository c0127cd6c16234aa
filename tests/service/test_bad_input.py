"""Every bad input gets its 4xx and one sentence; odd but valid images are converted."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from app.core.images import decode_upload
from idg_core.preprocess import UnsupportedImageError, decode_image
from tests.service.conftest import AppFactory, image_bytes, serve


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _png_header(width: int, height: int) -> bytes:
    """A PNG of a header only: its IHDR declares the size, no pixel follows."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IEND", b"")


def _broken_jpeg_header() -> bytes:
    data = bytearray(image_bytes(fmt="JPEG"))
    at = data.find(b"\xff\xc4")  # its Huffman table, overwritten
    data[at + 4:at + 40] = b"\xff" * 36
    return bytes(data)


@pytest.mark.parametrize(
    ("content", "status", "words"),
    [
        (b"this is a text file, not a picture", 415, "not an image"),
        (image_bytes(fmt="JPEG")[:300], 400, "truncated"),
        (image_bytes(fmt="ICO"), 415, "supported format"),
        (b"", 400, "empty"),
        (_png(Image.new("L", (9000, 9000))), 413, "pixels"),
        # past Pillow's own bomb limit (89 megapixels): its sentence had named its limit, not the service's
        (_png_header(50_000, 50_000), 413, "the image has 2500000000 pixels, more than the limit of 25000000"),
        # a supported format with a broken header had been "not an image in a supported format" (415)
        (_broken_jpeg_header(), 400, "it starts as a JPEG file but its header is corrupt"),
        (_png_header(0, 0), 400, "it starts as a PNG file but its header is corrupt"),
    ],
    ids=["text", "truncated-jpeg", "ico", "empty", "pixel-bomb", "pillow-bomb", "broken-jpeg-header", "zero-size-png"],
)
async def test_bad_images(tiny_app: AppFactory, content: bytes, status: int, words: str) -> None:
    async with serve(tiny_app(max_image_pixels=50_000_000 // 2)) as client:
        for route in ("/predict", "/attribute"):
            r = await client.post(route, files={"file": ("x", content, "application/octet-stream")})
            assert r.status_code == status, r.text
            assert words in r.json()["error"]["message"]


async def test_body_over_the_limit_is_413(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(max_upload_bytes=1000)) as client:
        r = await client.post("/predict", files={"file": ("a.png", b"\x89PNG" + b"0" * 5000)})
        assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["L", "CMYK", "P", "I;16", "RGBA", "LA", "1"])
async def test_odd_modes_are_converted(tiny_app: AppFactory, mode: str) -> None:
    img = Image.new("RGB", (40, 30), (200, 30, 60)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="TIFF" if mode in ("CMYK", "I;16") else "PNG")
    async with serve(tiny_app()) as client:
        r = await client.post("/predict", files={"file": ("a", buf.getvalue())})
        assert r.status_code == 200, r.text


def test_sixteen_bit_and_alpha_convert_sensibly() -> None:
    grey16 = Image.new("I;16", (4, 4), 65535)
    assert decode_upload(_png(grey16), 10_000).getpixel((0, 0)) == (255, 255, 255)
    clear = Image.new("RGBA", (4, 4), (0, 0, 0, 0))
    assert decode_upload(_png(clear), 10_000).getpixel((0, 0)) == (255, 255, 255)  # on white


def _png_keyed(img: Image.Image, colour: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", transparency=colour)
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_transparent_colour_is_composited_on_white_as_an_alpha_channel_is(mode: str) -> None:
    """A PNG's transparent colour (tRNS) in an RGB or grey image had been passed through as that colour (black here),
    where the same picture with an alpha channel or a palette came out white: the model saw two different images."""
    img = Image.new("RGB", (4, 4), (0, 0, 0)).convert(mode)
    img.putpixel((1, 1), 128 if mode == "L" else (128, 128, 128))
    colour = {"RGB": (0, 0, 0), "L": 0}[mode]
    out = decode_upload(_png_keyed(img, colour), 10_000)
    assert out.getpixel((0, 0)) == (255, 255, 255)  # transparent: on white, as RGBA (0, 0, 0, 0) is
    assert out.getpixel((1, 1)) == (128, 128, 128)  # an opaque pixel keeps its colour


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _hand_png(bit_depth: int, colour_type: int, row: bytes, key: bytes, *, text_first: bool = False, key_last: bool = False) -> bytes:
    """A one-row PNG written by hand (Pillow writes no 1-, 2- or 4-bit grey nor 16-bit RGB), with a tRNS chunk; with
    ``text_first`` a text chunk comes before IHDR, with ``key_last`` tRNS after the image data (both against the
    PNG spec, both read by Pillow)."""
    width = len(row) * 8 // (bit_depth * (3 if colour_type == 2 else 1))
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, 1, bit_depth, colour_type, 0, 0, 0))
    data, trns = _chunk(b"IDAT", zlib.compress(b"\x00" + row)), _chunk(b"tRNS", key)
    return (b"\x89PNG\r\n\x1a\n" + (_chunk(b"tEXt", b"a\x00b") if text_first else b"") + header
            + (data + trns if key_last else trns + data) + _chunk(b"IEND", b""))


@pytest.mark.parametrize(("bit_depth", "row", "key", "opaque"), [
    (1, bytes([0b01000000]), 0, 255),  # 2 pixels: 0 (the key), 1 (white)
    (2, bytes([0b01100000]), 1, 170),  # 4 pixels, the first two: 1 (the key), 2 (170 of 255)
    (4, bytes([0x5A]), 5, 170),  # 5 (the key), 10 (170 of 255)
    (8, bytes([7, 128]), 7, 128),
    (16, struct.pack(">HH", 0x1234, 0x8000), 0x1234, 128),
], ids=["1-bit", "2-bit", "4-bit", "8-bit", "16-bit"])
@pytest.mark.parametrize("layout", [{}, {"text_first": True}, {"key_last": True}], ids=["plain", "text-first", "key-last"])
def test_a_grey_png_s_transparent_value_is_read_at_its_own_bit_depth(
    bit_depth: int, row: bytes, key: int, opaque: int, layout: dict[str, bool],
) -> None:
    """Pillow decodes 2- and 4-bit grey as 0-255 but kept the tRNS value on the file's scale, and 16-bit grey was
    rescaled without it: the transparent pixel passed through as its grey (found by review); so it did again where
    the bit depth was read at IHDR's place in the file and the file had a chunk before IHDR, or its tRNS after the
    image data, which Pillow reads with the pixels (found by the review of that fix)."""
    out = decode_upload(_hand_png(bit_depth, 0, row, struct.pack(">H", key), **layout), 10_000)
    assert out.getpixel((0, 0)) == (255, 255, 255)  # the key: transparent, on white
    assert out.getpixel((1, 0)) == (opaque,) * 3  # the next pixel keeps its grey


def test_a_transparent_value_beyond_the_bit_depth_makes_no_pixel_transparent() -> None:
    # a malformed key (256 in an 8-bit file) had matched its low byte: every black pixel turned white
    out = decode_upload(_hand_png(8, 0, bytes([0, 128]), struct.pack(">H", 256)), 10_000)
    assert out.getpixel((0, 0)) == (0, 0, 0) and out.getpixel((1, 0)) == (128, 128, 128)
    rgb = decode_upload(_hand_png(8, 2, bytes([0, 0, 0, 9, 9, 9]), struct.pack(">3H", 256, 0, 0)), 10_000)
    assert rgb.getpixel((0, 0)) == (0, 0, 0)


async def test_a_16_bit_rgb_png_with_a_transparent_colour_is_refused(tiny_app: AppFactory) -> None:
    """Pillow reads a 16-bit RGB PNG as 8-bit (the high bytes) but keeps the 16-bit key, which then matched the low
    byte of other pixels: here the opaque (0x3400, 0, 0) turned white and the transparent (0x1234, 0, 0) stayed red.
    Its transparent pixels cannot be told apart once read, so it is a 415 that says what to send."""
    row, key = struct.pack(">6H", 0x1234, 0, 0, 0x3400, 0, 0), struct.pack(">3H", 0x1234, 0, 0)
    for layout in ({}, {"text_first": True}, {"key_last": True}):
        with pytest.raises(UnsupportedImageError, match="16-bit RGB PNG with a transparent colour"):
            decode_image(_hand_png(16, 2, row, key, **layout))
    async with serve(tiny_app()) as client:
        r = await client.post("/predict", files={"file": ("a.png", _hand_png(16, 2, row, key))})
    assert r.status_code == 415 and "send it as 8-bit or with an alpha channel" in r.json()["error"]["message"], r.text


async def test_a_float_tiff_is_refused_not_stretched_by_its_own_maximum(tiny_app: AppFactory) -> None:
    """A 32-bit float image had been divided by its own maximum: constant 0.25, 0.5 and 1.0 images all became white."""
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 30), 0.25, np.float32)).save(buf, format="TIFF")
    async with serve(tiny_app()) as client:
        r = await client.post("/predict", files={"file": ("a.tiff", buf.getvalue())})
    assert r.status_code == 415 and "32-bit float images are not supported" in r.json()["error"]["message"], r.text


def test_a_limit_above_pillows_warning_is_the_limit() -> None:
    """With IDG_MAX_IMAGE_PIXELS above Pillow's warning (89 megapixels), an image under the limit had been refused,
    saying it was "more than the limit" it was under."""
    from idg_core.preprocess import open_image

    assert open_image(_png_header(10_000, 10_000), max_pixels=150_000_000).size == (10_000, 10_000)
    with pytest.raises(Exception, match="the image has 10000x10000 pixels, more than the limit of 90000000"):
        open_image(_png_header(10_000, 10_000), max_pixels=90_000_000)


@pytest.mark.parametrize("value", [-100_000, 100_000], ids=["negative", "past 16 bits"])
async def test_a_32_bit_integer_tiff_out_of_16_bits_is_refused_not_clipped(tiny_app: AppFactory, value: int) -> None:
    """Clipped to 0-65535, such an image had been answered as a black or a white one."""
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 30), value, np.int32)).save(buf, format="TIFF")
    async with serve(tiny_app()) as client:
        r = await client.post("/predict", files={"file": ("a.tiff", buf.getvalue())})
    assert r.status_code == 415 and "32-bit integer images with values outside 0-65535" in r.json()["error"]["message"], r.text


def test_exif_orientation_is_honoured() -> None:
    img = Image.new("RGB", (60, 20), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise to display
    buf = io.BytesIO()
    img.save(buf, format="JPEG", exif=exif)
    assert decode_upload(buf.getvalue(), 10_000).size == (20, 60)


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        ({"target": "1000"}, 422, "target must be < 1000"),
        ({"target": "-3"}, 422, "target"),
        ({"model": "resnet9000"}, 404, "unknown model"),
        ({"method": "saliency"}, 422, "method"),
        ({"steps": "100000"}, 422, "steps must be <= 512"),
        ({"steps": "1", "method": "idg"}, 422, "steps must be >= 2"),
        ({"probe_steps": "2"}, 422, "probe_steps"),
        ({"placement": "middle"}, 422, "placement"),
        ({"top_k": "5000"}, 422, "top_k"),
        ({"colour": "red"}, 422, "unknown field"),
        ({"uniform": "perhaps"}, 422, "uniform"),
    ],
)
async def test_bad_parameters(tiny_app: AppFactory, fields: dict, status: int, words: str) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
        assert r.status_code == status, r.text
        assert words in r.json()["error"]["message"]


async def test_missing_file_wrong_content_type_and_bad_json(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", data={"method": "idg"}, files={"other": ("a", b"x")})
        assert r.status_code == 422 and "file" in r.json()["error"]["message"]
        r = await client.post("/predict", content=b"hello", headers={"content-type": "text/plain"})
        assert r.status_code == 415
        r = await client.post("/predict", json={"image": "%%%not base64%%%"})
        assert r.status_code == 400 and "base64" in r.json()["error"]["message"]
        r = await client.post("/predict", json={"picture": "abc"})
        assert r.status_code == 422
        # a body that stops before its closing boundary: the parser had dropped the open part, and the answer said no
        # file was sent
        open_part = b'--XYZ\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n' + image_bytes()
        r = await client.post("/predict", content=open_part, headers={"content-type": "multipart/form-data; boundary=XYZ"})
        assert r.status_code == 400 and "ends without its closing boundary (--XYZ--)" in r.json()["error"]["message"], r.text


async def test_api_key(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(api_key="s3cret")) as client:
        files = {"file": ("a.png", image_bytes())}
        r = await client.post("/predict", files=files)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
        r = await client.post("/predict", files=files, headers={"x-api-key": "wrong"})
        assert r.status_code == 401 and "wrong" in r.json()["error"]["message"]
        assert (await client.post("/predict", files=files, headers={"x-api-key": "s3cret"})).status_code == 200
        assert (await client.post("/predict", files=files, headers={"authorization": "Bearer s3cret"})).status_code == 200
        r = await client.get("/health/ready")  # probes need no key, and tell a stranger nothing more than the status
        assert r.status_code == 200 and r.json() == {"status": "ready"}
        r = await client.get("/health/ready", headers={"x-api-key": "s3cret"})
        assert r.json() == {"status": "ready", "models": ["tiny"], "job_store": "up"}
        metrics = await client.get("/metrics")  # off by default: scrapes come over a protected network
        assert metrics.status_code == 200 and "idg_http_requests_total" in metrics.text


async def test_metrics_behind_the_key_when_asked(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(api_key="s3cret", metrics_need_key=True)) as client:
        r = await client.get("/metrics")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert (await client.get("/metrics", headers={"x-api-key": "wrong"})).status_code == 401
        r = await client.get("/metrics", headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200 and "idg_http_requests_total" in r.text
    async with serve(tiny_app(metrics_need_key=True)) as client:  # no key set: nothing to ask for
        assert (await client.get("/metrics")).status_code == 200


async def test_a_method_a_path_does_not_take_gets_405_naming_every_method_the_schema_documents_there(tiny_app: AppFactory) -> None:
    """Starlette's Allow named the first route's methods only (POST for /jobs, whose GET is a route of its own), and the
    Open Inference Protocol's catch-all answered a known /v2 path with another method 404: schemathesis's coverage
    run checks both against /openapi.json."""
    app = tiny_app()
    async with serve(app) as client:
        documented = app.openapi()["paths"]
        for method, path, template in [("PATCH", "/jobs", "/jobs"), ("POST", "/jobs/abc", "/jobs/{job_id}"),
                                       ("PUT", "/predict", "/predict"), ("POST", "/v2/health/live", "/v2/health/live"),
                                       ("DELETE", "/v2/models/tiny", "/v2/models/{name}")]:
            r = await client.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == ", ".join(sorted(m.upper() for m in documented[template])), (method, path)
            error = r.json()["error"]  # each in its own form: the service's, or the protocol's (a sentence) under /v2
            assert (method in error) if path.startswith("/v2/") else error["status"] == 405
        unknown = await client.post("/v2/nothing")
    assert unknown.status_code == 404 and "allow" not in unknown.headers
