"""The images of one tar or zip archive, read in memory with bounds that hold whatever the archive
declares: at most ``max_members`` images, each at most ``max_member_bytes``, all together at most
``max_total_bytes``, decompressed. Sizes are checked from each member's header before it is read
and again while it is read (a zip's header may lie), so a zip or tar bomb costs at most the bounds.
Nothing is written to disk; a member whose name is absolute or climbs out (``../``), a link, a
device or any other non-file is refused (422), as are nested archives. Directories are skipped, as
are hidden files (``.DS_Store``, macOS's ``__MACOSX/``).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zipfile
from dataclasses import dataclass
from typing import IO

from app.core.errors import ApiError


@dataclass(frozen=True)
class Bounds:
    max_members: int
    max_member_bytes: int
    max_total_bytes: int


def is_archive(data: bytes) -> bool:
    """A zip (local header or empty archive), or a tar, plain or gzip/bzip2/xz-compressed."""
    return data[:4] in (b"PK\x03\x04", b"PK\x05\x06") or _is_tar(data)


def _is_tar(data: bytes) -> bool:
    if data[:2] == b"\x1f\x8b" or data[:3] == b"BZh" or data[:6] == b"\xfd7zXZ\x00":
        return True
    return len(data) >= 512 and data[257:262] == b"ustar"


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


class _Budget:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.members = 0
        self.entries = 0
        self.total = 0

    def entry(self) -> None:
        """Any entry, skipped ones included: a tar of a million empty directories is refused too."""
        self.entries += 1
        if self.entries > 2 * self.bounds.max_members + 100:
            raise _too_large(f"the archive holds more than {2 * self.bounds.max_members + 100} entries")

    def skip(self, name: str, declared: int) -> None:
        """A skipped tar member is still decompressed to reach the next header: its size counts."""
        self.total += declared
        if self.total > self.bounds.max_total_bytes:
            raise _too_large(f"the archive passes {self.bounds.max_total_bytes} bytes decompressed (IDG_JOBS_MAX_UPLOAD_BYTES)")

    def admit(self, name: str, declared: int) -> None:
        b = self.bounds
        self.members += 1
        if self.members > b.max_members:
            raise _too_large(f"the archive holds more than {b.max_members} images (IDG_JOBS_MAX_IMAGES)")
        if declared > b.max_member_bytes:
            raise _too_large(f"archive member {name!r} has {declared} bytes, more than the limit of {b.max_member_bytes} per image")
        if self.total + declared > b.max_total_bytes:
            raise _too_large(f"the archive's images pass {b.max_total_bytes} bytes decompressed (IDG_JOBS_MAX_UPLOAD_BYTES)")

    def read(self, name: str, stream: IO[bytes]) -> bytes:
        b = self.bounds
        data = stream.read(b.max_member_bytes + 1)
        if len(data) > b.max_member_bytes:
            raise _too_large(f"archive member {name!r} has more than {b.max_member_bytes} bytes (its header said less)")
        self.total += len(data)
        if self.total > b.max_total_bytes:
            raise _too_large(f"the archive's images pass {b.max_total_bytes} bytes decompressed (IDG_JOBS_MAX_UPLOAD_BYTES)")
        return bytes(data)


def read_archive(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of every image in the archive, in archive order; 422 for a broken or
    unsafe archive, 413 past a bound."""
    if data[:2] == b"PK":
        return _read_zip(data, bounds)
    return _read_tar(data, bounds)


def _read_zip(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    budget, out = _Budget(bounds), []
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                budget.entry()
                if info.is_dir():
                    continue
                mode = info.external_attr >> 16
                if mode and (mode & 0o170000) not in (0, 0o100000):  # a symlink or other special file (Unix attributes)
                    raise _bad(f"archive member {info.filename!r} is not a regular file")
                name = _checked_name(info.filename)
                if name is None:
                    continue
                budget.admit(name, info.file_size)
                with zf.open(info) as stream:
                    out.append((name, budget.read(name, stream)))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, OSError) as err:  # also a bad CRC, an unknown method
        raise _bad(f"the zip archive could not be read: {err}") from err
    return out


def _read_tar(data: bytes, bounds: Bounds) -> list[tuple[str, bytes]]:
    budget, out = _Budget(bounds), []
    try:
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
    except (tarfile.TarError, EOFError, OSError, ValueError) as err:  # also a truncated gzip, a bad header
        raise _bad(f"the tar archive could not be read: {err}") from err
    return out
