"""Hostile and broken archives (POST /jobs): every one is a 4xx that says what was wrong, never a
500; a central directory of a million entries is refused from its headers, in bounded memory and
time; the bounds hold per upload and per job; nested archives are refused. A fuzz loop over
corrupted archives of every kind the service reads finds no 5xx."""

from __future__ import annotations

import io
import struct
import tarfile
import time
import tracemalloc
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.errors import ApiError
from app.jobs.archive import Bounds, is_archive, read_archive
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST

PHOTOS = {f"p{i}.png": image_bytes((60 * i, 90, 180)) for i in range(3)}
BOUNDS = Bounds(max_members=100, max_member_bytes=1_000_000, max_total_bytes=10_000_000)


def zipped(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def tarred(members: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def encrypted_zip() -> bytes:
    """A zip whose member says it is encrypted (the flag bit, in its local header and its directory entry)."""
    data = bytearray(zipped({"p.png": image_bytes()}, zipfile.ZIP_STORED))
    data[6] |= 1  # local header: general purpose flags
    entry = data.find(b"PK\x01\x02")
    data[entry + 8] |= 1  # central directory entry: the same flags
    return bytes(data)


def corrupt_member(method: int) -> bytes:
    """A zip whose one member's compressed bytes are garbage in the middle (its headers intact)."""
    data = bytearray(zipped({"p.png": image_bytes(size=(200, 150))}, method))
    start, end = 30 + len("p.png"), data.find(b"PK\x01\x02")
    middle = (start + end) // 2
    data[middle:middle + 16] = bytes(range(0xF0, 0x100))
    return bytes(data)


def corrupt_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes(range(0xF0, 0x100)) + data[middle + 16:]


def million_entry_directory(declared: int | None = None) -> bytes:
    """A zip of one local header and a central directory listing 1,000,000 empty entries (47 MB), its end
    record declaring ``declared`` of them (the real count, capped at 0xFFFF as a zip without zip64 says)."""
    n = 1_000_000
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 1, 0) + b"a"
    entry = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0) + b"a"
    count = min(n, 0xFFFF) if declared is None else declared
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, count, count, len(entry) * n, len(local), 0)
    return local + entry * n + end


BROKEN = [  # (archive, what the 422 says)
    (encrypted_zip(), "encrypted"),
    (corrupt_member(zipfile.ZIP_DEFLATED), "could not be read"),
    (corrupt_member(zipfile.ZIP_LZMA), "could not be read"),
    (corrupt_member(zipfile.ZIP_BZIP2), "could not be read"),
    (corrupt_middle(tarred(PHOTOS, "w:xz")), "could not be read"),
    (corrupt_middle(tarred(PHOTOS, "w:gz")), "could not be read"),
    (corrupt_middle(tarred(PHOTOS, "w:bz2")), "could not be read"),
    (tarred(PHOTOS, "w:xz")[:200], "could not be read"),  # truncated
    (zipped(PHOTOS)[:-30], "could not be read"),  # its end record cut off
    (tarred({"inner.zip": zipped(PHOTOS), **PHOTOS}), "nested archives are refused"),
    (zipped({"inner.tar.gz": tarred(PHOTOS)}), "nested archives are refused"),
]


