"""Evaluate methods × metrics over a folder of images (resumable), then write the report.

    python -m idg_evaluation --images ../shared/data/imagenet-samples --out results/evaluation
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from idg_core.preprocess import IMAGE_SUFFIXES
from idg_evaluation.cost import COST_GRID, REFERENCES, cost_grid, write_cost_report
from idg_evaluation.report import merge_earlier, write_report
from idg_evaluation.runner import (
    ABLATION,
    ALL_METRICS,
    MAIN_METHODS,
    RIVALS,
    VARIANTS,
    WITH_ROAD,
    EvalConfig,
    evaluate_folder,
    parse_row,
)
from idg_models import PRECISIONS, image_files, keep_freed_memory, load_entry, tune
from idg_models.cli_args import count
from idg_models.cli_args import device as cli_device


def _machine() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu} ({torch.get_num_threads()} threads{gpu}), torch {torch.__version__}"


def _images_error(folder: Path) -> str | None:
    """Why ``folder`` is not a folder of photos to evaluate (it does not exist, is a file, holds none), or None."""
    if not folder.exists():
        return f"--images {folder} does not exist"
    if not folder.is_dir():
        return f"--images {folder} is not a folder"
    try:
        found = image_files(folder)
    except OSError as err:
        return f"--images {folder} cannot be read: {err.strerror or err}"
    if not found:
        return f"--images {folder} holds no photos ({', '.join(IMAGE_SUFFIXES)})"
    return None


def _out_error(out: Path) -> str | None:
    """Why the folder ``out`` can neither be used nor made (a file, under a file, not writable), or None; makes nothing."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder"
    here = out.absolute()
    while not here.exists():
        here = here.parent
    if not here.is_dir():
        return f"--out {out} cannot be made: {here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"--out {out} cannot be {'written' if here == out.absolute() else 'made'}: {here} is not writable"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="idg-evaluate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=Path, required=True,
                   help="folder of JPEG/PNG photos; a WNID_* name gives an ImageNet model's label (for Top-1 only)")
    p.add_argument("--out", type=Path, default=Path("results/evaluation"))
    p.add_argument("--model", default="efficientnet_lite0",
                   help="a packaged name, a torchvision ARCH (file from --weights), or any IDG_MODELS entry "
                        "(NAME=torchscript:PATH, NAME=timm:ARCH:PATH, NAME=hf:FOLDER, ...): evaluate your own model")
    p.add_argument("--weights", default=None, help="weights file for a bare torchvision ARCH")
    p.add_argument("--models-file", type=Path, default=None,
                   help="the service's IDG_MODELS_FILE: input size, mean, std and labels for a NAME=SOURCE entry")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--suite", default="paper", choices=["paper", "cost"],
                   help="paper: the paper's methods and ablation with all four metrics; cost: IDG and IG over a grid of "
                        "step counts, insertion and deletion only (the table the presets come from)")
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"paper suite: rows by name ({', '.join([*MAIN_METHODS, *ABLATION, *VARIANTS, *RIVALS])}) or composed, "
                        "BASE[+IDGI][+SmoothGrad][+XRAI|+cam_regions|+cam_product][+Blur][:key=value,...] with BASE a row, a method "
                        "or method@preset (e.g. IDG+IDGI+SmoothGrad EG LA idg@fast+SmoothGrad:smooth_samples=8 idg@fast+XRAI "
                        "idg@fast+cam_regions); cost suite: rows of its grid "
                        f"({', '.join(REFERENCES.get(n, n) for n in COST_GRID)}; IG-50 and IDG-50/50 are always kept)")
    p.add_argument("--no-ablation", action="store_true", help="main comparison only")
    p.add_argument("--no-road", action="store_true", help="skip ROAD (2 x 9 sparse solves and forward passes per row and image)")
    p.add_argument("--limit", type=count(1), default=None, help="first N images only")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="only the images at positions K, K+N, K+2N, ... (0 <= K < N): several processes share one cache, "
                        "each its own images, with the seeds one run would use; run once more without --shard for the report")
    p.add_argument("--report-only", action="store_true",
                   help="write the report from the images already in the cache (a run still going on: 'N of M images'); "
                        "evaluate nothing")
    p.add_argument("--workers", type=count(0), default=2, help="processes for PIC's rebuilds (0 or 1: inline)")
    p.add_argument("--batch-size", type=count(1), default=32)
    p.add_argument("--rise-step", type=count(1), default=224, help="pixels per insertion/deletion step (default 224)")
    p.add_argument("--pic-min-confidence", type=float, default=0.8)
    p.add_argument("--baseline", default="mean", choices=["mean", "black"],
                   help="mean: the model's normalisation mean (zero in its normalised space), as the service's default")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS, help="fp32 is IEEE (no TF32) also on CUDA")
    p.add_argument("--fold-bn", action="store_true", help="fold batch norm into the convolutions, as the service does")
    p.add_argument("--channels-last", action="store_true", help="channels-last memory format (the service's CPU default)")
    p.add_argument("--pair-with", type=Path, default=None,
                   help="an earlier run's per_image.csv with the same model and settings: its other methods (e.g. IDG, AGI) "
                        "join the report, paired by image, without being computed again")
    args = p.parse_args(argv)
    shard = None
    if args.shard:
        k, slash, n = args.shard.partition("/")
        if not (slash and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
            p.error(f"--shard must be K/N with 0 <= K < N, got {args.shard!r}")
        shard = (int(k), int(n))
    # before the model loads (a minute for a large one), so a wrong path fails at once, without a traceback
    for problem in (_images_error(args.images), _out_error(args.out)):
        if problem:
            p.error(problem)
    if args.pair_with is not None and not args.pair_with.is_file():
        p.error(f"--pair-with {args.pair_with} is not a file (an earlier run's per_image.csv)")
    try:
        device = cli_device(args.device)
    except ValueError as err:
        p.error(str(err))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    keep_freed_memory()  # as the service does by default: fewer page faults on the CPU, same results
    metrics: tuple[str, ...]
    if args.suite == "cost":
        try:
            chosen, metrics = cost_grid(args.methods), ("insertion", "deletion")
        except ValueError as exc:
            p.error(str(exc))
    else:
        default = [*MAIN_METHODS, *([] if args.no_ablation else ABLATION)]
        try:
            chosen = {n: parse_row(n) for n in (args.methods or default)}
        except ValueError as exc:
            p.error(str(exc))
        metrics = ALL_METRICS if args.no_road else WITH_ROAD
    cfg = EvalConfig(model=args.model, methods=chosen, baseline=args.baseline, rise_step=args.rise_step,
                     pic_min_confidence=args.pic_min_confidence, batch_size=args.batch_size, precision=args.precision,
                     metrics=metrics, fold_bn=args.fold_bn, channels_last=args.channels_last)
    try:
        model = tune(load_entry(args.model, args.weights, args.models_file, device), precision=args.precision,
                     fold_bn=args.fold_bn, channels_last=args.channels_last)
    except (ValueError, OSError, ImportError, RuntimeError) as err:  # an unknown name, a missing file, a models file in error
        p.exit(2, f"{p.prog}: error: --model {args.model} could not be loaded: {err}\n")
    images = image_files(args.images)
    total = len(images)
    images = images[: args.limit] if args.limit else images
    records = evaluate_folder(model, images, args.out, cfg, workers=args.workers, shard=shard, compute=not args.report_only)
    if args.report_only and not records:
        p.error("no image is cached for these settings yet: nothing to report")
    if shard:
        logging.getLogger("idg_evaluation").info("shard %s done (%d images): run again without --shard for the report",
                                                      args.shard, len(records))
        return 0
    speed = "".join(f", {flag}" for flag, on in (("batch norm folded", args.fold_bn), ("channels-last", args.channels_last)) if on)
    machine, date = f"{_machine()}, precision {args.precision}{speed}", time.strftime("%Y-%m-%d")
    if args.suite == "cost":
        command = " ".join(["python -m idg_evaluation", *(sys.argv[1:] if argv is None else argv)])
        path = write_cost_report(records, args.out, machine=machine, date=date, model=args.model, rise_step=args.rise_step,
                                 command=command)
    else:
        earlier = (args.pair_with, merge_earlier(records, args.pair_with)) if args.pair_with else None
        path = write_report(records, args.out, machine=machine, date=date, model=args.model, total_images=total, earlier=earlier)
    logging.getLogger("idg_evaluation").info("wrote %s", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
