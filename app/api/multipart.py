"""The common multipart form, parsed from the body already in memory.

Every image route reads the whole body first (:func:`app.api.requests.read_body`: its size limit, its deadline), so
Starlette's streaming parser then spends its effort on a stream that is one chunk: python-multipart's callbacks, a
spooled temporary file per upload, and a copy back out of it, on the event loop, where the service's whole host side
waits for it. Here, the same body in a few ``bytes.find`` calls and two strict regular expressions, a fraction of that
time (measured: docs/results/speed.md).

Only a form as browsers, curl, httpx and requests write it is taken: no preamble or epilogue, CRLF line ends, each
part with a ``Content-Disposition: form-data`` header naming it (and a file's ``filename``), at most a
``Content-Type`` besides, the boundary unquoted, no ``charset`` on the body. Anything else (and any limit passed) gets ``None``, and the
caller parses the body with Starlette's parser as before, which decides, and words the error. The two agree on every
form taken here: ``tests/service/test_multipart.py`` parses generated forms, odd ones included, with both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_FIELD_BYTES = 1024 * 1024
"""Starlette's limit on a text field (``max_part_size``): a longer one is left to its parser, to refuse."""
MAX_HEADER_LINE = 4096
"""Longer header lines are left to the parser (python-multipart refuses those over 4224 bytes)."""
_HEADER = re.compile(rb"([A-Za-z0-9-]+): ?([^\r\n\x00]*)")
_HEADERS = (b"content-disposition", b"content-type")
_CONTENT_TYPE = re.compile(r"multipart/form-data; ?boundary=([0-9A-Za-z'()+_,./:=?-]{1,70})", re.IGNORECASE)
"""The request's type as clients write it: a boundary of RFC 2046's characters, unquoted (else Starlette's parser)."""
_DISPOSITION = re.compile(rb'form-data; name="([^"\\\r\n]*)"(?:; filename="([^"\\\r\n]*)")?')
"""A part's ``Content-Disposition`` as clients write it, no quote or backslash inside the quotes (escapes, a Windows
path that the parser cuts to its last component, RFC 5987 ``filename*``: all Starlette's parser's)."""


@dataclass(frozen=True)
class FilePart:
    """An uploaded file: its ``filename`` (as sent, possibly empty) and its bytes."""

    filename: str
    data: bytes


FormItems = list[tuple[str, "str | FilePart"]]
"""A form's parts in their order: a field's name and its text, or a file's field name and the file."""


def _decode(raw: bytes) -> str:
    """As Starlette decodes names and fields: UTF-8, else Latin-1 (never an error)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _part_headers(block: bytes) -> dict[bytes, bytes] | None:
    headers: dict[bytes, bytes] = {}
    for line in block.split(b"\r\n"):
        if len(line) > MAX_HEADER_LINE:
            return None
        m = _HEADER.fullmatch(line)
        if m is None:
            return None
        name = m.group(1).lower()
        if name not in _HEADERS or name in headers or m.group(2) != m.group(2).strip():
            return None
        headers[name] = m.group(2)
    return headers if b"content-disposition" in headers else None


def _part(headers: dict[bytes, bytes], data: bytes) -> tuple[str, str | FilePart] | None:
    m = _DISPOSITION.fullmatch(headers[b"content-disposition"])
    if m is None:
        return None
    name = _decode(m.group(1))
    if m.group(2) is not None:
        return name, FilePart(_decode(m.group(2)), data)
    if len(data) > MAX_FIELD_BYTES:
        return None
    return name, _decode(data)


def simple_form(body: bytes, content_type: str, max_files: int, max_fields: int) -> FormItems | None:
    """The parts of ``body`` (a ``multipart/form-data`` request's, with ``content_type`` its header), or None where the
    form is not the common kind or passes ``max_files`` / ``max_fields`` (then Starlette's parser is to read it)."""
    m = _CONTENT_TYPE.fullmatch(content_type)
    if m is None:
        return None
    delimiter = b"\r\n--" + m.group(1).encode("ascii")
    if not body.startswith(delimiter[2:] + b"\r\n"):
        return None
    items: FormItems = []
    files = fields = 0
    pos = len(delimiter)  # just past the first delimiter's line end
    while True:
        head_end = body.find(b"\r\n\r\n", pos)
        end = body.find(delimiter, pos)
        if head_end == -1 or end < head_end + 4:  # a part's data begins after its blank line, whatever it holds
            return None
        headers = _part_headers(body[pos:head_end])
        part = None if headers is None else _part(headers, body[head_end + 4 : end])
        if part is None:
            return None
        if isinstance(part[1], FilePart):
            files += 1
        else:
            fields += 1
        if files > max_files or fields > max_fields:
            return None
        items.append(part)
        after = body[end + len(delimiter) : end + len(delimiter) + 2]
        if after == b"\r\n":
            pos = end + len(delimiter) + 2
            continue
        if after == b"--" and body[end + len(delimiter) + 2 :] in (b"", b"\r\n"):
            return items
        return None
