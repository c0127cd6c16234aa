"""Run the benchmarks and write results/benchmarks/<label>.{json,md}.

    python -m benchmarks.run [--label cpu-lite0] [--batch-sizes 1 8] [--load-levels 1 8]
    python -m benchmarks.run --model resnet101 --weights random --device cuda --batch-sizes 1 8 32 --load-levels 1 8 32
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from benchmarks.service_load import run_load
from benchmarks.speed import machine, run_speed
from idg_core.models import PRECISIONS, decode_image, imagenet_wnids, load_model, tune

log = logging.getLogger("benchmarks")
SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "imagenet-samples"


def _markdown(meta: dict, speed: list[dict], load: list[dict]) -> str:
    lines = [f"# Benchmark `{meta['label']}`", "", f"Measured {meta['date']} on: {meta['machine']}", "",
             f"Model {meta['model']}, device {meta['device']}, precision {meta.get('precision', 'fp32')}"
             f"{' channels-last' if meta.get('channels_last') else ''}, evaluator batch {meta['batch_size']}.", "",
             "## Attribution speed (seconds per attribution; ratios > 1 mean ours is faster)", "",
             "| images | ours IDG-50/50 | ours IG-50 | Captum IG-50 | authors' way IDG | IDG vs Captum IG | IG vs Captum IG | IDG vs authors' way | IDG TFLOP/s | IDG share of peak | IDG peak MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        share = f"{r['idg_share_of_peak']:.1%}" if r.get("idg_share_of_peak") else "n/a"
        mem = f"{r['ours_idg_peak_mib']:.0f}" if r.get("ours_idg_peak_mib") is not None else "n/a (CPU)"
        lines.append(f"| {r['batch']} | {r['ours_idg_s_per_attr']:.3f} | {r['ours_ig_s_per_attr']:.3f} | {r['captum_ig_s_per_attr']:.3f} | "
                     f"{r['authors_way_idg_s_per_attr']:.3f} | {r['idg_vs_captum_ig']:.2f}x | {r['ig_vs_captum_ig']:.2f}x | "
                     f"{r['idg_vs_authors_way']:.2f}x | {r['ours_idg_tflops']:.3f} | {share} | {mem} |")
    if load:
        lines += ["", f"## Service under load (`/attribute`, {meta['load_fields']})", "",
                  "| clients | requests | ok | 503 | p50 s | p95 s | p99 s | attributions/s | model calls | images/call |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in load:
            lines.append(f"| {r['clients']} | {r['requests']} | {r['ok']} | {r['rejected_503']} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
                         f"{r['p99_s']:.2f} | {r['throughput_per_s']:.3f} | {r['model_calls']} | {r['mean_images_per_call']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="cpu-efficientnet_lite0")
    p.add_argument("--model", default="efficientnet_lite0")
    p.add_argument("--weights", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--batch-size", type=int, default=32, help="evaluator images per model call")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's fp32 peak, for the share of peak")
    p.add_argument("--load-levels", type=int, nargs="*", default=[1, 8])
    p.add_argument("--per-client", type=int, default=1)
    p.add_argument("--load-steps", type=int, default=50)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="see benchmarks/gpu_variants.py")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--images", type=Path, default=SAMPLES, help="folder of WNID_*.JPEG images")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    device = torch.device(args.device)
    model = tune(load_model(args.model, args.weights).to(device).eval(), precision=args.precision, channels_last=args.channels_last)
    files = sorted(args.images.glob("*.JPEG"))[: max(args.batch_sizes)]
    images = torch.stack([model.prepare(decode_image(f.read_bytes())) for f in files])
    wnids = imagenet_wnids()
    targets = [wnids.index(f.name.split("_")[0]) for f in files]
    speed = run_speed(model, images, targets, args.batch_sizes, device=device, batch_size=args.batch_size,
                      repeats=args.repeats, peak_tflops=args.peak_tflops)
    fields = {"method": "idg", "steps": str(args.load_steps), "probe_steps": str(args.load_steps), "return_overlay": "false"}
    env = {"IDG_MODELS": args.model if args.weights is None else f"{args.model}={args.weights}", "IDG_DEVICE": args.device,
           "IDG_MAX_QUEUE": "256", "IDG_REQUEST_TIMEOUT_S": "3600", "IDG_MAX_BATCH_IMAGES": str(args.batch_size),
           "IDG_MAX_ROUND_IMAGES": str(args.batch_size * 8), "IDG_PRECISION": args.precision,
           "IDG_CHANNELS_LAST": str(args.channels_last).lower()}
    load = run_load(sorted(args.images.glob("*.JPEG")), args.load_levels, args.per_client, fields, env) if args.load_levels else []
    meta = {"label": args.label, "date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": args.model, "device": str(device),
            "precision": args.precision, "channels_last": args.channels_last,
            "batch_size": args.batch_size, "load_fields": fields}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps({"meta": meta, "speed": speed, "load": load}, indent=1))
    (args.out / f"{args.label}.md").write_text(_markdown(meta, speed, load))
    log.info("wrote %s/%s.{json,md}", args.out, args.label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
