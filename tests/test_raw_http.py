"""The load benchmark's lean HTTP client (benchmarks/raw_http.py): the service parses its uploads as httpx's, and it
reads every way an HTTP/1.1 answer can end (length, chunks, the connection's close) and survives a closed keep-alive."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from benchmarks.raw_http import Connection, multipart_post
from tests.models import tiny_classifier
from tests.service.conftest import image_bytes, live_server

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await reader.readexactly(length)


def test_the_service_reads_its_uploads_and_answers_on_one_kept_alive_connection() -> None:
    from app.core.config import Settings
    from app.main import create_app

    app = create_app(Settings(models=["tiny"], warmup=False), models={"tiny": tiny_classifier()})
    photo = image_bytes((200, 30, 30))
    async def go(url: str) -> list[tuple[int, dict[str, object]]]:
        conn = Connection(url)
        good = multipart_post(url, "/predict", {"top_k": "2"}, "red.png", photo)
        bad = multipart_post(url, "/predict", {"top_k": "0"}, "red.png", photo)
        answers = [await conn.send(r) for r in (good, bad, good)]
        assert conn._writer is not None  # still the one connection
        conn.close()
        return [(a.status, json.loads(a.body)) for a in answers]

    for url in live_server(app):
        (s1, ok), (s2, refused), (s3, again) = asyncio.run(go(url))
        assert s1 == s3 == 200 and len(ok["top_k"]) == 2 and ok["top_k"] == again["top_k"]  # type: ignore[arg-type]
        assert s2 == 422, refused  # the form's fields arrive as fields: a bad top_k is refused by name
        assert "top_k" in json.dumps(refused)


def test_chunked_and_closed_answers_are_read_and_a_closed_connection_is_opened_again() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        await writer.drain()
        await _read_request(reader)  # kept alive: a second request, answered up to the close
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nX-Idg-Replica: a\r\n\r\nbusy")
        await writer.drain()
        writer.close()

    async def go() -> None:
        server, url = await _serve(handler)
        async with server:
            conn = Connection(url)
            request = multipart_post(url, "/attribute", {"method": "idg"}, "a.png", b"\x89PNG")
            first = await conn.send(request)
            second = await conn.send(request)
            third = await conn.send(request)  # the server closed: a new connection
            conn.close()
        assert (first.status, first.body) == (200, b"hello world")
        assert (second.status, second.body, second.headers["x-idg-replica"]) == (503, b"busy", "a")
        assert third.status == 200 and connections == 2

    asyncio.run(go())


def test_a_kept_alive_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    served = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await _read_request(reader)
        served.append(request)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if len(served) == 1:  # drops the kept-alive connection without a word, as an idle timeout does
            await asyncio.sleep(0.05)
            writer.close()
            return
        await reader.read()

    async def go() -> None:
        server, url = await _serve(handler)
        async with server:
            conn = Connection(url)
            request = multipart_post(url, "/attribute", {}, "a.png", b"data")
            assert (await conn.send(request)).body == b"ok"
            await asyncio.sleep(0.2)
            assert (await conn.send(request)).body == b"ok"
            conn.close()
        assert len(served) == 2 and served[0] == served[1]  # sent once on the dead connection's successor
        boundary = served[0].split(b"boundary=")[1].split(b"\r\n")[0]
        assert served[0].endswith(b"--" + boundary + b"--\r\n") and b'name="file"; filename="a.png"' in served[0]

    asyncio.run(go())
