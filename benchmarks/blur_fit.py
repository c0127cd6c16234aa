"""The blur control's σ: the Gaussian blur (pixels) that brings IDG's map closest to IDG+SmoothGrad's,
by Pearson correlation of the saliency maps, over a few photos.

    python -m benchmarks.blur_fit --images ../shared/data/imagenet-samples --limit 4
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from idg_core.heatmap import saliency
from idg_core.methods.eg import gaussian_blur
from idg_core.model_calls import run_plans
from idg_core.paths import resolve_baseline
from idg_core.postprocess import build_plan
from idg_models import ImageClassifier, decode_image, image_files, keep_freed_memory, load_entry, tune

log = logging.getLogger(__name__)
SIGMAS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)


def fit(
    model: ImageClassifier, images: list[Path], idg: dict[str, Any], smooth: dict[str, Any], batch_size: int,
) -> dict[float, list[float]]:
    """For each σ of :data:`SIGMAS`, the correlation per image of blurred-IDG and IDG+SmoothGrad saliency."""
    out: dict[float, list[float]] = {s: [] for s in SIGMAS}
    for path in images:
        x = model.prepare(decode_image(path.read_bytes()))
        with torch.no_grad():
            pred = int(model(x.unsqueeze(0)).argmax())
        base = resolve_baseline("mean", x.unsqueeze(0), model.preprocessing.mean)[0]
        plain, smoothed = run_plans(model, [build_plan("idg", x, base, pred, **idg), build_plan("idg", x, base, pred, **idg, **smooth)],
                                    batch_size)
        target = saliency(smoothed.attributions[0]).flatten().numpy()
        for s in SIGMAS:
            mine = saliency(gaussian_blur(plain.attributions[0], s)).flatten().numpy()
            out[s].append(float(np.corrcoef(mine, target)[0, 1]))
        log.info("%s: %s", path.name, {s: round(v[-1], 3) for s, v in out.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--model", default="efficientnet_lite0")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=50, help="IDG's main steps (the evaluation's IDG+SmoothGrad: 50)")
    p.add_argument("--probe-steps", type=int, default=50)
    p.add_argument("--out", type=Path, default=Path("results/evaluation-quality/blur_fit.md"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    keep_freed_memory()
    model = tune(load_entry(args.model, None, None, torch.device("cpu")), precision="fp32")
    idg, smooth = {"steps": args.steps, "probe_steps": args.probe_steps}, {"smooth_samples": 10, "smooth_std": 0.15}
    scores = fit(model, image_files(args.images)[: args.limit], idg, smooth, args.batch_size)
    best = max(SIGMAS, key=lambda s: float(np.mean(scores[s])))
    lines = [f"# Blur control: σ fitted to IDG+SmoothGrad ({args.model}, {len(scores[0.0])} photos)", "",
             f"IDG {idg}, SmoothGrad {smooth}; Pearson correlation of |Σ_c| saliency maps, IDG blurred by σ pixels "
             "against IDG+SmoothGrad, mean over photos.", "", "| σ (px) | correlation |", "|---|---|",
             *(f"| {s:g} | {np.mean(scores[s]):.3f} |" for s in SIGMAS), "", f"Best: σ = {best:g}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    log.info("best sigma %g; wrote %s", best, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
