"""The common multipart form parsed from the body in memory (:mod:`app.api.multipart`) answers as Starlette's parser,
or leaves the body to it: generated forms, odd ones included, parsed both ways."""

from __future__ import annotations

import asyncio

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from app.api.multipart import FilePart, FormItems, simple_form


def _starlette(body: bytes, content_type: str, max_files: int = 2, max_fields: int = 64) -> FormItems | None:
    """The form as Starlette's parser reads it (None: it refuses the body)."""

    async def parse() -> FormItems | None:
        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
                 "headers": [(b"content-type", content_type.encode("latin-1"))]}
        try:
            form = await Request(scope, receive).form(max_files=max_files, max_fields=max_fields)
        except Exception:  # noqa: BLE001 - whatever it refuses, the fast path must not take
            return None
        return [(k, v if isinstance(v, str) else FilePart(v.filename or "", await v.read())) for k, v in form.multi_items()]

    return asyncio.run(parse())


def _httpx_form(fields: dict[str, str], files: dict[str, tuple[str, bytes, str]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", data=fields, files=files)
    return request.read(), request.headers["content-type"]


def test_what_the_clients_send_takes_the_fast_path_and_reads_as_starlette_reads_it() -> None:
    photo = bytes(range(256)) * 40 + b"\r\n--" + b"\r\n\r\n"  # bytes that look like delimiters and header ends
    for fields in ({}, {"method": "idg", "return_overlay": "false"}, {"name": "é ünïcode", "empty": ""}):
        body, ctype = _httpx_form(fields, {"file": ("tench.jpg", photo, "image/jpeg")})
        fast = simple_form(body, ctype, 2, 64)
        assert fast is not None and fast == _starlette(body, ctype)
        assert dict(fast)["file"] == FilePart("tench.jpg", photo)
    curl = (b"--------------------------d74496d66958873e\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n"
            b"Content-Type: image/png\r\n\r\nPNGDATA\r\n--------------------------d74496d66958873e\r\nContent-Disposition: "
            b"form-data; name=\"steps\"\r\n\r\n16\r\n--------------------------d74496d66958873e--\r\n")
    ctype = "multipart/form-data; boundary=------------------------d74496d66958873e"
    assert simple_form(curl, ctype, 2, 64) == _starlette(curl, ctype) == [("file", FilePart("a.png", b"PNGDATA")), ("steps", "16")]


def test_odd_forms_and_passed_limits_are_left_to_starlette() -> None:
    body, ctype = _httpx_form({"a": "1", "b": "2"}, {"file": ("x.jpg", b"data", "image/jpeg")})
    assert simple_form(body, ctype, 2, 1) is None  # two fields, one allowed: Starlette's parser words the refusal
    assert simple_form(body, ctype, 0, 64) is None
    assert simple_form(b"preamble\r\n" + body, ctype, 2, 64) is None
    assert simple_form(body + b"epilogue", ctype, 2, 64) is None
    assert simple_form(body, ctype + "; charset=latin-1", 2, 64) is None
    assert simple_form(body.replace(b"\r\n", b"\n"), ctype, 2, 64) is None
    assert simple_form(body.replace(b"Content-Disposition", b"X-Other: 1\r\nContent-Disposition", 1), ctype, 2, 64) is None


def test_a_delimiter_right_after_a_parts_blank_line_is_its_data_and_a_long_header_line_is_the_parsers() -> None:
    """Found by review: the blank line's CRLF is not the next delimiter's (RFC 2046: the data begins after it, so
    Starlette reads one field holding the rest of the form, where a part boundary there would smuggle a file in);
    header lines over 4 KB are the parser's to refuse (python-multipart's limit is 4224 bytes)."""
    ctype = "multipart/form-data; boundary=b"
    smuggled = (b'--b\r\nContent-Disposition: form-data; name="steps"\r\n\r\n--b\r\nContent-Disposition: form-data; '
                b'name="file"; filename="x.png"\r\n\r\nIMG\r\n--b--\r\n')
    assert simple_form(smuggled, ctype, 2, 64) is None
    assert [name for name, _ in _starlette(smuggled, ctype) or []] == ["steps"]
    for size in (4000, 4300):
        long = f'--b\r\nContent-Disposition: form-data; name="file"; filename="{"a" * size}"\r\n\r\nIMG\r\n--b--\r\n'.encode()
        fast = simple_form(long, ctype, 2, 64)
        assert (fast is None) == (size > 4000) and (fast is None or fast == _starlette(long, ctype))


_BOUNDARIES = st.sampled_from([b"b", b"ab", b"----bnd", b"d74496d66958873e", b"a" * 70])
_CHUNKS = st.sampled_from([b"\r\n", b"--", b"\r\n--", b"\r\n\r\n", b"x", b"\x00\xff", "é".encode(), b'"', b";", b" "])


def _mostly(usual: object, *odd: object) -> st.SearchStrategy[object]:
    """``usual`` most of the time, else one of ``odd``."""
    return st.integers(0, 9).flatmap(lambda i: st.just(usual) if i < 8 else st.sampled_from(odd))


@st.composite
def _forms(draw: st.DrawFn) -> tuple[bytes, str]:
    """A multipart body, mostly well formed, with the odd things a client or an attacker may send."""
    boundary = draw(_BOUNDARIES)
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.text(st.sampled_from("abfile"), max_size=5) | st.text(st.sampled_from('ab"; =\\é'), max_size=4)
                    | st.sampled_from(["a" * 4100, "a" * 4300]))
        data = b"".join(draw(st.lists(st.one_of(_CHUNKS, st.just(boundary), st.binary(max_size=8)), max_size=6)))
        header = draw(_mostly("Content-Disposition", "content-disposition", "CONTENT-DISPOSITION", "Content Disposition"))
        space = draw(_mostly(" ", "", "  ", "\t"))
        disposition = draw(_mostly("form-data", "attachment", "form-data ", "form-data;"))
        line = f'{header}:{space}{disposition}; name="{name}"'
        if draw(st.booleans()):
            line += f'; filename="{draw(st.text(st.sampled_from("ab.jpg é"), max_size=5))}"'
        line += str(draw(_mostly("", "; filename*=UTF-8''a.jpg", "; size=3")))
        extra = draw(_mostly("", "\r\nContent-Type: image/png", "\r\nX-Other: 1", "\r\nContent-Type: text/plain ", "\r\n"))
        parts.append(line.encode("utf-8") + str(extra).encode() + b"\r\n\r\n" + data)
    ends = [bytes(draw(_mostly(b"\r\n", b""))) for _ in parts]  # b"": the next delimiter straight after the data
    body = b"".join(b"--" + boundary + b"\r\n" + part + end for part, end in zip(parts, ends, strict=True)) + b"--" + boundary + b"--"
    body = bytes(draw(_mostly(b"", b"junk\r\n", b"\r\n"))) + body + bytes(draw(_mostly(b"\r\n", b"", b"junk", b"\r\n\r\n")))
    if draw(st.integers(0, 19)) == 0:
        body = body.replace(b"\r\n", b"\n")
    ctype = str(draw(_mostly("multipart/form-data; boundary={}", "multipart/form-data;boundary={}", 'multipart/form-data; boundary="{}"',
                             "Multipart/Form-Data; Boundary={}", "multipart/form-data; boundary={}; charset=latin-1",
                             "multipart/form-data; boundary={} ")))
    return body, ctype.format(boundary.decode())


@settings(max_examples=400, deadline=None)
@given(form=_forms(), max_files=_mostly(2, 0, 1, 3), max_fields=_mostly(64, 0, 1, 2))
def test_a_form_the_fast_path_takes_reads_as_starlette_reads_it(form: tuple[bytes, str], max_files: int, max_fields: int) -> None:
    body, ctype = form
    fast = simple_form(body, ctype, max_files, max_fields)
    if fast is not None:
        assert fast == _starlette(body, ctype, max_files, max_fields)
