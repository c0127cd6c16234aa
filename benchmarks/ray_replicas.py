"""Throughput of 1 against 2 Ray Serve replicas of the real app on this machine (CPU).

Each run starts a local Ray cluster, deploys N replicas of the default model (EfficientNet-Lite0,
one torch thread and one CPU each), warms them up, then sends the same sample photos with
``concurrency`` clients at the default preset and measures attributions per second, and which
replica served each answer (``X-IDG-Replica``). Results go to ``results/benchmarks/`` with the
machine named::

    python -m benchmarks.ray_replicas --requests 16 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from benchmarks.samples import bench_photos

log = logging.getLogger("benchmarks.ray_replicas")
ROOT = Path(__file__).resolve().parents[1]
SAMPLES = bench_photos()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def measure(replicas: int, photos: list[bytes], requests: int, concurrency: int) -> dict[str, Any]:
    """Deploy ``replicas`` replicas, warm each, then time ``requests`` /attribute calls."""
    import ray
    from ray import serve

    from app.ray_serve import IDGReplica

    port = _free_port()
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        env = {"PYTHONPATH": str(ROOT), "IDG_TORCH_THREADS": "1"}
        deployment = IDGReplica.options(  # type: ignore[attr-defined]  # added by @serve.deployment
            num_replicas=replicas, ray_actor_options={"num_cpus": 1, "runtime_env": {"env_vars": env}})
        started = time.perf_counter()
        serve.run(deployment.bind(), name="idg", route_prefix="/")
        ready_s = time.perf_counter() - started
        url = f"http://127.0.0.1:{port}/attribute"

        def one(i: int, client: httpx.Client) -> tuple[int, str]:
            r = client.post(url, files={"file": (f"{i}.jpg", photos[i % len(photos)], "image/jpeg")},
                            data={"return_overlay": "false", "return_heatmap": "false"})
            return r.status_code, r.headers.get("x-idg-replica", "?")

        with httpx.Client(timeout=600) as client, ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda i: one(i, client), range(2 * replicas)))  # every replica answers once before timing
            began = time.perf_counter()
            answers = list(pool.map(lambda i: one(i, client), range(requests)))
            seconds = time.perf_counter() - began
    finally:
        serve.shutdown()
        ray.shutdown()
    statuses = Counter(status for status, _ in answers)
    served = Counter(replica for _, replica in answers)
    return {"replicas": replicas, "ready_s": round(ready_s, 1), "requests": requests, "concurrency": concurrency,
            "seconds": round(seconds, 2), "per_s": round(requests / seconds, 3), "statuses": dict(statuses),
            "served_by": sorted(served.values(), reverse=True)}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "benchmarks")
    args = p.parse_args()
    photos = [f.read_bytes() for f in sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))[:8]]
    load = os.getloadavg()
    rows = []
    for replicas in (1, 2):
        row = measure(replicas, photos, args.requests, args.concurrency)
        log.info("%s", row)
        rows.append(row)
    machine = f"{_cpu()} ({os.cpu_count()} cores), load average before the runs {load[0]:.2f}"
    lines = [
        "# 1 against 2 Ray Serve replicas (CPU)", "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine}; `python -m benchmarks.ray_replicas --requests {args.requests} "
        f"--concurrency {args.concurrency}`. EfficientNet-Lite0, default preset (fast), `/attribute` without images in the "
        "answer, one torch thread and one Ray CPU per replica, 8 sample photos cycled; each replica answered once before timing.", "",
        "| replicas | attributions/s | speed-up | seconds | statuses | answers per replica | start-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['replicas']} | {row['per_s']:.3f} | {row['per_s'] / rows[0]['per_s']:.2f}x | {row['seconds']} | "
                     f"{row['statuses']} | {row['served_by']} | {row['ready_s']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu-ray-replicas.md").write_text("\n".join(lines) + "\n")
    (args.out / "cpu-ray-replicas.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")
    log.info("wrote %s", args.out / "cpu-ray-replicas.md")


if __name__ == "__main__":
    main()
