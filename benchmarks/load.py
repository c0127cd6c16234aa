"""The service as users see it: a real server process started with the service's defaults (plus only
the settings given), N concurrent clients on loopback sending real photos, and what the device did.

    python -m benchmarks.load --label h100-lite0-service --levels 8 32 128 --per-client 6 --serial 99
    python -m benchmarks.load --label h100-resnet101-bf16 --env IDG_MODELS=resnet101=random IDG_PRECISION=bf16 --levels 128
    python -m benchmarks.load --label cpu-simulated-20ms --simulated-ms 20 --levels 8 32 128 --per-client 6

``--simulated-ms`` serves a light TorchScript CNN (saved as a user would, :func:`light_cnn`)
whose every call takes that long on a device timeline of its own, as on a CUDA stream (``IDG_SIMULATED_CALL_MS``,
``IDG_SIMULATED_STREAM``), with fixed call sizes up to 128: the device-busy fraction under load then says whether the
host keeps a device fed, on a machine without one. Each level reports throughput, p50/p95/p99 and p99/p50,
model calls and images per call, the device-busy counter, padding rows per real row (fixed sizes'
waste), calls at an unwarmed size, and on a GPU the SM utilisation ``nvidia-smi dmon`` saw.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.service_load import gil_profile_summary, run_load

# No torch (nor idg_core, nor benchmarks.speed) at module level: the load generator's client processes are spawned, and a
# spawned child imports the parent's main module, this one. With torch here each of the check's four client processes spent
# seconds importing it before every level (9 s between ready and a level's first request on the H200, 2026-11-27).

log = logging.getLogger(__name__)


def _fmt(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _machine(m: dict[str, Any]) -> str:
    where = m.get("gpu") or f"{m.get('cpu', 'a CPU')} ({m.get('threads')} torch threads)"
    return f"{where}, {m.get('platform')}, torch {m.get('torch')}"


def _busy(row: dict[str, Any]) -> str:
    """The machine's CPU use during the level, over all its cores."""
    if row.get("machine_cpu_busy") is None:
        return "n/a"
    return f"{row['machine_cpu_busy']:.0%} of {row.get('machine_cores', '?')} cores"


def _level(clients: int | str) -> str:
    """A level's name in the report's lines: "32 clients", or the first row's own ("first after ready")."""
    return f"{clients} clients" if isinstance(clients, int) else clients


def _idle(row: dict[str, Any]) -> str:
    """The device's idle time over the level, by what it waited for: the worker's host steps, or requests."""
    idle = row.get("device_idle_fraction")
    if not idle:
        return "n/a"
    return f"{idle.get('host', 0.0):.0%} / {idle.get('no_work', 0.0):.0%}"


