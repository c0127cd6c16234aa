"""A lean HTTP/1.1 client for the load benchmark: one kept-alive connection per client, each request's bytes encoded
once before the traffic starts, the answer read by its ``Content-Length``.

The load generator shares the machine with the server it measures; on the 2-core VM httpx spent 4-6 ms of CPU per
request (multipart encoding, its connection pool, header objects), a quarter of the cores at 100 requests/s, taken
from the server. This client does only what a load level needs: write prepared bytes, read the status, the headers
and the body (``Content-Length`` or chunked), reconnect when the server closes."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes


def multipart_post(url: str, path: str, fields: dict[str, str], filename: str, data: bytes) -> bytes:
    """The whole ``POST path`` request (head and body) uploading ``data`` as the form's ``file`` beside ``fields``."""
    boundary = "idg-load-" + secrets.token_hex(12)
    while boundary.encode() in data:  # pragma: no cover - 96 random bits
        boundary = "idg-load-" + secrets.token_hex(12)
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    host = urlsplit(url).netloc
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


class Connection:
    """One client's connection to ``url`` (``http://host:port``), opened on first use and again after the server
    closed it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"plain http://host:port only, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> Answer:
        """Send a prepared request and read its answer. A kept-alive connection the server closed meanwhile (nothing
        of the answer read) is opened again and the request sent once more."""
        reused = self._writer is not None
        try:
            return await self._send(request)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as err:
            self.close()
            if not reused or (isinstance(err, asyncio.IncompleteReadError) and err.partial):
                raise
            return await self._send(request)

    async def _send(self, request: bytes) -> Answer:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(request)
        await self._writer.drain()
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:] if line)}
        if "content-length" in headers:
            body = await self._reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:  # the body runs to the connection's end
            body = await self._reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            self.close()
        return Answer(status, headers, body)

    async def _chunked(self) -> bytes:
        assert self._reader is not None
        chunks: list[bytes] = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers: the empty line after the last chunk
                return b"".join(chunks)
            chunks.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
