"""IDG at the paper's cost (50 probe + 50 main points) per attribution, the four ways the library can run a model
on a GPU, in one run on the same images (issue #48's "IDG-50/50 ResNet-101 bf16 <= 12 ms" target):

- ``eager``: the tuned model (precision, channels-last, folded batch norm) called as it is;
- ``graphs``: the same model with each call size replayed as a CUDA graph (:func:`idg_models.cuda_graphs.graphed_shapes`);
- ``compiled``: ``torch.compile`` (inductor) at the call sizes (:mod:`idg_models.compiled`), its compile time reported;
- ``compiled+graphs``: the compiled model's calls captured as CUDA graphs;
- ``fused``: eager with each convolution, its bias, residual add and ReLU one cuDNN kernel
  (:func:`idg_models.fuse.fuse_conv_add_relu`; PyTorch's separate operations on the CPU), ``fused+graphs`` captured.

Every variant's attributions are compared with eager's (cosine per image), so a faster path that answers differently
shows; at a precision below fp32 also with the same model's in IEEE fp32 (``--fp32-reference``, one untimed run), so a
variant that answers otherwise than eager but no further from the exact function than eager does shows as such.
``--profile`` adds where eager's time goes: the model's own passes timed alone at the call size (a forward,
a forward with the input's gradient) against the IDG they add up to (the rest is IDG's own work between calls), and
the kernels (CUDA; aten operators on the CPU) of one profiled run, largest first. Writes ``<out>/<label>.json`` and ``.md``.

    python -m benchmarks.paper_speed --model resnet101 --weights random --precision bf16   (CUDA)
    python -m benchmarks.paper_speed --variants eager --profile   (where eager's 17 ms go: passes, IDG's own work, kernels)
    python -m benchmarks.paper_speed --dry-run   (the CPU, a light CNN: every variant but the graphs, for the script only)
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.functional import cosine_similarity

from benchmarks.speed import SAMPLES, _timed, machine, sample_batch
from idg_core import idg
from idg_core.model_calls import CallStats, RowSelect, run_call
from idg_models import PRECISIONS, default_channels_last, load_entry, tune
from idg_models.compiled import warm_up_compiled
from idg_models.cuda_graphs import graphed_shapes
from idg_models.fuse import fuse_conv_add_relu

log = logging.getLogger(__name__)

VARIANTS = ("eager", "graphs", "compiled", "compiled+graphs", "fused", "fused+graphs")


def _variant(args: argparse.Namespace, variant: str, eager: Any, tuned: Callable[[bool], Any], x: Tensor, targets: list[int],
             device: torch.device) -> tuple[dict[str, Any], Tensor | None]:
    """One variant's row (its time per attribution and set-up) and its attributions (None: it could not run)."""
    started = time.perf_counter()
    model = eager
    if variant.startswith("compiled"):
        model = tuned(True)
        warm_up_compiled(model, int(x.shape[-1]))
    if variant.startswith("fused"):
        model = copy.deepcopy(eager)
        model.net, fused = fuse_conv_add_relu(model.net, model.autocast_dtype)
        log.info("%s: %d convolutions fused", variant, fused)
    shapes = graphed_shapes(model, (args.batch_size,), int(x.shape[-1]), device) if "graphs" in variant else None
    if shapes is not None and not shapes.graphs:
        return {"variant": variant, "error": "the model could not be captured (see the log)"}, None
    setup_s = time.perf_counter() - started

    def run() -> Tensor:
        return idg(model, x, "mean", targets, steps=args.steps, probe_steps=args.probe_steps, batch_size=args.batch_size,
                   shapes=shapes).attributions

    seconds = _timed(run, device, args.repeats, warm=True)
    return {"variant": variant, "ms_per_attribution": 1000 * seconds / len(targets), "setup_s": setup_s}, run().float().flatten(1)


