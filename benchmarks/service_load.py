"""The service under load: N concurrent clients against a real uvicorn process on loopback."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np

from benchmarks.raw_http import Connection, multipart_post

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """A real server process with ``env``, once ready: within 150 s, or 900 s with ``IDG_COMPILE``,
    whose graphs compile before readiness (minutes for a large network on CUDA). With ``IDG_PROCESSES`` > 1, once
    that many processes answered ready (``X-IDG-Replica``), so no level begins while one still loads; with
    ``IDG_PROCESSES=auto`` (the default), as many as the server's log says it runs."""
    server_env = {**os.environ, **env}
    wanted = server_env.get("IDG_PROCESSES", "auto")
    try:
        fixed: int | None = int(float(wanted))  # as pydantic reads it: " 2", "2.0"
    except ValueError:  # auto: what the server logs, read again at each probe (an extra may be dropped after the decision)
        fixed = None
    ready: set[str] = set()
    ready_within_s = 900.0 if env.get("IDG_COMPILE", "").lower() == "true" else float(os.environ.get("IDG_BENCH_READY_S", "150"))
    port = _free_port()
    # a pipe nobody reads would fill and stall the server; the server keeps writing to its own copy
    # of the descriptor after this function closes ours
    with tempfile.TemporaryFile() as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.server", "--host", "127.0.0.1", "--port", str(port)],
            env=server_env, stdout=subprocess.DEVNULL, stderr=log_file,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_within_s
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"{url}/health/ready", timeout=1)
                if r.status_code == 200:
                    ready.add(r.headers.get("x-idg-replica", ""))
                    processes = fixed if fixed is not None else auto_processes_logged(log_file)
                    if processes is not None and len(ready) >= processes:
                        return proc, url
                    continue  # a new connection at once: the next may reach another process
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                log_file.seek(0)
                tail = log_file.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"the server exited during start-up:\n{tail}")
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server was not ready within {ready_within_s:.0f} s")


def auto_processes_logged(log_file: IO[bytes]) -> int | None:
    """The server processes an ``IDG_PROCESSES=auto`` server said it runs (its log: the decision, then "serving with N"
    for each extra that failed to start), or None before it said. Read without moving the file's offset, which the
    server's own writes share."""
    said = re.findall(rb"IDG_PROCESSES=auto: (\d+) server process|failed to start \(exit code [^)]*\): serving with (\d+)",
                      os.pread(log_file.fileno(), 1 << 20, 0))
    return int(said[-1][0] or said[-1][1]) if said else None


def _histogram(text: str, name: str) -> dict[str, float]:
    out = {}
    for le, value in re.findall(rf'{name}_bucket{{le="([^"]+)"}} ([0-9.e+]+)', text):
        out[le] = float(value)
    out["count"] = float(re.search(rf"{name}_count ([0-9.e+]+)", text).group(1))  # type: ignore[union-attr]
    out["sum"] = float(re.search(rf"{name}_sum ([0-9.e+]+)", text).group(1))  # type: ignore[union-attr]
    return out


def _counter(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def server_pids(pid: int) -> list[int]:
    """The server's process and, when it is the launcher of several (``IDG_PROCESSES``), its server processes."""
    family = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            family += [int(c) for c in (task / "children").read_text().split()]
    except (OSError, ValueError):
        pass
    return family


def _cpu_s(stat: Path) -> float:
    """CPU seconds (user + system) from a ``/proc`` ``stat`` file, of a process or of one of its threads."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_cpu_s(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user + system) the server's processes (:func:`server_pids`) have used in all their threads,
    and in their main threads, which run the event loops (HTTP, routing, the answer's JSON); None off Linux. The
    rest is the worker threads' and the decode/render threads'."""
    try:
        pids = server_pids(pid)
        return sum(_cpu_s(Path(f"/proc/{p}/stat")) for p in pids), sum(_cpu_s(Path(f"/proc/{p}/task/{p}/stat")) for p in pids)
    except (OSError, ValueError, IndexError):
        return None


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of the server's threads by OS thread name, over its processes (the worker and device threads name
    themselves ``idg-worker`` / ``idg-device``; a main thread is an event loop; the rest: decode, render, HTTP)."""
    out: dict[str, float] = {}
    try:
        for p in server_pids(pid):
            for task in Path(f"/proc/{p}/task").iterdir():
                name = "event loop" if task.name == str(p) else (task / "comm").read_text().strip()
                name = name if name.startswith("idg-") else ("event loop" if name == "event loop" else "other threads")
                out[name] = out.get(name, 0.0) + _cpu_s(task / "stat")
    except (OSError, ValueError, IndexError):
        return {}
    return out


def machine_cpu() -> tuple[float, float] | None:
    """The machine's busy and total CPU seconds so far, over all its cores (``/proc/stat``); None off Linux."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


