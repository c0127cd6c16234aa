"""An archive is verified whole before anything of it is stored (issue 59, item 1): tar header checksums, members cut
short, the end-of-archive marker, gzip / bzip2 / xz integrity (checks, the stream's end, nothing after it but another
stream or zero padding) and zip CRCs; any failure is one 422 ``bad_archive`` that says where, and no job. Every corrupt
archive is built here, byte by byte, from real images; the fuzz test posts a few hundred to the real app."""

from __future__ import annotations

import asyncio
import gzip
import io
import random
import sqlite3
import tarfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from httpx import AsyncClient

from app.core.errors import ApiError
from app.jobs.archive import Bounds, is_archive, read_archive
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, results, wait_done
from tests.service.jobs.test_archives import tarred as archives_tarred
from tests.service.jobs.test_archives import zipped

PHOTOS = {"p0.jpg": image_bytes((200, 40, 40), (40, 32), "JPEG"), "p1.png": image_bytes((40, 200, 40), (36, 30)),
          "p2.jpg": image_bytes((40, 40, 200), (32, 40), "JPEG")}
"""Three small real images (Pillow), JPEG and PNG."""
BOUNDS = Bounds(max_members=100, max_member_bytes=1_000_000, max_total_bytes=10_000_000)


def tarred(members: dict[str, bytes], mode: str = "w") -> bytes:
    """A plain tar unless told (test_archives' helper makes tar.gz unless told)."""
    return archives_tarred(members, mode)


def header_offsets(tar: bytes) -> list[int]:
    """Where each member's header starts in a plain tar."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        return [m.offset for m in tf.getmembers()]


def end_of_members(tar: bytes) -> int:
    """Where a plain tar's end-of-archive marker starts: after the last member's data, padded to a block."""
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        last = tf.getmembers()[-1]
    return last.offset_data + -(-last.size // 512) * 512


def refusal(data: bytes) -> str:
    """The message of the 422 ``bad_archive`` that ``data`` gets."""
    with pytest.raises(ApiError) as refused:
        read_archive(data, BOUNDS)
    assert (refused.value.status, refused.value.code) == (422, "bad_archive"), refused.value.message
    return refused.value.message


def zeroed_checksum(tar: bytes, member: int) -> bytes:
    data = bytearray(tar)
    at = header_offsets(tar)[member]
    data[at + 148:at + 156] = bytes(8)
    return bytes(data)


def flipped(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def test_a_bad_header_checksum_after_the_first_member_is_an_error_naming_it_not_the_archive_s_end() -> None:
    # before: tarfile took the bad header for the archive's end and the job held the first two images (202, total 2)
    tar = tarred(PHOTOS)
    assert [name for name, _ in read_archive(tar, BOUNDS)] == list(PHOTOS)
    for member, name in enumerate(PHOTOS):
        says = refusal(zeroed_checksum(tar, member))
        assert f"'{name}'" in says and "checksum does not hold" in says, says
    says = refusal(flipped(tar, header_offsets(tar)[2] + 1))  # a bit of the third member's name: p2.jpg reads p3.jpg
    assert "(of member 'p3.jpg', after archive member 'p1.png') is corrupt: its checksum does not hold" in says, says


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_a_compressed_tar_cut_anywhere_in_its_stream_or_trailer_is_refused(mode: str) -> None:
    whole = tarred(PHOTOS, mode)
    for cut in (1, 4, 8, 12, len(whole) // 2):  # the trailer's check and length (gzip: CRC-32 and ISIZE), then data
        says = refusal(whole[:-cut])
        assert "truncated" in says or "corrupt" in says, (cut, says)


@pytest.mark.parametrize("field", [-8, -5, -4, -1])
def test_a_gzip_trailer_that_disagrees_with_the_data_is_refused(field: int) -> None:
    """The deflate data intact, only the trailer's CRC-32 (last 8 to 5 bytes) or ISIZE (last 4) flipped: nothing but
    the check of the trailer can see it (before, 51 of 60 tar.gz files failing their CRC were taken)."""
    whole = tarred(PHOTOS, "w:gz")
    assert gzip.decompress(whole)  # the stream as made is whole
    says = refusal(flipped(whole, len(whole) + field))
    assert "gzip stream is corrupt" in says and ("incorrect data check" in says or "incorrect length check" in says), says


@pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
def test_bytes_after_a_compressed_stream_are_refused_but_another_stream_or_zero_padding_is_read(mode: str) -> None:
    whole = tarred(PHOTOS, mode)
    kind = {"w:gz": "gzip", "w:bz2": "bzip2", "w:xz": "xz"}[mode]
    says = refusal(whole + b"garbage!")
    assert f"8 bytes that are neither another {kind} stream nor zero padding" in says, says
    assert [name for name, _ in read_archive(whole + bytes(1024), BOUNDS)] == list(PHOTOS)  # a tape's blocking
    if mode == "w:gz":  # one tar in two gzip members (as `cat a.gz b.gz`): gzip -d reads them as one stream
        tar = tarred(PHOTOS)
        two = gzip.compress(tar[:700]) + gzip.compress(tar[700:])
        assert [name for name, _ in read_archive(two, BOUNDS)] == list(PHOTOS)


def test_a_tar_member_cut_short_is_named_and_a_tar_without_its_end_blocks_is_refused() -> None:
    tar = tarred(PHOTOS)
    offsets = header_offsets(tar)
    says = refusal(tar[:offsets[1] + 512 + 100])  # inside the second member's data
    assert "'p1.png' is truncated" in says, says
    ends = end_of_members(tar)
    says = refusal(tar[:ends])  # after the last member, whole, without the zero blocks
    assert "without its end-of-archive blocks" in says and "after archive member 'p2.jpg'" in says, says
    says = refusal(tar[:offsets[2]])  # the same, one member earlier: it cannot be told from the above
    assert "without its end-of-archive blocks" in says and "after archive member 'p1.png'" in says, says
    assert [name for name, _ in read_archive(tar[:ends + 512], BOUNDS)] == list(PHOTOS)  # one zero block: the end
    appended = tar + tarred({"p3.png": PHOTOS["p1.png"]})  # `cat a.tar b.tar`: tarfile reads a.tar only
    assert "follow its end-of-archive marker" in refusal(appended)
    assert "follow its end-of-archive marker" in refusal(flipped(tar, len(tar) - 1))


def test_a_zip_member_failing_its_crc_or_bytes_after_the_end_record_are_refused() -> None:
    stored = zipped(PHOTOS, zipfile.ZIP_STORED)
    with zipfile.ZipFile(io.BytesIO(stored)) as zf:
        info = zf.getinfo("p1.png")
    data_at = info.header_offset + 30 + len("p1.png")
    says = refusal(flipped(stored, data_at + 40))  # a byte of the PNG: only the CRC-32 tells
    assert "'p1.png' is broken" in says and "CRC" in says, says
    hidden = zipped({".DS_Store": b"x" * 200, **PHOTOS}, zipfile.ZIP_STORED)  # skipped, yet verified as the rest
    says = refusal(flipped(hidden, 30 + len(".DS_Store") + 50))
    assert "'.DS_Store' is broken" in says, says
    says = refusal(stored + b"tail")
    assert "declares a comment of 0 bytes but 4 follow it" in says, says


def _rows(path: Path) -> tuple[int, int]:
    """Jobs and images rows in the SQLite store, read on a connection of its own."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM jobs").fetchone()[0], conn.execute("SELECT count(*) FROM images").fetchone()[0]


