"""One registry of faithfulness metrics: each file declares its own (name, direction, cost), and the service's score,
the evaluation and the docs all read :data:`idg_core.metrics.METRICS`."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from idg_core.faithfulness import FAITHFULNESS_METRICS, parse_metrics
from idg_core.metrics import METRICS, Metric
from idg_evaluation.report import EXTRA, RULE_METRICS
from idg_evaluation.report import METRICS as REPORT_COLUMNS
from idg_evaluation.runner import ALL_METRICS, WITH_ROAD, EvalConfig

ROOT = Path(__file__).resolve().parents[2]


def _declared_in(module: str) -> list[str]:
    """The names of the metrics ``idg_core.metrics.<module>`` declares (``X = Metric(...)`` at module level)."""
    tree = ast.parse((ROOT / "idg_core" / "metrics" / f"{module}.py").read_text())
    calls = [n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Name) and n.value.func.id == "Metric"]
    mod = importlib.import_module(f"idg_core.metrics.{module}")
    return [getattr(mod, t.id).name for n in calls for t in n.targets if isinstance(t, ast.Name)]


def test_each_metric_is_declared_in_a_file_of_its_own() -> None:
    """As a method is: ``insertion.py`` declares insertion, ``sic.py`` SIC; ROAD's two directions share ``road.py``."""
    modules = sorted(p.stem for p in (ROOT / "idg_core" / "metrics").glob("*.py") if p.stem != "__init__")
    homes = {name: module for module in modules for name in _declared_in(module)}
    assert homes == {name: name for name in METRICS if not name.startswith("road_")} | {"road_morf": "road", "road_lerf": "road"}
    for name, metric in METRICS.items():
        assert isinstance(metric, Metric) and metric.name == name


def test_diffid_is_derived_from_insertion_and_deletion_through_the_registry() -> None:
    diffid = METRICS["diffid"]
    assert diffid.derived_from == ("insertion", "deletion") and diffid.higher_is_better and not diffid.service
    assert diffid.of({"insertion": 0.7, "deletion": 0.2}) == 0.7 - 0.2
    assert diffid.of({"insertion": 0.7}) is None and diffid.of({"insertion": 0.7, "deletion": None}) is None
    assert METRICS["sic"].of({"sic": 0.4}) == 0.4 and METRICS["sic"].of({}) is None
    assert "diffid" not in WITH_ROAD  # nothing measures it: the report computes it
    assert (*REPORT_COLUMNS, ("diffid", "↑")) == RULE_METRICS
    with pytest.raises(ValueError, match="derived_from and combine"):
        Metric("half", higher_is_better=True, cost="", summary="", derived_from=("insertion",))


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