def _by_label(text: str, name: str, label: str) -> dict[str, float]:
    """A metric by the values of one of its labels, summed over the others."""
    out: dict[str, float] = {}
    for labels, v in re.findall(rf"^{name}{{([^}}]*)}} ([0-9.e+-]+)$", text, re.M):
        found = re.search(rf'\b{label}="([^"]*)"', labels)
        if found:
            out[found.group(1)] = out.get(found.group(1), 0.0) + float(v)
    return out


def _idle(text: str) -> dict[str, float]:
    """``idg_device_idle_seconds_total`` by cause (summed over server processes)."""
    return _by_label(text, "idg_device_idle_seconds_total", "cause")


def _labelled(text: str, name: str) -> float:
    """A metric summed over its labels."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


async def _client(conn: Connection, requests: list[bytes], n: int, lat: list[float], codes: list[int]) -> None:
    """One client: ``n`` requests one after another on its connection, cycling through ``requests``."""
    try:
        for i in range(n):
            started = time.perf_counter()
            answer = await conn.send(requests[i % len(requests)])
            codes.append(answer.status)
            if answer.status == 200:
                lat.append(time.perf_counter() - started)
                found = {k.decode(): float(v) for k, v in _TIMING.findall(answer.body)}
                if "total_ms" in found:  # the server's own time (from its reading the body to its answer), beside the client's
                    SERVER_MS.append((found["total_ms"], answer.headers.get("x-idg-replica", ""), found))
    finally:
        conn.close()


def prepare_requests(url: str, images: list[Path], fields: dict[str, str]) -> list[bytes]:
    """Each image's ``POST /attribute`` as bytes (:mod:`benchmarks.raw_http`), encoded before a level's counters are
    read: preparing is not traffic."""
    return [multipart_post(url, "/attribute", fields, img.name, img.read_bytes()) for img in images]


async def _run_clients(url: str, requests: list[bytes], first: int, clients: int, per_client: int) -> Share:
    """Clients ``first .. first + clients - 1``, client ``c`` starting at request ``c``: what they measured, the span
    from the first request sent to the last answer read (monotonic), and this process's CPU meanwhile."""
    lat: list[float] = []
    codes: list[int] = []
    cpu = time.process_time()
    SERVER_MS.clear()
    conns = [Connection(url) for _ in range(clients)]
    began = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    await asyncio.gather(*[_client(conns[c - first], requests[c:] + requests[:c], per_client, lat, codes)
                           for c in range(first, first + clients)])
    return lat, codes, time.process_time() - cpu, list(SERVER_MS), (began, time.monotonic())


_TIMING = re.compile(rb'"(queued_ms|compute_ms|render_ms|total_ms)":\s*([0-9.]+)')
SERVER_MS: list[tuple[float, str, dict[str, float]]] = []
"""The server-side ``timings.total_ms`` of the answers this process received, the server process that answered
(``X-IDG-Replica``) and all of the answer's ``timings``; a load level reads and clears it."""


