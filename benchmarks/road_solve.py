"""ROAD's linear imputation: seconds per solve, the nested-dissection factorisation against the plain
``spsolve`` it replaced, on a real 224² sample photo, in the same run (interleaved, median of repeats).

Masks: the photo's blurred gradient magnitude (a stand-in for an attribution map: removals in large
connected regions, like a real map's) and a uniform random map, each MoRF and LeRF, at several levels.
One solve = one image and level, all three channels (what ``road`` does 18 times per row and image).

    python -m benchmarks.road_solve --image ../shared/data/imagenet-samples/n01440764_tench.JPEG
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from idg_core.metrics.road import impute_one, removal_masks, spsolve_impute
from idg_core.preprocess import resize_crop, to_tensor

log = logging.getLogger("benchmarks.road_solve")


def _seconds(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def run(image: Path, levels: list[float], repeats: int) -> list[dict[str, float | str]]:
    """One row per (map, order, level): median seconds of each solver and their max abs difference."""
    img = to_tensor(resize_crop(Image.open(image).convert("RGB"), 256, 224)).double().numpy()
    gray = img.mean(0)
    maps = {"edges": ndimage.gaussian_filter(np.hypot(ndimage.sobel(gray, 0), ndimage.sobel(gray, 1)), 4),
            "uniform": np.random.default_rng(0).random(gray.shape)}
    rows: list[dict[str, float | str]] = []
    for name, sal in maps.items():
        for most_first in (True, False):
            masks = removal_masks(torch.from_numpy(sal)[None], levels, most_first)[0].numpy()
            for level, keep in zip(levels, masks, strict=True):
                before, after, diff = [], [], 0.0
                for _ in range(repeats):  # interleaved: both see the same load
                    t0, ref = _seconds(partial(spsolve_impute, img, keep))
                    t1, new = _seconds(partial(impute_one, img, keep))
                    before.append(t0)
                    after.append(t1)
                    diff = max(diff, float(np.abs(new - ref).max()))
                row: dict[str, float | str] = {"map": name, "order": "MoRF" if most_first else "LeRF", "level": level,
                                               "unknowns": float((~keep).sum()), "spsolve_s": statistics.median(before),
                                               "dissection_s": statistics.median(after), "max_abs_diff": diff}
                rows.append(row)
                log.info("%s", row)
    return rows


def render(rows: list[dict[str, float | str]]) -> str:
    lines = ["| map | order | removed | unknowns | spsolve (s) | dissection LU (s) | speed-up | max abs diff |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        before, after = float(r["spsolve_s"]), float(r["dissection_s"])
        lines.append(f"| {r['map']} | {r['order']} | {float(r['level']):.0%} | {int(float(r['unknowns']))} | {before:.3f} | "
                     f"{after:.3f} | {before / after:.1f}× | {float(r['max_abs_diff']):.1e} |")
    total_before = sum(float(r["spsolve_s"]) for r in rows)
    total_after = sum(float(r["dissection_s"]) for r in rows)
    lines += ["", f"All {len(rows)} solves: {total_before:.2f} s → {total_after:.2f} s ({total_before / total_after:.1f}×); "
              f"max abs diff {max(float(r['max_abs_diff']) for r in rows):.1e} (pixels in [0, 1])."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", type=Path, default=Path("../shared/data/imagenet-samples/n01440764_tench.JPEG"))
    p.add_argument("--levels", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    table = render(run(args.image, args.levels, args.repeats))
    if args.out:
        args.out.write_text(table + "\n")
    log.info("\n%s", table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
