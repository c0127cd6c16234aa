"""The images of one tar or zip archive, read in memory with bounds that hold whatever the archive
declares: at most ``max_members`` images, each at most ``max_member_bytes``, all together at most
``max_total_bytes``, decompressed. A zip's entries are counted from its end record and its central
directory before it is parsed, and its members' declared sizes summed before one is decompressed;
every size is checked again while it is read (a header may lie), so a zip or tar bomb, or a central
directory of a million entries, costs at most the bounds. Nothing is written to disk; a member whose
name is absolute or climbs out (``../``), a link, a device or any other non-file is refused (422), as
are encrypted members and nested archives (a member that is itself a tar or zip: unpack it first).
Directories are skipped, as are hidden files (``.DS_Store``, macOS's ``__MACOSX/``). An archive that
cannot be read (corrupt, truncated, an unknown compression) is a 422 saying what was wrong, never a 500.

An archive is verified whole before any of it is answered (the route stores nothing before): a tar's every header
checksum, every member's data there in full, its end-of-archive marker, and its gzip, bzip2 or xz stream's checks and
end; a zip's every entry's CRC-32, skipped ones included. Where tarfile would stop early and quietly (a bad header
after the first, read as the archive's end; a compressed stream never read to its checks; bytes after the end), the
job had been stored without the images after it.
"""

from __future__ import annotations

import bz2
import io
import lzma
import posixpath
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import IO

from app.core.errors import ApiError

END = struct.Struct("<4s4H2LH")
"""A zip's end of central directory record: signature, disks, entries here, entries in all, directory size and offset."""
END64_LOCATOR = struct.Struct("<4sLQL")
END64 = struct.Struct("<4sQ2H2L4Q")
"""Zip64's: signature, record size, versions, disks, entries here, entries in all, directory size and offset."""
DIRECTORY_ENTRY = b"PK\x01\x02"
CENTRAL = struct.Struct("<4s6H3L5H2L")
"""A central directory entry: signature, versions, flags, method, time, date, CRC-32, sizes (compressed, not), name,
extra and comment lengths, disk, attributes (internal, external), its local header's offset."""
LOCAL = struct.Struct("<4s5H3L2H")
"""A local header: signature, version, flags, method, time, date, CRC-32, sizes (compressed, not), name and extra lengths."""
DESCRIPTOR = struct.Struct("<3L")
DESCRIPTOR64 = struct.Struct("<L2Q")
"""A data descriptor after its signature (optional): CRC-32 and sizes (compressed, not), zip64's 8 bytes each."""


@dataclass(frozen=True)
class Bounds:
    max_members: int
    max_member_bytes: int
    max_total_bytes: int


def is_archive(data: bytes) -> bool:
    """A zip (local header or empty archive), or a tar, plain or gzip/bzip2/xz-compressed."""
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06") or _is_tar(data) or _ends_like_zip(data)


def _is_tar(data: bytes) -> bool:
    """Compressed, or a POSIX (``ustar``) tar; or a pre-POSIX (v7) one, whose first header's checksum holds, or an
    empty one (zero blocks: no image format starts so). Those two had been taken for an image and refused as one."""
    if data[:2] == b"\x1f\x8b" or data[:3] == b"BZh" or data[:6] == b"\xfd7zXZ\x00":
        return True
    if len(data) < 512:
        return False
    if data[257:262] == b"ustar" or _tar_checksum_holds(data[:512]):
        return True
    return len(data) >= 1024 and len(data) % 512 == 0 and not data[:1024].strip(b"\x00")


def _tar_checksum_holds(block: bytes) -> bool:
    """A tar header's checksum (octal at bytes 148-155: the sum of the header's bytes, the field itself as spaces)."""
    field = block[148:156].split(b"\x00", 1)[0].strip()
    if not field or any(c not in b"01234567" for c in field):
        return False
    return int(field, 8) == sum(block[:148]) + 8 * 32 + sum(block[156:512])


def _bad(message: str) -> ApiError:
    return ApiError(422, message, code="bad_archive")


def _too_large(message: str) -> ApiError:
    return ApiError(413, message, code="too_large")


