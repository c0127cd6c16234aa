"""``IDG_PROCESSES=auto`` (the default): one server process on the CPU; on CUDA a second, started once the first is
warm and only if the GPU's memory holds it (:mod:`app.processes.launch`). The rules, and the launcher starting in stages
with stand-in processes that report a GPU's memory (:mod:`tests.service.reliability.fake_child`)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from app.processes.launch import (
    CONTEXT_BYTES,
    MEMORY_REPORT_DIR,
    Child,
    DeviceMemory,
    Supervisor,
    auto_processes,
    cgroup_cpu_quota,
    host_cores,
    processes_that_fit,
    read_memory_report,
    save_memory_report,
    write_memory_report,
)
from app.server import _auto
from benchmarks.service_load import auto_processes_logged
from tests.service.conftest import AppFactory, serve
from tests.service.reliability.server_app import ROOT

GIB = 1 << 30


def test_auto_is_one_process_on_the_cpu_and_up_to_four_on_cuda_where_the_host_has_the_cores() -> None:
    assert auto_processes(cuda=False, cores=64)[0] == 1
    assert auto_processes(cuda=True, cores=64)[0] == 4
    assert auto_processes(cuda=True, cores=16)[0] == 4
    assert auto_processes(cuda=True, cores=12)[0] == 3
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


async def test_a_ready_process_counts_itself_in_idg_ready_processes_until_it_drains_or_stops(tiny_app: AppFactory) -> None:
    from app.doors.drain import start_draining

    app = tiny_app()
    async with serve(app) as client:
        lines = (await client.get("/metrics")).text.splitlines()
        assert "idg_ready_processes 1.0" in lines and "idg_ready 1.0" in lines
        start_draining(app)
        lines = (await client.get("/metrics")).text.splitlines()
        assert "idg_ready_processes 0.0" in lines and "idg_ready 0.0" in lines
    app = tiny_app()
    async with serve(app):
        assert app.state.metrics.ready_processes._value.get() == 1
    assert app.state.metrics.ready_processes._value.get() == 0  # the lifespan ended: not ready


def test_a_process_that_did_not_warm_up_makes_no_room_for_another() -> None:
    n, why = processes_that_fit(DeviceMemory(GIB, 70 * GIB, 80 * GIB, warmed=False), wanted=2)
    assert n == 1 and "IDG_WARMUP=false" in why


def _cgroups(root: Path, membership: str, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "self-cgroup").write_text(membership)
    return root / "self-cgroup"


def test_host_cores_are_the_affinity_and_no_more_than_any_cgroup_quota_above_the_process(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert host_cores(tmp_path / "fs", tmp_path / "absent") == cpus  # no /proc/self/cgroup: the affinity
    # cgroup v2, a container's own namespace: its limit at the root ("--cpus=1")
    v2 = _cgroups(tmp_path / "a", "0::/\n", {"cpu.max": "100000 100000\n"})
    assert host_cores(tmp_path / "a", v2) == 1
    # cgroup v2 seen from the host: no quota at the root or the process's own cgroup, one on a parent (half a core: one)
    v2 = _cgroups(tmp_path / "b", "0::/system.slice/idg.service\n", {
        "cpu.max": "max 100000\n", "system.slice/cpu.max": "50000 100000\n", "system.slice/idg.service/cpu.max": "max 100000\n"})
    assert host_cores(tmp_path / "b", v2) == 1
    v2 = _cgroups(tmp_path / "c", "0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": f"{(cpus + 8) * 100000} 100000\n"})
    assert host_cores(tmp_path / "c", v2) == cpus  # a quota above the affinity
    # cgroup v1 (this project's VMs): the cpu controller's hierarchy; -1 is no quota
    v1 = "4:memory:/x\n1:cpu,cpuacct:/docker/abc\n"
    none = _cgroups(tmp_path / "d", v1, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n",
                                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert host_cores(tmp_path / "d", none) == cpus
    one = _cgroups(tmp_path / "e", v1, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000\n",
                                         "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert host_cores(tmp_path / "e", one) == 1


def test_the_smallest_cpu_quota_above_the_process_counts_in_either_cgroup_version(tmp_path: Path) -> None:
    # v2: the parent's 3 cores under the process's own 6, and the other way round
    v2 = _cgroups(tmp_path / "a", "0::/p/c\n", {"p/cpu.max": "300000 100000\n", "p/c/cpu.max": "600000 100000\n"})
    assert cgroup_cpu_quota(tmp_path / "a", v2) == 3
    v2 = _cgroups(tmp_path / "b", "0::/p/c\n", {"p/cpu.max": "600000 100000\n", "p/c/cpu.max": "250000 100000\n"})
    assert cgroup_cpu_quota(tmp_path / "b", v2) == 2.5
    # v1: a quota on the parent, the controllers listed the other way round from the mount's name
    v1 = _cgroups(tmp_path / "c", "3:cpuacct,cpu:/kube/pod/box\n", {
        "cpu,cpuacct/kube/cpu.cfs_quota_us": "200000\n", "cpu,cpuacct/kube/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/kube/pod/box/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/kube/pod/box/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(tmp_path / "c", v1) == 2
    # what start-up must survive: bytes that are not UTF-8, lines of no known shape
    odd = tmp_path / "odd"
    odd.write_bytes(b"0::/caf\xe9\n\x00\ngarbage\n7:cpu:\n")
    assert cgroup_cpu_quota(tmp_path / "d", odd) is None  # (undecodable bytes had raised at start-up)


def test_at_the_stop_an_extra_that_never_served_sets_no_exit_code_but_a_counted_process_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # the launcher's metrics folder (a dead process's files)
    context = multiprocessing.get_context("spawn")
    for optional, want in ((True, 0), (False, 1)):
        supervisor = Supervisor(("unused:unused", ()), [], 1.0, "127.0.0.1")
        supervisor.optional = optional
        failed = context.Process(target=sys.exit, args=(1,))  # it fails before it is ready
        failed.start()
        failed.join(30)
        supervisor.children = [Child(1, failed, context.Event(), socket.socket())]
        supervisor._stop_all()
        supervisor.children[0].sock.close()
        assert supervisor.exit_code == want


def test_a_memory_report_is_written_only_for_a_cuda_device_and_read_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_memory_report(tmp_path, os.getpid()) is None  # nothing written
    write_memory_report(torch.device("cpu"), warmed=True)  # no launcher asked: nothing
    monkeypatch.setenv(MEMORY_REPORT_DIR, str(tmp_path))
    write_memory_report(torch.device("cpu"), warmed=True)
    write_memory_report(None, warmed=True)  # an app without a service
    assert list(tmp_path.iterdir()) == []
    save_memory_report(DeviceMemory(3, 2, 1))
    assert read_memory_report(tmp_path, os.getpid()) == DeviceMemory(3, 2, 1)
    (tmp_path / f"device-memory-{os.getpid()}.json").write_text('{"peak_reserved": 3')  # garbled: as absent
    assert read_memory_report(tmp_path, os.getpid()) is None


class Launcher:
    """The launcher in a process of its own with ``count`` stand-in server processes (:func:`fake_child.serve`; in stages
    unless ``staged`` is False), its log read line by line as it comes."""

    def __init__(self, report: tuple[int, int, int] | None, marks: Path, count: int = 2, staged: bool = True,
                 fail: tuple[int, ...] = (), die_once: tuple[int, ...] = ()) -> None:
        self.marks = marks
        args = (report, fail, die_once, str(marks))
        code = ("import logging, sys; logging.basicConfig(level=logging.INFO, format='%(message)s'); "
                "from app.processes.launch import serve_processes; "
                f"sys.exit(serve_processes(('tests.service.reliability.fake_child:serve', {args!r}), {count}, "
                f"'127.0.0.1', 0, 1.0, False, staged={staged!r}))")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip())

    def until(self, done: str, limit_s: float = 60) -> list[str]:
        """The log's next lines, up to the first that starts with ``done``; an AssertionError after ``limit_s``."""
        seen: list[str] = []
        deadline = time.monotonic() + limit_s
        while not (seen and seen[-1].startswith(done)):
            try:
                seen.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no line starting {done!r} within {limit_s} s:\n" + "\n".join(seen)) from None
        return seen

    def sockets(self) -> dict[int, int]:
        """The inode of the socket each ready process (by pid) listens on."""
        return {int(f.name.split("-")[1]): int(f.read_text().split()[1]) for f in self.marks.glob("socket-*") if not f.suffix}

    def stop(self) -> tuple[int, list[str]]:
        """SIGTERM (unless it ended); its exit code and the lines it logged since the last :meth:`until`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        time.sleep(0.2)  # the reader's last lines
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get())
        return self.proc.returncode, rest


DECIDED = "IDG_PROCESSES=auto: "


@pytest.mark.parametrize(("report", "want"), [
    ((4 * GIB, 70 * GIB, 80 * GIB), 2),  # room for another
    ((4 * GIB, 12 * GIB, 80 * GIB), 1),  # none
    (None, 1),  # the first process reported nothing: its models are not on CUDA
])
def test_the_launcher_starts_the_others_once_the_first_is_ready_and_only_as_many_as_fit(
        report: tuple[int, int, int] | None, want: int, tmp_path: Path) -> None:
    launcher = Launcher(report, tmp_path)
    try:
        launcher.until(DECIDED + "up to")
        lines = launcher.until(DECIDED)
        started = [line for line in lines if re.match(r"server process \d+: pid \d+", line)]
        assert [s.split(":")[0] for s in started] == ["server process 0"], lines  # the first alone until it is ready
        assert lines[-1].startswith(f"{DECIDED}{want} server process{'es' if want > 1 else ''}: ")
        time.sleep(0.5)  # the others, if any, start now
    finally:
        code, rest = launcher.stop()
    after = [line for line in rest if re.match(r"server process \d+: pid \d+", line)]
    assert len(after) == want - 1, rest
    assert f"stopping {want} server process(es) (grace 1 s)" in rest
    assert code == 0, rest


def test_an_extra_process_that_fails_to_start_is_dropped_and_the_first_serves_on(tmp_path: Path) -> None:
    """The memory estimate said two fit, and the second fails as it loads (as one the GPU cannot hold after all): the
    launcher goes on with the first, where a process that fails to start otherwise stops them all."""
    launcher = Launcher((4 * GIB, 70 * GIB, 80 * GIB), tmp_path, fail=(1,))
    try:
        lines = launcher.until(DECIDED + "2 server processes")
        with tempfile.TemporaryFile() as log:  # what the load benchmark reads from a server's log: 2, then 1
            log.write("\n".join(lines).encode())
            log.flush()
            assert auto_processes_logged(log) == 2
            lines = launcher.until("server process 1 (pid")
            log.write("\n".join(["", *lines]).encode())
            log.flush()
            assert auto_processes_logged(log) == 1
        time.sleep(1.0)  # the launcher's polls: still serving
        assert launcher.proc.poll() is None
    finally:
        code, rest = launcher.stop()
    assert "stopping 1 server process(es) (grace 1 s)" in rest, rest
    assert code == 0, rest


def test_the_launcher_tells_each_process_how_many_share_the_host(tmp_path: Path) -> None:
    """Each server process sizes its image threads by its share of the host's cores (app.core.image_threads): the
    launcher's count reaches every one of them."""
    launcher = Launcher(None, tmp_path, staged=False, count=3)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("socket-*[0-9]"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        told = sorted(f.read_text().split()[2] for f in tmp_path.glob("socket-*") if not f.suffix)
    finally:
        code, _ = launcher.stop()
    assert told == ["3", "3", "3"]
    assert code == 0


def test_with_a_count_a_process_that_fails_to_start_stops_them_all(tmp_path: Path) -> None:
    """IDG_PROCESSES=2 (not auto): the second is not an extra; failing to start, it stops the launcher with its code."""
    launcher = Launcher(None, tmp_path, staged=False, fail=(1,))
    try:
        launcher.until("server process 1 (pid")
        launcher.proc.wait(timeout=30)
    finally:
        code, rest = launcher.stop()
    assert code == 1, rest


def test_after_a_dropped_extra_a_replacement_listens_on_a_socket_of_its_own(tmp_path: Path) -> None:
    """Three wanted, the second fails to start (dropped), the third dies after it served: its replacement gets a new
    socket on the port, not the first's, and the launcher goes on with two."""
    launcher = Launcher((GIB, 70 * GIB, 80 * GIB), tmp_path, count=3, fail=(1,), die_once=(2,))
    try:
        launcher.until(DECIDED + "3 server processes")
        launcher.until("server process 2 (pid")  # "... exited with code 3: starting another in its place"
        launcher.until("server process 2: pid")  # its replacement
        deadline = time.monotonic() + 30
        while len(launcher.sockets()) < 3 and time.monotonic() < deadline:  # the first, the one that died, its replacement
            time.sleep(0.1)
        inodes = launcher.sockets()
        assert len(inodes) == 3 and len(set(inodes.values())) == 3, inodes
        assert launcher.proc.poll() is None
    finally:
        code, rest = launcher.stop()
    assert "stopping 2 server process(es) (grace 1 s)" in rest, rest
    assert code == 0, rest
