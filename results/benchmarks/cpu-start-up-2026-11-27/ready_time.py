"""Seconds from spawning ``python -m app.server`` (its defaults) to its port answering and to ``/health/ready`` 200.

    python results/benchmarks/cpu-start-up-2026-11-27/ready_time.py   (from the repository root, in its venv)
"""

import logging
import socket
import subprocess
import sys
import time

import httpx

log = logging.getLogger("ready_time")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "app.server", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_open = None
    deadline = started + 300
    try:
        while True:
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise SystemExit(f"the server exited (code {proc.returncode}) or was not ready within 300 s")
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1)
                port_open = port_open or time.perf_counter() - started
                if answer.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        log.info("port open %.2f s, ready %.2f s", port_open, time.perf_counter() - started)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
