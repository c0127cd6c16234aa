"""Faithfulness against cost: IDG over a grid of (probe, main) steps and IG over 8…50 steps,
scored by insertion and deletion and compared, paired per image, with IG-50 and IDG-50/50.

    python -m idg_evaluation --suite cost --images ../shared/data/imagenet-samples --out results/cost

The table this writes is what the presets in :mod:`idg_core.presets` were chosen from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from idg_core.metrics import METRICS
from idg_core.metrics.curves import mean_ci
from idg_evaluation.report import pyplot

# name -> (method, parameters). "IG" and "IDG" are the paper's settings (IG-50 uniform, IDG-50/50),
# the two references every other row is paired against.
COST_GRID: dict[str, tuple[str, dict[str, Any]]] = {
    "IDG-4/4": ("idg", {"probe_steps": 4, "steps": 4}),
    "IDG-8/8": ("idg", {"probe_steps": 8, "steps": 8}),
    "IDG-8/16": ("idg", {"probe_steps": 8, "steps": 16}),
    "IDG-16/16": ("idg", {"probe_steps": 16, "steps": 16}),
    "IDG-32/32": ("idg", {"probe_steps": 32, "steps": 32}),
    "IDG": ("idg", {"probe_steps": 50, "steps": 50}),
    "IG-8": ("ig", {"steps": 8, "rule": "uniform"}),
    "IG-16": ("ig", {"steps": 16, "rule": "uniform"}),
    "IG-32": ("ig", {"steps": 32, "rule": "uniform"}),
    "IG": ("ig", {"steps": 50, "rule": "uniform"}),
}
REFERENCES = {"IG": "IG-50", "IDG": "IDG-50/50"}


def _label(name: str) -> str:
    return REFERENCES.get(name, name)


def cost_grid(names: list[str] | None = None) -> dict[str, tuple[str, dict[str, Any]]]:
    """The grid, or the rows ``names`` picks from it (a table for a costlier model at a fraction of the
    time). Names as the table prints them (``IDG-8/16``, ``IG-50``, ``IDG-50/50``); the two references are
    always kept, since every paired column is against them."""
    if not names:
        return dict(COST_GRID)
    by_label = {_label(n): n for n in COST_GRID}
    unknown = [n for n in names if n not in by_label and n not in COST_GRID]
    if unknown:
        raise ValueError(f"not in the cost grid: {', '.join(unknown)} (choose from {', '.join(by_label)})")
    keep = {by_label.get(n, n) for n in names} | set(REFERENCES)
    return {n: spec for n, spec in COST_GRID.items() if n in keep}


def paired(records: list[dict[str, Any]], name: str, ref: str, metric: str) -> tuple[float, float, int]:
    """Mean of (name − ref) per image, signed so that > 0 means ``name`` is better (lower deletion
    is better), its 95% half-width and n."""
    sign = 1.0 if METRICS[metric].higher_is_better else -1.0
    diffs = [sign * (r["methods"][name][metric] - r["methods"][ref][metric]) for r in records
             if name in r["methods"] and ref in r["methods"]]
    return mean_ci(diffs)


def within_noise_or_better(mean: float, half: float) -> bool:
    """The paired interval includes 0 or lies above it."""
    return bool(mean + half >= 0)


def cost_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per grid entry: passes, mean scores, and the paired differences against both references."""
    names = [n for n in COST_GRID if records and n in records[0]["methods"]]
    rows = []
    for n in names:
        first = records[0]["methods"][n]
        row: dict[str, Any] = {"name": _label(n), "forward": first["forward_passes"], "backward": first["backward_passes"]}
        for metric in ("insertion", "deletion"):
            row[metric] = mean_ci([r["methods"][n][metric] for r in records])
            for ref in REFERENCES:
                row[f"{metric}_vs_{ref}"] = paired(records, n, ref, metric)
        rows.append(row)
    return rows


def write_cost_report(records: list[dict[str, Any]], out: Path, *, machine: str, date: str, model: str, rise_step: int = 224,
                      command: str | None = None) -> Path:
    """``cost.md`` (the table) and ``cost.png`` (insertion and deletion against model passes)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = cost_rows(records)

    def cell(v: tuple[float, float, int]) -> str:
        mean, half, _ = v
        mark = "**" if abs(mean) > half else ""
        return f"{mark}{mean:+.3f} ± {half:.3f}{mark}"

    lines = [f"# Faithfulness against cost: {model}, {len(records)} images", "",
             f"Measured {date} on {machine}. Targets: the predicted classes; baseline: zero in the model's normalised "
             f"space; RISE step {rise_step} pixels. Paired columns: mean of (row − reference) per image ± half-width of the 95% "
             "interval, signed so that > 0 means the row is **better** (for deletion: lower); bold where the interval "
             "excludes 0. Passes are per image: forward passes (including the probe) / passes with an input gradient.", "",
             *([f"Made with `{command}` (it resumes from its cache).", ""] if command else []),
             "| method | forward / gradient passes | insertion ↑ | deletion ↓ | insertion vs IG-50 | deletion vs IG-50 "
             "| insertion vs IDG-50/50 | deletion vs IDG-50/50 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['forward']} / {r['backward']} | {r['insertion'][0]:.3f} | {r['deletion'][0]:.3f} | "
                     f"{cell(r['insertion_vs_IG'])} | {cell(r['deletion_vs_IG'])} | {cell(r['insertion_vs_IDG'])} | "
                     f"{cell(r['deletion_vs_IDG'])} |")
    lines += ["", "The `fast` preset is the cheapest IDG row whose insertion and deletion are within noise of IDG-50/50 "
              "(paired interval includes 0 or favours it) and not worse than IG-50 (likewise).", ""]
    fast = choose_fast(rows)
    lines.append(f"Chosen by this rule on these images: **{fast}**." if fast else "No IDG row meets the rule on these images.")
    path = out / "cost.md"
    path.write_text("\n".join(lines) + "\n")
    _plot(rows, out / "cost.png")
    return path


def choose_fast(rows: list[dict[str, Any]]) -> str | None:
    """The cheapest IDG row (by forward + gradient passes) that meets the ``fast`` rule."""
    ok = [r for r in rows if r["name"].startswith("IDG") and all(
        within_noise_or_better(*r[f"{m}_vs_{ref}"][:2]) for m in ("insertion", "deletion") for ref in REFERENCES)]
    return min(ok, key=lambda r: r["forward"] + r["backward"])["name"] if ok else None


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("insertion", "deletion"), strict=True):
        for family, colour in (("IDG", "C3"), ("IG", "C0")):
            chosen = sorted((r for r in rows if r["name"].split("-")[0] == family), key=lambda r: r["forward"] + r["backward"])
            if not chosen:
                continue
            x = np.array([r["forward"] + r["backward"] for r in chosen])
            y = np.array([r[metric][0] for r in chosen])
            ax.errorbar(x, y, yerr=[r[metric][1] for r in chosen], marker="o", color=colour, label=family, capsize=3)
            for xi, yi, r in zip(x, y, chosen, strict=True):
                ax.annotate(r["name"].split("-", 1)[-1], (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set(xscale="log", xlabel="model passes per image (forward + gradient)", ylabel=f"{metric} AUC",
               title=f"{metric} ({'higher' if METRICS[metric].higher_is_better else 'lower'} is better)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
