"""The client's job calls and ``idg-client job submit | wait | results`` against the real app on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from idg_client import AsyncClient, Client, ServiceError
from idg_client.cli import main as cli
from tests.service.conftest import AppFactory, image_bytes, live_server


@pytest.fixture
def url(tiny_app: AppFactory) -> Iterator[str]:
    yield from live_server(tiny_app(delay_s=0.01))


def test_cli_submits_a_directory_waits_with_a_progress_bar_and_prints_json_lines(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "photos" / "more").mkdir(parents=True)
    for i, name in enumerate(["a.png", "b.png", "more/c.png", "more/d.PNG"]):
        (tmp_path / "photos" / name).write_bytes(image_bytes((60 * i, 100, 30)))
    (tmp_path / "photos" / "notes.txt").write_text("not sent")
    base = ["--url", url, "job"]
    assert cli([*base, "submit", str(tmp_path / "photos"), "--method", "ig", "--steps", "4", "--set", "return_overlay=false"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert len(job_id) == 32
    assert cli([*base, "wait", job_id, "--poll", "0.05"]) == 0
    captured = capsys.readouterr()
    assert "4/4 answered, 0 failed" in captured.err and "[" + "#" * 30 + "]" in captured.err
    assert captured.out.startswith(f"{job_id} done: 4 answered")
    assert cli([*base, "results", job_id, "--summary"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["filename"] for line in lines) == ["a.png", "b.png", "more/c.png", "more/d.PNG"]
    assert all("result" not in line and line["target"] for line in lines)
    assert cli([*base, "results", job_id, "--follow", "--summary"]) == 0  # finished: the end line is not printed
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert cli([*base, "results", job_id, "--offset", "3"]) == 0
    (last,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert last["seq"] == 4 and last["result"]["overlay_png"] is None and last["result"]["parameters"]["steps"] == 4
    assert cli([*base, "submit", str(tmp_path / "photos" / "notes.txt")]) == 0  # not an image: it fails alone, in the job
    bad_job = capsys.readouterr().out.strip()
    assert cli([*base, "wait", bad_job, "--poll", "0.05"]) == 3  # done, with failures
    assert "0 answered, 1 failed" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert cli([*base, "submit", str(tmp_path / "empty")]) == 2
    assert "no images" in capsys.readouterr().err


def test_client_follows_results_as_they_come_and_deletes(url: str) -> None:
    with Client(url) as c:
        job = c.submit_job([image_bytes((i * 30, 9, 9)) for i in range(5)], method="ig", steps=4, return_overlay=False)
        stream = c.job_results(job["id"], follow=True)
        followed = list(stream)  # opened before the job is done, ends when it is
        assert sorted(a["index"] for a in followed) == list(range(5)) and c.job(job["id"])["state"] == "done"
        assert (stream.end, stream.after) == ("finished", 5)  # the end line is no answer: it is not among them
        unfollowed = c.job_results(job["id"])
        assert len(list(unfollowed)) == 5 and unfollowed.end is None  # not followed: no end line, as before
        assert [a["seq"] for a in c.job_results(job["id"], offset=3, summary=True)] == [4, 5]
        assert c.jobs()["jobs"][0]["id"] == job["id"]
        assert c.delete_job(job["id"])["deleted"] is True
        with pytest.raises(ServiceError) as err:
            c.job(job["id"])
        assert err.value.status == 404 and err.value.code == "unknown_job"
        with pytest.raises(ServiceError) as err:
            list(c.job_results(job["id"]))
        assert err.value.status == 404


@pytest.fixture
def slow_url(tiny_app: AppFactory) -> Iterator[str]:
    yield from live_server(tiny_app(delay_s=0.05))  # slow enough that a job is deleted long before it is done


def test_a_followed_stream_says_the_job_was_deleted_not_finished(slow_url: str) -> None:
    with Client(slow_url) as c:
        job = c.submit_job([image_bytes((i * 12, 9, 9)) for i in range(20)], method="ig", steps=4, return_overlay=False)
        stream = c.job_results(job["id"], follow=True, summary=True)
        first = next(stream)  # the job runs: one answer is in
        assert first["seq"] == 1 and stream.end is None
        assert c.delete_job(job["id"])["deleted"] is True
        rest = list(stream)  # the answers stored before the deletion was seen, then the end
        assert stream.end == "deleted" and len(rest) < 19
        assert stream.after == (rest[-1]["seq"] if rest else 1)


async def test_the_async_client_submits_waits_follows_and_deletes_as_the_sync_one(url: str) -> None:
    """``AsyncClient`` has the job calls too: a followed stream read with ``async for`` ends with ``finished``, the
    wait reports progress, the list, a resumed read and the deletion answer as the sync client's do."""
    progress: list[int] = []
    async with AsyncClient(url) as c:
        job = await c.submit_job([image_bytes((i * 30, 9, 9)) for i in range(5)], method="ig", steps=4, return_overlay=False)
        stream = c.job_results(job["id"], follow=True)
        followed = [answer async for answer in stream]  # opened before the job is done, ends when it is
        assert sorted(a["index"] for a in followed) == list(range(5)) and (stream.end, stream.after) == ("finished", 5)
        done = await c.wait_job(job["id"], poll_s=0.05, on_progress=lambda s: progress.append(s["done"]))
        assert done["state"] == "done" and done["done"] == 5 and progress[-1] == 5
        assert [a["seq"] async for a in c.job_results(job["id"], offset=3, summary=True)] == [4, 5]
        assert (await c.jobs())["jobs"][0]["id"] == job["id"]
        assert (await c.delete_job(job["id"]))["deleted"] is True
        with pytest.raises(ServiceError) as err:
            await c.job(job["id"])
        assert err.value.status == 404 and err.value.code == "unknown_job"
        with pytest.raises(ServiceError) as err:
            [a async for a in c.job_results(job["id"])]
        assert err.value.status == 404


async def test_the_async_wait_gives_up_on_a_service_that_is_not_there() -> None:
    """Nothing listens: the wait ends with the transport error after ``unreachable_s``, not never."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        async with AsyncClient(f"http://127.0.0.1:{port}", retries=0) as c:
            began = time.monotonic()
            with pytest.raises(httpx.TransportError):
                await asyncio.wait_for(c.wait_job("0" * 32, poll_s=0.05, unreachable_s=0.3), timeout=10)
            assert time.monotonic() - began >= 0.3  # it asked again until then
