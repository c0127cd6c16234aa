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
"""

from __future__ import annotations

import io
import posixpath
import struct
import tarfile
import zipfile
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
        """A skipped tar member is still decompressed to reach the next header: its size counts."""
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
    """``(name, bytes)`` of every image in the archive, in archive order; 422 for a broken or
    unsafe archive, 413 past a bound."""
    kind = "zip" if data[:2] == b"PK" else "tar"
    try:
        return _read_zip(data, bounds) if kind == "zip" else _read_tar(data, bounds)
    except ApiError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a corrupt archive makes the decoders raise (zlib.error, LZMAError,
        # OSError, EOFError, struct.error, ValueError, ...) is the uploader's 422, not the server's 500
        why = str(err).strip() or "corrupt or truncated"
        raise _bad(f"the {kind} archive could not be read: {type(err).__name__}: {why[:200]}") from err


def _zip_entries(data: bytes) -> int:
    """How many entries the zip's central directory holds, at least: the count its end record declares
    or the entry signatures in the directory it points to, whichever is larger (zipfile parses them all
    before it answers anything, so this is checked first)."""
    at = data.rfind(b"PK\x05\x06", max(0, len(data) - END.size - 0xFFFF))
    if at < 0 or at + END.size > len(data):
        raise _bad("the zip archive could not be read: it has no end of central directory record (truncated?)")
    _, _, _, _, declared, size, _, _ = END.unpack_from(data, at)
    if at >= END64_LOCATOR.size:
        signature, _, end64, _ = END64_LOCATOR.unpack_from(data, at - END64_LOCATOR.size)
        if signature == b"PK\x06\x07" and 0 <= end64 <= len(data) - END64.size and data[end64:end64 + 4] == b"PK\x06\x06":
            _, _, _, _, _, _, _, declared, size, _ = END64.unpack_from(data, end64)
            at = end64
    return max(declared, data.count(DIRECTORY_ENTRY, max(0, at - size), at))


def _read_zip(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    if (entries := _zip_entries(data)) > _max_entries(bounds):
        raise _too_large(f"the archive's central directory lists {entries} entries, more than {_max_entries(bounds)} (directories "
                         "and hidden files included: twice the images left to the job of IDG_JOBS_MAX_IMAGES, and 100)")
    budget, out = _Budget(bounds), []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        declared = sum(i.file_size for i in infos if not i.is_dir())
        if declared > bounds.max_total_bytes:
            raise _too_large(f"the archive's members declare {declared} bytes decompressed, more than the {bounds.max_total_bytes} "
                             "left to the job of IDG_JOBS_MAX_UPLOAD_BYTES (all its uploads together, unpacked)")
        for info in infos:
            budget.entry()
            if info.is_dir():
                continue
            mode = info.external_attr >> 16
            if mode and (mode & 0o170000) not in (0, 0o100000):  # a symlink or other special file (Unix attributes)
                raise _bad(f"archive member {info.filename!r} is not a regular file")
            name = _checked_name(info.filename)
            if name is None:
                continue
            if info.flag_bits & 0x1:
                raise _bad(f"archive member {info.filename!r} is encrypted: send archives without a password")
            budget.admit(name, info.file_size)
            with zf.open(info) as stream:
                out.append((name, budget.read(name, stream)))
    return out


def _read_tar(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    budget, out = _Budget(bounds), []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        for member in tf:
            budget.entry()
            if member.isdir():
                continue
            if not member.isfile():
                raise _bad(f"archive member {member.name!r} is not a regular file (a link, a device or a FIFO)")
            name = _checked_name(member.name)
            if name is None:
                budget.skip(member.name, member.size)
                continue
            budget.admit(name, member.size)
            stream = tf.extractfile(member)
            if stream is None:
                raise _bad(f"archive member {member.name!r} could not be read")
            out.append((name, budget.read(name, stream)))
    return out