def _checked_name(name: str) -> str | None:
    """The member's name, None to skip it (a directory, a hidden file); 422 for a name that is
    absolute or climbs out."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise _bad(f"archive member {name!r}: absolute paths are refused")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise _bad(f"archive member {name!r}: paths that climb out ('..') are refused")
    base = posixpath.basename(name.replace("\\", "/"))
    if not base or base.startswith(".") or "__MACOSX" in parts:
        return None
    return posixpath.normpath(name.replace("\\", "/"))


def _max_entries(bounds: Bounds) -> int:
    """Entries of any kind (skipped directories and hidden files included) an archive may hold."""
    return 2 * bounds.max_members + 100


class _Budget:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.members = 0
        self.entries = 0
        self.total = 0

    def entry(self) -> None:
        """Any entry, skipped ones included: a tar of a million empty directories is refused too."""
        self.entries += 1
        if self.entries > _max_entries(self.bounds):
            raise _too_large(f"the archive holds more than {_max_entries(self.bounds)} entries (directories and hidden files "
                             "included: twice the images left to the job of IDG_JOBS_MAX_IMAGES, and 100)")

    def over_total(self) -> str:
        return (f"the archive passes {self.bounds.max_total_bytes} bytes decompressed, what is left to the job of "
                "IDG_JOBS_MAX_UPLOAD_BYTES (all its uploads together, unpacked)")

    def skip(self, name: str, declared: int) -> None:
        """A skipped member is still read (a tar's to reach the next header, a zip's to check its CRC): its size counts."""
        self.total += declared
        if self.total > self.bounds.max_total_bytes:
            raise _too_large(self.over_total())

    def admit(self, name: str, declared: int) -> None:
        b = self.bounds
        self.members += 1
        if self.members > b.max_members:
            raise _too_large(f"the archive holds more than {b.max_members} images (IDG_JOBS_MAX_IMAGES)")
        if declared > b.max_member_bytes:
            raise _too_large(f"archive member {name!r} has {declared} bytes, more than the limit of {b.max_member_bytes} per image")
        if self.total + declared > b.max_total_bytes:
            raise _too_large(self.over_total())

    def read(self, name: str, stream: IO[bytes]) -> bytes:
        b = self.bounds
        data = stream.read(b.max_member_bytes + 1)
        if len(data) > b.max_member_bytes:
            raise _too_large(f"archive member {name!r} has more than {b.max_member_bytes} bytes (its header said less)")
        return self.take(name, data)

    def take(self, name: str, data: bytes) -> bytes:
        """The member's bytes, read: counted, and refused if they are an archive."""
        self.total += len(data)
        if self.total > self.bounds.max_total_bytes:
            raise _too_large(self.over_total())
        if is_archive(data):
            raise _bad(f"archive member {name!r} is itself an archive: nested archives are refused (unpack it and send its images)")
        return bytes(data)


