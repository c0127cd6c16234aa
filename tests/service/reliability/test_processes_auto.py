"""``IDG_PROCESSES=auto`` (the default): one server process on the CPU; on CUDA a second, started once the first is
warm and only if the GPU's memory holds it (:mod:`app.core.processes`). The rules, and the launcher starting in stages
with stand-in processes that report a GPU's memory (:mod:`tests.service.reliability.fake_child`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from app.core.processes import (
    CONTEXT_BYTES,
    MEMORY_REPORT_DIR,
    DeviceMemory,
    auto_processes,
    processes_that_fit,
    read_memory_report,
    save_memory_report,
    write_memory_report,
)
from app.server import _auto
from tests.service.reliability.server_app import ROOT

GIB = 1 << 30


def test_auto_is_one_process_on_the_cpu_and_two_on_cuda_where_the_host_has_the_cores() -> None:
    assert auto_processes(cuda=False, cores=64)[0] == 1
    assert auto_processes(cuda=True, cores=16)[0] == 2
    assert auto_processes(cuda=True, cores=8)[0] == 2
    n, why = auto_processes(cuda=True, cores=4)
    assert n == 1 and "4 host cores" in why


def test_auto_on_this_machine_without_cuda_is_one_process_in_the_launchers_place() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _auto("cpu") == (1, False)
    assert _auto("auto") == (1, False)
    assert _auto("cuda") == (1, False)  # no CUDA: the one process says so as it loads its models


def test_the_gpu_holds_as_many_processes_as_its_free_memory_after_the_first_allows() -> None:
    # 4 GiB at its peak + the context: 5 GiB each; 80 GiB, 8 of them kept free
    assert processes_that_fit(DeviceMemory(4 * GIB, 70 * GIB, 80 * GIB), wanted=2)[0] == 2
    assert processes_that_fit(DeviceMemory(4 * GIB, 70 * GIB, 80 * GIB), wanted=16)[0] == 1 + (70 - 8) // 5
    assert processes_that_fit(DeviceMemory(4 * GIB, 13 * GIB, 80 * GIB), wanted=2)[0] == 2  # 13 - 8 = 5: exactly one more
    n, why = processes_that_fit(DeviceMemory(4 * GIB, 12 * GIB, 80 * GIB), wanted=2)  # 4 GiB spare: not one more
    assert n == 1 and "5.0 GiB" in why and "12.0 GiB free" in why
    assert processes_that_fit(DeviceMemory(4 * GIB, 2 * GIB, 80 * GIB), wanted=2)[0] == 1  # less free than kept free
    assert processes_that_fit(None, wanted=2)[0] == 1
    assert DeviceMemory(GIB, 0, 0).footprint == GIB + CONTEXT_BYTES


def test_a_memory_report_is_written_only_for_a_cuda_device_and_read_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_memory_report(tmp_path, os.getpid()) is None  # nothing written
    write_memory_report(torch.device("cpu"))  # no launcher asked: nothing
    monkeypatch.setenv(MEMORY_REPORT_DIR, str(tmp_path))
    write_memory_report(torch.device("cpu"))
    write_memory_report(None)  # an app without a service
    assert list(tmp_path.iterdir()) == []
    save_memory_report(DeviceMemory(3, 2, 1))
    assert read_memory_report(tmp_path, os.getpid()) == DeviceMemory(3, 2, 1)
    (tmp_path / f"device-memory-{os.getpid()}.json").write_text('{"peak_reserved": 3')  # garbled: as absent
    assert read_memory_report(tmp_path, os.getpid()) is None


def _launch(report: tuple[int, int, int] | None) -> subprocess.Popen[str]:
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
            "from app.core.processes import serve_processes; "
            f"sys.exit(serve_processes(('tests.service.reliability.fake_child:serve', ({report!r},)), 2, '127.0.0.1', 0, 1.0, "
            "False, staged=True))")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _until_decided(proc: subprocess.Popen[str], limit_s: float = 60) -> list[str]:
    """The launcher's log lines up to its decision."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if line.startswith("IDG_PROCESSES=auto: ") and "server process" in line and "up to" not in line:
            return lines
    raise AssertionError("the launcher never decided:\n" + "\n".join(lines))


def _stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out


@pytest.mark.parametrize(("report", "want"), [
    ((4 * GIB, 70 * GIB, 80 * GIB), 2),  # room for another
    ((4 * GIB, 12 * GIB, 80 * GIB), 1),  # none
    (None, 1),  # the first process reported nothing: its models are not on CUDA
])
def test_the_launcher_starts_the_others_once_the_first_is_ready_and_only_as_many_as_fit(
        report: tuple[int, int, int] | None, want: int) -> None:
    proc = _launch(report)
    try:
        lines = _until_decided(proc)
        started = [line for line in lines if re.match(r"server process \d+: pid \d+", line)]
        assert [s.split(":")[0] for s in started] == ["server process 0"], lines  # the first alone until it is ready
        assert lines[-1].startswith(f"IDG_PROCESSES=auto: {want} server process{'es' if want > 1 else ''}: ")
        time.sleep(0.5)  # the others, if any, start now
    finally:
        code, rest = _stop(proc)
    after = [line for line in rest.splitlines() if re.match(r"server process \d+: pid \d+", line)]
    assert len(after) == want - 1, rest
    assert f"stopping {want} server process(es)" in rest
    assert code == 0, rest
