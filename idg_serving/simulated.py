"""A simulated accelerator: a network wrapper whose every call takes a set time with the GIL released,
as a GPU kernel does, and returns the wrapped network's real outputs.

Timing and overlap (does the host prepare call k+1 while call k runs? is the device ever idle under
load?) can then be tested and measured on a machine without a GPU: the wrapped network computes
the real, checkable answer, and the call is stretched to ``call_ms`` (+ ``image_ms`` per image) by
sleeping, which, like waiting on a CUDA kernel, leaves the GIL to the other threads. Each call is
logged (start and end, in order, with its batch size) for tests that prove overlap by event order.

With ``stream=True`` it behaves as a CUDA stream does instead: a call returns once launched (its real outputs
computed on the caller's thread, standing for the host's cost of launching its kernels), and its time is booked on
the device's own timeline, after the calls launched before it: it begins when the device is free or when its launch
began, whichever is later (a GPU runs a call's first kernels while the host still launches the rest), and its result
is ready ``call_ms`` later, or once the host finished launching it if that is later (:meth:`end_event`: the caller
waits for it, as for a CUDA event). A device that waits for the host then shows as a gap in that timeline, and the
host's own waits for the GIL between calls do not stop the device, as on a GPU, where the kernels need no Python.
The service wraps its models in it with ``IDG_SIMULATED_CALL_MS`` (benchmarks and tests only), as a stream.

Several processes can share one simulated device, as several server processes share one GPU: give each
the same ``timeline`` file (:class:`SharedTimeline`), and a call launched in one begins only once the calls
launched before it in any of them have ended.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import NamedTuple

from torch import Tensor, nn

_FREE_AT = struct.Struct("d")


class Booking(NamedTuple):
    """A call booked on a device's timeline: when it begins and ends (``time.perf_counter``), and the seconds the device
    had nothing to run before it (None: the device's first call)."""

    begins: float
    ends: float
    idle_before: float | None


class Timeline:
    """When the device is next free (``time.perf_counter``; 0: now): a call launched now begins then or now,
    whichever is later. This process's own device; :class:`SharedTimeline` is one several processes share.
    Its lock is its own: the models of one process share one timeline (one device), each with its own lock."""

    def __init__(self) -> None:
        self._free_at = 0.0
        self._lock = threading.Lock()

    def book(self, took: float) -> Booking:
        """Book a call of ``took`` seconds launched now: its begin, end and the device's gap before it, in one step."""
        with self._lock:
            return self._book(took)

    def _book(self, took: float) -> Booking:
        now = time.perf_counter()
        begins = max(now, self._free_at)
        idle_before = max(0.0, now - self._free_at) if self._free_at else None
        self._free_at = begins + took
        return Booking(begins, begins + took, idle_before)


class SharedTimeline(Timeline):
    """The timeline in a file that every process using the device maps (``time.perf_counter`` is the system-wide
    monotonic clock on Linux): :meth:`book` takes the file's lock (between processes) inside the timeline's own
    (between threads: ``flock`` does not exclude the threads of one process), so no two calls overlap."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < _FREE_AT.size:
            os.ftruncate(self._fd, _FREE_AT.size)  # a new file is zeros: free at time 0, i.e. now
        self._map = mmap.mmap(self._fd, _FREE_AT.size)

    def book(self, took: float) -> Booking:
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                self._free_at = _FREE_AT.unpack_from(self._map)[0]
                booking = self._book(took)
                _FREE_AT.pack_into(self._map, 0, self._free_at)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return booking


class SimulatedAccelerator(nn.Module):
    """``net``, each call stretched to ``call_ms + image_ms * batch`` milliseconds of wall time.

    Calls are serialised, as on one device: a second thread's call waits for the first to end.
    :attr:`events` holds ``("start" | "end", call number, batch size)`` in the order they happened;
    :attr:`busy_s` the seconds calls took."""

    def __init__(self, net: nn.Module, call_ms: float, image_ms: float = 0.0, stream: bool = False,
                 timeline: Path | Timeline | None = None) -> None:
        super().__init__()
        if timeline is not None and not stream:
            raise ValueError("a shared timeline needs stream=True: only a stream's calls are booked on the device's timeline")
        self.net = net
        self.call_ms = call_ms
        self.image_ms = image_ms
        self.stream = stream
        self.events: list[tuple[str, int, int]] = []
        self.busy_s = 0.0
        self.calls = 0
        self._mine = threading.local()  # what the calling thread launched last (free_at, idle_before, booked_at)
        self.timeline = timeline if isinstance(timeline, Timeline) else SharedTimeline(timeline) if timeline is not None else Timeline()
        """With ``stream``: the device's timeline: its own, one given (the other models of the process share it: one
        device) or, with a ``timeline`` file, the one shared with the other processes that map it."""
        self._device = threading.Lock()
        self._log = threading.Lock()

    @property
    def probe_net(self) -> nn.Module:
        """The network a probe that is no served call runs (:mod:`idg_models.cam_layer`'s search for Grad-CAM's layer):
        ``net`` itself, taking no time on the simulated device, as the probe takes next to none on a real one."""
        return self.net

    @property
    def free_at(self) -> float | None:
        """With ``stream``: when (``time.perf_counter``) the last call this thread launched here ends on the device.
        Per thread, as a CUDA event recorded after a launch is that launch's: a call another thread launches meanwhile
        (the worker evaluating a failed call's requests again, say) does not change it."""
        return getattr(self._mine, "free_at", None)

    @property
    def idle_before(self) -> float | None:
        """With ``stream``: seconds the device had nothing to run before the last call this thread launched here (a
        shared timeline's device: no call of any process); None before the device's first call."""
        return getattr(self._mine, "idle_before", None)

    @property
    def booked_at(self) -> float | None:
        """With ``stream``: when (``time.monotonic``) the last call this thread launched here was booked on the timeline."""
        return getattr(self._mine, "booked_at", None)

    @property
    def thread_busy_s(self) -> float:
        """Seconds of device time booked by the calls this thread launched here (:attr:`busy_s` counts every thread's)."""
        return float(getattr(self._mine, "busy_s", 0.0))

    def note(self, what: str, number: int, size: int) -> None:
        with self._log:
            self.events.append((what, number, size))

    def forward(self, x: Tensor) -> Tensor:
        if self.stream:
            return self._launch(x)
        with self._device:
            self.calls += 1
            number, size = self.calls, int(x.shape[0])
            self.note("start", number, size)
            started = time.perf_counter()
            out: Tensor = self.net(x)
            left = (self.call_ms + self.image_ms * size) / 1000 - (time.perf_counter() - started)
            if left > 0:
                time.sleep(left)  # the GIL is released, as while a CUDA kernel runs
            self.busy_s += time.perf_counter() - started
            self.note("end", number, size)
        return out

    def _launch(self, x: Tensor) -> Tensor:
        size = int(x.shape[0])
        took = (self.call_ms + self.image_ms * size) / 1000
        with self._device:  # booked as the launch begins: the device starts on it while the host goes on launching
            self.calls += 1
            mine = self._mine
            booking = self.timeline.book(took)
            mine.free_at, mine.idle_before = booking.ends, booking.idle_before
            mine.booked_at = time.monotonic()
            mine.busy_s = self.thread_busy_s + took
            self.busy_s += took
            self.note("start", self.calls, size)
        out: Tensor = self.net(x)
        return out

    def end_event(self) -> EndEvent:
        """The end of the last call this thread launched (on a stream), to wait for as for a CUDA event: its booked end,
        or now if that is later (called once the host finished launching the call: its last kernel cannot end before)."""
        now = time.perf_counter()
        free_at = self.free_at
        return EndEvent(now if free_at is None else max(free_at, now))


class EndEvent:
    """When a simulated stream's call has its result (``time.perf_counter``); :meth:`synchronize` waits
    for it with the GIL released, as ``torch.cuda.Event.synchronize`` does."""

    def __init__(self, at: float) -> None:
        self.at = at

    def synchronize(self) -> None:
        time.sleep(max(0.0, self.at - time.perf_counter()))
