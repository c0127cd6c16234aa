"""Which pixels IDGI moves: a straight-path row's map against its IDGI map from the same passes, photo by photo
(:func:`idg_core.evaluation.idgi_mix.analyse`), as a markdown table.

    python -m idg_core.evaluation.idgi_pixels --images ../shared/data/imagenet-samples --limit 8 --row IDG

A command of its own, above the evaluation runner (whose rows it parses), so the runner can import
:mod:`idg_core.evaluation.idgi_mix` without a cycle.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch

from idg_core.evaluation.idgi_mix import analyse
from idg_core.evaluation.runner import _baseline, parse_row
from idg_core.models import decode_image, image_files, load_entry, tune


def main(argv: list[str] | None = None) -> int:
    """``python -m idg_core.evaluation.idgi_pixels --images DIR --limit N``: :func:`analyse` per photo, a markdown table."""
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
        rows.append(analyse(model, x, _baseline(model, x, "mean"), pred, {**kw, "method": method}))
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
