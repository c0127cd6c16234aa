"""deploy/monitoring works on first start: the rules pass ``promtool check`` and their unit tests
(input series -> alerts firing and silent), they and the Grafana dashboard name only metrics the
service exports (or rules record), docker-compose.yml provisions what exists, and (slow) a real
Prometheus scraping a real server process records a series that its HTTP API gives back."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.monitoring.prometheus import Metrics

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "rules" / "idg.rules.yml"
RULE_TESTS = tuple(MONITORING / "rules" / f"idg.{n}.test.yml" for n in ("rules", "faithfulness", "drift"))
DASHBOARD = MONITORING / "grafana" / "dashboards" / "idg.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian's prometheus package; scripts/setup.sh dev)")

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_series() -> set[str]:
    """Every series name the service's /metrics can carry (labelled families have no sample until used)."""
    return {family.name + suffix for family in Metrics().registry.collect() for suffix in SUFFIXES[family.type]}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=MONITORING)


@needs_promtool
def test_rules_and_config_pass_promtool_check() -> None:
    rules = promtool("check", "rules", str(RULES))
    assert rules.returncode == 0 and "SUCCESS" in rules.stdout, rules.stdout + rules.stderr
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    passed = promtool("test", "rules", *(str(t) for t in RULE_TESTS))
    assert passed.returncode == 0 and passed.stdout.count("SUCCESS") == len(RULE_TESTS), passed.stdout + passed.stderr


