"""Attribute one photo with a real pretrained model and write the heatmap, overlay and curve.

    python -m idg_models.demo IMAGE [--model efficientnet_lite0] [--method idg] [--out out/demo]
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from idg_core import METHODS, heatmap_png, overlay_png
from idg_models import decode_image, load_model

log = logging.getLogger("idg_models.demo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("image", type=Path)
    parser.add_argument("--model", default="efficientnet_lite0")
    parser.add_argument("--weights", default=None, help="local weights file for torchvision architectures")
    parser.add_argument("--method", default="idg", choices=sorted(METHODS))
    parser.add_argument("--baseline", default="mean", choices=["mean", "black"])
    parser.add_argument("--target", type=int, default=None, help="class index (default: the predicted class)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    model = load_model(args.model, args.weights)
    x = model.prepare(decode_image(args.image.read_bytes())).unsqueeze(0)
    with torch.no_grad():
        probs = torch.softmax(model(x), 1)[0]
    target = int(probs.argmax()) if args.target is None else args.target
    log.info("%s: predicted %s (%.3f); explaining class %d %s", args.image.name, model.class_names[int(probs.argmax())],
             float(probs.max()), target, model.class_names[target])
    started = time.perf_counter()
    res = METHODS[args.method](model, x, args.baseline, target)
    seconds = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "heatmap.png").write_bytes(heatmap_png(res.attributions[0]))
    (args.out / "overlay.png").write_bytes(overlay_png(x[0], res.attributions[0]))
    curve = {
        "model": model.name, "method": args.method, "target": target, "class_name": model.class_names[target],
        "seconds": round(seconds, 3), "forward_passes": res.forward_passes, "backward_passes": res.backward_passes,
        "probe_alphas": res.probe_alphas.tolist(), "probe_logits": res.probe_values[0].tolist() if res.probe_values.numel() else [],
        "alphas": res.alphas[0].tolist() if res.alphas.numel() else [], "logits": res.values[0].tolist() if res.values.numel() else [],
        "importance": res.importance[0].tolist() if res.importance.numel() else [],
        "weights": res.weights[0].tolist() if res.weights.numel() else [],
    }
    (args.out / "curve.json").write_text(json.dumps(curve, indent=1))
    log.info("%s took %.2f s (%d forward, %d backward passes); wrote %s/{heatmap,overlay}.png and curve.json",
             args.method, seconds, res.forward_passes, res.backward_passes, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
