"""Does a second worker process per GPU add throughput? Two server processes on one device (as Ray Serve
with ``num_gpus: 0.5`` or N processes behind one port would run), each sent half the clients at once,
against one process sent all of them, in the same run.

    python -m benchmarks.two_servers --label h100-service-lite0-two-processes --clients 128 --per-client 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks.service_load import load_level, start_server
from benchmarks.speed import SAMPLES, machine
from idg_core.models import image_files

log = logging.getLogger(__name__)


async def _split(urls: list[str], images: list[Path], clients: int, per_client: int, fields: dict[str, str]) -> list[dict[str, Any]]:
    share = clients // len(urls)
    return list(await asyncio.gather(*[load_level(u, images, share, per_client, fields) for u in urls]))


def measure(processes: int, images: list[Path], clients: int, per_client: int, env: dict[str, str]) -> dict[str, Any]:
    fields = {"method": "idg", "preset": "fast", "return_overlay": "false"}
    servers = [start_server(env) for _ in range(processes)]
    try:
        urls = [url for _, url in servers]
        for url in urls:  # one warm request each
            asyncio.run(load_level(url, images, 1, 1, fields))
        started = time.perf_counter()
        rows = asyncio.run(_split(urls, images, clients, per_client, fields))
        wall = time.perf_counter() - started
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=60)
    ok = sum(r["ok"] for r in rows)
    return {"processes": processes, "clients": clients, "ok": ok, "attributions_per_s": ok / wall,
            "p50_s": max(r["p50_s"] or 0 for r in rows), "p99_s": max(r["p99_s"] or 0 for r in rows),
            "device_busy_sum": sum(r["device_busy_fraction"] for r in rows), "per_process": rows}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--images", type=Path, default=SAMPLES)
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--per-client", type=int, default=6)
    ap.add_argument("--env", nargs="*", default=[])
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = ap.parse_args(argv)
    env = {"IDG_MAX_QUEUE": "512", "IDG_REQUEST_TIMEOUT_S": "600"} | dict(item.split("=", 1) for item in args.env)
    images = image_files(args.images)
    rows = [measure(n, images, args.clients, args.per_client, env) for n in (1, 2)]
    lines = [f"# One or two server processes on one device: `{args.label}`", "", f"Measured {time.strftime('%Y-%m-%d')} on "
             f"{machine().get('gpu') or machine().get('cpu')}; {args.clients} clients x {args.per_client} requests, split evenly "
             f"between the processes; settings beyond the defaults: {env}.", "",
             "| processes | attributions/s | worst p50 s | worst p99 s | device busy (sum of the processes' counters) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['processes']} | {r['attributions_per_s']:.1f} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | {r['device_busy_sum']:.0%} |"
              for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps(rows, indent=1))
    (args.out / f"{args.label}.md").write_text("\n".join(lines) + "\n")
    log.info("\n%s", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
