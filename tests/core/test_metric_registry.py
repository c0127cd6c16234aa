"""One registry of faithfulness metrics: each file declares its own (name, direction, cost), and the service's score,
the evaluation and the docs all read :data:`idg_core.metrics.METRICS`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from idg_core.faithfulness import FAITHFULNESS_METRICS, parse_metrics
from idg_core.metrics import METRICS, Metric
from idg_evaluation.report import EXTRA
from idg_evaluation.report import METRICS as REPORT_COLUMNS
from idg_evaluation.runner import ALL_METRICS, WITH_ROAD, EvalConfig

ROOT = Path(__file__).resolve().parents[2]


def test_each_metric_is_declared_in_its_own_file() -> None:
    for name, metric in METRICS.items():
        assert isinstance(metric, Metric) and metric.name == name
        homes = [m for m in ("rise", "pic", "road") if metric in vars(importlib.import_module(f"idg_core.metrics.{m}")).values()]
        assert len(homes) == 1, (name, homes)


def test_the_service_and_the_evaluation_read_the_registry() -> None:
    assert FAITHFULNESS_METRICS == tuple(n for n, m in METRICS.items() if m.service) == ("insertion", "deletion")
    assert parse_metrics("deletion,insertion") == ("insertion", "deletion")
    # the evaluation's defaults, and so its cache keys, are what they were before the registry
    assert ALL_METRICS == ("insertion", "deletion", "sic", "aic") and (*ALL_METRICS, "road") == WITH_ROAD
    assert EvalConfig().key() == "d04079b30c"
    arrows = dict(REPORT_COLUMNS) | dict(EXTRA)
    assert all(arrows[n] == ("↑" if m.higher_is_better else "↓") for n, m in METRICS.items())


def test_the_docs_table_lists_every_metric() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        hooks = importlib.import_module("mkdocs_hooks")
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    table = hooks.faithfulness_table()
    assert all(f"| `{n}` | {'higher' if m.higher_is_better else 'lower'} |" in table for n, m in METRICS.items())
    assert "<!-- generated:faithfulness -->" in (ROOT / "docs" / "methods" / "metrics.md").read_text()
