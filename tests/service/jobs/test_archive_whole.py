"""An archive is taken whole or refused whole (issue 71, item 1): two zips end to end, any prefix, bytes hidden
between entries, central-directory entries that overlap or share one local header (one member listed 50 times),
local headers that disagree with the central directory, sizes that lie, duplicate names, and the same for tars (two
end to end, bytes after the end, a name twice) are each one 422 ``bad_archive`` that says where, and no job. Every
archive is made here with Python's zipfile and tarfile from real images, then cut and patched byte by byte; the
fuzz test draws hostile and whole archives from seeds of its own, posts them to the real app, and holds each 202 to
answering every image put in the archive exactly once."""

from __future__ import annotations

import io
import random
import sqlite3
import struct
import tarfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from httpx import AsyncClient

from app.core.errors import ApiError
from app.jobs.archive import Bounds, is_archive, read_archive
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import FAST, results, wait_done

BOUNDS = Bounds(max_members=200, max_member_bytes=1_000_000, max_total_bytes=20_000_000)
Members = dict[str, bytes]


def photos(prefix: str, n: int, salt: int = 0) -> Members:
    """``n`` distinct small PNGs (Pillow), named ``{prefix}{i}.png``."""
    return {f"{prefix}{i}.png": image_bytes(((53 * i + 17 * salt) % 256, (29 * i + 101 * salt) % 256, 90 + i % 100))
            for i in range(n)}


class _Unseekable(io.RawIOBase):
    """A pipe, for zipfile: it writes each member's CRC-32 and sizes in a data descriptor after its data."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        return len(b)


def zipped(members: Members | list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED, *, streamed: bool = False,
           zip64: bool = False, comment: bytes = b"") -> bytes:
    items = list(members.items()) if isinstance(members, dict) else members
    out: Any = _Unseekable() if streamed else io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w", method) as zf:
        warnings.simplefilter("ignore")  # "Duplicate name": the point of some cases
        zf.comment = comment
        for name, data in items:
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.compress_type = method
            with zf.open(info, "w", force_zip64=zip64) as member:
                member.write(data)
    return bytes(out.data if streamed else out.getvalue())


def tarred(members: Members | list[tuple[str, bytes]], mode: str = "w") -> bytes:
    items = list(members.items()) if isinstance(members, dict) else members
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for name, data in items:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# Byte surgery on a plain zip (no zip64, no comment): where its parts are, and patches that keep the rest consistent.

def _u32(data: bytes | bytearray, at: int) -> int:
    return int(struct.unpack_from("<L", data, at)[0])


def _put32(data: bytearray, at: int, value: int) -> None:
    struct.pack_into("<L", data, at, value & 0xFFFFFFFF)


def layout(z: bytes) -> tuple[int, int, list[int]]:
    """The end record's position, the central directory's, and each directory entry's."""
    end = z.rfind(b"PK\x05\x06")
    count, _, offset = struct.unpack_from("<H2L", z, end + 10)
    entries, pos = [], offset
    for _ in range(count):
        entries.append(pos)
        name, extra, comment = struct.unpack_from("<3H", z, pos + 28)
        pos += 46 + name + extra + comment
    return end, offset, entries


def local_offsets(z: bytes) -> list[int]:
    """Each member's local header, in directory order."""
    return [_u32(z, entry + 42) for entry in layout(z)[2]]


def directory_entries(z: bytes) -> list[bytes]:
    end, directory, entries = layout(z)
    return [z[a:b] for a, b in zip(entries, [*entries[1:], end], strict=True)]


def with_directory(z: bytes, entries: list[bytes]) -> bytes:
    """The zip with its central directory replaced by ``entries`` (its end record's counts and size made to match)."""
    end, directory, _ = layout(z)
    record = bytearray(z[end:])
    struct.pack_into("<2HL", record, 8, len(entries), len(entries), sum(map(len, entries)))
    return z[:directory] + b"".join(entries) + bytes(record)