def _passes(model: Any, x: Tensor, targets: list[int], args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Eager's time split: the model's passes alone at calls of ``batch_size`` rows (points on one image's path, as IDG
    sends them) against one IDG run's rows of each kind, and the kernels of a profiled IDG run."""
    stats = CallStats()
    idg(model, x, "mean", targets, steps=args.steps, probe_steps=args.probe_steps, batch_size=args.batch_size, stats=stats)
    alphas = torch.linspace(0, 1, args.batch_size, device=device).view(-1, 1, 1, 1)
    inputs = (alphas * x[:1]).contiguous()
    rows = RowSelect(torch.full((args.batch_size,), targets[0], dtype=torch.long, device=device), None, targets[0])
    forward_s = _timed(lambda: run_call(model, inputs, rows, False), device, args.repeats, warm=True)
    gradient_s = _timed(lambda: run_call(model, inputs, rows, True), device, args.repeats, warm=True)
    forward_rows = stats.forward_images - stats.backward_images
    passes_ms = 1000 * (forward_rows * forward_s + stats.backward_images * gradient_s) / args.batch_size / len(targets)
    return {"calls": stats.calls, "forward_rows": forward_rows, "gradient_rows": stats.backward_images,
            "forward_ms_per_row": 1000 * forward_s / args.batch_size, "gradient_ms_per_row": 1000 * gradient_s / args.batch_size,
            "passes_ms_per_attribution": passes_ms,
            "kernels": _kernels(lambda: idg(model, x, "mean", targets, steps=args.steps, probe_steps=args.probe_steps,
                                            batch_size=args.batch_size), device, len(targets), args.top)}


def _kernels(run: Callable[[], Any], device: torch.device, images: int, top: int) -> dict[str, Any]:
    """One profiled run: the device's busy time (CUDA kernels' own time, aten operators' on the CPU) per attribution
    against the run's wall time, and the ``top`` kernels by their time."""
    from torch.profiler import ProfilerActivity, profile

    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - started
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        on_device = e.device_type == torch.autograd.DeviceType.CUDA
        if device.type == "cuda" and not on_device:
            continue
        if device.type != "cuda" and not e.name.startswith("aten::"):
            continue
        us = e.self_device_time_total if on_device else e.self_cpu_time_total
        row = by_name.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += us
    busy_us = sum(v[1] for v in by_name.values())
    largest = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"wall_ms_per_attribution": 1000 * wall_s / images, "busy_ms_per_attribution": busy_us / 1000 / images,
            "top": [{"name": name, "count": int(n), "ms_per_attribution": us / 1000 / images, "share": us / busy_us if busy_us else 0.0}
                    for name, (n, us) in largest]}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    models_file = Path(args.models_file) if args.models_file else None
    channels_last = default_channels_last(device, args.precision)

    def tuned(compile_: bool, precision: str = args.precision, channels_last: bool = channels_last) -> Any:
        """The same network each time (random weights drawn from one seed), tuned as asked."""
        torch.manual_seed(0)
        loaded = load_entry(args.model, args.weights, models_file).to(device).eval()
        return tune(loaded, precision=precision, channels_last=channels_last, fold_bn=True, compile=compile_,
                    compile_sizes=(args.batch_size,))

    eager = tuned(False)
    images, targets, _ = sample_batch(eager, args.images, args.count)
    x = images.to(device)
    rows: list[dict[str, Any]] = []
    answers: dict[str, Tensor] = {}
    reference: tuple[str, Tensor] | None = None  # the first variant that ran (eager when it did): what the cosines compare with
    for variant in args.variants:
        if "graphs" in variant and device.type != "cuda":
            log.info("%s: no CUDA here, skipped", variant)
            continue
        try:
            row, got = _variant(args, variant, eager, tuned, x, targets, device)
        except Exception as err:  # noqa: BLE001 - an out-of-memory size is a row of the table; so is a way that fails after
            # the reference ran (a fused kernel this cuDNN lacks, say): its error is in the table, the other rows stay
            if _out_of_memory(err):
                row, got = {"variant": variant, "error": f"CUDA out of memory at calls of {args.batch_size} rows"}, None
            elif reference is None:
                raise
            else:
                log.exception("%s failed", variant)
                first_line = (str(err).splitlines() or [""])[0][:160]
                row, got = {"variant": variant, "error": f"failed: {type(err).__name__}: {first_line}"}, None
        finally:  # the variant's model, graphs and their memory pool go before the next one's (a compiled model holds a cycle)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if got is not None:
            answers[variant] = got
            reference = reference or (variant, got)
            cos = cosine_similarity(got, reference[1])
            row |= {"cosine_to_first_min": float(cos.min()), "cosine_to_first_mean": float(cos.mean())}
            log.info("%s: %.2f ms per attribution (set-up %.1f s), cosine to %s >= %.4f", variant, row["ms_per_attribution"],
                     row["setup_s"], reference[0], row["cosine_to_first_min"])
        rows.append(row)
    passes = _passes(eager, x, targets, args, device) if args.profile else None
    if args.fp32_reference and args.precision != "fp32" and answers:
        # the exact function's answers: the same network in IEEE fp32 (TF32 off, process-wide: the last run here), untimed
        exact = idg(tuned(False, "fp32", False), x, "mean", targets, steps=args.steps, probe_steps=args.probe_steps,
                    batch_size=args.batch_size).attributions.float().flatten(1)
        for row in rows:
            if row["variant"] in answers:
                cos = cosine_similarity(answers[row["variant"]], exact)
                row |= {"cosine_to_fp32_min": float(cos.min()), "cosine_to_fp32_mean": float(cos.mean())}
    return {"passes": passes, "label": args.label, "date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": args.model,
            "weights": args.weights, "precision": args.precision, "channels_last": channels_last, "device": str(device),
            "images": len(targets), "batch_size": args.batch_size, "steps": args.steps, "probe_steps": args.probe_steps,
            "repeats": args.repeats, "cosine_reference": reference[0] if reference else None, "rows": rows}


def _out_of_memory(err: BaseException | None) -> bool:
    """Whether ``err`` is CUDA running out of memory, or wraps it (inductor re-raises a compile's errors as its own)."""
    while err is not None:
        if isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower():
            return True
        err = err.__cause__ or err.__context__
    return False


