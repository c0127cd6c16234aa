"""What the saliency's definition changes in RISE insertion and deletion: the same attributions ranked by Σ_c |a| (the
metrics' definition, the code's since 2026-11-27) and by |Σ_c a| (the code's before), paired per photo with 95%
intervals, for IDG at the service's defaults and IG-50. Whether IDG's lead over IG holds under both is the question;
the committed faithfulness tables ranked by |Σ_c a|.

    python -m benchmarks.saliency_definitions --images ../shared/data/imagenet-samples --out results/saliency-definitions
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.speed import SAMPLES, machine, sample_batch
from idg_core import idg, ig
from idg_core.budget import pixels_per_step
from idg_core.metrics import deletion, insertion
from idg_core.metrics.curves import mean_ci
from idg_models import load_entry, tuned

log = logging.getLogger(__name__)

DEFINITIONS = {"sum of magnitudes": lambda a: a.abs().sum(1), "magnitude of the sum": lambda a: a.sum(1).abs()}
"""``(B, C, H, W)`` attributions -> ``(B, H, W)`` saliency, by each definition."""


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model = tuned(load_entry(args.model, None, None, torch.device("cpu")))
    x, targets, files = sample_batch(model, args.images, args.count)
    step = pixels_per_step(x.shape[-2], x.shape[-1], args.rise_steps)
    maps = {"IDG (service defaults)": idg(model, x, "mean", targets, batch_size=args.batch_size).attributions,
            "IG-50": ig(model, x, "mean", targets, steps=50, batch_size=args.batch_size).attributions}
    scores: dict[str, dict[str, dict[str, list[float]]]] = {}
    for method, a in maps.items():
        for name, define in DEFINITIONS.items():
            sal = define(a.float())
            scores.setdefault(method, {})[name] = {
                "insertion": [c.auc for c in insertion(model, x, sal, step=step, batch_size=args.batch_size)],
                "deletion": [c.auc for c in deletion(model, x, sal, step=step, batch_size=args.batch_size)]}
            log.info("%s, %s: done", method, name)
    return {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": args.model, "images": [f.name for f in files],
            "rise_steps": args.rise_steps, "scores": scores}


def render(data: dict[str, Any]) -> str:
    m, s = data["machine"], data["scores"]
    lines = [f"# Saliency definitions in RISE insertion and deletion ({data['model']}, {len(data['images'])} photos)", "",
             f"Measured {data['date']} on: {m.get('gpu', m.get('cpu'))} ({m['platform']}, torch {m['torch']}); "
             f"{data['rise_steps']} RISE steps; ± is the half-width of the 95% interval, paired per photo.", "",
             "| method | metric | Σ_c \\|a\\| (defined) | \\|Σ_c a\\| (before) | paired: defined − before |", "|---|---|---|---|---|"]
    for method, by in s.items():
        for metric in ("insertion", "deletion"):
            new, old = by["sum of magnitudes"][metric], by["magnitude of the sum"][metric]
            (mn, hn, _), (mo, ho, _) = mean_ci(new), mean_ci(old)
            d, hd, n = mean_ci([a - b for a, b in zip(new, old, strict=True)])
            lines.append(f"| {method} | {metric} | {mn:.3f} ± {hn:.3f} | {mo:.3f} ± {ho:.3f} | {d:+.3f} ± {hd:.3f} (n={n}) |")
    lines += ["", "IDG against IG-50, paired per photo (> 0 favours IDG: insertion higher, deletion lower):", "",
              "| ranking | insertion | deletion |", "|---|---|---|"]
    idg_, ig_ = s["IDG (service defaults)"], s["IG-50"]
    for name, label in (("sum of magnitudes", "Σ_c \\|a\\| (defined)"), ("magnitude of the sum", "\\|Σ_c a\\| (before)")):
        ins = mean_ci([a - b for a, b in zip(idg_[name]["insertion"], ig_[name]["insertion"], strict=True)])
        dele = mean_ci([b - a for a, b in zip(idg_[name]["deletion"], ig_[name]["deletion"], strict=True)])
        lines.append(f"| {label} | {ins[0]:+.3f} ± {ins[1]:.3f} | {dele[0]:+.3f} ± {dele[1]:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="efficientnet_lite0")
    ap.add_argument("--images", type=Path, default=SAMPLES)
    ap.add_argument("--count", type=int, default=65)
    ap.add_argument("--rise-steps", type=int, default=28, help="RISE steps (the service's faithfulness score's default)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("results/saliency-definitions"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    data = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "saliency-definitions.json").write_text(json.dumps(data, indent=1))
    (args.out / "README.md").write_text(render(data))
    print(render(data))  # noqa: T201 - the table is the command's output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