@pytest.mark.slow
@needs_promtool
def test_rule_unit_tests_fail_when_the_alerts_are_silenced(tmp_path: Path) -> None:
    """The unit tests against the rules with every alert's expression never true: each expectation
    of a firing alert fails (the tests are not vacuous), and only those."""
    yaml = pytest.importorskip("yaml")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["expr"] = "vector(1) == 0"
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules))
    for t in RULE_TESTS:
        (tmp_path / t.name).write_text(t.read_text())
    failed = subprocess.run([str(PROMTOOL), "test", "rules", *(t.name for t in RULE_TESTS)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    firing = [a for t in RULE_TESTS for test in yaml.safe_load(t.read_text())["tests"] for a in test.get("alert_rule_test", [])
              if a["exp_alerts"]]
    out = failed.stdout + failed.stderr
    assert len(firing) >= 8 and failed.returncode != 0, out
    assert out.count("alertname:") == len(firing), out


def names_in(text: str) -> tuple[set[str], set[str]]:
    """The raw metric names (``idg_...``) and recorded names (``idg:...``) a file's queries use."""
    return set(re.findall(r"\bidg_[a-z_]+\b", text)), set(re.findall(r"\bidg:[a-z0-9_:]+\b", text))


def test_rules_and_dashboard_use_only_metrics_the_service_exports() -> None:
    import json

    rules = RULES.read_text()
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    recorded = set(re.findall(r"record: (\S+)", rules))
    raw_rules, used_rules = names_in(rules)
    raw_dash, used_dash = names_in(exprs)
    assert raw_rules and raw_dash and used_dash
    assert raw_rules | raw_dash <= exported_series(), (raw_rules | raw_dash) - exported_series()
    assert (used_rules - recorded) == set() and (used_dash - recorded) == set(), (used_rules | used_dash) - recorded
    wanted = {"idg_requests_total", "idg_request_seconds_bucket", "idg_http_requests_total", "idg_device_idle_seconds_total",
              "idg_device_busy_seconds_total", "idg_faithfulness_sum"}
    assert wanted <= raw_rules
    assert all(p.get("datasource", {"uid": "prometheus"})["uid"] == "prometheus" for p in dashboard["panels"])


def test_compose_provisions_prometheus_and_grafana_from_files_that_exist() -> None:
    yaml = pytest.importorskip("yaml")
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"idg", "prometheus", "grafana"} <= set(services)
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    target = config["scrape_configs"][0]["static_configs"][0]["targets"][0]
    assert target == "idg:8000" and services["idg"]["ports"][0].endswith(":8000")  # the service's name and port in Compose
    datasource = yaml.safe_load((MONITORING / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    assert datasource["uid"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == "/var/lib/grafana/dashboards/" + DASHBOARD.name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus on loopback with the shipped config and rules, scraping ``target`` every second."""
    assert PROMETHEUS is not None
    config = (MONITORING / "prometheus.yml").read_text()
    for old, new in (("idg:8000", target), ("scrape_interval: 15s", "scrape_interval: 1s"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s"), ("rules/idg.rules.yml", str(RULES))):
        assert old in config, old
        config = config.replace(old, new)
    (tmp_path / "prometheus.yml").write_text(config)
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed with the process by the caller's kill
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def recorded(result: list[dict[str, Any]]) -> bool:
    """Whether a query found a series whose value is a number (a rate over one scrape is 0 / 0 = NaN)."""
    return bool(result) and result[0]["value"][1] != "NaN"


def query(url: str, expr: str) -> list[dict[str, Any]]:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is missing (Debian's prometheus package; scripts/setup.sh dev)")
def test_a_real_prometheus_records_the_real_servers_series(tmp_path: Path) -> None:
    from tests.service.conftest import image_bytes
    from tests.service.reliability.server_app import serve_process

    with serve_process(tmp_path / "server.log") as served:
        proc, url = start_prometheus(tmp_path, f"127.0.0.1:{served.port}")
        try:
            deadline, found, faithful = time.monotonic() + 90, [], []
            while time.monotonic() < deadline and not (recorded(found) and recorded(faithful)):
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                httpx.post(served.url + "/predict", files={"file": ("a.png", image_bytes())}, timeout=30)
                httpx.post(served.url + "/attribute", files={"file": ("a.png", image_bytes())}, timeout=30,
                           data={"steps": "4", "probe_steps": "4", "faithfulness": "insertion", "return_overlay": "false"})
                try:
                    found = query(url, 'idg:http_requests:rate5m{route="/predict", status="200"}')
                    faithful = query(url, 'idg:faithfulness:mean_15m{metric="insertion"}')
                except httpx.HTTPError:
                    pass  # Prometheus is still starting
                time.sleep(1)
            assert found and float(found[0]["value"][1]) > 0, (tmp_path / "prometheus.log").read_text()[-3000:]
            assert faithful and faithful[0]["metric"]["model"] == "tiny" and 0 <= float(faithful[0]["value"][1]) <= 1
            targets = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            assert [t["health"] for t in targets] == ["up"]
            rules = httpx.get(url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
            assert all(r["health"] == "ok" for g in rules for r in g["rules"]), rules
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_the_compose_file_sets_only_settings_the_service_has_and_keeps_their_defaults_where_it_says_nothing() -> None:
    """Every IDG_* variable the compose file passes is a setting, and its fallback is the setting's own default
    (a compose file that pinned IDG_PRECISION to fp32 had given every GPU user IEEE fp32)."""
    from app.core.config import Settings

    yaml = pytest.importorskip("yaml")
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = compose["services"]["idg"]["environment"]
    fields = Settings.model_fields
    for name, value in env.items():
        field = name.removeprefix("IDG_").lower()
        assert field in fields, f"{name} is not a setting"
        fallback = str(value).split(":-", 1)[1].rstrip("}") if ":-" in str(value) else None
        default = fields[field].default
        if fallback is None or field in ("host", "port", "api_key", "cors_origins", "models"):  # deployment choices
            continue
        try:
            same = float(fallback) == float(default)
        except (TypeError, ValueError):
            same = fallback.lower() == str(default).lower()
        assert same, f"{name}: the compose file falls back to {fallback}, the service to {default}"


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every dashboard target, its variables set to all (instance, model) and a 1 m rate window."""
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$model", ".*")
            out.append((panel["title"], expr))
    return out


def test_the_dashboard_filters_by_instance_and_model() -> None:
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["instance", "model"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert "$instance" in target["expr"] or "$model" in target["expr"], f"{panel['title']}: {target['expr']} ignores both"


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is missing (Debian's prometheus package; scripts/setup.sh dev)")
def test_every_dashboard_panel_query_returns_series_from_a_real_prometheus(tmp_path: Path) -> None:
    """A real Prometheus with the shipped rules scrapes a real server that answered predictions, explanations and a
    durable job, started with a drift reference (IDG_DRIFT_REFERENCE, the drift row's): every query of every panel finds
    a series (none names a metric or label nobody exports)."""
    import json

    from tests.service.conftest import image_bytes
    from tests.service.reliability.server_app import serve_process

    queries = panel_queries()
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"format": 1, "models": {"tiny": {
        "classes": {"0": 0.5, "1": 0.5}, "confidence": 0.6, "concentration": 0.3, "faithfulness": {"idg": {"insertion": 0.7}}}}}))
    with serve_process(tmp_path / "server.log", IDG_DATA_DIR=tmp_path / "data", IDG_DRIFT_REFERENCE=reference) as served:
        proc, url = start_prometheus(tmp_path, f"127.0.0.1:{served.port}")
        try:
            job = httpx.post(served.url + "/jobs", files=[("files", ("a.png", image_bytes(), "image/png"))], timeout=30)
            assert job.status_code in (200, 201, 202), job.text
            deadline, empty = time.monotonic() + 120, queries
            while time.monotonic() < deadline and empty:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
                httpx.post(served.url + "/predict", files={"file": ("a.png", image_bytes())}, timeout=30)
                httpx.post(served.url + "/attribute", files={"file": ("a.png", image_bytes())}, timeout=30,
                           data={"steps": "4", "probe_steps": "4", "faithfulness": "insertion", "return_overlay": "false"})
                with contextlib.suppress(httpx.HTTPError):  # Prometheus is still starting
                    empty = [(title, expr) for title, expr in empty if not query(url, expr)]
                time.sleep(1)
            assert not empty, empty
        finally:
            proc.terminate()
            proc.wait(timeout=30)