async def test_broken_encrypted_or_nested_archives_are_a_422_that_says_what_was_wrong(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:  # one app for every case: each starts one in about a second
        for i, (archive, says) in enumerate(BROKEN):
            r = await client.post("/jobs", files={"archive": ("a.bin", archive)}, data=FAST)
            assert r.status_code == 422, (i, r.text)
            error = r.json()["error"]
            assert error["status"] == 422 and error["code"] == "bad_archive" and says in error["message"], (i, error)
        assert (await client.get("/jobs")).json()["total"] == 0


def _v7(posix_tar: bytes) -> bytes:
    """A pre-POSIX (v7) tar: the first header without its ``ustar`` magic, its checksum made again."""
    raw = bytearray(posix_tar)
    raw[257:265], raw[148:156] = bytes(8), b" " * 8
    raw[148:156] = b"%06o\x00 " % sum(raw[:512])
    return bytes(raw)


def test_a_pre_posix_or_empty_tar_is_read_as_an_archive_not_refused_as_an_image() -> None:
    # both had been taken for an image (only the ustar magic was looked for) and answered 415 per item
    v7 = _v7(tarred(PHOTOS, "w"))
    assert v7[257:262] != b"ustar" and is_archive(v7)
    assert [name for name, _ in read_archive(v7, BOUNDS)] == list(PHOTOS)
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    assert is_archive(empty.getvalue()) and read_archive(empty.getvalue(), BOUNDS) == []
    assert not any(is_archive(image_bytes(fmt=f)) for f in ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP"))


async def test_an_empty_tar_is_a_job_of_no_images(tiny_app: AppFactory) -> None:
    empty = io.BytesIO()
    tarfile.open(fileobj=empty, mode="w").close()
    async with serve(tiny_app()) as client:
        r = await client.post("/jobs", files={"archive": ("a.tar", empty.getvalue())}, data=FAST)
    assert r.status_code == 422 and r.json()["error"]["code"] == "missing_file", r.text


async def test_the_unpacked_bytes_are_bounded_per_job_across_its_uploads(tiny_app: AppFactory) -> None:
    """Two archives of 60 KB of (compressible) images each: either alone fits 100 KB, both do not."""
    blank = {f"b{i}.bmp": bytes(20_000) for i in range(3)}
    async with serve(tiny_app(jobs_max_upload_bytes=100_000)) as client:
        one = zipped(blank)
        assert len(one) < 2_000
        r = await client.post("/jobs", files=[("archive", ("a.zip", one)), ("archive", ("b.zip", zipped(blank)))], data=FAST)
        assert r.status_code == 413 and "IDG_JOBS_MAX_UPLOAD_BYTES" in r.json()["error"]["message"], r.text
        assert (await client.get("/jobs")).json()["total"] == 0


@pytest.mark.parametrize("declared", [None, 1])
def test_a_million_entry_central_directory_is_refused_from_its_headers_in_bounded_memory(declared: int | None) -> None:
    """Before: zipfile parsed every entry first (11.6 s, +620 MB). The end record's count, or the entries'
    signatures when it lies (declared=1), refuse it before any is parsed."""
    data = million_entry_directory(declared)
    assert is_archive(data)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ApiError) as refused:
            read_archive(data, BOUNDS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert refused.value.status == 413 and "entries" in refused.value.message
    assert peak < 2_000_000, peak  # bytes allocated while refusing it (the 47 MB upload itself was there before)
    assert time.perf_counter() - started < 2.0


KINDS = {
    "zip stored": zipped(PHOTOS, zipfile.ZIP_STORED), "zip deflate": zipped(PHOTOS), "zip bzip2": zipped(PHOTOS, zipfile.ZIP_BZIP2),
    "zip lzma": zipped(PHOTOS, zipfile.ZIP_LZMA), "tar": tarred(PHOTOS, "w"), "tar.gz": tarred(PHOTOS),
    "tar.bz2": tarred(PHOTOS, "w:bz2"), "tar.xz": tarred(PHOTOS, "w:xz"),
}


@st.composite
def corrupted(draw: st.DrawFn) -> bytes:
    data = bytearray(KINDS[draw(st.sampled_from(sorted(KINDS)))])
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        if how == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del data[max(at, 4):]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        else:
            data[at:at + draw(st.integers(1, 512))] = bytes(min(512, len(data) - at))
    return bytes(data)


@settings(max_examples=400, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(corrupted())
def test_randomly_corrupted_archives_are_read_or_refused_with_a_4xx_never_a_5xx(data: bytes) -> None:
    if not is_archive(data):  # the route takes it as an image: its decoder's own tests cover that
        return
    refused: ApiError | None = None
    try:
        images = read_archive(data, BOUNDS)
    except ApiError as err:  # any other exception fails the test: it would be the route's 500
        refused, images = err, []
    if refused is not None:
        assert 400 <= refused.status < 500 and refused.message, (refused.status, refused.message)
    assert all(isinstance(name, str) and isinstance(body, bytes) for name, body in images)
