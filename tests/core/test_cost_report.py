"""The cost table's rule for the ``fast`` preset, on records whose answer is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from idg_evaluation.cost import COST_GRID, choose_fast, cost_rows, write_cost_report


def _records(n: int = 12) -> list[dict]:
    """IG rows score 0.50/0.30; IDG-4/4 is clearly worse than IDG-50/50, IDG-8/8 equal to it up to
    noise, every larger IDG equal too; so the rule must pick IDG-8/8."""
    passes = {"IDG-4/4": (8, 4), "IDG-8/8": (16, 8), "IDG-8/16": (24, 16), "IDG-16/16": (32, 16), "IDG-32/32": (64, 32),
              "IDG": (100, 50), "IG-8": (8, 8), "IG-16": (16, 16), "IG-32": (32, 32), "IG": (50, 50)}
    records = []
    for i in range(n):
        noise = 0.004 * (1 if i % 2 else -1)
        methods = {}
        for name, (f, b) in passes.items():
            ins, dele = (0.50, 0.30) if name.startswith("IG") else (0.60, 0.20)
            if name == "IDG-4/4":
                ins, dele = 0.52, 0.29
            if name == "IDG-8/8":
                ins, dele = ins + noise, dele - noise
            methods[name] = {"insertion": ins + 0.01 * i, "deletion": dele, "forward_passes": f, "backward_passes": b}
        records.append({"methods": methods})
    return records


def test_fast_is_the_cheapest_idg_within_noise_of_the_paper_and_not_worse_than_ig() -> None:
    rows = cost_rows(_records())
    assert [r["name"] for r in rows] == [n if n not in ("IG", "IDG") else {"IG": "IG-50", "IDG": "IDG-50/50"}[n] for n in COST_GRID]
    four = next(r for r in rows if r["name"] == "IDG-4/4")
    mean, half, count = four["insertion_vs_IDG"]
    assert count == 12 and abs(mean + 0.08) < 1e-9 and half < 1e-9  # clearly worse than IDG-50/50
    assert choose_fast(rows) == "IDG-8/8"


def test_the_paper_setting_is_the_fallback_and_nothing_passes_when_idg_loses_to_ig(tmp_path: Path) -> None:
    records = _records()
    for r in records:
        for name in ("IDG-8/8", "IDG-8/16", "IDG-16/16", "IDG-32/32"):
            r["methods"][name]["insertion"] -= 0.2
    assert choose_fast(cost_rows(records)) == "IDG-50/50"  # equal to itself, better than IG-50
    for r in records:
        r["methods"]["IDG"]["deletion"] = 0.35  # now worse than IG-50 on deletion
    assert choose_fast(cost_rows(records)) is None
    text = write_cost_report(records, tmp_path, machine="test", date="today", model="tiny").read_text()
    assert "No IDG row meets the rule" in text and "| IDG-8/8 | 16 / 8 |" in text and "Made with" not in text
    text = write_cost_report(records, tmp_path, machine="test", date="today", model="tiny", command="python -m x --suite cost").read_text()
    assert "Made with `python -m x --suite cost`" in text


def test_a_subset_of_the_grid_keeps_both_references_and_names_unknown_rows() -> None:
    from idg_evaluation.cost import cost_grid

    assert list(cost_grid(["IDG-8/16"])) == ["IDG-8/16", "IDG", "IG"]
    assert list(cost_grid(["IG-50", "IDG-8/8", "IDG-50/50"])) == ["IDG-8/8", "IDG", "IG"]
    assert cost_grid() == COST_GRID and cost_grid() is not COST_GRID
    with pytest.raises(ValueError, match=r"IDG-8/12 \(choose from IDG-4/4, IDG-8/8, IDG-8/16"):
        cost_grid(["IDG-8/12"])


def test_the_cost_cache_keeps_its_key_and_the_cpu_settings_get_their_own() -> None:
    """A new field must not orphan a cache of the same results (a run resumes from it). The saliency ranking did so on
    purpose (2026-11-27): the Lite0 table's cache, 773ce62bdb, holds scores of the old ranking, which no run may read
    back. A run with the service's CPU settings (folded batch norm, channels-last) must not mix its rows into an
    unfolded cache."""
    from idg_evaluation.runner import EvalConfig

    cfg = EvalConfig(methods=dict(COST_GRID), rise_step=896, batch_size=8, metrics=("insertion", "deletion"))
    assert cfg.key() == "8780ace835" != "773ce62bdb"
    folded = EvalConfig(methods=dict(COST_GRID), rise_step=896, batch_size=8, metrics=("insertion", "deletion"), fold_bn=True)
    assert folded.key() != cfg.key()