def server_time_split(answered: list[tuple[float, str, dict[str, float]]]) -> dict[str, float] | None:
    """Where the server's time per answer went, the mean in ms over the answers: ``intake`` (the total less the rest:
    decoding, checks, the plan, and the event loop's resuming the request once the worker finished it; the answer's
    JSON comes after ``total_ms``), ``queued`` (admitted, before the worker took it), ``worker`` (its rounds on the
    device and the host steps between them) and ``render`` (its PNGs)."""
    timings = [t for _, _, t in answered if {"queued_ms", "compute_ms", "total_ms"} <= t.keys()]
    if not timings:
        return None
    mean = {k: float(np.mean([t.get(k, 0.0) for t in timings])) for k in ("queued_ms", "compute_ms", "render_ms", "total_ms")}
    return {"intake": mean["total_ms"] - mean["queued_ms"] - mean["compute_ms"] - mean["render_ms"], "queued": mean["queued_ms"],
            "worker": mean["compute_ms"], "render": mean["render_ms"]}


Share = tuple[list[float], list[int], float, list[tuple[float, str, dict[str, float]]], tuple[float, float]]
"""What a group of clients measured: latencies, status codes, client CPU seconds, the server's own times, and
the span (monotonic start, end) in which they sent and received, on the clock every process shares."""


def _client_share(url: str, requests: list[bytes], first: int, clients: int, per_client: int) -> Share:
    """Clients ``first .. first + clients - 1`` in this process (one of several). Its span starts after the process
    has started and imported what it needs, so a level's wall time is the traffic's, not the processes' start-up."""
    return asyncio.run(_run_clients(url, requests, first, clients, per_client))


def _started(_: int) -> int:
    """A task that only makes a client process start and import this module."""
    time.sleep(0.2)  # each of the first tasks holds its process a moment, so every process gets one
    return os.getpid()


def client_pool(processes: int) -> ProcessPoolExecutor | None:
    """The load generator's processes, started and with this module imported (seconds each), before a level's counters
    are read: while they start the device idles, and that idle time is no part of the level. None for one process."""
    if processes <= 1:
        return None
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_started, range(processes)))
    return pool


async def _clients(url: str, requests: list[bytes], clients: int, per_client: int, pool: ProcessPoolExecutor | None,
                   processes: int) -> Share:
    """Run the clients in ``processes`` processes (a load generator must not be what it measures: one Python process
    with httpx topped out near 100 requests/s of uploads and JSON answers; :mod:`benchmarks.raw_http` costs less). The
    span runs from the first process's first request to the last one's last answer: spawning the processes (seconds each: they import
    the benchmark's modules) is left out, or it would dilute the throughput and the device-busy fraction."""
    if pool is None:
        return await _run_clients(url, requests, 0, clients, per_client)
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    starts = [sum(shares[:i]) for i in range(processes)]
    loop = asyncio.get_running_loop()
    parts = await asyncio.gather(*[loop.run_in_executor(pool, _client_share, url, requests, a, n, per_client)
                                   for a, n in zip(starts, shares, strict=True) if n])
    span = (min(p[4][0] for p in parts), max(p[4][1] for p in parts))
    return ([x for p in parts for x in p[0]], [x for p in parts for x in p[1]], sum(p[2] for p in parts),
            [x for p in parts for x in p[3]], span)