async def _post(client: AsyncClient, archive: bytes) -> Any:
    return await client.post("/jobs", files={"archive": ("a.bin", archive)}, data=FAST)


async def test_a_tar_with_a_bad_third_header_is_refused_and_nothing_is_stored(tiny_app: AppFactory) -> None:
    jpegs = {f"p{i}.jpg": image_bytes((60 * i, 90, 180), fmt="JPEG") for i in range(3)}
    app = tiny_app()
    async with serve(app) as client:
        r = await _post(client, zeroed_checksum(tarred(jpegs), 2))
        assert r.status_code == 422 and r.json()["error"]["code"] == "bad_archive", r.text
        assert "'p2.jpg'" in r.json()["error"]["message"]
        assert _rows(app.state.jobs.store.path) == (0, 0)


KINDS = {"tar": "w", "tar.gz": "w:gz", "tar.bz2": "w:bz2", "tar.xz": "w:xz", "zip": ""}
CASES_PER_KIND = 60


def mutants(seed: int = 59) -> list[tuple[str, bytes]]:
    """``CASES_PER_KIND`` of each kind: 1 to 3 random bytes xor-ed with a random non-zero value, or the archive cut at a
    random length (seeded: the same cases each run)."""
    rng = random.Random(seed)
    out = []
    for kind, mode in KINDS.items():
        whole = zipped(PHOTOS) if kind == "zip" else tarred(PHOTOS, mode)
        for _ in range(CASES_PER_KIND):
            data = bytearray(whole)
            if rng.random() < 0.3:
                del data[rng.randrange(1, len(data)):]
            else:
                for _ in range(rng.randint(1, 3)):
                    data[rng.randrange(len(data))] ^= rng.randint(1, 255)
            out.append((kind, bytes(data)))
    return out


async def _answered(client: AsyncClient, job_id: str) -> list[dict[str, Any]]:
    await wait_done(client, job_id, limit_s=120)
    return await results(client, job_id, summary="true")


async def test_randomly_corrupted_archives_are_refused_whole_or_every_image_is_answered(tiny_app: AppFactory) -> None:
    """300 seeded corruptions of a tar, tar.gz, tar.bz2, tar.xz and zip of three real images, posted to the real app:
    each is a 422 ``bad_archive`` that stores nothing (no job, the store's rows unchanged), or a 202 of all three
    images (no image lost), each answered once."""
    app: FastAPI = tiny_app()
    outcomes: Counter[tuple[str, int]] = Counter()
    accepted: list[str] = []
    not_archives = 0
    async with serve(app) as client:
        path = app.state.jobs.store.path
        for i, (kind, data) in enumerate(mutants()):
            if not is_archive(data):  # its magic bytes hit: the route takes it for one image, as it should
                not_archives += 1
                continue
            before = _rows(path)
            r = await _post(client, data)
            outcomes[kind, r.status_code] += 1
            if r.status_code == 422:
                assert r.json()["error"]["code"] == "bad_archive", (i, kind, r.text)
                assert _rows(path) == before, (i, kind)
                continue
            assert r.status_code == 202, (i, kind, r.text)
            assert r.json()["total"] == len(PHOTOS), (i, kind, r.text)
            accepted.append(r.json()["id"])
        answers = await asyncio.gather(*(_answered(client, job_id) for job_id in accepted))
        jobs = (await client.get("/jobs", params={"limit": 500})).json()["total"]
    for job_id, lines in zip(accepted, answers, strict=True):
        assert sorted((line["index"], line["filename"]) for line in lines) == list(enumerate(PHOTOS)), job_id
    assert jobs == len(accepted)
    assert not_archives < 10, not_archives
    assert all(outcomes[kind, 422] >= CASES_PER_KIND // 2 for kind in KINDS), outcomes  # the corruptions reach the checks
    # and harmless ones pass: a byte of a tar member's data or padding, of a zip's local header (its copy of the
    # directory's fields) or timestamp; a compressed stream has hardly a byte that no check covers
    assert len(accepted) >= 5, outcomes
