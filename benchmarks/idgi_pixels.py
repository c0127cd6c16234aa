"""Which pixels IDGI moves: a straight-path row's map against its IDGI map from the same passes, photo by photo
(:func:`benchmarks.idgi_pixels.analyse`), as a markdown table.

    python -m benchmarks.idgi_pixels --images ../shared/data/imagenet-samples --limit 8 --row IDG

An experiment beside the evaluation: it parses the evaluation's row names and builds IDGI maps the way
:mod:`idg_evaluation.idgi_mix` does; its tables are in ``results/evaluation-rankmix/``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from idg_core.heatmap import saliency
from idg_core.methods import METHODS
from idg_core.metrics import deletion
from idg_core.model_calls import run_plans
from idg_core.postprocess.rankmix import ranks, with_idgi
from idg_core.postprocess.smoothgrad import noisy_copies, smooth_plan
from idg_core.types import Plan
from idg_evaluation.runner import parse_row, row_baseline
from idg_models import decode_image, image_files, load_entry, tune


def rank_shift(a: Tensor, b: Tensor, share: float = 0.1) -> dict[str, float]:
    """Where the top and bottom ``share`` of map ``a``'s pixels (``(H, W)`` saliencies) sit in ``b``'s order
    (mean rank in [0, 1]), how many of ``a``'s top are in ``b``'s top (overlap, [0, 1]), and the Spearman
    correlation of the two orders."""
    ra, rb = ranks(a).flatten(), ranks(b).flatten()
    top, bottom = ra >= 1.0 - share, ra < share
    rho = float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])
    return {"top_in_b": float(rb[top].mean()), "bottom_in_b": float(rb[bottom].mean()),
            "top_overlap": float((rb[top] >= 1.0 - share).double().mean()), "spearman": rho}


def _clustered(sal: Tensor, share: float) -> float:
    """Of the top ``share`` pixels of ``sal (H, W)``, the mean share of their 4 neighbours also in the top."""
    top = (ranks(sal) >= 1.0 - share).double()
    pad = torch.nn.functional.pad(top[None, None], (1, 1, 1, 1))[0, 0]
    around = pad[:-2, 1:-1] + pad[2:, 1:-1] + pad[1:-1, :-2] + pad[1:-1, 2:]
    return float((around[top > 0] / 4).mean())


def analyse(model: Any, x: Tensor, base: Tensor, pred: int, kw: dict[str, Any], share: float = 0.1) -> dict[str, float]:
    """One photo: a method's map (``kw``: its parameters and SmoothGrad's) against its IDGI map from the same passes:
    :func:`rank_shift` both ways, how clustered each map's top is, the share of each map's top whose signed
    attribution (Σ over channels) is negative, the same share among the method's top pixels that IDGI drops from its
    top and among those it keeps, how far each top's pixels are from the baseline (Σ_c |x - x'| over the image's mean:
    deletion puts the mean image, this table's baseline, in their place), and the deletion score
    left after each map's top 5, 10 and 20% are removed."""
    kw = dict(kw)
    kw.pop("postprocess", None)
    samples, std = int(kw.pop("smooth_samples", 0)), float(kw.pop("smooth_std", 0.15))
    method = kw.pop("method")

    def one(xi: Tensor) -> Plan:
        return with_idgi(METHODS[method].plan(xi, base, pred, **kw))

    plan = smooth_plan([one(xi) for xi in noisy_copies(x, samples, std, 0)]) if samples else one(x)
    (result,) = run_plans(model, [plan], 32)
    c = result.attributions.shape[1] // 2
    signed = [saliency(result.attributions[0, :c], signed=True), saliency(result.attributions[0, c:], signed=True)]
    own, idgi = signed[0].abs(), signed[1].abs()
    out = {f"idgi_vs_own_{k}": v for k, v in rank_shift(idgi, own, share).items()}
    out |= {f"own_vs_idgi_{k}": v for k, v in rank_shift(own, idgi, share).items() if k in ("top_in_b", "bottom_in_b")}
    own_top, idgi_top = ranks(own) >= 1.0 - share, ranks(idgi) >= 1.0 - share
    for name, moved in (("dropped", own_top & ~idgi_top), ("kept", own_top & idgi_top)):  # the method's top that IDGI drops or keeps
        out[f"own_{name}_negative"] = float((signed[0][moved] < 0).double().mean()) if moved.any() else float("nan")
    # how far from the baseline (the deletion's substrate, Σ_c |x - x'|, relative to the image's mean) the pixels are
    delta = (x - base).abs().sum(0).cpu().double()
    delta = delta / delta.mean().clamp_min(1e-12)
    for name, chosen in (("own_top", own_top), ("idgi_top", idgi_top), ("dropped", own_top & ~idgi_top), ("promoted", idgi_top & ~own_top)):
        out[f"{name}_delta"] = float(delta[chosen].mean()) if chosen.any() else float("nan")
    for name, s, sal in (("own", signed[0], own), ("idgi", signed[1], idgi)):
        top = ranks(sal) >= 1.0 - share
        out[f"{name}_top_negative"] = float((s[top] < 0).double().mean())
        out[f"{name}_clustered"] = _clustered(sal, share)
    p = model.preprocessing
    curves = deletion(model, x.unsqueeze(0).expand(2, -1, -1, -1), torch.stack([own, idgi]).to(x.device), substrate=p.mean, step=224)
    for name, curve in zip(("own", "idgi"), curves, strict=True):
        n = len(curve.y) - 1
        out[f"{name}_deletion"] = float(curve.auc)
        for frac in (0.05, 0.1, 0.2):
            out[f"{name}_left_{int(frac * 100)}"] = float(curve.y[round(frac * n)])
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.idgi_pixels --images DIR --limit N``: :func:`analyse` per photo, a markdown table."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--images", type=Path, required=True)
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--row", default="IDG", help="a straight-path row (its IDGI map is computed beside it), e.g. IDG or idg@fast+SmoothGrad")
    p.add_argument("--out", type=Path, default=None, help="write the table here too")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model = tune(load_entry("efficientnet_lite0", None, None, torch.device("cpu")), fold_bn=True, channels_last=True)
    method, kw = parse_row(args.row)
    rows = []
    for path in image_files(args.images)[: args.limit]:
        x = model.prepare(decode_image(path.read_bytes()))
        with torch.no_grad():
            pred = int(model(x.unsqueeze(0)).argmax())
        rows.append(analyse(model, x, row_baseline(model, x, "mean"), pred, {**kw, "method": method}))
        logging.info("%s: %s", path.name, {k: round(v, 3) for k, v in rows[-1].items()})
        lines = [f"{args.row} against its IDGI map (same passes), {len(rows)} photos, top/bottom share 10%: mean (min, max)", "",
                 "| measure | mean | min | max |", "|---|---|---|---|"]
        for key in rows[0]:
            v = np.array([r[key] for r in rows])
            lines.append(f"| {key} | {np.nanmean(v):.3f} | {np.nanmin(v):.3f} | {np.nanmax(v):.3f} |")
        text = "\n".join(lines) + "\n"
        if args.out:  # after every photo: a run stopped by its time limit keeps what it measured
            args.out.write_text(text)
    logging.getLogger(__name__).info("\n%s", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
