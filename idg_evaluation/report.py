"""Tables (Markdown, CSV) and plots from the per-image records."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import numpy as np

from idg_core.budget import WorkBound, postprocess_bound
from idg_core.methods import METHODS
from idg_core.metrics import METRICS as REGISTERED
from idg_core.metrics.curves import SKIP_RULES, mean_ci
from idg_evaluation.runner import ABLATION, MAIN_METHODS, parse_row

log = logging.getLogger(__name__)
METRICS = tuple((name, m.arrow) for name, m in REGISTERED.items() if m.default and not m.derived_from)
"""The metrics the evaluation measures by default (insertion, deletion, SIC, AIC), with their arrows."""
DERIVED = tuple((name, m.arrow) for name, m in REGISTERED.items() if m.derived_from)
"""The metrics computed from those per image (DiffID = insertion − deletion): reported always."""
EXTRA = (*DERIVED, *((name, m.arrow) for name, m in REGISTERED.items() if not m.default and not m.derived_from))
"""The derived metrics, then those measured only when asked (ROAD's MoRF and LeRF), reported where the records have
them."""


def value(m: dict[str, Any], metric: str) -> float | None:
    """A row's score on ``metric``, as its registry entry reads it (a derived one computed from its sources); None when
    absent."""
    return REGISTERED[metric].of(m) if metric in REGISTERED else m.get(metric)


def metrics_of(records: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The four metrics, the derived ones (DiffID), and each metric measured only when asked (ROAD) where the records
    have it."""
    rows = [m for r in records for m in r["methods"].values()]
    return (*METRICS, *(e for e in EXTRA if REGISTERED[e[0]].derived_from or any(e[0] in m for m in rows)))


def write_csv(records: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image", "label", "pred", "prob", "method", "insertion", "deletion", "sic", "aic", "sic_skipped", "aic_skipped"])
        for r in records:
            for name, m in r["methods"].items():
                pic = ["" if m[k] is None else f"{m[k]:.5f}" for k in ("sic", "aic")]
                w.writerow([r["image"], r["label"], r["pred"], f"{r['prob']:.4f}", name, f"{m['insertion']:.5f}", f"{m['deletion']:.5f}",
                            *pic, m["sic_skipped"] or "", m.get("aic_skipped") or ""])


def merge_earlier(records: list[dict[str, Any]], csv_path: Path) -> list[str]:
    """Add to each record the methods of an earlier run's ``per_image.csv`` (same model and settings)
    that this run did not evaluate, so they pair by image with this run's; returns their names.
    Each image must be in that file with the same prediction, or the runs are not comparable."""
    rows: dict[str, dict[str, dict[str, str]]] = {}
    with csv_path.open(newline="") as f:
        for row in csv.DictReader(f):
            rows.setdefault(row["image"], {})[row["method"]] = row
    added: list[str] = []
    for r in records:
        if r["image"] not in rows:
            raise ValueError(f"{csv_path} has no row for {r['image']}: not the same images")
        pred = next(iter(rows[r["image"]].values()))["pred"]  # every method's row of an image has its prediction
        if pred != str(r["pred"]):
            raise ValueError(f"{r['image']}: predicted {r['pred']} here but {pred} in {csv_path}: not the same model")
        for name, row in rows[r["image"]].items():
            if name in r["methods"]:
                continue
            r["methods"][name] = {**{k: float(row[k]) if row[k] else None for k in ("insertion", "deletion", "sic", "aic")},
                                  "sic_skipped": row["sic_skipped"] or None, "aic_skipped": row["aic_skipped"] or None}
            if name not in added:
                added.append(name)
    return added


def _skip_lines(records: list[dict[str, Any]]) -> list[str]:
    """Per metric and rule: how many images PIC skipped, which, and the values that tripped the rule."""
    lines = []
    for metric in ("sic", "aic"):
        groups: dict[str, list[tuple[str, float | None]]] = {}
        for r in records:
            skipped = next((m for m in r["methods"].values() if m.get(f"{metric}_skipped")), None)
            if skipped is not None:  # records without rule/value group by their sentence
                rule = skipped.get(f"{metric}_skip_rule") or skipped[f"{metric}_skipped"]
                groups.setdefault(rule, []).append((Path(r["image"]).stem.split("_", 1)[-1], skipped.get(f"{metric}_skip_value")))
        for rule, items in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            values = [v for _, v in items if v is not None]
            span = f" (from {min(values):.2f} to {max(values):.2f})" if values else ""
            names = ", ".join(name for name, _ in items)
            lines.append(f"- {metric.upper()}, {len(items)} images: {SKIP_RULES.get(rule, rule)}{span}: {names}")
    return lines or ["- none"]


def _table(records: list[dict[str, Any]], names: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    ranks: dict[str, list[str]] = {}
    for metric, arrow in metrics_of(records):
        cells, means = [], {}
        for n in names:
            mean, half, count = mean_ci([v for r in records if n in r["methods"] if (v := value(r["methods"][n], metric)) is not None])
            means[n] = mean
            cells.append(f"{mean:.3f} ± {half:.3f} (n={count})" if count else "n/a")
        best = sorted((n for n in names if not np.isnan(means[n])), key=lambda n: means[n], reverse=arrow == "↑")
        ranks[metric] = best
        if best:
            cells[names.index(best[0])] = f"**{cells[names.index(best[0])]}**"
        lines.append(f"| {metric} {arrow} | " + " | ".join(cells) + " |")
    return lines, ranks


def _paired(records: list[dict[str, Any]], names: list[str], ref: str = "IDG") -> list[str]:
    """``ref`` minus each other method on the same images: mean paired difference and its 95% interval,
    signed so that > 0 means ``ref`` is better. Pairing removes the image-to-image spread that makes
    the per-method intervals above overlap."""
    return _paired_pairs(records, [(ref, n) for n in names if n != ref] if ref in names else [])


def _paired_diffs(records: list[dict[str, Any]], a: str, b: str, metric: str, arrow: str) -> list[float]:
    """(a − b) on ``metric`` for each image that has both, signed so that > 0 favours ``a``."""
    sign = 1 if arrow == "↑" else -1
    return [(x - y) * sign for r in records if a in r["methods"] and b in r["methods"]
            for x, y in [(value(r["methods"][a], metric), value(r["methods"][b], metric))] if x is not None and y is not None]


def _paired_pairs(records: list[dict[str, Any]], pairs: list[tuple[str, str]]) -> list[str]:
    if not pairs:
        return []
    lines = ["| metric | " + " | ".join(f"{ref} vs {n}" for ref, n in pairs) + " |", "|---|" + "---|" * len(pairs)]
    for metric, arrow in metrics_of(records):
        cells = []
        for ref, n in pairs:
            diffs = _paired_diffs(records, ref, n, metric, arrow)
            mean, half, count = mean_ci(diffs)
            wins = sum(d > 0 for d in diffs)
            mark = "**" if count > 1 and abs(mean) > half else ""
            cells.append(f"{mark}{mean:+.3f} ± {half:.3f}{mark} (wins {wins}/{count})" if count else "n/a")
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    return lines


def _rank_table(ranks: dict[str, list[str]], names: list[str]) -> list[str]:
    """One row per method: its rank on each metric and its mean rank."""
    metrics = list(ranks)
    lines = ["| method | " + " | ".join(metrics) + " | mean rank |", "|---|" + "---|" * (len(metrics) + 1)]
    for n in names:
        cells = [ranks[m].index(n) + 1 if n in ranks[m] else None for m in metrics]
        known = [c for c in cells if c is not None]
        mean = f"{sum(known) / len(known):.1f}" if known else "n/a"
        lines.append(f"| {n} | " + " | ".join("n/a" if c is None else str(c) for c in cells) + f" | {mean} |")
    return lines


def _cost(records: list[dict[str, Any]], name: str) -> tuple[float, float, float] | None:
    """Mean forward passes per image of a row (gradient passes included), mean gradient passes, and the most
    forward passes on any image (None for rows merged from an earlier run, which did not keep them)."""
    passes = [(m["forward_passes"], m["backward_passes"]) for r in records if (m := r["methods"].get(name)) and "forward_passes" in m]
    if not passes:
        return None
    return float(np.mean([f for f, _ in passes])), float(np.mean([b for _, b in passes])), float(max(f for f, _ in passes))


def _paired_diff(records: list[dict[str, Any]], a: str, b: str, metric: str, arrow: str) -> tuple[float, float, int]:
    """Mean of (a − b) per image on ``metric``, signed so that > 0 favours ``a``, its 95% half-width, n."""
    return mean_ci(_paired_diffs(records, a, b, metric, arrow))


def preset_choice(records: list[dict[str, Any]], names: list[str], ranks: dict[str, list[str]], *, ref: str = "AGI",
                  budget: float = 10.0) -> tuple[str | None, list[str]]:
    """The rule for the ``quality`` preset: among the rows that cost at most ``budget`` × ``ref``'s model
    passes per image (its most on any image: AGI stops early on some, but a user pays its bound) and are ahead
    of ``ref`` in the mean on insertion, deletion, SIC and AIC, the one first on the most of the four (ties:
    the better mean rank over the four, then fewer passes). Returns that row
    (None when no row qualifies) and the report's lines: every row's cost, ranks and paired lead over ``ref``,
    and for the chosen row how far it trails the first row on each metric it is not first on."""
    four = [m for m, _ in METRICS if m in ranks]
    arrows = dict(METRICS)
    ref_cost = _cost(records, ref)
    limit = budget * ref_cost[2] if ref_cost else float("inf")
    head = ["| row | passes (gradient) | within budget | " + " | ".join(f"{m} rank / lead over {ref}" for m in four) + " | firsts |",
            "|---|---|---|" + "---|" * (len(four) + 1)]
    eligible: list[tuple[int, float, float, str]] = []
    for n in names:
        cost = _cost(records, n)
        within = cost is not None and cost[0] <= limit
        cells, ahead = [], n != ref
        for m in four:
            rank = ranks[m].index(n) + 1 if n in ranks[m] else None
            mean, half, count = _paired_diff(records, n, ref, m, arrows[m]) if n != ref else (float("nan"), float("nan"), 0)
            ahead = ahead and count > 0 and mean > 0
            sig = "**" if count > 1 and abs(mean) > half else ""
            lead = f"{sig}{mean:+.3f} ± {half:.3f}{sig}" if count else "—"
            cells.append(f"{rank if rank else 'n/a'} / {lead}")
        firsts = sum(1 for m in four if ranks[m] and ranks[m][0] == n)
        known = [ranks[m].index(n) + 1 for m in four if n in ranks[m]]
        if within and ahead and known:
            eligible.append((-firsts, sum(known) / len(known), cost[0] if cost else 0.0, n))
        passes = f"{cost[0]:.0f} ({cost[1]:.0f})" if cost else "n/a"
        head.append(f"| {n} | {passes} | {'yes' if within else 'no'} | " + " | ".join(cells) + f" | {firsts} |")
    chosen = min(eligible)[3] if eligible else None
    lines = [f"Budget: ≤ {budget:g} × {ref}'s most passes on an image ({limit:.0f} forward passes); passes: mean per image, "
             f"gradient passes included in the first figure. Lead over {ref}: mean paired "
             f"difference, > 0 favours the row, bold where the 95% interval excludes 0.", "", *head, ""]
    if chosen is None:
        lines.append(f"No row within the budget is ahead of {ref} on all four.")
        return None, lines
    gaps = []
    for m in four:
        first = ranks[m][0]
        if first != chosen:
            mean, half, count = _paired_diff(records, chosen, first, m, arrows[m])
            gaps.append(f"{m}: behind {first} by {-mean:.3f} ± {half:.3f} (n={count})")
    lines.append(f"By this rule: **{chosen}**, " + (f"first on all {len(four)}." if not gaps else
                 "first on " + (", ".join(m for m in four if ranks[m][0] == chosen) or "none") + "; " + "; ".join(gaps) + "."))
    return chosen, lines


def row_bound(name: str) -> WorkBound | None:
    """The most model passes a row's plan can cost on one image (its method's bound with its post-steps: what a user
    pays), from its name alone, so rows read from an earlier run's CSV have one too; None for a name not parsed."""
    try:
        method, kw = parse_row(name)
    except ValueError:
        return None
    spec = METHODS[method]
    own = {k: v for k, v in kw.items() if k in spec.params} | ({"num_classes": 1000} if "num_classes" in spec.params else {})
    return postprocess_bound(spec.bound(spec.validate(**own)), kw)


RULE_METRICS = (*METRICS, *DERIVED)
"""What :func:`first_or_tied` reads: the four metrics and DiffID."""
RULE_REFS = ("AGI", "IDG", "SIG")
"""The references every candidate is held against: AGI, IDG 50/50 and Spectral IG."""
CHEAP_PEERS = ("gradcam",)
"""References too where the run has them: Grad-CAM, one forward and one backward pass, which users pick for its region
maps, so a row that trails it on SIC or AIC does not pass for first."""


def first_or_tied(records: list[dict[str, Any]], candidates: list[str], refs: tuple[str, ...] = RULE_REFS,
                  budget: float = 10.0) -> tuple[str | None, list[str]]:
    """The rule that chooses the ``quality`` preset. A candidate within ``budget`` × AGI's bound of model passes on an
    image (:func:`row_bound`) passes a metric (insertion, deletion, SIC, AIC, DiffID) when, paired by image against each
    reference of ``refs`` present, it is ahead or its 95% interval reaches 0 (first, or tied within the interval); it
    qualifies when it passes all five. Among those that qualify: the most metrics ahead of every reference in the mean,
    then the largest smallest lead (the mean difference to its nearest reference on its weakest metric). When none
    does: the one failing the fewest (metric, reference) pairs, then the same, said so. Returns the row (None without
    candidates) and the report's lines (the table of paired differences, then the verdict)."""
    refs = tuple(r for r in refs if any(r in rec["methods"] for rec in records))
    agi = row_bound("AGI")
    limit = budget * agi.forward if agi else float("inf")
    rows = [c for c in candidates if c not in refs and any(c in rec["methods"] for rec in records)
            and ((cost := row_bound(c)) is None or cost.forward <= limit)]
    if not rows or not refs:
        return None, []
    head = ["| candidate | " + " | ".join(f"{m} {a} vs {', '.join(refs)}" for m, a in RULE_METRICS) + " | passes |",
            "|---|" + "---|" * (len(RULE_METRICS) + 1)]
    scored: list[tuple[int, int, float, str]] = []  # (failures, -metrics ahead of all, -smallest lead, name)
    for c in rows:
        cells, failures, ahead_all, least = [], 0, 0, float("inf")
        for m, arrow in RULE_METRICS:
            parts, ahead = [], True
            for r in refs:
                mean, half, count = _paired_diff(records, c, r, m, arrow)
                if not count:
                    parts.append("n/a")
                    continue
                behind = mean + half < 0  # behind even at the interval's far end
                failures += behind
                ahead = ahead and mean > 0
                least = min(least, mean)
                mark = "**" if count > 1 and abs(mean) > half else ""
                parts.append(f"{mark}{mean:+.3f} ± {half:.3f}{mark}" + (" ✗" if behind else ""))
            ahead_all += ahead
            cells.append("<br>".join(parts))
        scored.append((failures, -ahead_all, -least, c))
        head.append(f"| {c} | " + " | ".join(cells) + f" | {'yes' if failures == 0 else f'no ({failures} behind)'} |")
    best = min(scored)
    lines = [f"Each cell: the candidate minus {', '.join(refs)} (in that order), paired by image, signed so that > 0 favours "
             "the candidate, ± the 95% half-width; bold where the interval excludes 0; ✗ where the candidate is behind even "
             "at the interval's far end (the rule's failure). The rule: no ✗ on any of the five.", "", *head, ""]
    qualified = [s for s in scored if s[0] == 0]
    if qualified:
        lines.append(f"By the rule: **{best[3]}** (qualifies; {-best[1]} of {len(RULE_METRICS)} metrics ahead of every "
                     f"reference in the mean, its smallest lead {-best[2]:+.3f}; {len(qualified)} of {len(rows)} candidates qualify).")
    else:
        lines.append(f"No candidate qualifies. Closest by the rule: **{best[3]}** ({best[0]} (metric, reference) pairs behind).")
    return best[3], lines


def write_report(records: list[dict[str, Any]], out: Path, *, machine: str, date: str, model: str, total_images: int,
                 earlier: tuple[Path, list[str]] | None = None) -> Path:
    """``summary.md``, ``per_image.csv``, ``curves.png`` and ``idg_curves.png`` under ``out``.
    ``earlier``: the file and methods :func:`merge_earlier` took from an earlier run (said in the report)."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(records, out / "per_image.csv")
    names = list(records[0]["methods"]) if records else []
    variants = [n for n in names if n not in MAIN_METHODS and n not in ABLATION]  # post-steps, rivals, composed rows
    main = [n for n in names if n in MAIN_METHODS] + variants
    ablation = [n for n in ("IG", "IG-adaptive", "IDG-uniform", "IDG", "IDG-authors-placement", "IDG-exact-IF") if n in names]
    labelled = [r for r in records if r["correct"] is not None]
    top1 = (f"Top-1 of the model on these images: {sum(1 for r in labelled if r['correct'])}/{len(labelled)}. " if labelled
            else "Top-1 not known: the file names do not name this model's classes. ")
    lines = [f"# Evaluation: {model}, {len(records)} of {total_images} images", "",
             f"Measured {date} on {machine}. Mean ± half-width of the 95% normal interval over images (n). "
             f"Best per row in bold. {top1}"
             "Targets are the predicted classes. Settings: the paper's (50 steps, N = M = 50, baseline = zero in the model's "
             "normalised space, Guided IG fraction 0.5 / max_dist 1.0, AGI one seeded adversarial class, RISE step 224, "
             "PIC thresholds of the reference library and its 0.8 confidence rule).", "", "## Main comparison", ""]
    table, ranks = _table(records, main)
    lines += table + ["", "DiffID = insertion − deletion per image (higher is better). ROAD (Rong et al. 2022): the removed "
                      "pixels filled by noisy linear imputation at 10%…90% removed; MoRF removes the most salient first "
                      "(lower is better), LeRF the least (higher is better); mean probability of the predicted class.", "",
                      "### Ranks (1 = best mean)", "", *_rank_table(ranks, main), "",
                      "Rank of IDG per metric (1 = best): " + ", ".join(
                          f"{m}: {ranks[m].index('IDG') + 1} of {len(ranks[m])}" for m in ranks if "IDG" in ranks[m]), ""]
    if earlier:
        lines += [f"{', '.join(earlier[1])}: per-image scores of an earlier run with the same model and settings "
                  f"(`{earlier[0]}`, same predictions checked image by image), paired with this run's by image.", ""]
    if variants:
        refs = [r for r in ("IDG", "AGI") if r in main]
        lines += ["### Post-steps, rivals and composed rows against IDG and AGI, paired by image", "",
                  "Mean of (variant − other) per image, signed so that > 0 favours the variant, ± half-width of its 95% "
                  "interval; bold where the interval excludes 0.", "",
                  *_paired_pairs(records, [(v, r) for v in variants for r in refs]), ""]
    if "AGI" in main and len(main) > 2:
        lines += ["### Choosing the `quality` preset", "", *preset_choice(records, main, ranks)[1], ""]
    rule_refs = RULE_REFS + tuple(r for r in CHEAP_PEERS if r in names)  # the cheap peer a user picks instead, too
    candidates = [n for n in variants if n not in rule_refs]
    if candidates and {"AGI", "IDG"} <= set(names):
        peers = rule_refs[len(RULE_REFS):]
        title = "issue #47's rule" + (f", with {', '.join(peers)} as references (issue #72)" if peers else "")
        lines += [f"### First or tied on all five ({title})", "", *first_or_tied(records, candidates, rule_refs)[1], ""]
    paired = _paired(records, [n for n in main if n not in variants])
    if paired:
        lines += ["### IDG against each method, paired by image", "",
                  "Mean of (IDG − other) per image, signed so that > 0 favours IDG, ± half-width of its 95% interval; "
                  "bold where the interval excludes 0. Wins: images where IDG scored better.", "", *paired, ""]
    if len(ablation) > 2:
        lines += ["## Ablation", "", "IG = IG uniform, IDG = IDG adaptive with aligned placement and finite-difference importance.", ""]
        lines += _table(records, ablation)[0] + [""]
    lines += ["## Images skipped by PIC (SIC/AIC)", "", *_skip_lines(records)]
    lines += ["", "Per-image values: `per_image.csv`. Plots: `curves.png` (mean insertion/deletion curves), "
              "`idg_curves.png` (logit-α curves with IDG's sample positions).", ""]
    path = out / "summary.md"
    path.write_text("\n".join(lines))
    _plots(records, main, out)
    return path


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None (with a warning) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no plots")
        return None
    return plt


def _plots(records: list[dict[str, Any]], names: list[str], out: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("insertion", "deletion"), strict=True):
        for n in names:
            if any(f"{metric}_curve" not in r["methods"][n] for r in records):
                continue  # scores taken from an earlier run's CSV carry no curves
            curves = np.array([r["methods"][n][f"{metric}_curve"] for r in records])
            ax.plot(np.linspace(0, 1, curves.shape[1]), curves.mean(0), label=f"{n} ({curves.mean(0).mean():.3f})")
        ax.set(title=f"mean {metric} curve", xlabel="fraction of pixels", ylabel="p(predicted class)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
    shown = [r for r in records if "idg_curve" in r][:4]
    if not shown:
        return
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.4), squeeze=False)
    for ax, r in zip(axes[0], shown, strict=True):
        c = r["idg_curve"]
        ax.plot(c["probe_alphas"], c["probe_logits"], color="0.3", label="probe logit")
        sc = ax.scatter(c["alphas"], c["logits"], c=np.abs(c["importance"]), cmap="inferno", s=14, zorder=3, label="IDG samples")
        ax.set(title=r["image"][:28], xlabel="α", ylabel="target logit")
        fig.colorbar(sc, ax=ax, label="|importance dF/dα|")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "idg_curves.png", dpi=110)
    plt.close(fig)