def with_offset(entry: bytes, offset: int) -> bytes:
    out = bytearray(entry)
    _put32(out, 42, offset)
    return bytes(out)


def shifted(z: bytes, prefix: bytes) -> bytes:
    """``prefix`` before the zip, every offset moved past it (as ``zip -A`` makes a self-extractor): consistent, yet
    the prefix belongs to no entry."""
    return inserted(z, 0, prefix)


def inserted(z: bytes, at: int, extra: bytes) -> bytes:
    """``extra`` inserted at byte ``at`` (a local header's start, or the directory's), every offset past it moved."""
    end, directory, entries = layout(z)
    out = bytearray(z[:at] + extra + z[at:])
    moved = len(extra)
    for entry in entries:
        pos = entry + moved
        if (offset := _u32(out, pos + 42)) >= at:
            _put32(out, pos + 42, offset + moved)
    _put32(out, end + moved + 16, directory + moved)
    return bytes(out)


LOCAL_FIELDS = {"method": (8, "<H"), "crc": (14, "<L"), "compressed": (18, "<L"), "size": (22, "<L")}
CENTRAL_FIELDS = {"method": (10, "<H"), "crc": (16, "<L"), "compressed": (20, "<L"), "size": (24, "<L")}


def patched(z: bytes, member: int, field: str, delta: int, *, local: bool = True, central: bool = False) -> bytes:
    """A field of one member's local header and/or directory entry, moved by ``delta``."""
    out = bytearray(z)
    places = ([(local_offsets(z)[member], LOCAL_FIELDS[field])] if local else []) + \
             ([(layout(z)[2][member], CENTRAL_FIELDS[field])] if central else [])
    for base, (at, fmt) in places:
        (value,) = struct.unpack_from(fmt, out, base + at)
        struct.pack_into(fmt, out, base + at, (value + delta) % (1 << (8 * struct.calcsize(fmt))))
    return bytes(out)


def renamed_locally(z: bytes, member: int) -> bytes:
    """The member's local header names it otherwise (its first letter changed; the directory unchanged)."""
    out = bytearray(z)
    at = local_offsets(z)[member] + 30
    out[at] = ord("q") if out[at] != ord("q") else ord("r")
    return bytes(out)


def truncated_claim(members: Members, member: int, cut: int) -> tuple[bytes, str]:
    """Both headers of one member declare ``cut`` bytes fewer, and the CRC-32 of what is left: consistent headers,
    but the compressed data holds more (before: zipfile stopped at the declared size and said nothing)."""
    z = zipped(members, zipfile.ZIP_DEFLATED)
    name = list(members)[member]
    shorter = members[name][:-cut]
    out = bytearray(patched(z, member, "size", -cut, central=True))
    for base, at in ((local_offsets(z)[member], 14), (layout(z)[2][member], 16)):
        _put32(out, base + at, zlib.crc32(shorter))
    return bytes(out), name


def refusal(data: bytes) -> str:
    with pytest.raises(ApiError) as refused:
        read_archive(data, BOUNDS)
    assert (refused.value.status, refused.value.code) == (422, "bad_archive"), refused.value.message
    return refused.value.message


A, B = photos("a", 3), photos("b", 2, salt=1)


def test_two_zips_end_to_end_or_a_zip_after_any_prefix_is_refused_saying_how_many_bytes_come_before() -> None:
    a, b = zipped(A), zipped(B)
    for data, before in ((a + b, len(a)), (b + a, len(b)), (b"MZ junk of a self-extractor" + a, 27)):
        assert is_archive(data)  # one that does not start as a zip (its end record tells) too, not taken for an image
        says = refusal(data)
        assert f"{before} bytes come before the archive" in says and "cat a.zip b.zip" in says, says
    says = refusal(shifted(a, b))  # zip -A: the offsets moved past the prefix, which belongs to no entry
    assert f"{len(b)} bytes at byte 0, before its first member (member 'a0.png', at byte {len(b)})" in says, says


