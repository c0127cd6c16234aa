"""What the hardware offers, against faithfulness: IDG-50/50 under each speed setting of
:func:`idg_models.tune` (precision fp32 / tf32 / bf16, channels-last, torch.compile) and
evaluator batch sizes, timed on the same images in one run.

Faithfulness is the criterion: on a trained model, each setting's insertion and deletion (RISE,
scored in that setting's own precision) are paired per image against IEEE fp32, with 95%
intervals; a setting is kept only when both intervals include 0 or favour it. Pixel-level
Spearman correlation with the fp32 maps stays as a secondary column (it says little on
random-weight networks, whose input gradients are chaotic). Also measures the device's
matrix-product ceilings, so the share of the compute limit is against what this card does.

    python -m benchmarks.gpu_variants --model efficientnet_lite0 --weights none --images 65 --pic  # faithfulness (+ SIC/AIC) + speed
    python -m benchmarks.gpu_variants --model resnet101 --weights random --images 32 --no-faithfulness  # speed only
    python -m benchmarks.gpu_variants --device cpu --model efficientnet_lite0 --weights none --images 65 --batch-size 8 \
        --rise-step 896 --repeats 1 --batch-sizes --label cpu-variants-efficientnet_lite0 --variants fp32 \
        fp32+channels_last fp32+fold_bn fp32+channels_last+fold_bn bf16+channels_last+fold_bn  # the CPU's settings (~65 min)
    python -m benchmarks.gpu_variants --device cpu --model efficientnet_lite0 --weights none --images 65 --batch-size 8 \
        --rise-step 896 --repeats 1 --batch-sizes --label cpu-variants-pic-efficientnet_lite0 --variants fp32 \
        fp32+channels_last+fold_bn bf16+channels_last+fold_bn --pic --workers 2  # with SIC/AIC (~50 min)
    python -m benchmarks.gpu_variants --model cnn=torchscript:/models/cnn.ts --models-file /models/models.toml \
        --images 65 --variants fp32 bf16  # your own model (any IDG_MODELS entry): may it be served in bf16?
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.speed import SAMPLES, _timed, forward_flops, machine, matmul_tflops, sample_batch
from idg_core import idg
from idg_core.heatmap import saliency
from idg_core.metrics import (
    Skipped,
    original_confidence,
    pic_many,
    pic_pool,
    random_pixel_mask,
    to_uint8,
)
from idg_evaluation.runner import EvalConfig
from idg_models import ImageClassifier, keep_freed_memory, load_entry, set_tf32, tune
from idg_models.calibrate import insertion_deletion, keeps_faithfulness, paired_against
from idg_models.calibration import KEEP_METRICS, Paired
from idg_models.compiled import default_compile_sizes, warm_up_compiled

log = logging.getLogger("benchmarks.gpu_variants")

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("fp32", {"precision": "fp32"}),
    ("tf32", {"precision": "tf32"}),
    ("bf16", {"precision": "bf16"}),
    ("fp32+channels_last", {"precision": "fp32", "channels_last": True}),
    ("tf32+channels_last", {"precision": "tf32", "channels_last": True}),
    ("bf16+channels_last", {"precision": "bf16", "channels_last": True}),
    ("fp32+fold_bn", {"precision": "fp32", "fold_bn": True}),
    ("fp32+channels_last+fold_bn", {"precision": "fp32", "channels_last": True, "fold_bn": True}),  # the CPU default
    ("bf16+channels_last+fold_bn", {"precision": "bf16", "channels_last": True, "fold_bn": True}),  # Lite0's CUDA default
    ("bf16+channels_last+compile", {"precision": "bf16", "channels_last": True, "compile": True}),
    ("tf32+channels_last+compile", {"precision": "tf32", "channels_last": True, "compile": True}),
]


def ceiling(dtype: torch.dtype, tf32: bool) -> float:
    set_tf32(tf32)
    return matmul_tflops(torch.device("cuda"), dtype)


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Per-row Spearman rank correlation of two (B, P) tensors."""
    ra = a.argsort(1).argsort(1).double()
    rb = b.argsort(1).argsort(1).double()
    ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)
    return (ra * rb).sum(1) / (ra.norm(dim=1) * rb.norm(dim=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet101",
                   help="a packaged name, a torchvision ARCH (file from --weights), or any IDG_MODELS entry such as "
                        "NAME=torchscript:PATH or NAME=timm:ARCH:PATH: measure your own model before you serve it in bf16")
    p.add_argument("--weights", default="random", help="a torchvision ARCH's weights file or 'random'; packaged names and "
                                                       "NAME=SOURCE entries ignore it ('none')")
    p.add_argument("--models-file", type=Path, default=None,
                   help="the service's IDG_MODELS_FILE: input size, mean, std and labels for a NAME=SOURCE entry")
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--image-dir", type=Path, default=SAMPLES,
                   help="the photos (JPEG, PNG; the first --images by name); default: the 65 ImageNet samples")
    p.add_argument("--batch-size", type=int, default=128, help="evaluator images per model call")
    p.add_argument("--batch-sizes", type=int, nargs="*", default=[32, 64, 128, 256, 512],
                   help="evaluator batch sizes to sweep (best variant)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", nargs="*", default=[name for name, _ in VARIANTS])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu: the CPU's settings (channels-last, fold_bn); no matrix-product ceilings there")
    p.add_argument("--label", default=None)
    p.add_argument("--no-faithfulness", action="store_true", help="skip insertion/deletion (random-weight models: speed only)")
    p.add_argument("--rise-step", type=int, default=224, help="pixels moved per insertion/deletion step")
    p.add_argument("--pic", action="store_true",
                   help="also SIC and AIC (PIC), paired against fp32 on the images fp32 predicts with confidence >= 0.8; reported, "
                        "not part of the keep rule; the blurred rebuilds run in --workers processes")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="processes for PIC's rebuilds (--pic)")
    p.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    p.add_argument("--render", type=Path, default=None, help="only rewrite the Markdown of an earlier run's JSON")
    args = p.parse_args(argv)
    if args.render:
        data = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(_markdown(data["meta"], data["variants"], data["failed"], data["batch_sweep"]))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    keep_freed_memory()  # as the service does by default (IDG_KEEP_FREED_MEMORY)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    probe = load_entry(args.model, args.weights, args.models_file)
    x, targets, files = sample_batch(probe, args.image_dir, args.images)
    x = x.to(device)
    state = {k: v.clone() for k, v in probe.state_dict().items()}
    if not args.no_faithfulness:  # explain (and score) what the model predicts, as the evaluation does
        with torch.no_grad():
            targets = probe.to(device).eval()(x).argmax(1).tolist()
    fwd = forward_flops(probe.to(device).eval(), x.shape[-1], device)
    flops_per_attr = fwd * (50 + 3 * 50)  # probe forward + main pass (forward + backward ~ 3 forwards)
    pool: Executor | None = pic_pool(args.workers) if args.pic else None
    pic_rule = EvalConfig()  # the evaluation's confidence floor and mask size, so both score PIC alike
    pic_todo = ([i for i in range(len(files)) if original_confidence(probe, x[i], targets[i]) >= pic_rule.pic_min_confidence]
                if args.pic and not args.no_faithfulness else [])
    pic_images = [to_uint8(x[i]) for i in pic_todo]
    pic_masks = [random_pixel_mask(a.shape[0], a.shape[1], pic_rule.pic_mask_fraction, seed=i)
                 for i, a in zip(pic_todo, pic_images, strict=True)]
    ceilings = ({"fp32": ceiling(torch.float32, False), "tf32": ceiling(torch.float32, True),
                 "bf16": ceiling(torch.bfloat16, False)} if cuda else {"fp32": float("nan"), "tf32": float("nan"), "bf16": float("nan")})
    log.info("matmul ceilings (TFLOP/s): %s", ceilings)

    def fresh(largest_call: int = args.batch_size, **speed: Any) -> ImageClassifier:
        """The model with these speed settings; compiled ones at the service's batch sizes for ``largest_call``."""
        m = load_entry(args.model, args.weights, args.models_file)
        m.load_state_dict(state)
        sizes = default_compile_sizes(largest_call) if speed.get("compile") else None
        return tune(m.to(device).eval(), compile_sizes=sizes, **speed)

    reference: list[Tensor] = []
    ref_scores: list[dict[str, list[float | None]] | None] = []

    def faithfulness(model: ImageClassifier, attributions: Tensor) -> dict[str, list[float | None]]:
        """Insertion and deletion AUC per image of these maps (and SIC, AIC with --pic), scored by ``model`` (its own precision)."""
        sal = torch.stack([saliency(a) for a in attributions]).to(device)
        scores = insertion_deletion(model, x, sal, step=args.rise_step, batch_size=args.batch_size)  # as idg-calibrate scores
        return scores | (pic(model, sal) if args.pic else {})

    def pic(model: torch.nn.Module, sal: Tensor) -> dict[str, list[float | None]]:
        """SIC and AIC per image (None where fp32 was unsure or PIC skips the image), scored by ``model``."""
        maps = [sal[i].cpu().double().numpy() for i in pic_todo]
        curves = pic_many(model, pic_images, maps, pic_masks, [targets[i] for i in pic_todo], device, pool)
        out: dict[str, list[float | None]] = {"sic": [None] * len(files), "aic": [None] * len(files)}
        for i, scores in zip(pic_todo, curves, strict=True):
            for kind, res in scores.items():
                out[kind][i] = None if isinstance(res, Skipped) else res.auc
        return out

    def measure(name: str, speed: dict[str, Any]) -> dict[str, Any]:
        model = fresh(**speed)
        started = time.perf_counter()
        run = lambda m=model: idg(m, x, "mean", targets, steps=50, probe_steps=50, batch_size=args.batch_size)  # noqa: E731
        warm_up_compiled(model, x.shape[-1])  # every batch size's graphs, as the service does before ready
        run()  # warm-up
        first = time.perf_counter() - started
        seconds = _timed(run, device, args.repeats, warm=False)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device) if cuda else 0
        result = run()
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if cuda else float("nan")
        maps = result.attributions.sum(1).flatten(1).double()
        scores = None if args.no_faithfulness else faithfulness(model, result.attributions)
        if not reference:
            reference.append(maps)  # the first variant (fp32) is the reference
            ref_scores.append(scores)
        rho = spearman(maps, reference[0])
        rel = ((maps - reference[0]).norm(dim=1) / reference[0].norm(dim=1)).max()
        ref = ref_scores[0]
        paired = {} if scores is None or ref is None else {f"{m}_vs_fp32": tuple(v) for m, v in paired_against(scores, ref).items()}
        ceiling = ceilings[speed["precision"]]
        tflops = flops_per_attr * len(files) / seconds / 1e12
        del model, run, result
        if cuda:
            torch.cuda.empty_cache()
        return {"variant": name, "s_per_attr": seconds / len(files), "attr_per_s": len(files) / seconds, "first_run_s": first,
                "tflops": tflops, "share_of_measured_ceiling": tflops / ceiling, "ceiling_tflops": ceiling, "peak_mib": peak,
                "spearman_mean": float(rho.mean()), "spearman_min": float(rho.min()), "rel_l2_max": float(rel), **paired}

    rows: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    for name, speed in VARIANTS:
        if name not in args.variants:
            continue
        try:
            row = measure(name, speed)
        except Exception as err:  # noqa: BLE001 - a variant this stack cannot run is reported, not fatal
            log.exception("%s failed", name)
            failed.append({"variant": name, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"})
            continue
        log.info("%s: %.4f s/attr, %.1f TFLOP/s, rho mean %.4f min %.4f", name, row["s_per_attr"], row["tflops"],
                 row["spearman_mean"], row["spearman_min"])
        rows.append(row)

    if pool:
        pool.shutdown()
    kept = [r for r in rows if row_keeps_faithfulness(r, args.no_faithfulness)]
    best = min(kept, key=lambda r: r["s_per_attr"]) if kept else (rows[0] if rows else None)
    sweep: list[dict[str, Any]] = []
    if best is not None and args.batch_sizes:  # `--batch-sizes` with no values: the variants' table only
        model = fresh(max(args.batch_sizes), **dict(VARIANTS)[best["variant"]])
        warm_up_compiled(model, x.shape[-1])
        for bs in args.batch_sizes:
            run = lambda bs=bs: idg(model, x, "mean", targets, steps=50, probe_steps=50, batch_size=bs)  # noqa: E731
            seconds = _timed(run, device, args.repeats, warm=True)
            sweep.append({"variant": best["variant"], "batch_size": bs, "s_per_attr": seconds / len(files)})
            log.info("%s batch %d: %.4f s/attr", best["variant"], bs, seconds / len(files))

    label = args.label or f"gpu-variants-{args.model}"
    source: str = probe.source  # packaged:NAME, torchvision:ARCH:FILE|random, torchscript:PATH, ...
    weights_label = "packaged" if source.startswith("packaged:") else "random" if source.endswith(":random") else source
    meta = {"label": label, "date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": args.model, "weights": weights_label,
            "faithfulness": not args.no_faithfulness, "rise_step": args.rise_step,
            "pic_images": len(pic_todo) if args.pic else None,
            "images": len(files), "batch_size": args.batch_size, "forward_gflops": fwd / 1e9, "flops_per_attribution": flops_per_attr,
            "matmul_ceilings_tflops": ceilings, "kept": best["variant"] if best else None}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{label}.json").write_text(json.dumps({"meta": meta, "variants": rows, "failed": failed, "batch_sweep": sweep}, indent=1))
    (args.out / f"{label}.md").write_text(_markdown(meta, rows, failed, sweep))
    log.info("wrote %s/%s.{json,md}", args.out, label)
    return 0


def row_keeps_faithfulness(row: dict[str, Any], speed_only: bool) -> bool:
    """Faithfulness kept: both paired intervals against fp32 include 0 or favour the setting. Without
    faithfulness scores (random weights), the old pixel criterion: worst-image Spearman >= 0.99."""
    if speed_only or "insertion_vs_fp32" not in row:
        return bool(row["spearman_min"] >= 0.99)
    return keeps_faithfulness({m: Paired(*row[f"{m}_vs_fp32"]) for m in KEEP_METRICS})  # idg-calibrate's rule


def _paired_cell(v: list[float] | tuple[float, float, int] | None) -> str:
    if not v:
        return "n/a"
    mean, half = v[0], v[1]
    mark = "**" if abs(mean) > half else ""
    digits = 3 if max(abs(mean), half) >= 5e-4 else 6  # rounding-level differences (CPU memory formats) stay visible
    return f"{mark}{mean:+.{digits}f} ± {half:.{digits}f}{mark}"


def _markdown(meta: dict[str, Any], rows: list[dict[str, Any]], failed: list[dict[str, str]], sweep: list[dict[str, Any]]) -> str:
    c = meta["matmul_ceilings_tflops"]
    weights = f"{meta['weights']} weights" if meta["weights"] in ("packaged", "random") else meta["weights"]  # else the source
    lines = [f"# Speed settings, `{meta['model']}` ({weights})", "",
             f"Measured {meta['date']} on: {meta['machine'].get('gpu') or meta['machine'].get('cpu', '?')} "
             f"({meta['machine']['platform']}, torch {meta['machine']['torch']}).", "",
             f"IDG-50/50 on {meta['images']} sample images, evaluator batch {meta['batch_size']}; "
             f"{meta['forward_gflops']:.2f} GFLOP per forward pass (PyTorch's counter), "
             f"{meta['flops_per_attribution'] / 1e12:.2f} TFLOP per attribution.",
             (f"Measured 8192³ matrix-product ceilings: fp32 {c['fp32']:.0f}, tf32 {c['tf32']:.0f}, bf16 {c['bf16']:.0f} TFLOP/s."
              if not math.isnan(c["fp32"]) else "No matrix-product ceilings on the CPU (the share-of-ceiling column is nan)."), "",
             "Faithfulness against IEEE fp32, paired per image: mean of (setting − fp32) in insertion and deletion (RISE step "
             f"{meta.get('rise_step', 224)}, scored in the setting's own precision) ± half-width of the 95% interval, signed so that "
             "> 0 favours the setting (lower deletion is better); bold where the interval excludes 0. Secondary, pixel-level: "
             "Spearman rank correlation of the channel-summed maps (mean, worst image) and worst relative L2.", ""]
    pic = meta.get("pic_images") is not None
    if pic:
        lines[-1:] = [f"SIC and AIC (PIC, > 0 favours the setting) are paired on the images that fp32 predicts with confidence >= 0.8 "
                      f"({meta['pic_images']} of {meta['images']}), less any PIC skips; reported, not part of the keep rule.", ""]
    pic_head, pic_rule = (" SIC vs fp32 | AIC vs fp32 |", "---|---|") if pic else ("", "")
    lines += ["| variant | ms per attribution | attributions/s | speed-up vs fp32 | insertion vs fp32 | deletion vs fp32 |" + pic_head +
              " TFLOP/s | share of measured ceiling | peak MiB | first run s | Spearman mean (secondary) | Spearman min | rel. L2 max |",
              "|---|---|---|---|---|---|" + pic_rule + "---|---|---|---|---|---|---|"]
    base = rows[0]["s_per_attr"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['s_per_attr'] * 1e3:.1f} | {r['attr_per_s']:.1f} | {base / r['s_per_attr']:.2f}x | "
                     f"{_paired_cell(r.get('insertion_vs_fp32'))} | {_paired_cell(r.get('deletion_vs_fp32'))} | "
                     + (f"{_paired_cell(r.get('sic_vs_fp32'))} | {_paired_cell(r.get('aic_vs_fp32'))} | " if pic else "") +
                     f"{r['tflops']:.1f} | "
                     f"{r['share_of_measured_ceiling']:.1%} | {r['peak_mib']:.0f} | {r['first_run_s']:.1f} | {r['spearman_mean']:.4f} | "
                     f"{r['spearman_min']:.4f} | {r['rel_l2_max']:.3f} |")
    lines += [f"| {f['variant']} | failed: {f['error']} |" + " |" * (13 if pic else 11) for f in failed]
    rule = ("both paired intervals include 0 or favour it" if meta.get("faithfulness", False)
            else "worst-image Spearman >= 0.99 (no faithfulness scores: random weights)")
    lines += ["", f"Kept (fastest whose {rule}): **{meta['kept'] or 'none: every variant failed'}**."]
    if sweep:
        lines[-1] += " Evaluator batch sweep with it:"
        lines += ["", "| evaluator batch | ms per attribution |", "|---|---|"]
        lines += [f"| {s['batch_size']} | {s['s_per_attr'] * 1e3:.1f} |" for s in sweep]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
