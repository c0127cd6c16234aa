"""Command line on top of the client, for shell users and CI smoke tests.

    python -m app.cli predict photo.jpg
    python -m app.cli attribute photo.jpg --method idg --steps 50 --out heatmap.png [--overlay overlay.png]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import httpx

from app.client import Client, ServiceError

log = logging.getLogger("idg")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="idg-client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=os.environ.get("IDG_URL", "http://127.0.0.1:8000"), help="the service (default: $IDG_URL or http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=os.environ.get("IDG_API_KEY"))
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="top-k classes")
    pr.add_argument("image", type=Path)
    pr.add_argument("--model")
    pr.add_argument("--top-k", type=int, default=5)
    pr.add_argument("--explain-if", help="explain the prediction when this holds, e.g. 'confidence < 0.6'")
    at = sub.add_parser("attribute", help="heatmap and logit-α curve")
    at.add_argument("image", type=Path)
    at.add_argument("--model")
    at.add_argument("--method", default="idg")
    at.add_argument("--target", type=int)
    at.add_argument("--preset", choices=["fast", "paper", "quality"], help="cost preset (default: the service's, fast)")
    at.add_argument("--steps", type=int)
    at.add_argument("--probe-steps", type=int)
    at.add_argument("--baseline", choices=["mean", "black"])
    at.add_argument("--faithfulness", help="score the map: insertion, deletion or insertion,deletion")
    at.add_argument("--postprocess", choices=["none", "idgi"])
    at.add_argument("--smooth-samples", type=int, help="SmoothGrad over this many noisy copies")
    at.add_argument("--out", type=Path, default=Path("heatmap.png"), help="heatmap PNG to write")
    at.add_argument("--overlay", type=Path, help="also write the overlay PNG here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = sys.stdout
    try:
        with Client(args.url, api_key=args.api_key) as client:
            if args.command == "predict":
                res = client.predict(args.image, model=args.model, top_k=args.top_k, explain_if=args.explain_if)
                for s in res.top_k:
                    out.write(f"{s.index:4d}  {s.probability:.4f}  {s.name}\n")
                if res.raw.get("explained") is not None:
                    ex = res.explanation
                    which = f"; {ex.method} explanation of class {ex.target.index}" if ex else ""
                    out.write(f"explain_if held: {res.raw['explained']}{which}\n")
                return 0
            a = client.attribute(args.image, method=args.method, model=args.model, target=args.target, preset=args.preset, steps=args.steps,
                                 probe_steps=args.probe_steps, baseline=args.baseline, return_overlay=args.overlay is not None,
                                 faithfulness=args.faithfulness, postprocess=args.postprocess, smooth_samples=args.smooth_samples)
    except ServiceError as err:
        sys.stderr.write(f"error {err.status}: {err.message}\n")
        return 1
    except httpx.TransportError as err:  # refused, unreachable, timed out: one line, no traceback
        sys.stderr.write(f"error: could not reach the service at {args.url} ({type(err).__name__}); "
                         "start it (make run) or point --url / IDG_URL at it\n")
        return 2
    except OSError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    assert a.heatmap is not None
    a.heatmap.save(args.out)
    if args.overlay and a.overlay is not None:
        a.overlay.save(args.overlay)
    out.write(f"{a.model} {a.method}: class {a.target.index} {a.target.name} (p={a.target.probability:.4f}); heatmap -> {args.out}\n")
    if a.faithfulness:
        out.write("faithfulness: " + ", ".join(f"{k} {v:.3f}" for k, v in a.faithfulness.items() if k != "steps" and v is not None)
                  + f" ({a.faithfulness['steps']} steps)\n")
    c = a.curve
    out.write(f"alpha\t{c.output}\timportance\tweight\n")
    for i in range(len(c.alphas)):
        imp = f"{c.importance[i]:.5g}" if len(c.importance) else ""
        w = f"{c.weights[i]:.5g}" if len(c.weights) else ""
        out.write(f"{c.alphas[i]:.5f}\t{c.values[i]:.5g}\t{imp}\t{w}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
