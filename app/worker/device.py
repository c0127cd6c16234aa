"""The device stage: a thread that runs prepared model calls one after another, so the worker thread
can prepare call k+1 and book call k while call k runs.

The worker thread gathers a call's inputs (:func:`idg_core.model_calls.prepare_call`) and hands it to
:meth:`DeviceStage.submit`; this stage's thread runs it (:func:`idg_core.model_calls.run_prepared`) and marks it
done; the worker books the outputs into its jobs (:meth:`DeviceStage.wait`) while the next call runs.
At most ``depth`` calls are handed over at once (one running, the rest queued), so the device never
waits for the host as long as the host prepares a call faster than the device runs one.

On CUDA the calls run on a stream of their own. The worker's stream (the plans' host steps, the
inputs' gathering) and the call stream meet only through events: a call waits for the event recorded
after its inputs were gathered, and the worker's stream waits for the call's end event before its
outputs are used. What the plans read on the host (each row's value and arg-max class, a prediction's logits) is
copied to pinned host memory on the call stream behind the call, so it is there when the end event is and the worker
never waits for the GPU: a copy made from the worker's stream waited for every kernel its plans had queued there,
which run behind the next call. Tensors that cross streams are recorded on the stream that uses
them (``record_stream``), so the caching allocator does not hand their memory out too early.
Device time is measured per call: CUDA events on a GPU, the stage thread's time elsewhere. So is the time between
calls, when the device has nothing to run (:func:`split_gap`): each such gap is split into the part while the worker
held no request (the device waited for requests to arrive: HTTP, decoding, clients) and the part while it held one
(the device waited for this process's host steps: planning, gathering points, booking, the batch wait).

On an asynchronous device (CUDA, or a simulated accelerator run as a stream) the stage only *launches* a
call and a second thread of its own waits for it to end; up to ``ahead`` calls are launched at once, so
call k+1 is queued on the device behind call k and the device goes from one to the next without waiting
for this process's Python (the launching thread's wait for the GIL, the bookkeeping of call k's end).
Elsewhere (a CPU, where the call is the computation) a call runs to its end on the stage's thread.
"""

from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor

from idg_core.model_calls import PreparedCall, run_prepared
from idg_core.types import Model
from idg_serving.simulated import SimulatedAccelerator

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(eq=False)
class Call:
    """One model call handed to the device stage, and its outcome."""

    model: Model
    prepared: PreparedCall
    graphs: dict[tuple[int, bool], Any] | None = None
    """The model's CUDA graphs by (size, gradient) (:mod:`idg_models.cuda_graphs`): a call of a captured shape replays one."""
    owner: Any = None
    """What the submitter needs to book the result (the worker: its jobs and their rows)."""
    number: int = 0
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    ended: float | None = None
    out: tuple[Tensor, Tensor | None, Tensor] | None = None
    """Its outputs (:func:`idg_core.model_calls.run_call`); on CUDA the values and logits are host copies made behind it."""
    top1: Tensor | None = None
    """On CUDA: each row's arg-max class, on the host (an arg-max of the host's bf16 logits costs the worker 0.6 ms)."""
    host_logits: bool = True
    """On CUDA: whether its logits are copied to the host too (a prediction reads them; a 128-row call of a 1000-class
    model's are 256 KB); else they stay on the GPU."""
    error: BaseException | None = None
    device_seconds: float = 0.0
    busy_booked: float = 0.0
    """Seconds of it already booked as device busy time while it ran (a long call is booked as it goes, not at its end)."""
    busy_closed: bool = False
    """Its busy time is booked in full: nothing more is booked for it while it runs."""
    done: threading.Event = field(default_factory=threading.Event)
    work_since: float | None = None
    """When it was launched: since when the submitter had held work without a break (:func:`split_gap`)."""
    idle_before: float | None = None
    """Seconds the device had nothing to run before this call (None: unknown, or the first call)."""
    idle_ended: float | None = None
    """When that gap ended (``time.monotonic``), if later than ``started``: a simulated call is booked on its device's
    timeline as its launch begins, after the stage took it."""
    skip_gap: bool = False
    """Its gap is not booked: work ran outside the stage just before it (a failed call evaluated again by the worker)."""
    _inputs_ready: Any = None  # torch.cuda.Event recorded on the submitter's stream
    _prev_end: Any = None  # on CUDA: the end event of the call launched before this one
    _start: Any = None
    _end: Any = None