def read_archive(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of every image in the archive, in archive order, the archive verified whole first (see
    :func:`_read_tar` and :func:`_read_zip`); 422 for a broken or unsafe archive, 413 past a bound."""
    kind = "zip" if data[:2] == b"PK" or not _is_tar(data) else "tar"
    try:
        return _read_zip(data, bounds) if kind == "zip" else _read_tar(data, bounds)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a corrupt archive makes the decoders raise (zlib.error, LZMAError,
        # OSError, EOFError, struct.error, ValueError, ...) is the uploader's 422, not the server's 500
        why = str(err).strip() or "corrupt or truncated"
        raise _bad(f"the {kind} archive could not be read: {type(err).__name__}: {why[:200]}") from err


def _zip_end(data: bytes) -> int | None:
    """Where the zip's end of central directory record starts, if ``data`` ends with one: the last signature followed
    by exactly the comment it declares (a comment may hold the signature too); None otherwise."""
    low, high = max(0, len(data) - END.size - 0xFFFF), len(data)
    while (at := data.rfind(b"PK\x05\x06", low, high)) >= 0:
        if at + END.size <= len(data) and at + END.size + END.unpack_from(data, at)[-1] == len(data):
            return at
        high = at + 3
    return None


def _ends_like_zip(data: bytes) -> bool:
    """A zip after some prefix (``cat junk a.zip``, a self-extractor, a second zip after a first one: ``cat a.zip
    b.zip`` starts as one anyway): it ends with an end record whose central directory, or zip64 locator, is there."""
    at = _zip_end(data)
    if at is None:
        return False
    _, _, _, _, entries, size, _, _ = END.unpack_from(data, at)
    return (entries == 0 or data[at - END64_LOCATOR.size:at - END64_LOCATOR.size + 4] == b"PK\x06\x07"
            or (at - size >= 0 and data[at - size:at - size + 4] == DIRECTORY_ENTRY))


def _zip_bad(message: str) -> ApiError:
    return _bad(f"the zip archive could not be read: {message}")


ZIP_REFUSED = ("refused whole, as nothing of it is taken but what its central directory lists: send each archive on its "
               "own, as its own file")


@dataclass(frozen=True)
class _ZipEnd:
    directory_end: int
    """Where the central directory must end: at the zip64 end record, or at the end record."""
    entries: int
    size: int
    offset: int


def _zip_end_record(data: bytes) -> _ZipEnd:
    """The end record (zip64's where there is one), which must end the data and sit right after the directory."""
    at = _zip_end(data)
    if at is None:
        at = data.rfind(b"PK\x05\x06", max(0, len(data) - END.size - 0xFFFF))
    if at < 0 or at + END.size > len(data):
        raise _zip_bad("it has no end of central directory record (truncated?)")
    _, disk, directory_disk, here, entries, size, offset, comment = END.unpack_from(data, at)
    if (after := len(data) - (at + END.size + comment)) != 0:
        raise _zip_bad(f"its end record (at byte {at}) declares a comment of {comment} bytes but {comment + after} follow it "
                       "(truncated, or bytes appended)")
    end = at
    locator = at - END64_LOCATOR.size
    if locator >= 0 and data[locator:locator + 4] == b"PK\x06\x07":
        _, _, end64, _ = END64_LOCATOR.unpack_from(data, locator)
        if not (0 <= end64 <= locator - END64.size and data[end64:end64 + 4] == b"PK\x06\x06"):
            raise _zip_bad(f"its zip64 end locator (at byte {locator}) points to byte {end64}, where no zip64 end record is")
        _, record, _, _, disk, directory_disk, here, entries, size, offset = END64.unpack_from(data, end64)
        if end64 + 12 + record != locator:
            raise _zip_bad(f"its zip64 end record (at byte {end64}) declares {record + 12} bytes, but its locator is at byte "
                           f"{locator}")
        end = end64
    if disk or directory_disk or here != entries:
        raise _zip_bad("it is one part of an archive split across several files (disks): send it whole")
    return _ZipEnd(end, entries, size, offset)


def _zip_entry_count(data: bytes, end: _ZipEnd) -> int:
    """How many entries the zip's central directory holds, at least: the count its end record declares or the entry
    signatures before it, whichever is larger (checked against the bounds before any entry is parsed)."""
    return max(end.entries, data.count(DIRECTORY_ENTRY, max(0, end.directory_end - end.size), end.directory_end))


@dataclass(frozen=True)
class _ZipEntry:
    """One entry of a zip's central directory, zip64's sizes and offset applied."""

    name: str
    raw_name: bytes
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    offset: int
    """Where its local header starts."""
    mode: int
    """The Unix mode in its external attributes (0 where none)."""

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")


def _extra_field(extra: bytes, tag: int) -> bytes | None:
    pos = 0
    while pos + 4 <= len(extra):
        kind, size = struct.unpack_from("<2H", extra, pos)
        if kind == tag:
            return extra[pos + 4:pos + 4 + size]
        pos += 4 + size
    return None


def _zip64_values(extra: bytes, values: list[int], where: str) -> list[int]:
    """``values`` with each that is 0xFFFFFFFF replaced, in order, by the zip64 extra field's next 8-byte value."""
    wide = [v == 0xFFFFFFFF for v in values]
    if not any(wide):
        return values
    field = _extra_field(extra, 0x0001)
    if field is None or len(field) < 8 * sum(wide):
        raise _zip_bad(f"{where} declares zip64 sizes or offset (0xFFFFFFFF) without its zip64 extra field")
    wider = iter(struct.unpack_from(f"<{sum(wide)}Q", field))
    return [next(wider) if w else v for v, w in zip(values, wide, strict=True)]


def _central_directory(data: bytes, end: _ZipEnd) -> list[_ZipEntry]:
    """The directory's entries, in its order. It must sit right before its end record, where the end record says, and
    hold exactly the entries it declares."""
    starts = end.directory_end - end.size
    if starts < 0 or end.offset > starts:
        raise _zip_bad(f"its central directory ({end.size} bytes, said to start at byte {end.offset}) would run past its end "
                       f"record at byte {end.directory_end}: corrupt")
    if end.offset < starts:
        raise _zip_bad(f"{starts - end.offset} bytes come before the archive its end record describes (its central directory "
                       f"is at byte {starts}, its end record says {end.offset}): another archive in front of it, as `cat "
                       f"a.zip b.zip` makes, or a prefix such as a self-extractor's program; {ZIP_REFUSED}")
    entries: list[_ZipEntry] = []
    pos = starts
    for k in range(end.entries):
        where = f"entry {k + 1} of its central directory (at byte {pos})"
        if pos + CENTRAL.size > end.directory_end or data[pos:pos + 4] != DIRECTORY_ENTRY:
            raise _zip_bad(f"{where} is not there: the directory holds fewer entries than its end record declares "
                           f"({end.entries})")
        (_, _, _, flags, method, _, _, crc, compressed, size, name_len, extra_len, comment_len, disk, _, external,
         offset) = CENTRAL.unpack_from(data, pos)
        name_at = pos + CENTRAL.size
        following = name_at + name_len + extra_len + comment_len
        if following > end.directory_end:
            raise _zip_bad(f"{where} runs past the end of the directory")
        raw_name = data[name_at:name_at + name_len]
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
        where = f"member {name!r} ({where})"
        size, compressed, offset = _zip64_values(data[name_at + name_len:name_at + name_len + extra_len],
                                                 [size, compressed, offset], where)
        if disk:
            raise _zip_bad(f"{where} is on another disk (a split archive): send it whole")
        entries.append(_ZipEntry(name, raw_name, flags, method, crc, compressed, size, offset, external >> 16))
        pos = following
    if pos != end.directory_end:
        raise _zip_bad(f"its central directory holds {end.directory_end - pos} bytes (at byte {pos}) after the {end.entries} "
                       "entries its end record declares")
    return entries


def _zip_names_unique(entries: list[_ZipEntry]) -> None:
    seen: dict[str, int] = {}
    for entry in entries:
        key = posixpath.normpath(entry.name.replace("\\", "/")) + ("/" if entry.is_dir else "")
        if key in seen and seen[key] == entry.offset:
            raise _bad(f"the zip archive lists member {entry.name!r} (its local header at byte {entry.offset}) more than once "
                       f"in its central directory: it would be answered once per listing; {ZIP_REFUSED}")
        if key in seen:
            raise _bad(f"the zip archive holds two members named {entry.name!r} (their local headers at bytes {seen[key]} and "
                       f"{entry.offset}): which one is the image is ambiguous; {ZIP_REFUSED}")
        seen[key] = entry.offset


def _zip_layout(data: bytes, entries: list[_ZipEntry], directory: int) -> dict[int, int]:
    """Where each entry's data starts (by its local header's offset): the entries must tile the bytes before the
    central directory (at ``directory``) exactly, from byte 0, each a local header that agrees with its directory
    entry, its data, and its data descriptor where it has one. Nothing before, between or overlapping."""
    order = sorted(entries, key=lambda e: e.offset)
    starts: dict[int, int] = {}
    expected, previous = 0, None
    for k, entry in enumerate(order):
        if entry.offset > expected:
            where = "before its first member" if previous is None else f"between member {previous.name!r} and it"
            raise _zip_bad(f"{entry.offset - expected} bytes at byte {expected}, {where} (member {entry.name!r}, at byte "
                           f"{entry.offset}), belong to no entry of its central directory: another archive or data hidden "
                           f"in it; {ZIP_REFUSED}")
        if entry.offset < expected:
            assert previous is not None  # expected is 0 before the first
            raise _zip_bad(f"member {entry.name!r}'s local header (at byte {entry.offset}) lies inside member "
                           f"{previous.name!r} (bytes {previous.offset} to {expected}): entries that overlap, or share one "
                           "local header, are refused")
        following = order[k + 1].offset if k + 1 < len(order) else directory
        starts[entry.offset], expected = _zip_local(data, entry, directory, following)
        previous = entry
    if expected != directory:
        assert previous is not None
        if expected < directory:
            raise _zip_bad(f"{directory - expected} bytes at byte {expected}, between its last member ({previous.name!r}) and "
                           f"its central directory (at byte {directory}), belong to no entry; {ZIP_REFUSED}")
        raise _zip_bad(f"member {previous.name!r}'s data (to byte {expected}) runs into its central directory (at byte "
                       f"{directory})")
    return starts


def _zip_local(data: bytes, entry: _ZipEntry, directory: int, following: int) -> tuple[int, int]:
    """Where the entry's data starts, and where the entry (its descriptor included) ends; 422 where its local header
    is not there or disagrees with the central directory (name, compression, encryption and descriptor flags, CRC-32
    and sizes)."""
    at = entry.offset
    where = f"member {entry.name!r}: its local header (at byte {at})"
    if at + LOCAL.size > directory or data[at:at + 4] != b"PK\x03\x04":
        raise _zip_bad(f"{where} is not there")
    _, _, flags, method, _, _, crc, compressed, size, name_len, extra_len = LOCAL.unpack_from(data, at)
    name_at = at + LOCAL.size
    start = name_at + name_len + extra_len
    if start > directory:
        raise _zip_bad(f"{where} runs into the central directory")
    if (raw_name := data[name_at:name_at + name_len]) != entry.raw_name:
        raise _zip_bad(f"{where} names it {raw_name.decode('utf-8', 'replace')!r}, not as the central directory does")
    if method != entry.method:
        raise _zip_bad(f"{where} declares compression method {method}, the central directory {entry.method}")
    if (flags ^ entry.flags) & 0x9:
        raise _zip_bad(f"{where} has flags {flags:#06x}, the central directory {entry.flags:#06x} (encryption or data "
                       "descriptor)")
    if size == 0xFFFFFFFF or compressed == 0xFFFFFFFF:  # zip64: the local header's extra field holds both sizes
        field = _extra_field(data[name_at + name_len:start], 0x0001)
        if field is None or len(field) < 16:
            raise _zip_bad(f"{where} declares zip64 sizes (0xFFFFFFFF) without its zip64 extra field")
        size, compressed = struct.unpack_from("<2Q", field)
    central = (crc, compressed, size), (entry.crc, entry.compressed, entry.size)
    agrees = (all(v in (0, c) for v, c in zip(*central, strict=True)) if flags & 0x8  # sizes after the data, in its descriptor
              else central[0] == central[1])
    if not agrees:
        raise _zip_bad(f"{where} declares CRC-32 {crc:08x}, {compressed} bytes compressed and {size} bytes; the central "
                       f"directory {entry.crc:08x}, {entry.compressed} and {entry.size}: one of them lies")
    ends = start + entry.compressed
    if ends > directory:
        raise _zip_bad(f"member {entry.name!r}'s data ({entry.compressed} bytes from byte {start}) runs into the central "
                       f"directory (at byte {directory})")
    return start, (_zip_descriptor(data, entry, ends, following) if flags & 0x8 else ends)


def _zip_descriptor(data: bytes, entry: _ZipEntry, at: int, following: int) -> int:
    """Where the entry's data descriptor (at ``at``, after its data) ends: with or without its signature, with 4- or
    8-byte (zip64) sizes, the one whose values are the central directory's and that ends where the next entry or the
    central directory (``following``) begins, else the first whose values are."""
    ends = []
    for signed in (True, False):
        if signed and data[at:at + 4] != b"PK\x07\x08":
            continue
        for layout in (DESCRIPTOR, DESCRIPTOR64):
            pos = at + 4 * signed
            if pos + layout.size <= len(data) and layout.unpack_from(data, pos) == (entry.crc, entry.compressed, entry.size):
                ends.append(pos + layout.size)
    if not ends:
        raise _zip_bad(f"member {entry.name!r}: its data descriptor (at byte {at}) is missing or disagrees with the central "
                       "directory (CRC-32 and sizes)")
    return following if following in ends else ends[0]


def _zip_member(data: bytes, entry: _ZipEntry, start: int) -> bytes:
    """The member's bytes, decompressed to at most its declared size plus one; 422 where its compressed data does
    not end exactly where its size says (bytes after the stream's end, or a stream cut short), where it decompresses to
    another size than declared, or where its CRC-32 fails."""
    raw = data[start:start + entry.compressed]
    limit = entry.size + 1
    where = f"member {entry.name!r}"
    left = 0
    if entry.method == zipfile.ZIP_STORED:
        out, ended = raw, True
    elif entry.method == zipfile.ZIP_DEFLATED:
        inflate = zlib.decompressobj(-15)
        out = inflate.decompress(raw, limit)
        ended, left = inflate.eof, len(inflate.unused_data) + len(inflate.unconsumed_tail)
    elif entry.method == zipfile.ZIP_BZIP2:
        bunzip = bz2.BZ2Decompressor()
        out = bunzip.decompress(raw, limit)
        ended, left = bunzip.eof, len(bunzip.unused_data)
    elif entry.method == zipfile.ZIP_LZMA:
        out, ended, left = _zip_lzma(raw, limit, where, marked=bool(entry.flags & 0x2))
    else:
        raise _zip_bad(f"{where} is compressed with method {entry.method}: only stored, deflate, bzip2 and lzma are read")
    if len(out) > entry.size:
        raise _zip_bad(f"{where} decompresses to more than the {entry.size} bytes its headers declare")
    if not ended and len(out) < entry.size:
        raise _zip_bad(f"{where}'s compressed data stops before its end ({len(out)} of {entry.size} bytes): truncated or "
                       "corrupt")
    if not ended or left:
        raise _zip_bad(f"{where}'s compressed data ({entry.compressed} bytes) "
                       + (f"holds {left} bytes after its stream's end" if ended else "does not end its stream")
                       + ": refused, they would be dropped")
    if len(out) != entry.size:
        raise _zip_bad(f"{where} decompresses to {len(out)} bytes, its headers declare {entry.size}")
    if zlib.crc32(out) != entry.crc:
        raise _zip_bad(f"archive {where} is broken: its bytes fail their CRC-32 ({zlib.crc32(out):08x}, its headers "
                       f"declare {entry.crc:08x})")
    return out


def _zip_lzma(raw: bytes, limit: int, where: str, *, marked: bool) -> tuple[bytes, bool, int]:
    """A zip member's LZMA data (its 4-byte header, the LZMA1 properties, the raw stream): the bytes, whether the stream
    ended (its end marker, where flag bit 1 says it has one; otherwise all of the data read), and bytes left after it."""
    props_len = struct.unpack_from("<H", raw, 2)[0] if len(raw) >= 4 else 0
    if props_len < 5 or len(raw) < 4 + props_len:
        raise _zip_bad(f"{where}'s LZMA header is cut short or corrupt")
    props = raw[4:4 + props_len]
    if props[0] >= 9 * 5 * 5:
        raise _zip_bad(f"{where}'s LZMA properties are corrupt")
    pb, rest = divmod(props[0], 45)
    lp, lc = divmod(rest, 9)
    lzma1 = {"id": lzma.FILTER_LZMA1, "lc": lc, "lp": lp, "pb": pb, "dict_size": struct.unpack_from("<L", props, 1)[0]}
    unpack = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[lzma1])
    out = unpack.decompress(raw[4 + props_len:], limit)
    if marked:
        return out, unpack.eof, len(unpack.unused_data)
    return out, unpack.eof or unpack.needs_input, len(unpack.unused_data)


def _read_zip(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """A zip's images, in its central directory's order. Verified whole before one is decompressed: the end record
    ends the data; the central directory sits right before it, where it says, and holds exactly the entries it
    declares; no two entries have one name; and the entries tile the bytes before the directory exactly, from byte 0,
    each a local header that agrees with its directory entry, its data, its data descriptor where it has one (nothing
    before, between or overlapping: a second zip in front, as ``cat a.zip b.zip`` makes, or one member listed twice).
    Then every entry, skipped ones too, is decompressed to its declared size and no further, its stream ending where its
    compressed size does, and its CRC-32 checked. Any failure is a 422 that says where."""
    end = _zip_end_record(data)
    if (count := _zip_entry_count(data, end)) > _max_entries(bounds):
        raise _too_large(f"the archive's central directory lists {count} entries, more than {_max_entries(bounds)} (directories "
                         "and hidden files included: twice the images left to the job of IDG_JOBS_MAX_IMAGES, and 100)")
    entries = _central_directory(data, end)
    _zip_names_unique(entries)
    starts = _zip_layout(data, entries, end.directory_end - end.size)
    declared = sum(e.size for e in entries if not e.is_dir)
    if declared > bounds.max_total_bytes:
        raise _too_large(f"the archive's members declare {declared} bytes decompressed, more than the {bounds.max_total_bytes} "
                         "left to the job of IDG_JOBS_MAX_UPLOAD_BYTES (all its uploads together, unpacked)")
    budget, out = _Budget(bounds), []
    for entry in entries:
        budget.entry()
        if entry.flags & 0x1:
            raise _bad(f"archive member {entry.name!r} is encrypted: send archives without a password")
        name: str | None = None
        if not entry.is_dir:
            if entry.mode and (entry.mode & 0o170000) not in (0, 0o100000):  # a symlink or other special file
                raise _bad(f"archive member {entry.name!r} is not a regular file")
            name = _checked_name(entry.name)
        if name is None:  # skipped, but decompressed and checked all the same
            budget.skip(entry.name, entry.size)
            _zip_unpacked(data, entry, starts[entry.offset])
            continue
        budget.admit(name, entry.size)
        out.append((name, budget.take(name, _zip_unpacked(data, entry, starts[entry.offset]))))
    return out


def _zip_unpacked(data: bytes, entry: _ZipEntry, start: int) -> bytes:
    try:
        return _zip_member(data, entry, start)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - zlib.error, OSError (bzip2), LZMAError, ValueError...: the member is broken
        why = str(err).strip() or "corrupt"
        raise _zip_bad(f"archive member {entry.name!r} is broken: {type(err).__name__}: {why[:200]}") from err


CHUNK = 1 << 16
"""Bytes decompressed, or read, at a time."""
BLOCK = tarfile.BLOCKSIZE
HEADER_ALLOWANCE = 4 * BLOCK
"""Bytes of a tar beside its members' data, per entry: its header, a pax or GNU long-name header and its data, the
padding to a block."""
COMPRESSIONS = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
"""A compressed tar's magic bytes, and the compression's name."""


class _Corrupt(Exception):
    """The compressed stream around a tar is broken; the message says how (the tar's reader adds where)."""


def _compression(data: bytes) -> tuple[bytes, str] | None:
    return next(((magic, name) for magic, name in COMPRESSIONS.items() if data.startswith(magic)), None)


def _inflated(data: bytes, magic: bytes, kind: str) -> Iterator[bytes]:
    """The decompressed bytes of ``data``, ``CHUNK`` at most at a time, verified as they come and at the end: each
    stream's checks (gzip's CRC-32 and length, bzip2's block and stream CRCs, xz's check, index and footer), each stream
    ended (not truncated), and nothing after the last but another stream of the same kind or zero bytes (padding, as
    gzip, bzip2 and xz allow): bytes that would be dropped are :class:`_Corrupt`, as the rest is."""
    pos = 0
    while True:
        end = yield from (_gzip_stream(data, pos) if kind == "gzip" else _bz2_or_xz_stream(data, pos, kind))
        if data.startswith(magic, end):  # concatenated streams are one (as gzip -d and xz -d read them)
            pos = end
            continue
        garbage = len(data[end:].rstrip(b"\x00"))  # the tail only: stripping ``data`` had copied all of it
        if garbage > 0:
            raise _Corrupt(f"{garbage} bytes that are neither another {kind} stream nor zero padding follow its {kind} stream's "
                           f"end (at byte {end}): refused, they would be dropped")
        return


def _gzip_stream(data: bytes, pos: int) -> Generator[bytes, None, int]:
    """One gzip stream from ``pos``; returns where it ended. zlib checks its trailer's CRC-32 and length (ISIZE)."""
    inflate = zlib.decompressobj(wbits=31)
    try:
        while not inflate.eof:
            if inflate.unconsumed_tail:
                piece = inflate.unconsumed_tail
            elif pos < len(data):
                piece, pos = data[pos:pos + CHUNK], pos + CHUNK
            else:
                if out := inflate.flush():  # the input is all in: what zlib still holds
                    yield out
                if not inflate.eof:
                    raise _Corrupt("its gzip stream is truncated (it stops before its end and its CRC)")
                break
            if out := inflate.decompress(piece, CHUNK):
                yield out
    except zlib.error as err:
        raise _Corrupt(f"its gzip stream is corrupt ({err})") from err
    return min(pos, len(data)) - len(inflate.unused_data)


def _bz2_or_xz_stream(data: bytes, pos: int, kind: str) -> Generator[bytes, None, int]:
    """One bzip2 or xz stream from ``pos``; returns where it ended."""
    decompressor = bz2.BZ2Decompressor() if kind == "bzip2" else lzma.LZMADecompressor(lzma.FORMAT_XZ)
    try:
        while not decompressor.eof:
            piece = b""
            if decompressor.needs_input:
                if pos >= len(data):
                    raise _Corrupt(f"its {kind} stream is truncated (it stops before its end)")
                piece, pos = data[pos:pos + CHUNK], pos + CHUNK
            if out := decompressor.decompress(piece, CHUNK):
                yield out
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise _Corrupt(f"its {kind} stream is corrupt ({err})") from err
    return min(pos, len(data)) - len(decompressor.unused_data)


def _pieces(data: bytes) -> Iterator[bytes]:
    for at in range(0, len(data), CHUNK):
        yield data[at:at + CHUNK]


class _TarStream:
    """A tar's bytes for :mod:`tarfile`, read forward only (tarfile's reading mode seeks only forward) from ``pieces``,
    at most ``limit`` of them (413 past it); it keeps the last block read whole (a header) and where it began, to tell
    how the archive ended."""

    def __init__(self, pieces: Iterator[bytes], limit: int, too_large: str) -> None:
        self._pieces = pieces
        self._piece, self._at = b"", 0
        self._pos = self._produced = 0
        self._limit, self._too_large = limit, too_large
        self.last_block: tuple[int, bytes] = (-1, b"")

    def _more(self) -> bool:
        piece = next(self._pieces, None)
        if piece is None:
            return False
        self._produced += len(piece)
        if self._produced > self._limit:
            raise _too_large(self._too_large)
        self._piece, self._at = piece, 0
        return True

    def read(self, n: int = -1) -> bytes:
        start, want, parts = self._pos, n if n >= 0 else self._limit + 1, []
        while want > 0:
            if self._at >= len(self._piece) and not self._more():
                break
            part = self._piece[self._at:self._at + want]
            self._at += len(part)
            self._pos += len(part)
            want -= len(part)
            parts.append(part)
        out = b"".join(parts)
        if n == BLOCK:
            self.last_block = (start, out)
        return out

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:
        raise io.UnsupportedOperation("a tar's stream is read only")

    def close(self) -> None:
        """Nothing to close: the bytes are in memory."""

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            pos += self._pos
        if whence == io.SEEK_END or pos < self._pos:
            raise io.UnsupportedOperation("a tar's stream is read forward only")
        while self._pos < pos and self.read(min(pos - self._pos, CHUNK)):
            pass
        return self._pos


def _read_tar(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """A tar's images, plain or compressed. Verified whole, as it is read: every header's checksum (a bad one where
    another member's header belongs is an error, not the archive's end, as tarfile takes it), every member's data there
    in full, the end-of-archive marker (a zero block; POSIX writes two, then pads to a record) followed by nothing but
    zero bytes, and the compressed stream to its end (see :func:`_inflated`). A tar that stops after a complete member
    without its zero blocks is refused too: it cannot be told from one cut short at a member's end. Any failure is a
    422 saying where (the member, or the byte, and after which member)."""
    compression = _compression(data)
    pieces = _pieces(data) if compression is None else _inflated(data, *compression)
    allowance = _max_entries(bounds) * HEADER_ALLOWANCE + (1 << 20)
    limit = bounds.max_total_bytes + allowance
    stream = _TarStream(pieces, limit, f"the tar archive passes {limit} bytes decompressed: its images may take "
                        f"{bounds.max_total_bytes} (what is left to the job of IDG_JOBS_MAX_UPLOAD_BYTES), its headers, "
                        f"padding and end {allowance}")
    budget, out = _Budget(bounds), []
    where = "before its first member"
    try:
        try:
            tf = tarfile.TarFile(fileobj=stream, mode="r")  # it reads the first header
        except tarfile.ReadError as err:
            raise _bad(f"the tar archive could not be read: {_header_problem(stream, 0, where) or err}") from err
        with tf:
            seen: dict[str, int] = {}  # an image's name: where its header starts
            try:
                for member in tf:
                    where = f"in archive member {member.name!r}"
                    if (image := _tar_member(tf, member, budget)) is not None:
                        if (first := seen.setdefault(image[0], member.offset)) != member.offset:
                            raise _bad(f"the tar archive holds a member named {member.name!r} twice (its headers at bytes "
                                       f"{first} and {member.offset}, unpacked): which one is the image is ambiguous (tar "
                                       "-x keeps the last, as `tar -r` appends); refused whole")
                        out.append(image)
                    where = f"after archive member {member.name!r}"
            except tarfile.ReadError as err:  # past a member skipped unread (cut short), or a pax or GNU header broken
                raise _bad(f"the tar archive could not be read {where}: it is truncated or corrupt ({err})") from err
            if (problem := _header_problem(stream, tf.offset, where)) is not None:
                raise _bad(f"the tar archive could not be read: {problem}")
            _only_zeros_follow(stream, tf.offset)
    except _Corrupt as err:
        raise _bad(f"the tar archive could not be read: {err}, found {where}") from err
    return out


def _tar_member(tf: tarfile.TarFile, member: tarfile.TarInfo, budget: _Budget) -> tuple[str, bytes] | None:
    """The member's name and bytes; None for a member skipped (a directory, a hidden file)."""
    budget.entry()
    if member.isdir():
        return None
    if not member.isfile():
        raise _bad(f"archive member {member.name!r} is not a regular file (a link, a device or a FIFO)")
    name = _checked_name(member.name)
    if name is None:
        budget.skip(member.name, member.size)
        return None
    budget.admit(name, member.size)
    file = tf.extractfile(member)
    if file is None:
        raise _bad(f"archive member {member.name!r} could not be read")
    try:
        return name, budget.read(name, file)
    except tarfile.ReadError as err:
        raise _bad(f"the tar archive could not be read: archive member {member.name!r} is truncated (its header declares "
                   f"{member.size} bytes)") from err


def _header_problem(stream: _TarStream, at: int, after: str) -> str | None:
    """Why the block at ``at``, where tarfile stopped, is not the end-of-archive marker (a zero block); None if it is."""
    start, block = stream.last_block
    if start != at:
        return f"it stops {after} (truncated)"
    if not block:
        return f"it ends {after} without its end-of-archive blocks (truncated?)"
    if len(block) < BLOCK:
        return f"it is truncated inside the header at byte {at}, {after}"
    if not block.strip(b"\x00"):
        return None
    name = block[:100].split(b"\x00", 1)[0].decode("utf-8", "replace")
    why = "its checksum does not hold" if not _tar_checksum_holds(block) else "a field of it cannot be read"
    return f"the header at byte {at} (of member {name!r}, {after}) is corrupt: {why}"


def _only_zeros_follow(stream: _TarStream, at: int) -> None:
    """Reads the tar to its end (so a compressed one is verified to its end too); 422 where anything but zero bytes
    follows its end-of-archive marker at ``at``: a second archive appended, which tarfile would drop."""
    while piece := stream.read(CHUNK):
        if piece.strip(b"\x00"):
            raise _bad(f"the tar archive could not be read: bytes other than zero follow its end-of-archive marker (at byte "
                       f"{at}): refused, they would be dropped (another archive appended? send each on its own)")
