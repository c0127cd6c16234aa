"""A stand-in server process for the launcher's tests (:mod:`app.processes.launch`): it reports the GPU memory it is
given as its own (as a CUDA server process reports what it holds once warm), says it is ready, and waits for the
launcher's signal. No app, no model: the launcher's decisions alone, in a second instead of a model's start-up."""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from multiprocessing.synchronize import Event
from pathlib import Path

from app.core.image_threads import PROCESSES_ON_HOST
from app.processes.launch import DeviceMemory, save_memory_report


def serve(report: tuple[int, int, int] | None, fail: tuple[int, ...], die_once: tuple[int, ...], marks: str,
          sock: socket.socket, ready: Event, opened: Event) -> None:
    """``report``: (peak reserved, free, total) bytes to report, or None to report nothing (a CPU process). The processes
    whose index is in ``fail`` exit with code 1 before they are ready (as one the GPU cannot hold); those in ``die_once``
    exit with code 3 a moment after they are ready, the first time only (a file in ``marks`` remembers), as a crash
    would. Each ready process writes its index, its socket's inode (which socket it listens on) and the launcher's
    ``IDG_PROCESSES_ON_HOST`` into ``marks``."""
    index = int(multiprocessing.current_process().name.rsplit("-", 1)[1])
    if index in fail:
        sys.exit(1)
    if report is not None:
        save_memory_report(DeviceMemory(*report))
    mine = Path(marks) / f"socket-{os.getpid()}"
    on_host = os.environ.get(PROCESSES_ON_HOST, "-")  # what the launcher told its processes of their share of the host
    mine.with_suffix(".tmp").write_text(f"{index} {os.fstat(sock.fileno()).st_ino} {on_host}")
    mine.with_suffix(".tmp").replace(mine)  # whole: the test reads it while the others start
    ready.set()
    opened.set()
    mark = Path(marks) / f"died-{index}"
    if index in die_once and not mark.exists():
        mark.write_text("")
        time.sleep(0.3)
        sys.exit(3)
    time.sleep(3600)  # until SIGTERM, whose default action ends the process (a clean exit for the launcher)
