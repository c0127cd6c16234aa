"""The device's own busy and idle time when several server processes share it (:mod:`app.worker.device_time`): real
processes mark their calls in one file, and the device reads busy for the union of their calls, not the sum."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from app.worker.device_time import SharedDeviceTime, read_all


def _busy_between(folder: Path, spans: list[tuple[float, float]], ready: Event, t0: Synchronized[float],
                  marked: Queue[list[float]] | None = None) -> None:
    """A process that holds requests, says it is ready, and has a call on the device for each span (start, end) of
    seconds after ``t0`` (``time.monotonic``, set by the test once every process is ready). With ``marked``, it sends
    back when it really marked each call's start and end and its holding's end (a busy machine wakes it late)."""
    marks = SharedDeviceTime.of(folder, "cuda:0")
    marks.holds(True)
    ready.set()
    while t0.value == 0.0:
        time.sleep(0.001)
    times: list[float] = []
    for start, end in spans:
        time.sleep(max(0.0, t0.value + start - time.monotonic()))
        marks.call(True)
        times.append(time.monotonic())
        time.sleep(max(0.0, t0.value + end - time.monotonic()))
        marks.call(False)
        times.append(time.monotonic())
    marks.holds(False)
    if marked is not None:
        marked.put([*times, time.monotonic()])


def _union(spans: list[tuple[float, float]], within: tuple[float, float] = (-math.inf, math.inf)) -> float:
    """Seconds covered by any of ``spans``, clipped to ``within``."""
    total, reach = 0.0, -math.inf
    for start, end in sorted((max(a, within[0]), min(b, within[1])) for a, b in spans):
        if end > max(start, reach):
            total += end - max(start, reach)
            reach = end
    return total


def test_two_processes_busy_the_same_second_read_one_second_and_staggered_calls_their_union(tmp_path: Path) -> None:
    """Both processes busy over the same second, then staggered (1.8-2.4 and 2.2-2.8 s: the union 1.8-2.8): the device
    reads the union of their calls, not the sum. The reference is when each process really marked its calls (on a busy
    2-core machine they wake late: the planned 2.0 s of the union had read 1.87 s, rightly)."""
    context = multiprocessing.get_context("spawn")
    t0 = context.Value("d", 0.0)
    spans = [[(0.0, 1.0), (1.8, 2.4)], [(0.0, 1.0), (2.2, 2.8)]]
    events = [context.Event() for _ in spans]
    marked: Queue[list[float]] = context.Queue()
    procs = [context.Process(target=_busy_between, args=(tmp_path, s, e, t0, marked)) for s, e in zip(spans, events, strict=True)]
    for p in procs:
        p.start()
    assert all(e.wait(60) for e in events)
    reader = SharedDeviceTime.of(tmp_path, "cuda:0")
    read_before = time.monotonic()
    before = reader.seconds()
    t0.value = time.monotonic() + 0.1
    time.sleep(max(0.0, t0.value + 1.3 - time.monotonic()))
    read_first = time.monotonic()
    first = reader.seconds()
    times = [marked.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    after = read_all(tmp_path)["cuda_0"]
    calls = [(t[i], t[i + 1]) for t in times for i in range(0, len(t) - 1, 2)]
    union, summed = _union(calls), sum(b - a for a, b in calls)
    assert summed - union > 0.8  # the first second overlapped (a sum would read it twice)
    tolerance = 0.05  # a mark's own time against the process's clock read beside it
    assert abs(first["busy"] - before["busy"] - _union(calls, (read_before, read_first))) <= tolerance, (before, first, calls)
    assert abs(after["busy"] - before["busy"] - union) <= tolerance, (before, after, calls)
    # before the first call and between the calls the device waited for a host (both held requests all along, one
    # until the last call's end), not for work
    host = max(t[-1] for t in times) - read_before - union
    assert abs(after["host"] - before["host"] - host) <= 2 * tolerance, (before, after, host)


def test_the_state_running_now_is_read_and_a_dead_process_stops_counting(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    t0 = context.Value("d", time.monotonic())
    wedged = context.Process(target=_busy_between, args=(tmp_path, [(0.0, 3600.0)], go, t0))
    wedged.start()
    try:
        assert go.wait(60)
        reader = SharedDeviceTime.of(tmp_path, "cuda:0")
        deadline = time.monotonic() + 10
        while reader.seconds()["busy"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        first = reader.seconds()["busy"]
        time.sleep(0.5)
        assert 0.45 <= reader.seconds()["busy"] - first <= 0.6  # a stalled call reads busy while it lasts
    finally:
        assert wedged.pid is not None
        os.kill(wedged.pid, signal.SIGKILL)
        wedged.join(timeout=10)
    killed = reader.seconds()
    time.sleep(0.3)
    later = reader.seconds()
    assert later["busy"] == pytest.approx(killed["busy"])  # its call ended with it
    assert later["no_work"] - killed["no_work"] >= 0.25  # and nobody holds requests: idle for want of work


def test_one_process_marks_nothing_and_reads_its_own_counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import generate_latest

    from app.monitoring.prometheus import Metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = Metrics()
    assert metrics.device_marks("cuda:0") is None
    metrics.book_busy(1.5)
    metrics.book_idle(0.25, 0.5)
    text = generate_latest(metrics.registry).decode()
    assert "idg_device_busy_seconds_total 1.5" in text and "idg_process_device_busy_seconds_total 1.5" in text
    assert 'idg_device_idle_seconds_total{cause="host"} 0.5' in text