async def load_level(
    url: str, images: list[Path], clients: int, per_client: int, fields: dict[str, str], pid: int | None = None,
    client_processes: int = 1, prime: bool = True,
) -> dict[str, Any]:
    """One load level; with the server's ``pid``, also its host CPU per attribution (:func:`host_cpu_s`). ``prime``:
    one /predict first (not counted), so the device's idle time before the level is booked before it begins."""
    # A device gap is booked when the call that ends it is launched: one small call now books the pause since the last
    # level (its scrape, the clients' set-up) before the snapshot, so this level's idle time is its own.
    requests = prepare_requests(url, images, fields)
    pool = client_pool(client_processes)
    try:
        if prime:
            httpx.post(f"{url}/predict", files={"file": (images[0].name, images[0].read_bytes())}, timeout=600)
        cpu_before = None if pid is None else host_cpu_s(pid)
        threads_before = {} if pid is None else thread_cpu_s(pid)
        text = httpx.get(f"{url}/metrics").text
        before, busy_before = _histogram(text, "idg_batch_images"), _counter(text, "idg_device_busy_seconds_total")
        idle_before = _idle(text)
        rows_before = _rows(text)
        dmon = SmMonitor()
        machine_before = machine_cpu()
        lat, codes, client_cpu, answered, (began, ended) = await _clients(url, requests, clients, per_client, pool,
                                                                          client_processes)
    finally:
        if pool is not None:
            pool.shutdown()
    server_ms = [ms for ms, _, _ in answered]
    by_process = Counter(who for _, who, _ in answered)
    wall = ended - began
    machine_after = machine_cpu()
    sm = dmon.stop()
    text = httpx.get(f"{url}/metrics").text
    after, busy = _histogram(text, "idg_batch_images"), _counter(text, "idg_device_busy_seconds_total") - busy_before
    rows_after = _rows(text)
    idle = {cause: v - idle_before.get(cause, 0.0) for cause, v in _idle(text).items()}
    real, padding = rows_after[0] - rows_before[0], rows_after[1] - rows_before[1]
    calls = after["count"] - before["count"]
    cpu_after = None if pid is None else host_cpu_s(pid)
    threads_after = {} if pid is None else thread_cpu_s(pid)
    ok = codes.count(200)
    host: dict[str, Any] = {}
    if threads_after and ok:
        host["cpu_ms_per_attr_by_thread"] = {k: round(1000 * (v - threads_before.get(k, 0.0)) / ok, 2) for k, v in threads_after.items()}
    if machine_before is not None and machine_after is not None and machine_after[1] > machine_before[1]:
        # the whole machine (server, load generator, kernel): near 1, the cores are the limit, not one process's GIL
        host["machine_cpu_busy"] = (machine_after[0] - machine_before[0]) / (machine_after[1] - machine_before[1])
        host["machine_cores"] = os.cpu_count()
    if cpu_before is not None and cpu_after is not None and ok:
        host |= {"host_cpu_ms_per_attr": 1000 * (cpu_after[0] - cpu_before[0]) / ok,
                 "event_loop_cpu_ms_per_attr": 1000 * (cpu_after[1] - cpu_before[1]) / ok}
    return {
        "clients": clients, "requests": len(codes), "ok": codes.count(200), "rejected_503": codes.count(503),
        "other_errors": len(codes) - codes.count(200) - codes.count(503),
        "p50_s": float(np.percentile(lat, 50)) if lat else None, "p95_s": float(np.percentile(lat, 95)) if lat else None,
        "p99_s": float(np.percentile(lat, 99)) if lat else None, "throughput_per_s": codes.count(200) / wall,
        "model_calls": int(calls), "mean_images_per_call": (after["sum"] - before["sum"]) / calls if calls else None,
        "wall_s": wall, "device_busy_fraction": busy / wall,
        # the device's idle time by what it waited for: requests (no_work) or this process's worker (host)
        "device_idle_fraction": {cause: v / wall for cause, v in idle.items()} or None,
        "server_ms_split": server_time_split(answered), "padded_per_real_row": padding / real if real else None,
        "unwarmed_calls": _labelled(text, "idg_unwarmed_calls"), "client_processes": client_processes,
        "client_cpu_ms_per_request": 1000 * client_cpu / len(codes) if codes else None,
        "server_p50_s": float(np.percentile(server_ms, 50)) / 1000 if server_ms else None,
        "server_p99_s": float(np.percentile(server_ms, 99)) / 1000 if server_ms else None, "gpu_sm_util_mean": sm, **host,
        # with several server processes: each one's share of the answers, largest first (the kernel's spread)
        "answer_shares": sorted((n / len(answered) for n in by_process.values()), reverse=True) if len(by_process) > 1 else None,
    }