def split_gap(idle_since: float, now: float, work_since: float | None) -> tuple[float, float]:
    """The device's idle gap ``idle_since .. now`` (``time.monotonic``) as (no_work, host) seconds: ``host`` from when
    the worker began holding a request without a break (``work_since``; None: it holds none), its host steps being
    the holdup; ``no_work`` before that, while it held none."""
    gap = max(0.0, now - idle_since)
    host = 0.0 if work_since is None else min(gap, max(0.0, now - max(idle_since, work_since)))
    return gap - host, host


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` as its OS name too (Linux, 15 bytes), so per-thread CPU time can be
    read from /proc (benchmarks.service_load.thread_cpu_s); a no-op elsewhere."""
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class _Task:
    """A function to run on the stage's thread (warm-up)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self, stream: Any) -> None:
        try:
            if stream is None:
                self.value = self.fn()
            else:
                with torch.cuda.stream(stream):
                    self.value = self.fn()
                stream.synchronize()
        except BaseException as err:  # noqa: BLE001 - raised on the caller's thread
            self.error = err
        self.done.set()


class DeviceStage:
    """Runs :class:`Call` s in order on a thread of its own (and, on CUDA, a stream of its own)."""

    def __init__(self, device: torch.device, depth: int = 2, name: str = "idg-device",
                 on_event: Callable[[str, int], None] | None = None, ahead: int = 2,
                 work_since: Callable[[], float | None] | None = None,
                 on_idle: Callable[[float, float], None] | None = None,
                 on_busy: Callable[[bool], None] | None = None) -> None:
        self.device = device
        self.on_event = on_event
        """Called with ("submitted" | "started" | "ended", call number) as each happens (tests); on an
        asynchronous device "started" is the launch."""
        self.work_since = work_since
        """Since when the submitter has held work without a break (``time.monotonic``; None: none now)."""
        self.on_idle = on_idle
        """Called with the (no_work, host) seconds of each idle gap as it ends, at the next call's launch."""
        self.on_busy = on_busy
        """Called with True when a call is launched while none is on the device, False when the last one there ends
        (:mod:`app.worker.device_time`: the device's busy time when several processes share it)."""
        self._last_end: float | None = None  # a call run here: when the last one ended (time.monotonic)
        self._last_cuda_end: Any = None  # on CUDA: the last launched call's end event
        self._skip_gap = False
        self._numbers = 0
        self.depth = max(1, depth)
        self.ahead = max(1, ahead)
        """Calls launched on an asynchronous device at once (the running one and those queued behind it)."""
        self._queue: queue.Queue[Call | _Task | None] = queue.Queue()
        self._launched: queue.Queue[Call | None] = queue.Queue()
        self._slots = threading.Semaphore(self.ahead)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._running: deque[Call] = deque()  # started (launched) and not ended, oldest first
        self._front_since = 0.0  # when the device went on to the oldest of them: its start, or the end of the one before
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ends = threading.Thread(target=self._end_loop, name=f"{name}-done"[:15], daemon=True)
        self._ends.start()
        self._thread.start()

    @property
    def in_flight(self) -> int:
        """Calls submitted and not yet waited for."""
        return self._in_flight

    @property
    def has_room(self) -> bool:
        return self._in_flight < self.depth

    def submit(self, call: Call) -> None:
        """Hand ``call`` over (from the worker thread, after its inputs were gathered there)."""
        if self._stream is not None:
            call._inputs_ready = torch.cuda.Event()
            call._inputs_ready.record()  # on the submitter's current stream
        with self._lock:
            self._in_flight += 1
            self._numbers += 1
            call.number = self._numbers
        self._event("submitted", call)
        self._queue.put(call)

    def _event(self, what: str, call: Call) -> None:
        if self.on_event is not None:
            self.on_event(what, call.number)

    def wait(self, call: Call, timeout: float | None = None) -> bool:
        """Wait until ``call`` ran (True) or ``timeout`` passed (False). Once it ran, its outputs are
        safe to use on the caller's current stream; the call no longer counts as in flight."""
        if not call.done.wait(timeout):
            return False
        with self._lock:
            self._in_flight -= 1
        if call._start is not None and call.out is not None:  # launched on the CUDA stream (a simulated stream's end is no CUDA event)
            current = torch.cuda.current_stream(self.device)
            current.wait_event(call._end)
            for t in call.out:
                if t is not None and t.is_cuda:
                    t.record_stream(current)
            call.device_seconds = call._start.elapsed_time(call._end) / 1000 if call._end.query() else call.device_seconds
            if call._prev_end is not None and call._end.query():  # the device's gap between the call before and this one
                call.idle_before = max(0.0, call._prev_end.elapsed_time(call._start) / 1000)
        self._book_idle(call)
        return True

    def run_here(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the stage's thread (and stream) and return its value or raise its error. Warm-up
        must run there: PyTorch keeps cuDNN's chosen plans per thread (a ``thread_local`` cache)."""
        task = _Task(fn)
        self._queue.put(task)
        task.done.wait()
        if task.error is not None:
            raise task.error
        value: T = task.value
        return value

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        """The launching thread: takes each call as the worker hands it over and runs it (or, on an
        asynchronous device, launches it behind the calls already there and leaves its end to ``_end_loop``)."""
        name_os_thread(self._thread.name)
        while True:
            item = self._queue.get()
            if item is None:
                self._launched.put(None)
                self._ends.join(timeout=10)
                return
            if isinstance(item, _Task):
                self._quiet()
                item.run(self._stream)
                continue
            self._slots.acquire()
            item.started = time.monotonic()
            with self._lock:
                went_busy = not self._running
                if went_busy:
                    self._front_since = item.started
                self._running.append(item)
            if went_busy and self.on_busy is not None:
                self.on_busy(True)
            item.work_since = self.work_since() if self.work_since is not None else None
            item.skip_gap, self._skip_gap = self._skip_gap, False
            self._event("started", item)
            began = time.perf_counter()
            launched = False
            try:
                launched = self._launch(item)
            except BaseException as err:  # noqa: BLE001 - handed to the worker, which isolates the failing request
                item.error = err
            if launched:
                self._launched.put(item)
            else:
                item.device_seconds = time.perf_counter() - began
                self._ended(item)

    def _quiet(self) -> None:
        """Wait until no launched call is on the device (before a warm-up task)."""
        for _ in range(self.ahead):
            self._slots.acquire()
        for _ in range(self.ahead):
            self._slots.release()

    def _end_loop(self) -> None:
        """The second thread: waits for each launched call's end, in order, and marks it done."""
        name_os_thread(self._ends.name)
        while True:
            call = self._launched.get()
            if call is None:
                return
            try:
                call._end.synchronize()  # this thread waits (GIL released); the next call is already on the device
            except BaseException as err:  # noqa: BLE001 - a kernel's error shows here: handed to the worker
                call.error, call.out = err, None
            self._ended(call)

    def skip_next_gap(self) -> None:
        """Do not book the gap before the next call launched: the device ran work outside the stage meanwhile (the
        worker's evaluation of a failed call's requests one by one), already counted as busy."""
        self._skip_gap = True

    def _book_idle(self, call: Call) -> None:
        """Book the device's idle gap before ``call`` (once it is known), split by what the worker held then. The gap is
        the device's own: between the CUDA events of the call before and this one, the simulated device's timeline, or
        the stage thread's calls; it ended when ``call`` was launched (``started``). The first call's is not counted."""
        if call.idle_before is None or call.started is None or call.number <= 1 or call.skip_gap:
            return
        ended = max(call.started, call.idle_ended or call.started)
        no_work, host = split_gap(ended - call.idle_before, ended, call.work_since)
        if self.on_idle is not None:
            self.on_idle(no_work, host)

    def on_device(self) -> tuple[Call, float] | None:
        """The call the device is on now (the oldest launched and not ended) and since when (``time.monotonic``), or None."""
        with self._lock:
            if not self._running:
                return None
            call = self._running[0]
            return call, max(call.started or 0.0, self._front_since)

    def _ended(self, call: Call) -> None:
        call.ended = time.monotonic()
        with self._lock:
            went_idle = call in self._running and len(self._running) == 1
            if call in self._running:
                self._running.remove(call)
            self._front_since = call.ended
        if went_idle and self.on_busy is not None:
            self.on_busy(False)
        self._event("ended", call)
        call.done.set()
        self._slots.release()

    def _launch(self, call: Call) -> bool:
        """Run ``call`` here (False), or launch it on an asynchronous device (True: ``_end_loop`` waits for it)."""
        p = call.prepared
        sim = getattr(call.model, "net", None)
        if isinstance(sim, SimulatedAccelerator) and sim.stream:
            before = sim.thread_busy_s  # this thread's own bookings: a call launched meanwhile on another is not this one's
            call.out = run_prepared(call.model, p)
            call._end, call.device_seconds, call.idle_before = sim.end_event(), sim.thread_busy_s - before, sim.idle_before
            call.idle_ended = sim.booked_at  # when the call was booked on the device's timeline (as its launch began)
            return True
        if self._stream is None:
            if self._last_end is not None and call.started is not None:
                call.idle_before = max(0.0, call.started - self._last_end)
            try:
                call.out = run_prepared(call.model, p)
            finally:
                self._last_end = time.monotonic()
            return False
        stream = self._stream
        with torch.cuda.stream(stream):
            stream.wait_event(call._inputs_ready)
            for t in (p.inputs, p.rows.targets, p.rows.is_prob):
                if t is not None:
                    t.record_stream(stream)
            # the end event blocks: its waiter (the end thread) sleeps until the call ends, where a default event's
            # synchronize spins a host core for the whole call (a core per server process, taken from decode and render)
            call._start, call._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True, blocking=True)
            call._start.record(stream)
            values, grads, logits = run_prepared(call.model, p, call.graphs)
            # what the plans read on the host (each row's value, the arg-max class, the logits of a prediction) copied
            # behind the call on this stream, so it is there once the end event is: the worker reads it without a wait
            # (a copy from the worker's own stream waited for every kernel the plans had queued there before it, which
            # queue behind the next call: the H200's worker profile)
            call.top1 = logits.argmax(1).to("cpu", non_blocking=True)
            call.out = (values.to("cpu", non_blocking=True), grads, logits.to("cpu", non_blocking=True) if call.host_logits else logits)
            call._end.record(stream)
            call._prev_end, self._last_cuda_end = self._last_cuda_end, call._end
        return True
