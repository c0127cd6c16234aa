"""Per-image evaluation with a resumable cache: attributions of every configured method (their
plans pooled into shared model calls), then insertion, deletion, SIC, AIC and ROAD for each.

A row is named from the catalogue below, or composed: ``BASE[+POST...][:key=value,...]`` where BASE is
a catalogue row, a registry method (``eg``: its paper preset) or ``method@preset`` (``idg@fast``), each
POST is ``IDGI``, ``SmoothGrad`` (10 noisy copies, σ 0.15), ``Blur`` (the control, σ
:data:`BLUR_SIGMA`) or ``RankMix`` (the map and its IDGI map rank-averaged), and the keys override any setting
(``baseline`` too, for that row) (``IDG+IDGI+SmoothGrad:probe_steps=8,steps=16,smooth_samples=8``)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from idg_core.heatmap import saliency
from idg_core.methods import METHODS
from idg_core.metrics import (
    METRICS,
    SKIP_RULES,
    Curve,
    Skipped,
    deletion,
    insertion,
    original_confidence,
    pic_many,
    pic_pool,
    random_pixel_mask,
    to_uint8,
)
from idg_core.metrics.road import road
from idg_core.model_calls import run_plans
from idg_core.paths import resolve_baseline
from idg_core.postprocess import build_plan
from idg_core.types import Plan
from idg_evaluation.idgi_mix import idgi_mix_plan
from idg_models import ImageClassifier, decode_image, imagenet_label

log = logging.getLogger(__name__)

# The paper's settings (Section 5): 50 steps, N = M = 50, Guided IG fraction 0.5 / max_dist 1.0,
# AGI with one adversarial class; IG as in the authors' code (uniform points, mean of gradients).
MAIN_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "IG": ("ig", {"steps": 50, "rule": "uniform"}),
    "LIG": ("left_ig", {"steps": 50}),
    "GIG": ("guided_ig", {"steps": 50, "fraction": 0.5, "max_dist": 1.0}),
    "AGI": ("agi", {"epsilon": 0.05, "max_iter": 20, "adversarial_classes": 1, "seed": 0}),
    "IDG": ("idg", {"steps": 50, "probe_steps": 50}),
}
# The paper's ablation (IG and IDG, uniform vs adaptive; "IG" and "IDG" above are IG-uniform and
# IDG-adaptive) plus our two questions: the authors' placement, and the exact importance factor.
ABLATION: dict[str, tuple[str, dict[str, Any]]] = {
    "IG-adaptive": ("ig", {"steps": 50, "rule": "adaptive", "probe_steps": 50}),
    "IDG-uniform": ("idg", {"steps": 50, "uniform": True}),
    "IDG-authors-placement": ("idg", {"steps": 50, "probe_steps": 50, "placement": "authors"}),
    "IDG-exact-IF": ("idg", {"steps": 50, "probe_steps": 50, "importance": "exact"}),
}
# Post-steps (idg_core.postprocess) on the paper's settings; chosen by name with --methods only.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "IDG+IDGI": ("idg", {"steps": 50, "probe_steps": 50, "postprocess": "idgi"}),
    "IG+IDGI": ("ig", {"steps": 50, "rule": "uniform", "postprocess": "idgi"}),
    "IDG+SmoothGrad": ("idg", {"steps": 50, "probe_steps": 50, "smooth_samples": 10, "smooth_std": 0.15}),
}
BLUR_SIGMA = 1.0
"""σ (pixels) of the blur control: the blur that makes IDG's map most like IDG+SmoothGrad's (10 copies, σ 0.15),
fitted on 2 photos at IDG 8/16 on the loaded CPU (``results/evaluation-quality/blur_fit.md``: correlation 0.40-0.44
against 0.36-0.39 unblurred; 2 px next). Refit with more photos at 50/50 with ``python -m benchmarks.blur_fit``
or name the row ``IDG+Blur:blur_sigma=S``."""
# The rivals in the faithfulness tables, at their published defaults, and the blur control.
RIVALS: dict[str, tuple[str, dict[str, Any]]] = {
    "EG": ("eg", {"samples": 50}),
    "IDG-EG": ("idg_eg", {"paths": 4, "probe_steps": 8, "steps": 16}),
    "LA": ("la", {"max_iter": 20, "classes": 20, "spatial_range": 20.0}),
    "IDG+Blur": ("idg", {"steps": 50, "probe_steps": 50, "blur_sigma": BLUR_SIGMA}),
    # Spectral IG at its authors' settings (configs/spectral_ig.yaml: 200 points, overlap 0.4, SVD per channel,
    # the softmax probability, the black baseline), and on this table's mean baseline
    "SIG": ("spectral_ig", {"steps": 200, "overlap": 0.4, "baseline": "black"}),
    "SIG-mean": ("spectral_ig", {"steps": 200, "overlap": 0.4}),
}
POST_STEPS: dict[str, dict[str, Any]] = {
    "idgi": {"postprocess": "idgi"},
    "smoothgrad": {"smooth_samples": 10, "smooth_std": 0.15},
    "blur": {"blur_sigma": BLUR_SIGMA},
    "rankmix": {"idgi_mix": 0.5},
    "xrai": {"postprocess": "xrai"},
    "cam_regions": {"postprocess": "cam_regions"},
    "cam_product": {"postprocess": "cam_product"},
}
"""The post-steps a composed row name may add (lower case), with their evaluation settings. ``RankMix``: the
method's map and its IDGI map from the same passes, rank-averaged (:mod:`idg_evaluation.idgi_mix`). ``XRAI``: XRAI's
regions over the row's map, its pixels ranked within each (``BASE+XRAI:xrai_order=regions``: the regions alone).
``cam_regions`` / ``cam_product``: the row's pixels ranked within Grad-CAM's blobs / its map times Grad-CAM's
(:mod:`idg_core.postprocess.cam`; Grad-CAM's pass more).
A row's ``baseline`` key (``mean`` or ``black``) overrides the run's ``--baseline`` for that row."""

ALL_METRICS = tuple(dict.fromkeys(m.run_name for m in METRICS.values() if m.default and not m.derived_from))
"""What the evaluation computes by default (insertion, deletion, sic, aic), from :data:`idg_core.metrics.METRICS`; a
derived metric (DiffID) is computed by the report from these."""
WITH_ROAD = tuple(dict.fromkeys(m.run_name for m in METRICS.values() if not m.derived_from))


def catalogue() -> dict[str, tuple[str, dict[str, Any]]]:
    """Every named row."""
    return {**MAIN_METHODS, **ABLATION, **VARIANTS, **RIVALS}


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_row(name: str) -> tuple[str, dict[str, Any]]:
    """The (method, keywords) of a row name (see the module docstring); ValueError naming what is wrong."""
    rows = catalogue()
    if name in rows:
        return rows[name]
    head, _, overrides = name.partition(":")
    base, *posts = head.split("+")
    if base in rows:
        method, kw = rows[base][0], dict(rows[base][1])
    else:
        method, _, preset = base.partition("@")
        if method not in METHODS:
            raise ValueError(f"unknown row {name!r}: {base!r} is neither a row ({', '.join(rows)}) nor a method ({', '.join(METHODS)})")
        kw = {**METHODS[method].preset(preset or "paper"), **METHODS[method].preset_post(preset or "paper")}
    for post in posts:
        if post.lower() not in POST_STEPS:
            raise ValueError(f"unknown post-step {post!r} in {name!r}: one of IDGI, SmoothGrad, Blur, RankMix, XRAI, "
                             "cam_regions, cam_product")
        kw |= POST_STEPS[post.lower()]
    for pair in filter(None, overrides.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"{pair!r} in {name!r} is not key=value")
        kw[key.strip()] = _number(value.strip())
    return method, kw


@dataclass
class EvalConfig:
    """Everything that changes a result; its hash names the cache folder."""

    model: str = "efficientnet_lite0"
    methods: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=lambda: {**MAIN_METHODS, **ABLATION})
    baseline: str = "mean"
    rise_step: int = 224
    pic_min_confidence: float = 0.8
    pic_mask_fraction: float = 0.01
    batch_size: int = 32
    precision: str = "fp32"
    metrics: tuple[str, ...] = ALL_METRICS
    fold_bn: bool = False  # the service's CPU settings (IDG_FOLD_BN, IDG_CHANNELS_LAST): the same function up to rounding
    channels_last: bool = False

    def key(self) -> str:
        fields = asdict(self)
        # how a map becomes one value per pixel before ranking: the metrics' sum over channels of |a|
        # (idg_core.heatmap.saliency); in the key, so a cache ranked any other way is never read back
        fields["saliency"] = "sum_abs"
        if fields["baseline"] == "mean":  # the service's mean baseline, keyed by the name the caches use
            fields["baseline"] = "model_mean"
        # a field at its default stays out of the key, so adding a field leaves the existing caches' keys as they are
        if fields["precision"] == "fp32":
            del fields["precision"]
        if tuple(fields["metrics"]) == ALL_METRICS:
            del fields["metrics"]
        for speed in ("fold_bn", "channels_last"):
            if not fields[speed]:
                del fields[speed]
        return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def row_baseline(model: ImageClassifier, x: torch.Tensor, kind: str) -> torch.Tensor:
    """``mean``: zero in the model's normalised space (the authors' baseline, and the service's
    default: :func:`idg_core.paths.resolve_baseline`); or black."""
    if kind not in ("mean", "black"):
        raise ValueError(f"baseline must be 'mean' or 'black', got {kind!r}")
    return resolve_baseline(kind, x, model.preprocessing.mean)


def _row_plan(model: ImageClassifier, x: torch.Tensor, base: torch.Tensor, pred: int, method: str, kw: dict[str, Any]) -> Plan:
    """One row's plan: its own ``baseline`` when it names one, ``RankMix`` through :func:`idgi_mix_plan`."""
    kw = dict(kw)
    if "baseline" in kw:
        base = row_baseline(model, x, kw.pop("baseline"))
    if "num_classes" in METHODS[method].params:
        kw["num_classes"] = model.num_classes
    if "idgi_mix" in kw:
        return idgi_mix_plan(method, x, base, pred, **kw)
    return build_plan(method, x, base, pred, **kw)