def test_bytes_hidden_between_entries_or_before_the_directory_are_refused_saying_where() -> None:
    z = zipped(A)
    second = local_offsets(z)[1]
    says = refusal(inserted(z, second, b"hidden"))
    assert f"6 bytes at byte {second}, between member 'a0.png' and it (member 'a1.png'" in says, says
    directory = layout(z)[1]
    says = refusal(inserted(z, directory, zipped(B)))  # a whole zip between the last member and the directory
    assert f"bytes at byte {directory}, between its last member ('a2.png') and its central directory" in says, says


def test_one_member_listed_fifty_times_or_two_entries_sharing_a_local_header_are_refused() -> None:
    # before: a job of 50 images, the same bytes 50 times
    one = zipped({"p.png": A["a0.png"]})
    says = refusal(with_directory(one, directory_entries(one) * 50))
    assert "lists member 'p.png' (its local header at byte 0) more than once" in says, says
    z = zipped(A)
    entries = directory_entries(z)
    shared = [entries[0], entries[1], with_offset(entries[2], local_offsets(z)[1])]  # a2 points at a1's header
    says = refusal(with_directory(z, shared))
    assert f"member 'a2.png''s local header (at byte {local_offsets(z)[1]}) lies inside member" in says, says
    overlapping = [entries[0], with_offset(entries[1], local_offsets(z)[1] - 10), entries[2]]
    assert "lies inside member 'a0.png'" in refusal(with_directory(z, overlapping))


def test_duplicate_names_are_refused_in_zips_and_tars() -> None:
    twice = [("x/p.png", A["a0.png"]), ("x/q.png", A["a1.png"]), ("x/p.png", A["a2.png"])]
    z = zipped(twice)
    says = refusal(z)
    assert f"holds two members named 'x/p.png' (their local headers at bytes 0 and {local_offsets(z)[2]})" in says, says
    assert "two members named 'x//p.png'" in refusal(zipped([("x/p.png", A["a0.png"]), ("x//p.png", A["a2.png"])]))  # one name, spelt twice
    tar = tarred(twice)  # as `tar -r` appends a newer copy: tar -x keeps the last
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        third = tf.getmembers()[2].offset
    says = refusal(tar)
    assert f"holds a member named 'x/p.png' twice (its headers at bytes 0 and {third}" in says, says


@pytest.mark.parametrize(("field", "local", "central", "says"), [
    ("compressed", True, False, "one of them lies"),
    ("compressed", False, True, "one of them lies"),
    ("size", True, False, "one of them lies"),
    ("crc", True, False, "one of them lies"),
    ("method", True, False, "declares compression method"),
    ("compressed", True, True, "lies inside member"),  # both say more: the next header is inside this member's data
])
def test_a_local_header_that_disagrees_with_the_directory_or_sizes_that_lie_are_refused(
    field: str, local: bool, central: bool, says: str,
) -> None:
    z = zipped(A)
    message = refusal(patched(z, 0, field, 3, local=local, central=central))
    assert "'a0.png'" in message and says in message, message
    assert "names it 'q0.png'" in refusal(renamed_locally(z, 0))


def test_headers_that_agree_on_a_size_the_data_does_not_have_are_refused() -> None:
    lying, name = truncated_claim(A, 1, 40)
    assert f"member {name!r} decompresses to more than" in refusal(lying)
    z = zipped(A, zipfile.ZIP_STORED)
    says = refusal(patched(z, 2, "size", 5, central=True))  # stored: 5 bytes more than there are
    assert "'a2.png' decompresses to" in says, says
    deflated = zipped({"p.png": A["a0.png"]})
    entry = directory_entries(deflated)[0]
    data_at = 30 + len("p.png")
    assert struct.unpack_from("<H", entry, 10)[0] == zipfile.ZIP_DEFLATED
    tail = inserted(deflated, data_at + _u32(entry, 20), b"tail")  # 4 bytes after the deflate stream's end,
    grown = patched(tail, 0, "compressed", 4, central=True)  # counted in both headers' compressed size
    says = refusal(grown)
    assert "holds 4 bytes after its stream's end" in says, says


