"""A stand-in server process for the launcher's tests (:mod:`app.core.processes`): it reports the GPU memory it is
given as its own (as a CUDA server process reports what it holds once warm), says it is ready, and waits for the
launcher's signal. No app, no model: the launcher's decisions alone, in a second instead of a model's start-up."""

from __future__ import annotations

import multiprocessing
import socket
import sys
import time
from multiprocessing.synchronize import Event

from app.core.processes import DeviceMemory, save_memory_report


def serve(report: tuple[int, int, int] | None, extras_fail: bool, sock: socket.socket, ready: Event) -> None:
    """``report``: (peak reserved, free, total) bytes to report, or None to report nothing (a CPU process);
    ``extras_fail``: every process but the first exits with code 1 before it is ready (as one the GPU cannot hold)."""
    if extras_fail and multiprocessing.current_process().name != "idg-server-0":
        sys.exit(1)
    if report is not None:
        save_memory_report(DeviceMemory(*report))
    ready.set()
    time.sleep(3600)  # until SIGTERM, whose default action ends the process (a clean exit for the launcher)