def _rows(text: str) -> tuple[float, float]:
    """Real and padding rows of model calls so far (``idg_call_rows_total``), all models."""
    rows = _by_label(text, "idg_call_rows_total", "kind")
    return rows.get("real", 0.0), rows.get("padding", 0.0)


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the server's threads (all its processes), raw stacks into ``out``; None without py-spy. By default
    while they hold the GIL (what serialises the host); ``IDG_BENCH_PROFILE=idle`` waits too, ``cpu`` every running thread."""
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        log.warning("py-spy not found: no GIL profile")
        return None
    try:
        # idle: where threads wait, too; cpu: every thread while it runs, with or without the GIL (where the cores go)
        modes = {"idle": ["--idle"], "cpu": []}.get(os.environ.get("IDG_BENCH_PROFILE", ""), ["--gil"])
        return subprocess.Popen([exe, "record", "-p", str(pid), "-o", str(out), "-f", "raw", *modes,
                                 "--threads", "--subprocesses", "-r", "200", "-d", "600", "--nonblocking"], stdout=subprocess.DEVNULL)
    except OSError:
        return None


def gil_profile_summary(raw: Path, top: int = 8) -> list[str]:
    """The threads (by name, summed over the server's processes) and their leaf functions with the most samples, from
    py-spy's raw output: who held the GIL most under ``--gil``, where the CPU went without it."""
    by_thread: Counter[str] = Counter()
    leaves: dict[str, Counter[str]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        # --subprocesses: the launcher's process, the server process's (its command line may hold ";"), then the thread
        at = next((i for i, frame in enumerate(frames) if frame.startswith("thread (")), 0)
        frames = frames[at:]
        thread = frames[0].split(": ", 1)[-1]
        by_thread[thread] += int(count)
        leaves.setdefault(thread, Counter())[frames[-1]] += int(count)
    total = sum(by_thread.values()) or 1
    lines = []
    for thread, n in by_thread.most_common(6):
        lines.append(f"{thread}: {n / total:.0%} of samples; " + ", ".join(
            f"{leaf.split(' (')[0]} {m / total:.1%}" for leaf, m in leaves[thread].most_common(top)))
    return lines


class SmMonitor:
    """``nvidia-smi dmon -s u`` in the background while a load level runs: the GPU's SM utilisation as the
    driver samples it (each second), beside the service's own device-busy counter. None without nvidia-smi."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop(), after the level
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                ["nvidia-smi", "dmon", "-s", "u", "-d", "1"], stdout=self._file, stderr=subprocess.DEVNULL)
        except OSError:
            self._proc = None

    def stop(self) -> float | None:
        """Mean SM utilisation (percent) over the samples taken, or None."""
        if self._proc is None:
            return None
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._file.seek(0)
        values = []
        for line in self._file.read().decode(errors="replace").splitlines():
            parts = line.split()
            if parts and not line.startswith("#") and len(parts) > 1 and parts[1].isdigit():
                values.append(float(parts[1]))
        self._file.close()
        return sum(values) / len(values) if values else None


def run_load(images: list[Path], levels: list[int], per_client: int, fields: dict[str, str], env: dict[str, str],
             serial: int = 0, profile: Path | None = None, client_processes: int = 1) -> list[dict[str, Any]]:
    """Load levels against a fresh server; the first row is the first request after ready, then (with
    ``serial``) that many more one at a time, so "the first is as fast as the hundredth" can be read."""
    proc, url = start_server(env)
    try:
        models = httpx.get(f"{url}/models").json()["models"]
        # device idle n/a: the first request's gap began at the warm-up, before the level, and is booked whole
        first = asyncio.run(load_level(url, images, 1, 1, fields, prime=False))
        rows = [{**first, "clients": "first after ready", "device_idle_fraction": None,
                 "models": [{k: m.get(k) for k in ("name", "precision", "call_sizes", "warm_seconds", "cuda_graphs")} for m in models]}]
        if serial:
            rows.append({**asyncio.run(load_level(url, images, 1, serial, fields)), "clients": f"1 (next {serial})"})
        for i, clients in enumerate(levels):
            spy = _py_spy(proc.pid, profile) if profile is not None and i == len(levels) - 1 else None
            row = asyncio.run(load_level(url, images, clients, per_client, fields, pid=proc.pid, client_processes=client_processes))
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
                spy.wait(timeout=60)
            lat_p50, lat_p99 = row.get("p50_s"), row.get("p99_s")
            row["p99_over_p50"] = lat_p99 / lat_p50 if lat_p50 and lat_p99 else None
            log.info("%d clients: %s", clients, row)
            rows.append(row)
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=60)