def test_a_data_descriptor_that_disagrees_is_refused_and_whole_archives_of_every_writer_s_kind_are_read() -> None:
    streamed = zipped(A, streamed=True)  # each member's CRC-32 and sizes in a descriptor after its data
    first_end = local_offsets(streamed)[1]
    out = bytearray(streamed)
    out[first_end - 16:first_end - 12] = b"PK\x07\x09"  # no signature, and no values the directory holds there
    assert "data descriptor (at byte" in refusal(bytes(out))
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        for kind in ({}, {"streamed": True}, {"zip64": True}, {"comment": b"PK\x05\x06 in a comment"}):
            assert dict(read_archive(zipped(A, method, **kind), BOUNDS)) == A, (method, kind)
    reordered = zipped(A)
    reordered = with_directory(reordered, directory_entries(reordered)[::-1])  # the directory's order is the answer's
    assert [name for name, _ in read_archive(reordered, BOUNDS)] == list(A)[::-1]


def test_tars_end_to_end_or_followed_by_anything_but_zeros_are_refused() -> None:
    for mode in ("w", "w:gz", "w:bz2", "w:xz"):
        says = refusal(tarred(A, mode) + tarred(B, mode))  # compressed: two streams, read as one, of two tars
        assert "follow its end-of-archive marker" in says, (mode, says)
    assert "follow its end-of-archive marker" in refusal(tarred(A) + zipped(B))
    assert "follow its end-of-archive marker" in refusal(tarred(A) + b"\x00" * 700 + b"!")
    assert dict(read_archive(tarred(A) + bytes(4096), BOUNDS)) == A  # zero blocks (a tape's record) are no data
    assert "bytes that are neither another" in refusal(tarred(A, "w:gz") + b"PK\x03\x04")


def _rows(path: Path) -> tuple[int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM jobs").fetchone()[0], conn.execute("SELECT count(*) FROM images").fetchone()[0]


async def test_the_issue_s_two_cases_and_a_non_archive_sent_as_one_are_refused_by_the_app_storing_nothing(
    tiny_app: AppFactory,
) -> None:
    one = zipped({"p.png": A["a0.png"]})
    cases = [  # (field, bytes, what the 422 says)
        ("archive", zipped(A) + zipped(B), "bytes come before the archive"),
        ("files", zipped(A) + zipped(B), "bytes come before the archive"),
        ("archive", with_directory(one, directory_entries(one) * 50), "'p.png' (its local header at byte 0) more than once"),
        ("archive", A["a0.png"], "is not a tar (plain, gzip, bzip2 or xz) or zip archive"),  # before: a job of one image
        ("archive", b"junk" + tarred(A), "is not a tar"),
    ]
    app = tiny_app()
    async with serve(app) as client:
        for field, data, says in cases:
            r = await client.post("/jobs", files={field: ("a.zip", data)}, data=FAST)
            assert r.status_code == 422, (says, r.text)
            error = r.json()["error"]
            assert error["code"] == "bad_archive" and says in error["message"], error
        assert _rows(app.state.jobs.store.path) == (0, 0)
        assert (await client.get("/jobs")).json()["total"] == 0


@dataclass(frozen=True)
class Case:
    what: str
    data: bytes
    images: list[str]
    """Every image put in the bytes (a name twice where it was put twice)."""
    whole: bool
    """Made whole: a 202 of every image. Otherwise hostile: a 422 bad_archive."""
    field: str = "archive"


def _zip_kwargs(rng: random.Random) -> dict[str, Any]:
    return {"method": rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]),
            "streamed": rng.random() < 0.3, "zip64": rng.random() < 0.2}