def render(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [f"# IDG-{data['probe_steps']}/{data['steps']} per attribution: `{data['label']}`", "",
             f"Measured {data['date']} on: {m.get('gpu', m.get('cpu'))} ({m['platform']}, Python {m['python']}, torch {m['torch']}).", "",
             f"Model {data['model']} ({data['weights']} weights), {data['device']}, {data['precision']}, channels-last "
             f"{data['channels_last']}, batch norm folded, cuDNN benchmark {data.get('cudnn_benchmark', False)}; {data['images']} images, "
             f"calls of {data['batch_size']} rows; best of "
             f"{data['repeats']} after one warm run; every variant in the same process on the same images.", "",
             f"| variant | ms per attribution | set-up s (compile, capture) | cosine to {data.get('cosine_reference') or 'the first row'}, "
             "min / mean | cosine to IEEE fp32, min / mean |",
             "|---|---|---|---|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['error']} | | | |")
        else:
            exact = f"{r['cosine_to_fp32_min']:.4f} / {r['cosine_to_fp32_mean']:.4f}" if "cosine_to_fp32_min" in r else "n/a"
            lines.append(f"| {r['variant']} | {r['ms_per_attribution']:.2f} | {r['setup_s']:.1f} | "
                         f"{r['cosine_to_first_min']:.4f} / {r['cosine_to_first_mean']:.4f} | {exact} |")
    if data.get("passes"):
        lines += _render_passes(data["passes"], data)
    return "\n".join(lines) + "\n"


def _render_passes(p: dict[str, Any], data: dict[str, Any]) -> list[str]:
    k = p["kernels"]
    eager = next((r for r in data["rows"] if r["variant"] == "eager" and "error" not in r), None)
    measured = f"{eager['ms_per_attribution']:.2f} ms measured above" if eager else "eager not measured"
    what = "CUDA kernels" if data["device"].startswith("cuda") else "aten operators (CPU)"
    lines = ["", "## Where eager's time goes", "",
             f"The model's passes alone, calls of {data['batch_size']} rows on one image's path: forward "
             f"{p['forward_ms_per_row']:.4f} ms per row, forward with the input's gradient {p['gradient_ms_per_row']:.4f} ms per row "
             f"({p['gradient_ms_per_row'] / p['forward_ms_per_row']:.2f}x). One IDG run: {p['calls']} calls, {p['forward_rows']} forward "
             f"rows and {p['gradient_rows']} gradient rows for {data['images']} images (padding included), which the passes alone "
             f"make **{p['passes_ms_per_attribution']:.2f} ms per attribution** ({measured}; the difference is IDG's own work "
             "between and around the calls).", "",
             f"One profiled run: {k['wall_ms_per_attribution']:.2f} ms per attribution of wall time (the profiler's cost included), "
             f"the {what} busy {k['busy_ms_per_attribution']:.2f} ms of it. The largest:", "",
             "| kernel | count | ms per attribution | share of busy |", "|---|---|---|---|"]
    for t in k["top"]:
        name = t["name"] if len(t["name"]) <= 110 else t["name"][:107] + "..."
        lines.append(f"| `{name.replace('|', '/')}` | {t['count']} | {t['ms_per_attribution']:.3f} | {100 * t['share']:.1f}% |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet101")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--models-file", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=PRECISIONS, default="bf16")
    ap.add_argument("--images", type=Path, default=SAMPLES)
    ap.add_argument("--count", type=int, default=32, help="images explained together")
    ap.add_argument("--batch-size", type=int, default=128, help="rows per model call (the one call size compiled and captured)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--probe-steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--fp32-reference", action=argparse.BooleanOptionalAction, default=True,
                    help="compare every variant's answers with the model's in IEEE fp32 too (one untimed run; below fp32 only)")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark: cuDNN times its kernels for each shape (one call size here: seconds)")
    ap.add_argument("--profile", action="store_true",
                    help="where eager's time goes: the passes alone against IDG, and the kernels of one profiled run")
    ap.add_argument("--top", type=int, default=15, help="kernels listed by --profile")
    ap.add_argument("--label", default="paper-speed")
    ap.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    ap.add_argument("--dry-run", action="store_true", help="on the CPU with a light CNN, few points: the script, not a figure")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.dry_run:
        import tempfile

        from benchmarks.load import light_cnn

        folder = Path(tempfile.mkdtemp(prefix="paper-speed-"))
        args.model, args.weights, args.device, args.precision = light_cnn(folder), "default", "cpu", "fp32"
        args.models_file = str(folder / "models.toml")
        args.count, args.batch_size, args.steps, args.probe_steps, args.repeats = 4, 16, 8, 8, 1
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    data = measure(args)
    data["cudnn_benchmark"] = args.cudnn_benchmark
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps(data, indent=2))
    (args.out / f"{args.label}.md").write_text(render(data))
    print(render(data))  # noqa: T201 - the table is the command's output
    return 0 if data["rows"] and not any("error" in r for r in data["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
