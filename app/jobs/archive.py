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


@dataclass(frozen=True)
class Bounds:
    max_members: int
    max_member_bytes: int
    max_total_bytes: int


def is_archive(data: bytes) -> bool:
    """A zip (local header or empty archive), or a tar, plain or gzip/bzip2/xz-compressed."""
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06") or _is_tar(data)


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
        self.total += len(data)
        if self.total > b.max_total_bytes:
            raise _too_large(self.over_total())
        if is_archive(data):
            raise _bad(f"archive member {name!r} is itself an archive: nested archives are refused (unpack it and send its images)")
        return bytes(data)


def read_archive(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of every image in the archive, in archive order, the archive verified whole first (see
    :func:`_read_tar` and :func:`_read_zip`); 422 for a broken or unsafe archive, 413 past a bound."""
    kind = "zip" if data[:2] == b"PK" else "tar"
    try:
        return _read_zip(data, bounds) if kind == "zip" else _read_tar(data, bounds)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a corrupt archive makes the decoders raise (zlib.error, LZMAError,
        # OSError, EOFError, struct.error, ValueError, ...) is the uploader's 422, not the server's 500
        why = str(err).strip() or "corrupt or truncated"
        raise _bad(f"the {kind} archive could not be read: {type(err).__name__}: {why[:200]}") from err


def _zip_entries(data: bytes) -> tuple[int, int]:
    """How many entries the zip's central directory holds, at least: the count its end record declares
    or the entry signatures in the directory it points to, whichever is larger (zipfile parses them all
    before it answers anything, so this is checked first); and the count the end record declares. 422 where
    anything but the end record's own comment follows it (a zip cut inside its comment, or bytes appended)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - END.size - 0xFFFF))
    if at < 0 or at + END.size > len(data):
        raise _bad("the zip archive could not be read: it has no end of central directory record (truncated?)")
    _, _, _, _, declared, size, _, comment = END.unpack_from(data, at)
    if (after := len(data) - (at + END.size + comment)) != 0:
        raise _bad(f"the zip archive could not be read: its end record (at byte {at}) declares a comment of {comment} bytes "
                   f"but {comment + after} follow it (truncated, or bytes appended)")
    if at >= END64_LOCATOR.size:
        signature, _, end64, _ = END64_LOCATOR.unpack_from(data, at - END64_LOCATOR.size)
        if signature == b"PK\x06\x07" and 0 <= end64 <= len(data) - END64.size and data[end64:end64 + 4] == b"PK\x06\x06":
            _, _, _, _, _, _, _, declared, size, _ = END64.unpack_from(data, end64)
            at = end64
    return max(declared, data.count(DIRECTORY_ENTRY, max(0, at - size), at)), declared


def _read_zip(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """A zip's images. Verified whole: the end record ends the data, the central directory holds the entries it
    declares, and every entry (skipped ones too) is read to its end, so zipfile checks its local header's name and
    its CRC-32; any failure is a 422 naming the entry."""
    entries, declared_entries = _zip_entries(data)
    if entries > _max_entries(bounds):
        raise _too_large(f"the archive's central directory lists {entries} entries, more than {_max_entries(bounds)} (directories "
                         "and hidden files included: twice the images left to the job of IDG_JOBS_MAX_IMAGES, and 100)")
    budget, out = _Budget(bounds), []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        if len(infos) != declared_entries:
            raise _bad(f"the zip archive could not be read: its end record declares {declared_entries} entries, its central "
                       f"directory holds {len(infos)}")
        declared = sum(i.file_size for i in infos if not i.is_dir())
        if declared > bounds.max_total_bytes:
            raise _too_large(f"the archive's members declare {declared} bytes decompressed, more than the {bounds.max_total_bytes} "
                             "left to the job of IDG_JOBS_MAX_UPLOAD_BYTES (all its uploads together, unpacked)")
        for info in infos:
            budget.entry()
            if info.flag_bits & 0x1:
                raise _bad(f"archive member {info.filename!r} is encrypted: send archives without a password")
            name: str | None = None
            if not info.is_dir():
                mode = info.external_attr >> 16
                if mode and (mode & 0o170000) not in (0, 0o100000):  # a symlink or other special file (Unix attributes)
                    raise _bad(f"archive member {info.filename!r} is not a regular file")
                name = _checked_name(info.filename)
            try:
                with zf.open(info) as stream:
                    if name is None:  # skipped, but read to its end all the same: its CRC and local header are checked
                        budget.skip(info.filename, info.file_size)
                        while stream.read(CHUNK):
                            pass
                        continue
                    budget.admit(name, info.file_size)
                    out.append((name, budget.read(name, stream)))  # to its end, where zipfile checks the CRC-32
            except ApiError:
                raise
            except Exception as err:  # noqa: BLE001 - BadZipFile (a bad CRC-32, a local header that disagrees), zlib.error,
                # LZMAError, EOFError, ...: the member is broken
                why = str(err).strip() or "corrupt or truncated"
                raise _bad(f"the zip archive could not be read: archive member {info.filename!r} is broken: "
                           f"{type(err).__name__}: {why[:200]}") from err
    return out


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
            try:
                for member in tf:
                    where = f"in archive member {member.name!r}"
                    if (image := _tar_member(tf, member, budget)) is not None:
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