def _hostile_zip(rng: random.Random, a: Members, b: Members) -> tuple[str, bytes, list[str]]:
    z = zipped(a)
    names = list(a)
    member = rng.randrange(len(a))
    how = rng.choice(["concatenated", "prefix", "shifted prefix", "gap", "zip before directory", "repeated", "shared header",
                      "overlap", "local size", "central size", "both sizes", "local crc", "local method", "local name",
                      "agreeing short size", "duplicate name"])
    if how == "concatenated":
        first, second = zipped(a, **_zip_kwargs(rng)), zipped(b, **_zip_kwargs(rng))
        return how, first + second, names + list(b)
    if how == "prefix":
        return how, rng.randbytes(rng.randint(1, 3000)) + z, names
    if how == "shifted prefix":
        return how, shifted(z, rng.randbytes(rng.randint(1, 3000))), names
    if how == "gap":
        at = local_offsets(z)[member] if member else layout(z)[1]
        return how, inserted(z, at, rng.randbytes(rng.randint(1, 600))), names
    if how == "zip before directory":
        return how, inserted(z, layout(z)[1], zipped(b)), names + list(b)
    entries = directory_entries(z)
    if how == "repeated":
        times = rng.randint(2, 50)
        return how, with_directory(z, entries[:member] + [entries[member]] * times + entries[member + 1:]), \
            names + [names[member]] * (times - 1)
    if how in ("shared header", "overlap"):
        other = (member + rng.randrange(1, len(a))) % len(a)
        offset = local_offsets(z)[other] + (0 if how == "shared header" else rng.randint(1, 300))
        entries[member] = with_offset(entries[member], offset)
        return how, with_directory(z, entries), names
    if how in ("local size", "central size", "both sizes", "local crc", "local method"):
        field = {"local crc": "crc", "local method": "method"}.get(how, rng.choice(["compressed", "size"]))
        delta = rng.choice([-1, 1]) * rng.randint(1, 200)
        return how, patched(z, member, field, delta, local=how != "central size", central=how in ("central size", "both sizes")), \
            names
    if how == "local name":
        return how, renamed_locally(z, member), names
    if how == "agreeing short size":
        return how, truncated_claim(a, member, rng.randint(1, 60))[0], names
    twice = [*a.items(), (names[member], b[next(iter(b))])]
    rng.shuffle(twice)
    return how, zipped(twice, **_zip_kwargs(rng)), [name for name, _ in twice]


def _hostile_tar(rng: random.Random, a: Members, b: Members) -> tuple[str, bytes, list[str], str]:
    mode = rng.choice(["w", "w:gz", "w:bz2", "w:xz"])
    how = rng.choice(["concatenated", "zip after", "garbage after", "duplicate name", "prefix"])
    if how == "concatenated":
        return how, tarred(a, mode) + tarred(b, mode), list(a) + list(b), "archive"
    if how == "zip after":
        return how, tarred(a) + zipped(b), list(a) + list(b), "archive"
    if how == "garbage after":
        tail = bytes(rng.randint(0, 2000)) + rng.randbytes(rng.randint(1, 300)).replace(b"\x00", b"\x01")
        return how, tarred(a, mode) + tail, list(a), "archive"
    if how == "duplicate name":
        twice = [*a.items(), (rng.choice(list(a)), b[next(iter(b))])]
        rng.shuffle(twice)
        return how, tarred(twice, mode), [name for name, _ in twice], "archive"
    return how, b"junk" + rng.randbytes(rng.randint(0, 600)) + tarred(a, mode), list(a), "archive"  # not an archive


def _whole(rng: random.Random, a: Members) -> tuple[str, bytes]:
    how = rng.choice(["zip", "zip reordered", "zip with comment", "tar", "tar padded"])
    if how == "zip":
        return how, zipped(a, **_zip_kwargs(rng))
    if how == "zip reordered":
        z = zipped(a)
        entries = directory_entries(z)
        rng.shuffle(entries)
        return how, with_directory(z, entries)
    if how == "zip with comment":
        return how, zipped(a, comment=rng.randbytes(rng.randint(1, 200)))
    mode = rng.choice(["w", "w:gz", "w:bz2", "w:xz"])
    padded = how == "tar padded"
    return how, tarred(a, mode) + (bytes(512 * rng.randint(1, 20)) if padded and mode == "w" else b"")


