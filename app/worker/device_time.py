"""The device's busy and idle time when several server processes share it (``IDG_PROCESSES``).

Each process knows only its own calls, and the sum of their busy times over the processes counts a second twice
whenever two processes' calls overlap on the device: on a GPU each call's CUDA events span the slices the GPU gave
the other processes meanwhile (four processes on one H200 read 136% busy). So each process also marks, in a file
that every process of the server maps (one per device, in ``PROMETHEUS_MULTIPROC_DIR``), whether it has a call on
the device now (launched and not ended, as its host sees it) and whether it holds requests. The device is then:

- ``busy`` while any process has a call on it,
- idle waiting for a ``host`` while none has but one holds requests (it is still preparing their next call),
- idle with ``no_work`` otherwise.

Each change of that state books the time since the last change to the state it ends, so the totals are the union of
the processes' intervals, not their sum, and busy + host + no_work is the wall time since the first process marked
the file. A reader adds the time of the state running now, so a stalled call reads as busy while it stalls. A
process that died with a call on the device stops counting at the next look (its pid is gone).

The file is a header (the three totals, since when the current state runs, the state) and one slot per process
(pid, call on the device, holds requests), read and written under ``flock`` (between processes) and a thread lock
(``flock`` does not exclude the threads of one process). ``time.monotonic`` is one clock for every process on Linux.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STATES = ("busy", "host", "no_work")
_HEADER = struct.Struct("dddd q")  # busy, host, no_work seconds; since when the state runs (0: never marked); the state
_SLOT = struct.Struct("qqq")  # pid (0: free), a call on the device (0/1), holds requests (0/1)
SLOTS = 64
SIZE = _HEADER.size + SLOTS * _SLOT.size
FILE_PREFIX = "device-time-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


class SharedDeviceTime:
    """One device's time in a file that every server process using the device maps; this process's marks in it.

    Get it with :meth:`of` (one per file and process: the workers of one process share its slot, their marks counted)."""

    _open: dict[Path, SharedDeviceTime] = {}
    _open_lock = threading.Lock()

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < SIZE:
            os.ftruncate(self._fd, SIZE)  # a new file is zeros: never marked, every slot free
        self._map = mmap.mmap(self._fd, SIZE)
        self._lock = threading.Lock()
        self._calls = 0  # this process's calls on the device now (every worker of it)
        self._holds = 0  # this process's workers that hold requests now

    @classmethod
    def of(cls, folder: Path, device: str) -> SharedDeviceTime:
        """The device's file in ``folder`` (``device-time-cuda_0``), opened once per process."""
        path = folder / (FILE_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", device))
        with cls._open_lock:
            if path not in cls._open:
                cls._open[path] = cls(path)
            return cls._open[path]

    def join(self) -> None:
        """This process uses the device from now on (its worker started): the device's time starts, if it had not."""
        with self._lock:
            self._write()

    def call(self, on: bool) -> None:
        """A call of this process went onto the device (True) or its last one there ended (False)."""
        with self._lock:
            self._calls = max(0, self._calls + (1 if on else -1))
            self._write()

    def holds(self, on: bool) -> None:
        """A worker of this process began holding requests (True) or holds none any more (False)."""
        with self._lock:
            self._holds = max(0, self._holds + (1 if on else -1))
            self._write()

    def seconds(self) -> dict[str, float]:
        """The device's busy, host and no_work seconds so far, the state running now included."""
        with self._lock, self._locked():
            totals, since, state = self._update(time.monotonic())
        return dict(zip(STATES, totals, strict=True))

    # -- under the locks ------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write(self) -> None:
        with self._locked():
            pid, free = os.getpid(), None
            for i in range(SLOTS):
                owner = _SLOT.unpack_from(self._map, _HEADER.size + i * _SLOT.size)[0]
                if owner == pid:
                    free = i
                    break
                if free is None and (owner == 0 or not _alive(owner)):
                    free = i
            if free is None:
                raise RuntimeError(f"{self.path}: more than {SLOTS} processes share this device")
            _SLOT.pack_into(self._map, _HEADER.size + free * _SLOT.size, pid, int(self._calls > 0), int(self._holds > 0))
            self._update(time.monotonic())

    def _update(self, now: float) -> tuple[list[float], float, int]:
        """Free the slots of dead processes, book the state's time if it changed; the totals with the running state's
        time added, since when it runs, and the state."""
        *booked, since, state = _HEADER.unpack_from(self._map)
        calls = holds = False
        for i in range(SLOTS):
            at = _HEADER.size + i * _SLOT.size
            pid, call, hold = _SLOT.unpack_from(self._map, at)
            if pid == 0:
                continue
            if pid != os.getpid() and not _alive(pid):
                _SLOT.pack_into(self._map, at, 0, 0, 0)
                continue
            calls, holds = calls or bool(call), holds or bool(hold)
        now_state = 0 if calls else 1 if holds else 2
        if since == 0.0:  # the first mark: the device's time starts now
            since, state = now, now_state
        elif now_state != state:
            booked[state] += max(0.0, now - since)
            since, state = now, now_state
        _HEADER.pack_into(self._map, 0, *booked, since, state)
        totals = list(booked)
        totals[state] += max(0.0, now - since)
        return totals, since, state


def read_all(folder: Path) -> dict[str, dict[str, float]]:
    """Each device's seconds (:meth:`SharedDeviceTime.seconds`) from the files in ``folder``, by the file's device name."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted(folder.glob(FILE_PREFIX + "*")):
        out[path.name.removeprefix(FILE_PREFIX)] = SharedDeviceTime.of(folder, path.name.removeprefix(FILE_PREFIX)).seconds()
    return out
