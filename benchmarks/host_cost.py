"""What one /attribute costs the host outside the model, stage by stage, on one CPU thread.

On a GPU the model's passes run on the device; what the host does per attribution decides how many
attributions per second one service process can answer. This measures, for sample photos and the
service's default answer (heatmap and overlay), the stages the service runs in its own code:

- **decode**: upload bytes to the model's input tensor (``app.core.images.model_input``), in a thread;
- **render**: the PNGs of the answer (``app.service.render.render``), in a thread;
- **answer**: the /attribute answer built and serialised to JSON (``attribute_response`` + pydantic),
  on the event loop;
- **render as before**: separate scaling per image and Pillow's PNG encoder at its default zlib level,
  a reference measured in the same run;
- **threads**: the render's throughput in N threads at once over one (does it hold the GIL?).

HTTP parsing and routing are not in it; the load benchmark's event-loop column measures those in a
running server. Run: ``python -m benchmarks.host_cost`` (results/benchmarks/<label>.md and .json).
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from app.core.config import Settings
from app.core.images import model_input
from app.schemas import AttributeParams, Cost, Timings
from app.service.planning import plan_attribute
from app.service.render import attribute_response, render
from benchmarks.speed import SAMPLES, machine
from idg_core.heatmap import colorize, saliency, scale
from idg_core.model_calls import run_plans
from idg_models import ImageClassifier, load_model

log = logging.getLogger(__name__)


def _ms(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` calls, after one call to warm it."""
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _parallel_speedup(fn: Callable[[], object], threads: int, calls: int = 20) -> float:
    """Throughput of ``fn`` in ``threads`` threads at once over its throughput in one: near ``threads``
    when it releases the GIL, near 1 when it holds it."""
    def work() -> None:
        for _ in range(calls):
            fn()

    fn()
    started = time.perf_counter()
    work()
    one = time.perf_counter() - started
    pool = [threading.Thread(target=work) for _ in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return threads * one / (time.perf_counter() - started)


def _old_render(image: torch.Tensor, attr: torch.Tensor) -> tuple[bytes, bytes]:
    """The answer's two images as made before: heatmap and overlay each from its own saliency and
    scaling, PNGs at Pillow's default zlib level (6)."""
    def png(array: np.ndarray) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format="PNG")
        return buf.getvalue()

    heat = colorize(attr)
    weight = scale(saliency(attr)).abs().sqrt().numpy()[..., None] * 0.6
    photo = image.clamp(0, 1).permute(1, 2, 0).numpy() * 255
    over = (photo * (1 - weight) + colorize(attr).astype(np.float64) * weight).round().clip(0, 255).astype(np.uint8)
    return png(heat), png(over)


def _photo(
    model: ImageClassifier, settings: Settings, params: AttributeParams, photo: Path, repeats: int, threads: int,
) -> dict[str, Any]:
    """The stages' times for one photo (its explanation computed once, untimed)."""
    planned = plan_attribute(settings, params, model)
    cpu = torch.device("cpu")
    data = photo.read_bytes()
    x = model_input(data, model, settings, cpu)
    (found,) = run_plans(model, [planned.plan(x, params, None)], batch_size=8)
    images = render(x, found.result.attributions[0].float(), params)
    timings = Timings(queued_ms=0, compute_ms=0, render_ms=0, total_ms=0)

    def answer() -> bytes:
        return attribute_response("m", model, params, planned, found, "fp32", timings, images).model_dump_json().encode()

    return {
        "photo": photo.name,
        "decode_ms": _ms(lambda: model_input(data, model, settings, cpu), repeats),
        "render_ms": _ms(lambda: render(x, found.result.attributions[0].float(), params), repeats),
        "answer_json_ms": _ms(answer, repeats),
        "old_render_ms": _ms(lambda: _old_render(x, found.result.attributions[0].float()), repeats),
        "answer_kib": len(answer()) / 1024,
        "threads": threads,
        "render_parallel_speedup": _parallel_speedup(lambda: render(x, found.result.attributions[0].float(), params), threads),
        "old_render_parallel_speedup": _parallel_speedup(lambda: _old_render(x, found.result.attributions[0].float()), threads),
        "passes": Cost(forward_passes=found.forward_passes, backward_passes=found.backward_passes).model_dump(),
    }


def measure(model: ImageClassifier, photos: list[Path], repeats: int, threads: int) -> list[dict[str, Any]]:
    """One row per photo, for the service's default /attribute answer; ``threads``: how many render at
    once in the GIL test."""
    rows = []
    for photo in photos:
        rows.append(_photo(model, Settings(), AttributeParams(), photo, repeats, threads))  # defaults: IDG, its default preset
        log.info("%s", rows[-1])
    return rows


def report(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    host = med("decode_ms") + med("render_ms") + med("answer_json_ms")
    m = meta["machine"]
    lines = [f"# Host cost per attribution `{meta['label']}`", "",
             f"Measured {meta['date']} on: {m.get('cpu')}, one torch thread (Python {m['python']}, torch {m['torch']}). "
             f"Model {meta['model']}; the service's default answer (IDG `fast`, heatmap and overlay PNGs); "
             f"{len(rows)} sample photos, each stage the median of {meta['repeats']} calls, then the median over photos.", "",
             "| stage | where it runs | ms per attribution |", "|---|---|---|",
             f"| decode + resize + crop | a thread | {med('decode_ms'):.2f} |",
             f"| render heatmap + overlay PNGs | a thread | {med('render_ms'):.2f} |",
             f"| build the answer + JSON ({med('answer_kib'):.0f} KiB) | event loop | {med('answer_json_ms'):.2f} |",
             f"| **sum** | | **{host:.2f}** |",
             f"| render as before (separate scaling, Pillow's PNG at zlib level 6), same run | | {med('old_render_ms'):.2f} |", "",
             f"Renders in {rows[0]['threads']} threads at once (the service renders in a thread per answer): "
             f"**{med('render_parallel_speedup'):.2f}x** the throughput of one thread now, "
             f"{med('old_render_parallel_speedup'):.2f}x as before (near the thread count: the render does not hold the GIL "
             "for most of its time).", "",
             f"At {host:.1f} ms of one core per attribution outside the model, 150 attributions/s need about "
             f"{150 * host / 1000:.1f} cores of this kind for these stages alone. HTTP parsing and routing come on top, on the "
             "event loop, one thread under the GIL: see the load benchmark's event-loop column."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="cpu-host-cost")
    p.add_argument("--model", default="efficientnet_lite0")
    p.add_argument("--photos", type=int, default=8, help="how many sample photos (sorted by name)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="threads rendering at once in the GIL test")
    p.add_argument("--images", type=Path, default=SAMPLES)
    p.add_argument("--out", type=Path, default=Path("results/benchmarks"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core's cost per stage
    try:
        model = load_model(args.model)
        rows = measure(model, sorted(args.images.glob("*.JPEG"))[: args.photos], args.repeats, args.threads)
    finally:
        torch.set_num_threads(threads)
    meta = {"label": args.label, "date": date.today().isoformat(), "machine": machine(), "model": args.model, "repeats": args.repeats}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.label}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (args.out / f"{args.label}.md").write_text(report(meta, rows))
    log.info("wrote %s", args.out / f"{args.label}.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
