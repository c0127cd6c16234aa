"""Several processes share one simulated device (``IDG_SIMULATED_TIMELINE``, as server processes share a GPU):
calls launched in any of them never overlap on the device's timeline."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest
import torch
from torch import nn

from idg_core.models.simulated import SharedTimeline, SimulatedAccelerator

CALL_S = 0.004


def _book(path: Path, calls: int, out: multiprocessing.Queue, start: Barrier) -> None:  # type: ignore[type-arg]
    timeline = SharedTimeline(path)
    start.wait(timeout=60)  # both launch at once, each faster than the device runs
    out.put([timeline.book(CALL_S) for _ in range(calls)])


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
    _, other_end = other.book(0.5)  # another process's call holds the device for half a second
    sim = SimulatedAccelerator(nn.Identity(), call_ms=10, stream=True, timeline=path)
    x = torch.zeros(2, 3)
    assert torch.equal(sim(x), x)  # real outputs at once
    assert sim.free_at == pytest.approx(other_end + 0.010)  # its result: after the other's call, 10 ms later
    assert sim.busy_s == pytest.approx(0.010)  # its own time only: each process counts its calls


def test_a_shared_timeline_needs_a_stream(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stream"):
        SimulatedAccelerator(nn.Identity(), call_ms=10, stream=False, timeline=tmp_path / "device")