def evaluate_image(
    model: ImageClassifier, path: Path, label: int | None, cfg: EvalConfig, pool: Executor | None, seed: int,
) -> dict[str, Any]:
    """Every method and metric on one image; returns the JSON-ready record."""
    started = time.perf_counter()
    device = model.mean.device  # its buffers: a fused network may keep its weights as buffers only
    x = model.prepare(decode_image(path.read_bytes())).to(device)
    with torch.no_grad():
        probs = torch.softmax(model(x.unsqueeze(0)), 1)[0]
    pred = int(probs.argmax())
    base = row_baseline(model, x, cfg.baseline)
    names = list(cfg.methods)
    plans = [_row_plan(model, x, base, pred, m, kw) for m, kw in cfg.methods.values()]
    results = dict(zip(names, run_plans(model, plans, cfg.batch_size), strict=True))
    sal = torch.stack([saliency(results[n].attributions[0]) for n in names]).to(device)
    xs = x.unsqueeze(0).expand(len(names), -1, -1, -1)
    p = model.preprocessing
    ins = insertion(model, xs, sal, mean=p.mean, std=p.std, step=cfg.rise_step, batch_size=max(cfg.batch_size, 64))
    dele = deletion(model, xs, sal, substrate=p.mean, step=cfg.rise_step, batch_size=max(cfg.batch_size, 64))
    record: dict[str, Any] = {"image": path.name, "label": label, "pred": pred, "prob": float(probs[pred]),
                              "correct": label == pred if label is not None else None, "methods": {}}
    roads = road(model, xs, sal, std=p.std, seed=seed, batch_size=max(cfg.batch_size, 64), pool=pool) if "road" in cfg.metrics else None
    confidence = original_confidence(model, x, pred)
    if not {"sic", "aic"} & set(cfg.metrics):
        skipped = Skipped(SKIP_RULES["not_requested"], "not_requested")
        pic: dict[str, dict[str, Curve | Skipped]] = {n: {"sic": skipped, "aic": skipped} for n in names}
    elif confidence < cfg.pic_min_confidence:
        low = Skipped(f"the original prediction {confidence:.2f} is below {cfg.pic_min_confidence}", "low_confidence", confidence)
        pic = {n: {"sic": low} for n in names}
        for n in names:
            pic[n]["aic"] = pic[n]["sic"]
    else:
        arr = to_uint8(x)
        mask = random_pixel_mask(arr.shape[0], arr.shape[1], cfg.pic_mask_fraction, seed)
        maps = [s.cpu().double().numpy() for s in sal]
        k = len(names)
        pic = dict(zip(names, pic_many(model, [arr] * k, maps, [mask] * k, [pred] * k, device, pool), strict=True))
    for i, n in enumerate(names):
        entry: dict[str, Any] = {"insertion": ins[i].auc, "deletion": dele[i].auc,
                                 "insertion_curve": ins[i].y.tolist(), "deletion_curve": dele[i].y.tolist(),
                                 "forward_passes": results[n].forward_passes, "backward_passes": results[n].backward_passes}
        if roads is not None:
            entry |= {"road_morf": roads["morf"][i].auc, "road_lerf": roads["lerf"][i].auc,
                      "road_morf_curve": roads["morf"][i].y.tolist(), "road_lerf_curve": roads["lerf"][i].y.tolist()}
        for kind in ("sic", "aic"):
            res = pic[n][kind]
            entry[kind] = None if isinstance(res, Skipped) else res.auc
            entry[f"{kind}_skipped"] = res.reason if isinstance(res, Skipped) else None
            entry[f"{kind}_skip_rule"] = res.rule if isinstance(res, Skipped) else None
            entry[f"{kind}_skip_value"] = res.value if isinstance(res, Skipped) else None
        record["methods"][n] = entry
    idg_name = next((n for n, (m, kw) in cfg.methods.items() if m == "idg" and not kw.get("uniform")), None)
    if idg_name:
        r = results[idg_name]
        record["idg_curve"] = {"method": idg_name, "probe_alphas": r.probe_alphas.tolist(), "probe_logits": r.probe_values[0].tolist(),
                               "alphas": r.alphas[0].tolist(), "logits": r.values[0].tolist(), "importance": r.importance[0].tolist()}
    record["seconds"] = time.perf_counter() - started
    return record


