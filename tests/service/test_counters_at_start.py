"""Every labelled counter exists at 0 for every label value it can take from start-up (issue #60): a series that
appears at its first increment has no earlier sample, so Prometheus's ``increase()`` and ``rate()`` miss that first
failure (``idg_durable_job_store_errors_total{operation="finish"}`` was created by its first error, and
IDGJobStoreErrors could not see it).

A fresh app's /metrics is scraped and every labelled counter in its registry is enumerated: each has its series at 0
for its whole domain (the store operations, rejection reasons, callback and image outcomes, tenants, models...). The
domains are checked against the code that increments them: every label the source passes as a literal (``.labels("x")``,
the runner's ``_store("x", ...)``, a cancellation's or a refusal's reason, a callback's outcome word) is in them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from app.doors.door import GRPC
from app.doors.layer import Doors
from app.monitoring.prometheus import CALLBACK_OUTCOMES, CONDITIONS, JOB_OUTCOMES, REJECTION_REASONS, STORE_OPERATIONS, Metrics, exposition
from tests.service.conftest import AppFactory, serve

APP = Path(__file__).resolve().parents[2] / "app"
Series = dict[str, set[tuple[tuple[str, str], ...]]]


async def fresh_series(tiny_app: AppFactory, **settings: object) -> tuple[Series, dict[str, tuple[str, ...]]]:
    """The counters' series of a fresh app (name -> label sets, each at 0), and each labelled counter's label names."""
    app = tiny_app(warmup=False, **settings)
    async with serve(app) as client:
        text = (await client.get("/metrics")).text
        labelled = {c._name: tuple(c._labelnames) for c in app.state.metrics.registry._collector_to_names  # noqa: SLF001
                    if isinstance(c, Counter) and c._labelnames}  # noqa: SLF001
    series: Series = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and family.name.startswith("idg_"):
                if not family.name.endswith("_seconds"):  # time goes on from the start; nothing else has happened yet
                    assert sample.value == 0, sample
                series.setdefault(family.name, set()).add(tuple(sorted(sample.labels.items())))
    return series, labelled


def values(series: Series, name: str, label: str) -> set[str]:
    return {dict(s)[label] for s in series.get(name, set())}


async def test_every_labelled_counter_of_a_fresh_app_has_every_label_value_at_0(tiny_app: AppFactory) -> None:
    series, labelled = await fresh_series(tiny_app)
    assert labelled, "no labelled counter found in the registry"
    for name in labelled:  # none waits for its first increment
        assert series.get(name), f"{name} has no series at start-up"
    domains = {
        ("idg_rejections", "reason"): set(REJECTION_REASONS),
        ("idg_durable_job_images", "outcome"): set(JOB_OUTCOMES),
        ("idg_durable_job_store_errors", "operation"): {"claim", "upkeep", "release", "finish", "get_job", "callback_sent"},
        ("idg_durable_job_callbacks", "outcome"): {"delivered", "refused", "failed"},
        ("idg_durable_jobs_submitted", "tenant"): {""},  # no keys: the jobs of no tenant
        ("idg_read_timeouts", "phase"): {"headers", "body"},
        ("idg_process_device_idle_seconds", "cause"): {"no_work", "host"},
        ("idg_device_idle_seconds", "cause"): {"no_work", "host"},
        ("idg_model_calls", "model"): {"tiny"},
        ("idg_explanations", "model"): {"tiny"},
        ("idg_predictions", "condition"): set(CONDITIONS),
        ("idg_call_rows", "kind"): {"real", "padding"},
    }
    for (name, label), domain in domains.items():
        assert values(series, name, label) == domain, (name, label)
    assert len(values(series, "idg_predicted_classes", "classes")) == 20  # the tiny model's 1000 classes in 20 ranges
    statuses = {"200", "500", "503", "504"}  # the statuses the alerts count, for every route
    assert values(series, "idg_http_requests", "status") >= statuses
    assert "/predict" in values(series, "idg_http_requests", "route")


async def test_each_api_keys_tenant_is_counted_from_the_start(tiny_app: AppFactory) -> None:
    series, _ = await fresh_series(tiny_app, api_key="k0", api_keys="alice:k1,bob:k2:admin")
    assert values(series, "idg_durable_jobs_submitted", "tenant") == {"default", "alice", "bob"}


def _calls(tree: ast.AST) -> Iterator[ast.Call]:
    return (node for node in ast.walk(tree) if isinstance(node, ast.Call))


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _literal(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


async def test_every_label_the_code_passes_is_in_a_domain_created_at_start(tiny_app: AppFactory) -> None:
    series, labelled = await fresh_series(tiny_app)
    attribute_of = {}  # Metrics' attribute -> counter name, read from the modules where each part declares its metrics
    declared = [APP / "doors" / "metrics.py", APP / "monitoring" / "drift_metrics.py", APP / "processes" / "metrics.py",
                APP / "worker" / "metrics.py", APP / "jobs" / "metrics.py", APP / "monitoring" / "prometheus.py"]
    for node in (n for path in declared for n in ast.walk(ast.parse(path.read_text()))):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _name(node.value) == "Counter"
                and isinstance(node.targets[0], ast.Attribute) and node.value.args and _literal(node.value.args[0])):
            attribute_of[node.targets[0].attr] = _literal(node.value.args[0])
    assert {"rejections", "job_store_errors", "model_calls", "predictions", "door_requests"} <= attribute_of.keys(), attribute_of
    found = 0
    for path in APP.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for call in _calls(tree):
            name = _name(call)
            f = call.func
            if name == "labels" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute):
                counter = attribute_of.get(f.value.attr)
                if counter is None:
                    continue  # a gauge's or a histogram's
                for position, arg in enumerate(call.args):
                    given = _literal(arg)
                    if given is not None:
                        found += 1
                        label = labelled[counter][position]
                        assert given in values(series, counter, label), f"{path}: {counter}{{{label}={given!r}}} is not created at start"
            elif name == "_store" and call.args and (given := _literal(call.args[0])) is not None:
                found += 1
                assert given in STORE_OPERATIONS, f"{path}: store operation {given!r}"
            elif name == "cancel" and call.args and (given := _literal(call.args[-1])) is not None:  # job.cancel / worker.cancel
                found += 1
                assert given in REJECTION_REASONS, f"{path}: cancellation reason {given!r}"
            elif name == "QueueFull":
                for kw in call.keywords:
                    if kw.arg == "reason" and (given := _literal(kw.value)) is not None:
                        found += 1
                        assert given in REJECTION_REASONS, f"{path}: refusal reason {given!r}"
    assert found >= 10, found  # the scan saw the code it checks
    # a callback's outcome: the word _delivered returns, or the "failed: ..." deliver ends with
    callbacks = ast.parse((APP / "jobs" / "callbacks.py").read_text())
    functions = [f for f in ast.walk(callbacks) if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                 and f.name in ("_delivered", "deliver")]
    assert len(functions) == 2
    words = set()
    for node in (n for f in functions for n in ast.walk(f)):
        if isinstance(node, ast.Return) and node.value is not None:
            if (word := _literal(node.value)) is not None and " " not in word:
                words.add(word)
            elif isinstance(node.value, ast.JoinedStr) and (head := _literal(node.value.values[0])) and ":" in head:
                words.add(head.split(":", 1)[0])
    assert words == set(CALLBACK_OUTCOMES) == values(series, "idg_durable_job_callbacks", "outcome"), words


def _rule_statuses() -> set[str]:
    """Every status an alert or recording rule names literally (``status="503"``, an alternative of ``status=~"a|b"``)."""
    import yaml

    from tests.test_monitoring import RULES

    names: set[str] = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for pattern in re.findall(r'status\s*(?:=~|!~|=|!=)\s*"([^"]*)"', rule["expr"]):
                names |= {alt for alt in pattern.split("|") if re.fullmatch(r"[A-Z_]+|\d{3}", alt)}
    return names


async def test_every_status_a_rule_reads_exists_at_0_for_every_route_and_rpc(tiny_app: AppFactory) -> None:
    """gRPC's UNKNOWN, DATA_LOSS and CANCELLED (the server-error rule reads the first two) had appeared only with their
    first call: each status a rule names is created at 0 for every RPC (gRPC's code names) and every route (HTTP's)."""
    statuses = _rule_statuses()
    grpc_names, http_codes = {s for s in statuses if not s.isdigit()}, {s for s in statuses if s.isdigit()}
    assert {"UNKNOWN", "DATA_LOSS", "UNAVAILABLE", "RESOURCE_EXHAUSTED"} <= grpc_names and "503" in http_codes, statuses
    metrics = Metrics()
    Doors(metrics).init_routes(GRPC, ["ModelInfer", "ServerMetadata"])
    grpc_series = {(dict(s)["route"], dict(s)["status"]) for s in
                   (tuple(sorted(sample.labels.items())) for f in text_string_to_metric_families(exposition(metrics.registry).decode())
                    if f.name == "idg_requests" for sample in f.samples if sample.name == "idg_requests_total")}
    for rpc in ("ModelInfer", "ServerMetadata"):
        missing = {name for name in grpc_names | {"CANCELLED", "OK"} if (rpc, name) not in grpc_series}
        assert not missing, f"{rpc}: {sorted(missing)} not created at start"
    series, _ = await fresh_series(tiny_app)
    http = {(dict(s)["route"], dict(s)["status"]) for s in series["idg_requests"] if dict(s)["door"] == "http"}
    for route in ("/predict", "/attribute", "/v2/models/{name}/infer", "/jobs"):
        assert {(route, code) for code in http_codes | {"500", "504"}} <= http, route