def render(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    env = ", ".join(f"`{k}={v}`" for k, v in meta["env"].items()) or "none"
    lines = [f"# Service load `{meta['label']}`", "", f"Measured {meta['date']} on: {_machine(meta['machine'])}.", "",
             f"Real server process on loopback, settings beyond the defaults: {env}. Requests: `POST /attribute` with "
             f"{', '.join(f'{k}={v}' for k, v in meta['fields'].items())}, photos from {meta['images']} cycled; "
             f"{meta['per_client']} requests per client at each level, clients in {meta.get('client_processes', 1)} process(es).", "",
             "Models as served (`/models`): " + "; ".join(json.dumps(m) for m in rows[0].get("models", [])) + ".", "",
             "| clients | ok | 503 | p50 s | p95 s | p99 s | p99/p50 | attributions/s | model calls | images/call | padding/real rows "
             "| device busy | device idle: worker / no request | GPU SM util % (dmon) | unwarmed calls | host CPU ms/attr "
             "| event loop ms/attr | client CPU ms/request "
             "| machine CPU busy | server p50 / p99 s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['clients']} | {r['ok']} | {r['rejected_503']} | {_fmt(r['p50_s'], '.3f')} | {_fmt(r['p95_s'], '.3f')} | "
            f"{_fmt(r['p99_s'], '.3f')} | {_fmt(r.get('p99_over_p50'), '.2f')} | {r['throughput_per_s']:.1f} | {r['model_calls']} | "
            f"{_fmt(r['mean_images_per_call'], '.1f')} | {_fmt(r.get('padded_per_real_row'), '.2f')} | "
            f"{r['device_busy_fraction']:.0%} | {_idle(r)} | {_fmt(r.get('gpu_sm_util_mean'), '.0f')} | "
            f"{r.get('unwarmed_calls', 0):.0f} | {_fmt(r.get('host_cpu_ms_per_attr'), '.1f')} | "
            f"{_fmt(r.get('event_loop_cpu_ms_per_attr'), '.1f')} | {_fmt(r.get('client_cpu_ms_per_request'), '.1f')} | "
            f"{_busy(r)} | {_fmt(r.get('server_p50_s'), '.3f')} / {_fmt(r.get('server_p99_s'), '.3f')} |")
    shares = [(r["clients"], r["answer_shares"]) for r in rows if r.get("answer_shares")]
    if shares:
        lines += ["", "Answers by server process (`X-IDG-Replica`, largest share first): " + "; ".join(
            f"{_level(c)}: " + " / ".join(f"{x:.0%}" for x in share) for c, share in shares) + "."]
    spent = [(r["clients"], r["server_ms_split"]) for r in rows if r.get("server_ms_split")]
    if spent:
        lines += ["", "Server time per answer, mean ms (`timings`: intake = decoding, checks, planning and the event loop's resuming "
                  "the request after the worker; "
                  "queued = admitted, before the worker took it; worker = its rounds; render = its PNGs): " + "; ".join(
                      f"{_level(c)}: " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()) for c, t in spent) + "."]
    split = [(r["clients"], r["cpu_ms_per_attr_by_thread"]) for r in rows if r.get("cpu_ms_per_attr_by_thread")]
    if split:
        lines += ["", "Host CPU ms per attribution by thread: " + "; ".join(
            f"{_level(c)}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(t.items())) for c, t in split) + "."]
    if meta.get("gil_profile"):
        mode = meta.get("profile_mode", "gil")  # IDG_BENCH_PROFILE: gil (who held it), idle (waits too), cpu (every running thread)
        what = {"gil": "Who held the GIL", "idle": "Where the threads were, waiting too", "cpu": "Where the CPU went"}.get(mode, mode)
        lines += ["", f"{what} during the last level (py-spy{'' if mode == 'cpu' else ' --' + mode}, {meta['levels'][-1]} clients; "
                  "share of samples):", ""]
        lines += [f"- {line}" for line in meta["gil_profile"]]
    lines += ["", "Server p50 / p99: the answers' own `timings.total_ms` (from the server's reading the body to its answer); "
              "where they are far below the client's, the time went to HTTP, the network stack or the load generator."]
    lines += ["", "Device busy: the service's own counter (`idg_device_busy_seconds_total`: CUDA-event time of each model call on a "
              "GPU, the device thread's time in the call elsewhere; with several server processes, the union of their calls' "
              "times, from launch to result) over the level's wall time. GPU SM util: the mean of "
              "`nvidia-smi dmon -s u` samples during the level. Device idle (`idg_device_idle_seconds_total`): the gaps between "
              "calls, split by what the device waited for: the worker, while it held requests (planning, gathering points, "
              "booking: the host side of the device loop) or no request (they were still arriving or being decoded: more "
              "clients, or more server processes, fill that). The first row is the first request after ready; the second (with "
              "`--serial`) the next ones one at a time. Machine CPU busy: every core's time not idle (`/proc/stat`) over the level, the "
              "server's processes, the load generator and the kernel together: near 100%, the machine's cores are the limit."]
    return "\n".join(lines) + "\n"


def light_cnn(out: Path) -> str:
    """A TorchScript CNN saved as a user would, with the test suite's models file (48-pixel input, 10 classes), whose
    own work is small next to a simulated call: 4 ms for a 128-row gradient call on one core of the 2-core VM, against
    69 ms for the tests' SmallCNN, which had made a "20 ms" simulated call a 45-70 ms one that also took the host's CPU.
    The call's time is then the set time, as on an accelerator, and the host's cores are left to the host."""
    import torch
    from torch import nn

    from tests.models import tiny_model_maker  # the test suite's maker: its models file and labels

    tiny_model_maker()._common(out)
    torch.manual_seed(0)
    net = nn.Sequential(nn.AvgPool2d(4), nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                        nn.Linear(32, 10)).eval()
    torch.jit.save(torch.jit.script(net), out / "cnn.ts")
    return f"scripted=torchscript:{out / 'cnn.ts'}"


def main(argv: list[str] | None = None) -> int:
    from benchmarks.speed import SAMPLES, machine  # torch: see the note on imports above
    from idg_models import image_files

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--env", nargs="*", default=[], help="IDG_X=value settings for the server beyond its defaults")
    ap.add_argument("--images", type=Path, default=SAMPLES)
    ap.add_argument("--levels", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--per-client", type=int, default=6)
    ap.add_argument("--serial", type=int, default=0, help="requests one at a time after the first (the first vs the hundredth)")
    ap.add_argument("--preset", default="fast")
    ap.add_argument("--simulated-ms", type=float, default=None, help="serve a tiny CNN on a simulated device: ms per call")
    ap.add_argument("--client-processes", type=int, default=1,
                    help="load-generating processes (one costs ~0.5 ms of CPU per request: benchmarks/raw_http.py)")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy on the server during the last level, if installed: --gil, or as IDG_BENCH_PROFILE says (idle, cpu)")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = ap.parse_args(argv)
    profile = args.out / f"{args.label}-gil.txt" if args.profile else None
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory() as tmp:
        if args.simulated_ms is not None:
            entry = light_cnn(Path(tmp))
            env = {"IDG_MODELS": entry, "IDG_MODELS_FILE": str(Path(tmp) / "models.toml"), "IDG_DEVICE": "cpu",
                   "IDG_SIMULATED_CALL_MS": str(args.simulated_ms), "IDG_FIXED_CALL_SIZES": "true",
                   "IDG_MAX_BATCH_IMAGES": "128", "IDG_TORCH_THREADS": "1"} | env
        env = {"IDG_MAX_QUEUE": "512", "IDG_REQUEST_TIMEOUT_S": "600"} | env
        fields = {"method": "idg", "preset": args.preset, "return_overlay": "false"}
        rows = run_load(image_files(args.images), args.levels, args.per_client, fields, env, serial=args.serial, profile=profile,
                        client_processes=args.client_processes)
    gil = gil_profile_summary(profile) if profile is not None and profile.exists() else []
    meta = {"gil_profile": gil, "profile_mode": os.environ.get("IDG_BENCH_PROFILE", "gil"),
            "label": args.label, "date": time.strftime("%Y-%m-%d"), "machine": machine(), "env": env, "fields": fields,
            "images": str(args.images), "per_client": args.per_client, "levels": args.levels,
            "client_processes": args.client_processes}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (args.out / f"{args.label}.md").write_text(render(meta, rows))
    print(render(meta, rows))  # noqa: T201 - the report, as the command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
