"""Several server processes on one port (``IDG_PROCESSES``): more host per device.

One server process answers at most what its host side can prepare: HTTP, decode, render and the worker's
Python run under one GIL, milliseconds of CPU per attribution, so a process cannot feed a GPU that explains an image
faster than that (measured: docs/results/speed.md). With ``IDG_PROCESSES=N`` the launcher starts N server processes
on the port (spawned, as uvicorn's ``--workers`` does), each with a socket of its own there (``SO_REUSEPORT``), so
the kernel spreads new connections evenly over them. Each loads its own copy of the models onto the same device,
warms it and batches its own requests; the device runs their calls one after another. Of those started together the
first answers from the start (``/metrics`` and ``/health`` while they load, a JSON 503 for work); every other accepts
connections only once it is warm and the port is open (a process there is ready), so once ``/health/ready`` says 200 no
client meets a process still starting (on a GPU the second had listened first and answered 503 ``not_ready`` after the
first said ready). One started while another serves (a replacement, auto's extras) listens once it is warm. A process
waiting for the port has its models loaded and warm: its gRPC port (``IDG_GRPC_PORT``) and its jobs runner already
work, since they answer only what a ready process can.

The launcher (this module, in the parent process):

- gives the processes one metrics directory (``PROMETHEUS_MULTIPROC_DIR``), so ``/metrics`` answers the sum
  over all of them whichever process the scrape reaches (:func:`app.monitoring.prometheus.exposition`), and one
  simulated device's timeline (``IDG_SIMULATED_TIMELINE``, for benchmarks without a GPU);
- stops them on SIGTERM or Ctrl+C: each drains as one process does (``IDG_SHUTDOWN_GRACE_S``), and one still
  running at grace + :data:`STOP_MARGIN_S` is killed;
- starts another in place of one that dies after it was ready (a crash, the kernel's OOM killer), and stops
  them all with the exit code of one that failed before it was ready (a model that cannot load fails the
  same way every time: a loop of restarts would hide it);
- with ``IDG_PROCESSES=auto`` on CUDA (:func:`auto_processes`), starts one process, and the others only once it is
  warm and only as many as the device's memory holds (:func:`processes_that_fit`, from the first process's own
  :class:`DeviceMemory` report): each holds a copy of the models, their warm-up's activations and CUDA graphs.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from app.core.image_threads import PROCESSES_ON_HOST
from app.monitoring.prometheus import EXPECTED_PROCESSES, not_ready_yet

log = logging.getLogger("app.processes")

STOP_MARGIN_S = 6.0  # past the grace: a child's own watchdog exits at grace + 4.5 s
POLL_S = 0.2
CLEAN_EXITS = (0, -signal.SIGTERM, -signal.SIGINT)
"""A stopped child's exit codes: uvicorn raises the signal it handled again once it has shut down."""
Target = tuple[str, tuple[object, ...]]
"""What each server process runs: ``module:function`` and its first arguments, then the socket and the ready event.
A name, not a function, so the process says it is not ready before it imports the app (seconds: torch and the rest)."""


AUTO_CUDA_PROCESSES = 4
"""``IDG_PROCESSES=auto`` on CUDA: the most server processes per GPU. One process's host side (HTTP, decode, render, the
worker's Python under one GIL) caps it below what a GPU explains; four answered
most per GPU before the tail grew (processes per GPU: docs/results/speed.md). The host's cores
(:data:`AUTO_CORES_PER_PROCESS` each) and the GPU's memory (:func:`processes_that_fit`) may allow fewer."""
AUTO_CORES_PER_PROCESS = 4
"""Host cores a process needs to pay on CUDA: its event loop, worker and device threads, and the decode/render threads
(one per core it has: :mod:`app.core.image_threads`)."""
CONTEXT_BYTES = 1 << 30
"""What a CUDA process holds outside PyTorch's caching allocator (its context, cuDNN and cuBLAS handles): an estimate,
kept on the generous side."""
HEADROOM = 0.10
"""The share of the device's memory :func:`processes_that_fit` leaves free (fragmentation, a request's larger call)."""
MEMORY_REPORT_DIR = "IDG_MEMORY_REPORT_DIR"
"""The launcher's folder (its environment variable) where each server process writes its :class:`DeviceMemory` once ready."""