def evaluate_folder(model: ImageClassifier, images: list[Path], out: Path, cfg: EvalConfig, *, workers: int = 0,
                    progress: bool = True, shard: tuple[int, int] | None = None, compute: bool = True) -> list[dict[str, Any]]:
    """Evaluate ``images``, caching each image's record under ``out/cache/<config>/``; images
    already cached are read back, so an interrupted run goes on where it stopped.

    ``shard=(k, n)``: only the images at positions i with i % n == k (several processes or machines
    share one cache folder, each its own images); an image's seed is still its position in the whole
    list, so a sharded run caches exactly what one unsharded run would. ``compute=False``: only the images
    already cached (a report of a run still going on), nothing evaluated."""
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise ValueError(f"shard must be k/n with 0 <= k < n, got {shard[0]}/{shard[1]}")
    cache = out / "cache" / cfg.key()
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    records = []
    pool = pic_pool(workers)
    try:
        mine = [(i, path) for i, path in enumerate(images) if shard is None or i % shard[1] == shard[0]]
        bar = _progress(mine, progress)
        for i, path in bar:
            target = cache / f"{path.stem}.json"
            if target.is_file():
                records.append(json.loads(target.read_text()))
                continue
            if not compute:
                continue
            record = evaluate_image(model, path, imagenet_label(path.name, model.num_classes), cfg, pool, seed=i)
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(record))
            tmp.replace(target)  # atomic: an interrupted write never leaves half a record
            records.append(record)
            log.info("%s: %.1f s", path.name, record["seconds"])
    finally:
        if pool:
            pool.shutdown()
    return records


def _progress(items: list[tuple[int, Path]], show: bool) -> Any:
    if not show:
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc="images", unit="img")