def cases(seed: int, n: int) -> list[Case]:
    """``n`` archives drawn from ``seed``: a third whole, the rest hostile (zips two thirds of those)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        a = photos(f"c{k}/a", rng.randint(2, 4), salt=k)
        b = photos(f"c{k}/b", rng.randint(1, 3), salt=k + 1000)
        field = rng.choice(["archive", "files"])
        roll = rng.random()
        if roll < 1 / 3:
            how, data = _whole(rng, a)
            out.append(Case(how, data, list(a), whole=True, field=field))
        elif roll < 7 / 9:
            how, data, images = _hostile_zip(rng, a, b)
            out.append(Case(f"zip: {how}", data, images, whole=False, field=field))
        else:
            how, data, images, field = _hostile_tar(rng, a, b)
            out.append(Case(f"tar: {how}", data, images, whole=False, field=field))
    return out


def _check_read(case: Case) -> None:
    """Without the app: a whole archive reads as every image put in it, once, byte for byte; a hostile one is a 422."""
    if case.whole:
        found = read_archive(case.data, BOUNDS)
        assert sorted(name for name, _ in found) == sorted(case.images), case.what
        return
    with pytest.raises(ApiError) as refused:
        read_archive(case.data, BOUNDS)
    assert (refused.value.status, refused.value.code) == (422, "bad_archive"), (case.what, refused.value.message)


@pytest.mark.parametrize(("seed", "n"), [(71, 150), pytest.param(7101, 2000, marks=pytest.mark.slow)])
def test_drawn_archives_read_as_every_image_once_or_are_refused(seed: int, n: int) -> None:
    drawn = cases(seed, n)
    assert {c.whole for c in drawn} == {True, False} and len({c.what for c in drawn}) > 15
    for case in drawn:
        _check_read(case)


async def _post_all(app: FastAPI, client: AsyncClient, drawn: list[Case]) -> list[tuple[Case, str]]:
    accepted: list[tuple[Case, str]] = []
    path = app.state.jobs.store.path
    for case in drawn:
        before = _rows(path)
        r = await client.post("/jobs", files={case.field: ("a.bin", case.data)}, data=FAST)
        if r.status_code == 202:
            assert r.json()["total"] == len(case.images), (case.what, r.text)  # before: 1 of 2 zips end to end, or 50 of 1
            accepted.append((case, r.json()["id"]))
        else:
            assert r.status_code == 422 and r.json()["error"]["code"] == "bad_archive", (case.what, r.text)
            assert _rows(path) == before, case.what  # no job, no image
        assert (r.status_code == 202) == case.whole, (case.what, r.text)
    return accepted


@pytest.mark.parametrize(("seed", "n"), [(1971, 24), pytest.param(197101, 160, marks=pytest.mark.slow)])
async def test_drawn_archives_posted_to_the_app_are_answered_image_by_image_exactly_once_or_refused_whole(
    tiny_app: AppFactory, seed: int, n: int,
) -> None:
    """Each 202 answers every image put in its archive exactly once (by name and place); each refusal is a 422
    ``bad_archive`` and leaves the store's rows as they were."""
    drawn = cases(seed, n)
    app = tiny_app()
    async with serve(app) as client:
        accepted = await _post_all(app, client, drawn)
        for case, job_id in accepted:
            await wait_done(client, job_id, limit_s=120)
            lines = await results(client, job_id, summary="true")
            assert sorted(line["filename"] for line in lines) == sorted(case.images), case.what
            assert sorted(line["index"] for line in lines) == list(range(len(case.images))), case.what
            assert all(line["status"] == 200 for line in lines), (case.what, lines)
        listed = (await client.get("/jobs", params={"limit": 500})).json()["total"]
    assert listed == len(accepted) and 0 < len(accepted) < len(drawn)

