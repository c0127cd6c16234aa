"""Several processes share one simulated device (``IDG_SIMULATED_TIMELINE``, as server processes share a GPU):
calls launched in any of them never overlap on the device's timeline."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
import torch
from torch import nn

from idg_serving.simulated import SharedTimeline, SimulatedAccelerator, Timeline

CALL_S = 0.004


def _book(path: Path, calls: int, out: multiprocessing.Queue, start: Barrier) -> None:  # type: ignore[type-arg]
    timeline = SharedTimeline(path)
    start.wait(timeout=60)  # both launch at once, each faster than the device runs
    out.put([timeline.book(CALL_S)[:2] for _ in range(calls)])


def test_two_processes_calls_never_overlap_and_fill_the_timeline_back_to_back(tmp_path: Path) -> None:
    path = tmp_path / "device"
    context = multiprocessing.get_context("spawn")
    out, start = context.Queue(), context.Barrier(2)
    procs = [context.Process(target=_book, args=(path, 40, out, start)) for _ in range(2)]
    for p in procs:
        p.start()
    spans = sorted(out.get(timeout=60) + out.get(timeout=60))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert len(spans) == 80
    for (_, end), (begin, _) in zip(spans, spans[1:], strict=False):
        assert begin >= end - 1e-9  # the next call begins once the one before it, from either process, ended
    # booked back to back as both launch faster than the device runs: the device is never idle in between
    assert spans[-1][1] - spans[0][0] == pytest.approx(80 * CALL_S, rel=0.05)


def test_a_simulated_device_on_a_shared_timeline_books_after_the_other_process_calls(tmp_path: Path) -> None:
    path = tmp_path / "device"
    other = SharedTimeline(path)
    other_end = other.book(0.5).ends  # another process's call holds the device for half a second
    sim = SimulatedAccelerator(nn.Identity(), call_ms=10, stream=True, timeline=path)
    x = torch.zeros(2, 3)
    assert torch.equal(sim(x), x)  # real outputs at once
    assert sim.free_at == pytest.approx(other_end + 0.010)  # its result: after the other's call, 10 ms later
    assert sim.busy_s == pytest.approx(0.010)  # its own time only: each process counts its calls


def test_a_shared_timeline_needs_a_stream(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stream"):
        SimulatedAccelerator(nn.Identity(), call_ms=10, stream=False, timeline=tmp_path / "device")


class _SlowLaunch(nn.Module):
    """A network whose forward takes ``seconds`` of the host's time (the launch of a call's kernels)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


def test_a_stream_call_begins_as_its_launch_begins_and_ends_no_earlier_than_the_launch() -> None:
    # as on a GPU, the device runs a call's first kernels while the host still launches the rest: a call launched on a
    # free device begins then (not after the host's 30 ms), and one launched behind it begins when the first one ends
    sim = SimulatedAccelerator(_SlowLaunch(0.030), call_ms=50, stream=True)
    x = torch.zeros(1, 3)
    t0 = time.perf_counter()
    sim(x)
    first = sim.end_event()
    assert first.at == pytest.approx(t0 + 0.050, abs=0.010)  # not t0 + 30 ms of launch + 50 ms
    sim(x)  # launched at ~t0 + 30 ms, while the first call still runs
    second = sim.end_event()
    assert second.at == pytest.approx(first.at + 0.050, abs=1e-6)  # back to back: no gap for the host's launch
    # a launch longer than the call: its result is not ready before the host finished launching it
    slow = SimulatedAccelerator(_SlowLaunch(0.040), call_ms=5, stream=True)
    slow(x)
    launched = time.perf_counter()
    assert slow.end_event().at >= launched - 1e-3
    assert slow.free_at is not None and slow.free_at < launched  # the device's own time ended before: a gap for the host


def test_each_thread_reads_the_end_and_time_of_its_own_launch() -> None:
    # the device stage reads a call's end, device time and preceding gap right after launching it; the worker may launch
    # another call on the same model from its own thread meanwhile (a failed call's requests evaluated again): as with
    # a CUDA event recorded after each launch, each thread must read its own call's booking, not the other's
    sim = SimulatedAccelerator(nn.Identity(), call_ms=40, stream=True)
    x = torch.zeros(1, 3)
    launched, other_done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def other() -> None:
        launched.wait(timeout=10)
        sim(x)  # booked behind the first thread's call: ends ~40 ms after it
        seen["other"] = (sim.end_event().at, sim.thread_busy_s, sim.idle_before)
        other_done.set()

    thread = threading.Thread(target=other)
    thread.start()
    before = sim.thread_busy_s
    sim(x)
    launched.set()
    other_done.wait(timeout=10)
    mine = (sim.end_event().at, sim.thread_busy_s - before, sim.idle_before)
    thread.join(timeout=10)
    other_end, other_busy, other_idle = seen["other"]  # type: ignore[misc]
    assert other_end == pytest.approx(mine[0] + 0.040, abs=1e-6)  # back to back on the one device
    assert mine[1] == pytest.approx(0.040) and other_busy == pytest.approx(0.040)  # each its own call's time
    assert sim.busy_s == pytest.approx(0.080)  # the device's total counts both
    assert mine[2] is None and other_idle == 0.0  # the first call began the device's work; the second waited for none


def test_threads_booking_one_timeline_never_overlap_and_each_reads_its_own_gap() -> None:
    # the models of one process share one Timeline (one device) but each has its own lock: the timeline's own lock
    # keeps two threads' bookings from both reading the same free time (found by review: 5 in 40,000 launches read
    # the other thread's gap when the gap was read after the booking from the timeline's shared attribute)
    timeline = Timeline()
    spans: list[list[tuple[float, float, float | None]]] = [[], []]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        threads = [threading.Thread(target=lambda out=out: out.extend(timeline.book(1e-6) for _ in range(3000))) for out in spans]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        sys.setswitchinterval(previous)
    booked = sorted(spans[0] + spans[1])
    assert len(booked) == 6000
    for (_, end, _), (begin, _, gap) in zip(booked, booked[1:], strict=False):
        assert begin >= end - 1e-12  # never two calls at once on the device
        assert gap is not None and gap == pytest.approx(begin - end, abs=1e-9)  # the gap before a call is the one it saw