@dataclass(frozen=True)
class DeviceMemory:
    """What one server process holds on its GPU once its models are warm, and what the GPU has left then."""

    peak_reserved: int
    """PyTorch's caching allocator at its peak (``torch.cuda.max_memory_reserved``): the weights, the warm-up's largest
    call's activations and gradients (the largest a call can need: call sizes are fixed), the CUDA graphs' pools."""
    free: int
    total: int
    warmed: bool = True
    """Whether its models ran their largest call before ready (``IDG_WARMUP``): if not, ``peak_reserved`` is not the peak."""

    @property
    def footprint(self) -> int:
        """Device memory another process like this one takes."""
        return self.peak_reserved + CONTEXT_BYTES


def auto_processes(cuda: bool, cores: int) -> tuple[int, str]:
    """``IDG_PROCESSES=auto``: how many server processes to aim for, and why. One on the CPU, whose torch threads are
    the device and take every core already; on CUDA :data:`AUTO_CUDA_PROCESSES` where the host has
    :data:`AUTO_CORES_PER_PROCESS` cores for each (the device's memory decides later: :func:`processes_that_fit`)."""
    if not cuda:
        return 1, "the models run on the CPU, whose cores their torch threads already use"
    n = max(1, min(AUTO_CUDA_PROCESSES, cores // AUTO_CORES_PER_PROCESS))
    if n == 1:
        return 1, f"CUDA, but {cores} host cores: too few for a second process ({AUTO_CORES_PER_PROCESS} each)"
    return n, f"CUDA and {cores} host cores: more host per GPU than one process's GIL gives"


def host_cores(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> int:
    """The cores this process may use: its CPU affinity (``taskset``, a container's cpuset), and no more than a cgroup's
    CPU quota gives (``docker run --cpus``, a Kubernetes CPU limit, systemd's ``CPUQuota=``), where ``os.cpu_count()``
    counts the machine's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root, membership)
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return max(1, cores)


def cgroup_cpu_quota(root: Path, membership: Path) -> float | None:
    """The smallest CPU quota (in cores) over this process's cgroup and its parents, or None without one. cgroup v2:
    ``cpu.max`` ("max 100000", or "400000 100000" for 4 cores) in the process's own cgroup (``0::/path`` in
    ``/proc/self/cgroup``) and each parent up to the root (a container with a cgroup namespace sees its own as the root);
    cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none) in the cpu controller's hierarchy."""
    try:
        return _cgroup_cpu_quota(root, membership.read_text(errors="replace").splitlines())
    except (OSError, ValueError):  # an unreadable hierarchy (permissions, an odd mount): no quota known; start-up goes on
        return None


def _cgroup_cpu_quota(root: Path, lines: list[str]) -> float | None:
    quotas: list[float] = []
    files: list[tuple[Path, Path | None]]
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":  # v2
            folder = root / path.lstrip("/")
            files = [(d / "cpu.max", None) for d in [folder, *folder.parents] if d.is_relative_to(root)]
        elif "cpu" in controllers.split(","):  # v1: the controller's own mount, its path inside it
            mount = next((root / name for name in (controllers, "cpu,cpuacct", "cpu") if (root / name).is_dir()), None)
            if mount is None:
                continue
            folder = mount / path.lstrip("/")
            files = [(d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us") for d in [folder, *folder.parents] if d.is_relative_to(mount)]
        else:
            continue
        for first, second in files:
            try:
                if second is None:
                    limit, period = first.read_text().split()[:2]
                else:
                    limit, period = first.read_text().strip(), second.read_text().strip()
                if limit not in ("max", "-1") and int(period) > 0:
                    quotas.append(int(limit) / int(period))
            except (OSError, ValueError):  # absent at this level, or unreadable: no quota there
                continue
    return min(quotas) if quotas else None


def processes_that_fit(memory: DeviceMemory | None, wanted: int) -> tuple[int, str]:
    """How many of ``wanted`` server processes the GPU holds, given the first one's :class:`DeviceMemory` once warm
    (itself included), and why: each other process takes :attr:`DeviceMemory.footprint`, and :data:`HEADROOM` of the
    device stays free."""
    if memory is None:
        return 1, "the first process reported no GPU memory (its models are not on CUDA)"
    if not memory.warmed:
        return 1, "the first process did not warm its models up (IDG_WARMUP=false): what a process needs at its peak is unknown"
    spare = memory.free - HEADROOM * memory.total
    more = max(0, int(spare // memory.footprint))
    n = 1 + min(wanted - 1, more)
    gib = 1 << 30
    why = (f"each takes ~{memory.footprint / gib:.1f} GiB of the GPU's {memory.total / gib:.0f} GiB, "
           f"{memory.free / gib:.1f} GiB free after the first, {HEADROOM:.0%} kept free")
    return n, why


def write_memory_report(device: object, warmed: bool) -> None:
    """In a server process, once ready: its :class:`DeviceMemory` on ``device`` (a ``torch.device``) into the launcher's
    folder (:data:`MEMORY_REPORT_DIR`), named by its pid; nothing off CUDA or outside a launcher. ``warmed``: its models
    ran their calls' sizes before ready (``IDG_WARMUP``)."""
    import torch

    if not os.environ.get(MEMORY_REPORT_DIR) or not isinstance(device, torch.device) or device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    save_memory_report(DeviceMemory(torch.cuda.max_memory_reserved(device), free, total, warmed))


def save_memory_report(report: DeviceMemory) -> None:
    """Write this process's ``report`` where the launcher reads it (:func:`read_memory_report`), if it asked for one."""
    folder = os.environ.get(MEMORY_REPORT_DIR)
    if not folder:
        return
    path = Path(folder) / f"device-memory-{os.getpid()}.json"
    path.with_suffix(".tmp").write_text(json.dumps(asdict(report)))
    path.with_suffix(".tmp").replace(path)  # whole or absent: the launcher may read it at any time


def read_memory_report(folder: Path, pid: int | None) -> DeviceMemory | None:
    """The :class:`DeviceMemory` that process ``pid`` wrote (:func:`write_memory_report`), or None."""
    try:
        return DeviceMemory(**json.loads((folder / f"device-memory-{pid}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


@dataclass
class Child:
    index: int
    process: multiprocessing.process.BaseProcess
    ready: Event
    sock: socket.socket
    """Its listening socket on the port (its own: a replacement gets a new one)."""
    serves_early: bool = False
    """Whether it answers while it starts (the port's first); the others listen once warm and the port open."""


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a server process: be sent SIGTERM (and so drain and stop) when the launcher dies, even by SIGKILL, instead
    of serving on as an orphan that nothing supervises and that holds the port (Linux's ``PR_SET_PDEATHSIG``)."""
    parent = multiprocessing.parent_process()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the launcher's own stop is the only one
        log.debug("PR_SET_PDEATHSIG not available")
        return
    if parent is not None and parent.pid is not None and os.getppid() != parent.pid:  # it died before the call
        os.kill(os.getpid(), signal.SIGTERM)


SERVE_EARLY = "IDG_SERVE_EARLY"
"""Set by the launcher for each server process it starts: "1" for the one that answers while the port starts, "0" for
the others, which listen only once they are warm and the port is open (see ``Supervisor._start``)."""


def child_main(target: Target, sock: socket.socket, ready: Event, opened: Event) -> None:
    """A server process's first steps, before the app's imports: die with the launcher, say it is not ready (so
    ``idg_ready`` is 0 until it is), then run the target."""
    die_with_parent()
    not_ready_yet()
    spec, args = target
    module, _, name = spec.partition(":")
    getattr(importlib.import_module(module), name)(*args, sock, ready, opened)


def bind(host: str, port: int, count: int) -> list[socket.socket]:
    """One listening socket per server process, all on ``host:port`` with ``SO_REUSEPORT``: the kernel spreads new
    connections over them evenly (by a hash of each connection's addresses). One socket shared by all had let
    whichever process woke first accept a burst of connections at once (asyncio accepts up to its backlog per
    wake-up), so one process answered most clients and its clients waited longer (measured: docs/results/speed.md).
    A socket takes connections only once its process listens, that is once it is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]  # port 0: the others join the port the first was given
            sock.set_inheritable(True)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


class Supervisor:
    """Runs one process of :func:`child_main` per socket until a signal stops them (a new process on a new socket in
    place of one that died); closes the sockets at the end."""

    def __init__(self, target: Target, socks: list[socket.socket], grace_s: float, host: str, staged: Path | None = None) -> None:
        self.target = target
        self.staged = staged
        """``IDG_PROCESSES=auto``: the folder of the processes' memory reports; the first process starts alone, and as many
        others as the GPU holds once it is warm (:meth:`_grow`). None: all at once."""
        self.optional = staged is not None
        """``IDG_PROCESSES=auto``: the processes after the first are extras: one that fails to start (the memory estimate
        was wrong, another tenant took the GPU) is dropped and the others serve on, where a process that fails to start
        otherwise stops them all."""
        self.host = host
        self.count = len(socks)
        self.socks = socks
        self.grace_s = grace_s
        self.children: list[Child] = []
        self._stop = threading.Event()
        self._context = multiprocessing.get_context("spawn")
        self.opened = self._context.Event()
        """Set once the process that answers while the port starts (or its replacement) is ready: the port is open; the
        others, warm or not, listen only once it is set (so the port is ready when that process is, not the fastest)."""
        self.exit_code = 0

    def _start(self, index: int, sock: socket.socket) -> Child:
        # one process answers while the port starts (/metrics, /health: app.server.Server.startup); every other, and one
        # started while another serves (a replacement, auto's extras), listens only once warm and the port open, so no
        # client meets its start-up
        serving = any(c.process.is_alive() and (c.ready.is_set() or c.serves_early) for c in self.children)
        os.environ[SERVE_EARLY] = "0" if serving else "1"  # read by the spawned child
        ready = self._context.Event()
        process = self._context.Process(target=child_main, args=(self.target, sock, ready, self.opened), name=f"idg-server-{index}")
        process.start()
        log.info("server process %d: pid %s", index, process.pid)
        return Child(index, process, ready, sock, serves_early=not serving)

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._stop.set()

    def run(self) -> int:
        """Start the processes, keep them running until SIGTERM/SIGINT, stop them; the exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for i in range(1 if self.staged is not None else self.count):
                self.children.append(self._start(i, self.socks[i]))
            while not self._stop.wait(POLL_S):
                self._replace_dead()
                if self.staged is not None and not self._stop.is_set() and self.children[0].ready.is_set():
                    self._grow(self.staged)
            self._stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for sock in self.socks + [c.sock for c in self.children]:  # a replacement's socket is not in socks
                sock.close()
        return self.exit_code

    def _grow(self, folder: Path) -> None:
        """The first process is warm: start as many others as the GPU holds by its report (:func:`processes_that_fit`)
        and close the sockets of those that will not run."""
        self.staged = None
        n, why = processes_that_fit(read_memory_report(folder, self.children[0].process.pid), self.count)
        log.info("IDG_PROCESSES=auto: %d server process%s: %s", n, "" if n == 1 else "es", why)
        for sock in self.socks[n:]:
            sock.close()
        self.socks, self.count = self.socks[:n], n
        os.environ[EXPECTED_PROCESSES] = str(n)  # the others say so (idg_processes_expected is the maximum over them)
        self.children += [self._start(i, self.socks[i]) for i in range(1, n)]

    def _extra(self, child: Child) -> bool:
        """Auto's extra process (not the first) that never served: dropped when it fails, its exit code not the launcher's."""
        return self.optional and child.index > 0 and not child.ready.is_set()

    def _replace_dead(self) -> None:
        for i, child in reversed(list(enumerate(self.children))):  # from the last: a drop moves only those after it
            if child.process.is_alive():
                continue
            code = child.process.exitcode
            if child.process.pid is not None:
                mark_process_dead(child.process.pid)
            if self._extra(child):  # it does not fit after all
                log.warning("server process %d (pid %s) failed to start (exit code %s): serving with %d", child.index,
                            child.process.pid, code, len(self.children) - 1)
                child.sock.close()
                self.children.pop(i)
                continue
            if not child.ready.is_set():  # it never served: the next one would fail the same way
                log.error("server process %d (pid %s) failed to start (exit code %s): stopping the others",
                          child.index, child.process.pid, code)
                self.exit_code = code if code is not None and code > 0 else 1  # killed by a signal: 1
                self._stop.set()
                return
            log.warning("server process %d (pid %s) exited with code %s: starting another in its place",
                        child.index, child.process.pid, code)
            # its socket goes with it: the connections still waiting there are refused (they never reached a process)
            # rather than held for the replacement's start-up (a GPU model's: up to a minute); new ones go to the others
            port = child.sock.getsockname()[1]
            child.sock.close()
            try:
                sock = bind(self.host, port, 1)[0]
            except OSError as err:
                log.error("cannot listen on %s:%d again for a new server process: %s: stopping the others", self.host, port, err)
                self.exit_code = 1
                self._stop.set()
                return
            self.children[i] = self._start(child.index, sock)

    def _stop_all(self) -> None:
        alive = [c for c in self.children if c.process.is_alive()]
        log.info("stopping %d server process(es) (grace %g s)", len(alive), self.grace_s)
        for child in alive:
            if child.process.pid is not None:
                os.kill(child.process.pid, signal.SIGTERM)  # each drains as one server does
        deadline = time.monotonic() + self.grace_s + STOP_MARGIN_S
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            if child.process.is_alive():
                log.error("server process %d (pid %s) still running %g s after the signal: killed",
                          child.index, child.process.pid, self.grace_s + STOP_MARGIN_S)
                child.process.kill()
                child.process.join()
            code = child.process.exitcode
            if code not in CLEAN_EXITS and self._extra(child):
                log.warning("server process %d (pid %s) failed to start (exit code %s)", child.index, child.process.pid, code)
            elif code not in CLEAN_EXITS:
                log.warning("server process %d (pid %s) exited with code %s", child.index, child.process.pid, code)
                if not self.exit_code:
                    self.exit_code = code if code is not None and code > 0 else 1
            if child.process.pid is not None:
                mark_process_dead(child.process.pid)


def serve_processes(target: Target, count: int, host: str, port: int, grace_s: float, simulated: bool, staged: bool = False) -> int:
    """Bind ``host:port``, run ``count`` server processes on it until a signal; the exit code. ``staged``
    (``IDG_PROCESSES=auto``): at most ``count``, as many as the GPU holds once the first is warm."""
    run_dir = Path(tempfile.mkdtemp(prefix="idg-processes-"))
    try:
        (run_dir / "metrics").mkdir()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir / "metrics")  # read by prometheus_client in each child
        os.environ[PROCESSES_ON_HOST] = str(count)  # each sizes its image threads by its share of the cores
        os.environ[EXPECTED_PROCESSES] = str(1 if staged else count)  # idg_processes_expected; auto's grow says how many
        if staged:
            (run_dir / "memory").mkdir()
            os.environ[MEMORY_REPORT_DIR] = str(run_dir / "memory")
        if simulated:
            os.environ["IDG_SIMULATED_TIMELINE"] = str(run_dir / "simulated-device")
        try:
            socks = bind(host, port, count)
        except OSError as err:
            log.error("cannot listen on %s:%d: %s", host, port, err)
            return 1
        if staged:
            log.info("IDG_PROCESSES=auto: up to %d server processes on %s:%d, one device: the first, then the others once it "
                     "is warm, as many as the GPU's memory holds", count, host, socks[0].getsockname()[1])
        else:
            log.info("%d server processes on %s:%d, one device", count, host, socks[0].getsockname()[1])
        return Supervisor(target, socks, grace_s, host, run_dir / "memory" if staged else None).run()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
