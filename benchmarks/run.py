"""Run the benchmarks and write results/benchmarks/<label>.{json,md}.

    python -m benchmarks.run [--label cpu-efficientnet_lite0] [--batch-sizes 1 8 32] [--load-levels 1 8 32]
    python -m benchmarks.run --model resnet101 --weights random --device cuda --batch-sizes 1 8 32 --load-levels 1 8 32
    python -m benchmarks.run --model cnn=torchscript:/models/cnn.ts --models-file /models/models.toml --images /my/photos
    python -m benchmarks.run --rows-only --batch-sizes 1 8   # writes cpu-efficientnet_lite0-rows.{json,md}
        # the region rows' attributions/s alone, with the default answer's and pytorch-grad-cam's measured in the same run
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import time
from pathlib import Path

import torch

from benchmarks.service_load import run_load
from benchmarks.speed import CPU_MEMORY, SAMPLES, machine, matmul_tflops, row_ratios, run_rows, run_speed, sample_batch
from idg_core import default_batch_size
from idg_core.presets import ROWS, preset_params, preset_post
from idg_models import PRECISIONS, default_channels_last, default_precision, image_files, keep_freed_memory, load_entry, tune
from idg_models.compiled import default_compile_sizes, warm_up_compiled
from idg_models.sources import entry_with_weights

log = logging.getLogger("benchmarks")


def _machine_line(m: dict) -> str:
    where = m.get("gpu") or f"{m.get('cpu', '?')}, {m.get('threads', '?')} threads, no GPU"
    return f"{where} ({m.get('platform', '?')}, Python {m.get('python', '?')}, torch {m.get('torch', '?')})"


def _precision_note(meta: dict) -> str:
    if "precision_set" not in meta:  # runs before 2026-11-24 did not record it
        return ""
    if not meta["precision_set"]:
        return " (the service's auto for this model)"
    if meta["precision"] == meta["auto_precision"]:
        return " (set; the same as the service's auto for this model)"
    return f" (set for this run; the service's auto gives this model {meta['auto_precision']})"


def _compiled_text(meta: dict) -> str:
    if not meta.get("compile_sizes"):
        return ""
    return (f", torch.compile at batch sizes {', '.join(map(str, meta['compile_sizes']))} "
            f"(compiling them took {meta['compile_seconds']:.0f} s before the first measurement)")


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _rows_table(rows: list[dict]) -> list[str]:
    """The region rows' section: attributions/s at each batch size and, where the run measured them (earlier runs did
    not), each row's ratio to the default answer's and Grad-CAM's to pytorch-grad-cam's, computed from the figures."""
    sizes = sorted({int(k.rsplit("_", 1)[1]) for r in rows for k in r if k.startswith("attr_per_s_")})
    reference = next((r for r in rows if r.get("reference")), None)
    peers = [r for r in rows if "peer" in r]
    notes = any("error" in r or "peer_error" in r for r in rows)
    per_size = [f"{b} image{'s' if b > 1 else ''}" for b in sizes]
    header = ["row", *per_size]
    if reference is not None:
        header += [f"vs default, {s}" for s in per_size]
    if peers:
        header += [f"vs pytorch-grad-cam, {s}" for s in per_size]
    if notes:
        header.append("note")
    lines = ["## Region rows (attributions/s; each as the service answers it, without the prediction's pass)", "",
             "| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]

    def line(label: str, figures: list[str], versus: list[str], peer: list[str], note: str) -> str:
        cells = [label, *figures, *(versus if reference is not None else []), *(peer if peers else []), *([note] if notes else [])]
        return "| " + " | ".join(cells) + " |"

    for r in rows:
        figures = [f"{r[f'attr_per_s_{b}']:.2f}" if f"attr_per_s_{b}" in r else "n/a" for b in sizes]
        ratios = [row_ratios(r, reference or {}, b) for b in sizes]
        versus = ["reference"] * len(sizes) if r.get("reference") else [_ratio_text(q.get("vs_default")) for q in ratios]
        if "peer" not in r:
            peer = [""] * len(sizes)
        elif not r.get("peer_installed", True):
            peer = ["peer not installed"] * len(sizes)
        else:
            peer = [_ratio_text(q.get("vs_peer")) for q in ratios]
        note = "; ".join(filter(None, [r.get("error"), f"peer: {r['peer_error']}" if "peer_error" in r else None]))
        label = f"`{r['row']}`" + (" (the reference: the default answer when it ran)" if r.get("reference") else "")
        lines.append(line(label, figures, versus, peer, note))
        if "peer" in r and any(f"peer_attr_per_s_{b}" in r for b in sizes):
            lines.append(line(f"{r['peer']} (peer of `{r['row']}`)",
                              [f"{r[f'peer_attr_per_s_{b}']:.2f}" if f"peer_attr_per_s_{b}" in r else "n/a" for b in sizes],
                              [_ratio_text(q.get("peer_vs_default")) for q in ratios], [""] * len(sizes), ""))
    lines.append("")
    if reference is not None:
        lines += ["vs default: the row's attributions/s over the default answer's at the same batch size, in this run on the "
                  "same images (20.00x: twenty times as many attributions per second)."
                  + (" vs pytorch-grad-cam: ours over the peer library's on the same model and the same CAM layer (> 1: ours is "
                     "faster); the peer is called as it is used, all images in one call: a forward pass, `loss.backward()` "
                     "(which also computes the gradients of the weights that have them), its maps resized to the input by "
                     "OpenCV and scaled to [0, 1]." if peers else ""), ""]
    if any(not r.get("peer_installed", True) for r in peers):
        lines += ["pytorch-grad-cam was not installed for this run (`scripts/setup.sh dev` puts grad-cam 1.5.7 in "
                  "`.venv/peers/gradcam`): peer not installed, no peer figures.", ""]
    return lines


def render(meta: dict, speed: list[dict], load: list[dict], rows: list[dict] | None = None) -> str:
    """The Markdown report of one run (also: ``python -m benchmarks.run --render results/benchmarks/X.json``)."""
    ceiling = meta.get("ceiling_tflops")
    peak = meta.get("peak_tflops")
    note = _precision_note(meta)
    layout = ("," if note else "") + " channels-last" if meta.get("channels_last") else ""
    lines = [f"# Benchmark `{meta['label']}`", "", f"Measured {meta['date']} on: {_machine_line(meta['machine'])}.", "",
             f"Model {meta['model']}, device {meta['device']}, precision {meta.get('precision', 'fp32')}{note}{layout}"
             f"{', batch norm folded' if meta.get('fold_bn') else ''}"
             f"{', malloc keeps freed memory' if meta.get('keep_freed_memory') else ''}"
             f"{_compiled_text(meta)}, "
             f"evaluator batch {meta['batch_size']}. "
             "Each figure is the best of the repeats; every column of a row was measured in the same run on the same images."
             + (f" {meta['note'][0].upper()}{meta['note'][1:]}." if meta.get("note") else ""), ""]
    if peak or ceiling:
        arithmetic = meta["precision"] if "precision_set" in meta else "fp32"  # runs before 2026-11-24 measured fp32 products
        peak_text = f"datasheet peak given {peak:.0f} TFLOP/s" if peak else "no datasheet peak given"
        ceiling_text = (f"measured {arithmetic} matrix-product ceiling {ceiling:.2f} TFLOP/s{meta.get('ceiling_note', '')}" if ceiling
                        else "no measured ceiling")
        lines += [f"Compute limit: {peak_text}; {ceiling_text}. "
                  "FLOPs from PyTorch's counter: (probe forward + 3 x main-pass forward) x points.", ""]
    rows = rows or []
    if rows:
        lines += _rows_table(rows)
    if rows and not speed:  # --rows-only
        return "\n".join(lines)
    lines += ["## Attribution speed (seconds per attribution; ratios > 1 mean ours is faster)", "",
              f"| images | ours default (IDG {meta.get('default_steps', 'fast')}) | ours IDG-50/50 | ours IG-50 | Captum IG-50 "
              "| Captum IG-50 at PyTorch's defaults | authors' way IDG "
              "| default vs Captum at its defaults | default vs Captum IG | IDG-50/50 vs Captum IG | IG vs Captum IG | IDG vs authors' way "
              "| IDG TFLOP/s | IDG share of datasheet peak | IDG share of measured ceiling | IDG peak MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        share = f"{r['idg_share_of_peak']:.1%}" if r.get("idg_share_of_peak") else "n/a"
        of_ceiling = f"{r['idg_share_of_ceiling']:.1%}" if r.get("idg_share_of_ceiling") else "n/a"
        mem = r.get("ours_idg_peak_mib")
        measured = f" ({meta.get('cpu_memory', 'RSS growth')}, a lower bound)" if meta["device"] == "cpu" else ""
        mem_text = "n/a" if mem is None else f"{mem:.0f}{measured}"
        default = f"{r['ours_default_s_per_attr']:.3f}" if "ours_default_s_per_attr" in r else "n/a"
        default_ratio = f"{r['default_vs_captum_ig']:.2f}x" if "default_vs_captum_ig" in r else "n/a"
        plain = f"{r['captum_ig_default_s_per_attr']:.3f}" if "captum_ig_default_s_per_attr" in r else "n/a"
        plain_ratio = f"{r['default_vs_captum_default']:.2f}x" if "default_vs_captum_default" in r else "n/a"
        lines.append(f"| {r['batch']} | {default} | {r['ours_idg_s_per_attr']:.3f} | {r['ours_ig_s_per_attr']:.3f} | "
                     f"{r['captum_ig_s_per_attr']:.3f} | {plain} | {r['authors_way_idg_s_per_attr']:.3f} | "
                     f"{plain_ratio} | {default_ratio} | "
                     f"{r['idg_vs_captum_ig']:.2f}x | {r['ig_vs_captum_ig']:.2f}x | "
                     f"{r['idg_vs_authors_way']:.2f}x | {r['ours_idg_tflops']:.3f} | {share} | {of_ceiling} | {mem_text} |")
    lines += ["", "Captum IG-50 runs on the same model as ours in this run's precision; \"at PyTorch's defaults\" is the untuned "
              "model as loaded (float32, no speed settings) with PyTorch's own switches (on CUDA: TF32 convolutions, IEEE matrix "
              "products), what a Captum user gets without thinking. "
              "IDG does a probe pass (50 forwards) before its main pass, so at equal steps it costs about 1.33x IG's passes: "
              "IDG vs Captum IG near 0.75x is the expected price of adaptive sampling, IG vs Captum IG compares the engines. "
              "Captum's `internal_batch_size` cannot be smaller than the number of images it is given (it then uses that number), "
              "so with more images than the batch size Captum runs larger batches than ours."]
    if load:
        fields = ", ".join(f"{k}={v}" for k, v in meta["load_fields"].items())
        lines += ["", f"## Service under load (`POST /attribute`, {fields}; real server process on loopback)", "",
                  "| clients | requests | ok | 503 | p50 s | p95 s | p99 s | attributions/s | model calls | images/call | device busy "
                  "| host CPU ms/attribution | of it, event loop |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in load:
            busy = f"{r['device_busy_fraction']:.0%}" if "device_busy_fraction" in r else "n/a"
            host = f"{r['host_cpu_ms_per_attr']:.1f}" if "host_cpu_ms_per_attr" in r else "n/a"
            loop = f"{r['event_loop_cpu_ms_per_attr']:.1f}" if "event_loop_cpu_ms_per_attr" in r else "n/a"
            lines.append(f"| {r['clients']} | {r['requests']} | {r['ok']} | {r['rejected_503']} | {r['p50_s']:.2f} | {r['p95_s']:.2f} | "
                         f"{r['p99_s']:.2f} | {r['throughput_per_s']:.3f} | {r['model_calls']} | {r['mean_images_per_call']:.1f} | "
                         f"{busy} | {host} | {loop} |")
        lines += ["", "Host CPU: what the server process used in all its threads per attribution answered (on a CPU device this "
                  "includes the model calls; on a GPU it is the host's share: decode, plan bookkeeping, kernel launches, rendering, "
                  "HTTP). The event loop is one thread under the GIL: at E ms per attribution it alone caps the service at "
                  "1000 / E attributions/s."]
    return "\n".join(lines) + "\n"


def default_label() -> str:
    """The default answer's IDG setting as the table's header names it: ``8/16``, with ``x 2 copies sharing its probe``
    where the preset smooths."""
    steps, post = preset_params("idg"), preset_post("idg")
    copies = int(post.get("smooth_samples") or 0)
    shared = " sharing its probe" if post.get("smooth_probe") == "shared" else ""
    return f"{steps['probe_steps']}/{steps['steps']}" + (f" x {copies} copies{shared}" if copies else "")


def _write(out: Path, label: str, meta: dict, speed: list[dict], load: list[dict], rows: list[dict] | None = None) -> None:
    (out / f"{label}.json").write_text(json.dumps({"meta": meta, "speed": speed, "load": load, "rows": rows or []}, indent=1))
    (out / f"{label}.md").write_text(render(meta, speed, load, rows))
    log.info("wrote %s/%s.{json,md}", out, label)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default=None,
                   help="the results' file name (default: cpu-efficientnet_lite0; with --rows-only cpu-efficientnet_lite0-rows, "
                        "so a rows-only run does not overwrite the full run's files)")
    p.add_argument("--model", default="efficientnet_lite0")
    p.add_argument("--weights", default=None,
                   help="a torchvision ARCH's weights file or 'random'; --model also takes any IDG_MODELS entry (NAME=SOURCE)")
    p.add_argument("--models-file", type=Path, default=None, help="the IDG_MODELS_FILE for --model's entry (input size, labels)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--batch-size", type=int, default=None,
                   help="images per model call, ours and Captum's internal batch "
                        "(default: idg_core.default_batch_size, 8 on CPU, 128 on CUDA)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's datasheet peak in the run's precision (TFLOP/s), for the share of peak")
    p.add_argument("--load-levels", type=int, nargs="*", default=[1, 8, 32, 128])
    p.add_argument("--per-client", type=int, default=1)
    p.add_argument("--load-preset", default="fast", choices=["fast", "paper"],
                   help="the service's cost preset under load (its default: fast)")
    p.add_argument("--captum-batch", type=int, default=None,
                   help="Captum's internal batch (default: 512 on CUDA as in the issue's reference, ours on CPU)")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="default: what the service's auto gives the model (bf16 on CUDA for a model whose bf16 faithfulness "
                        "was measured or calibrated, else TF32 on CUDA); see benchmarks/gpu_variants.py")
    p.add_argument("--channels-last", choices=["auto", "true", "false"], default="auto",
                   help="default: the service's (auto: on for the CPU and for bf16 on CUDA)")
    p.add_argument("--no-fold-bn", action="store_true", help="keep batch norm unfolded (the service folds it by default)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile ours at the service's batch sizes for --batch-size (IDG_COMPILE); start-up cost reported")
    p.add_argument("--images", type=Path, default=SAMPLES, help="folder of WNID_*.JPEG images")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    p.add_argument("--no-keep-freed-memory", action="store_true",
                   help="leave glibc's malloc at its defaults, here and in the service (IDG_KEEP_FREED_MEMORY=false)")
    p.add_argument("--render", type=Path, default=None, help="only rewrite the Markdown of an earlier run's JSON")
    p.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS),
                   help="region rows whose attributions/s to measure, with the default answer's (idg at the default preset) and, "
                        "for gradcam and gradcam_pp, pytorch-grad-cam's in the same run (default: all; none: skip)")
    p.add_argument("--rows-only", action="store_true", help="measure the region rows alone (no Captum table, no load)")
    args = p.parse_args(argv)
    args.label = args.label or ("cpu-efficientnet_lite0-rows" if args.rows_only else "cpu-efficientnet_lite0")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.render:
        data = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(render(data["meta"], data["speed"], data["load"], data.get("rows")))
        return 0

    kept = False if args.no_keep_freed_memory else keep_freed_memory()  # as the service does by default
    device = torch.device(args.device)
    loaded = load_entry(args.model, args.weights, args.models_file).to(device).eval()
    auto_precision = default_precision(device, loaded.source)  # what the service's IDG_PRECISION=auto gives this model
    precision_set = args.precision is not None
    args.precision = args.precision or auto_precision
    args.batch_size = args.batch_size or default_batch_size(device)
    args.channels_last = default_channels_last(device, args.precision) if args.channels_last == "auto" else args.channels_last == "true"
    model = tune(loaded, precision=args.precision, channels_last=args.channels_last,
                 fold_bn=not args.no_fold_bn, compile=args.compile, compile_sizes=default_compile_sizes(args.batch_size))
    compile_seconds = warm_up_compiled(model, model.preprocessing.crop_size) if args.compile else None
    images, targets, _ = sample_batch(model, args.images, max(args.batch_sizes))
    # the ceiling in the run's arithmetic: bf16 products for bf16, else fp32 under the TF32 switches tune() set
    ceiling_dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    ceiling = matmul_tflops(device, ceiling_dtype)
    log.info("measured %s matrix-product ceiling: %.2f TFLOP/s", args.precision, ceiling)
    rows = run_rows(model, images, targets, args.batch_sizes, args.rows, device=device, batch_size=args.batch_size,
                    repeats=args.repeats)
    speed: list[dict] = []
    plain_model = None
    if not args.rows_only:
        plain_model = load_entry(args.model, args.weights, args.models_file).to(device).eval()
        speed = run_speed(model, images, targets, args.batch_sizes, device=device, batch_size=args.batch_size,
                          repeats=args.repeats, peak_tflops=args.peak_tflops, ceiling_tflops=ceiling,
                          captum_batch=args.captum_batch or (512 if device.type == "cuda" else None), plain_model=plain_model)
    fields = {"method": "idg", "preset": args.load_preset, "return_overlay": "false"}
    env = {"IDG_MODELS": entry_with_weights(args.model, args.weights), "IDG_DEVICE": args.device,
           "IDG_MAX_QUEUE": "256", "IDG_REQUEST_TIMEOUT_S": "3600", "IDG_MAX_BATCH_IMAGES": str(args.batch_size),
           "IDG_MAX_ROUND_IMAGES": str(args.batch_size * 8), "IDG_PRECISION": args.precision,
           "IDG_CHANNELS_LAST": str(args.channels_last).lower(), "IDG_FOLD_BN": str(not args.no_fold_bn).lower(),
           "IDG_COMPILE": str(args.compile).lower(), "IDG_KEEP_FREED_MEMORY": str(not args.no_keep_freed_memory).lower()}
    if args.models_file is not None:
        env["IDG_MODELS_FILE"] = str(args.models_file.resolve())
    meta = {"label": args.label, "date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": args.model, "source": loaded.source,
            "device": str(device), "precision": args.precision, "precision_set": precision_set, "auto_precision": auto_precision,
            "channels_last": args.channels_last, "fold_bn": not args.no_fold_bn,
            "keep_freed_memory": kept, "cpu_memory": CPU_MEMORY,
            "compile_sizes": list(default_compile_sizes(args.batch_size)) if args.compile else None, "compile_seconds": compile_seconds,
            "batch_size": args.batch_size, "load_fields": fields, "default_steps": default_label(),
            "peak_tflops": args.peak_tflops, "ceiling_tflops": ceiling}
    args.out.mkdir(parents=True, exist_ok=True)
    _write(args.out, args.label, meta, speed, [], rows)  # the speed table is kept even if the service then fails to start
    load = []
    if args.load_levels and not args.rows_only:
        # the server shares this device: give back what the measurements here hold (on CUDA, Captum's
        # 512-image batches on the untuned model leave most of the GPU in this process's cache)
        del model, plain_model, loaded, images
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        load = run_load(image_files(args.images), args.load_levels, args.per_client, fields, env)
        _write(args.out, args.label, meta, speed, load, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
