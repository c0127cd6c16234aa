"""Each alert of deploy/monitoring/rules fires on its own fault, caused on a real server process, and stays silent
while that server is healthy.

A test starts ``python -m app.server`` (the tiny model; a simulated device where calls must take time), causes the
fault (a device call that stalls past the deadline, a start-up that does not end, a full queue, 504s, a server
process killed, the whole server killed), and scrapes the real ``/metrics`` twice a few seconds apart. Those two
scrapes become a ``promtool test rules`` file: each counter goes on at the rate measured between them and each gauge
stays at its value for 30 minutes (what Prometheus would have scraped had the state lasted), with the ``job`` and
``instance`` labels Prometheus adds and ``up`` 1 (0 for a server that did not answer). promtool then evaluates the
shipped rules on them; the rules' annotations are stripped, as the unit tests (idg.rules.test.yml) check their text.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import Served, serve_process
from tests.test_monitoring import PROMTOOL, RULES

yaml = pytest.importorskip("yaml")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian's prometheus package; scripts/setup.sh dev)")

MINUTES = 30  # how long each window's state is held in the generated series
EVAL = "25m"  # when the alerts are evaluated: past every rule's `for` and rate window
Series = dict[tuple[str, frozenset[tuple[str, str]]], tuple[str, float]]  # (name, labels) -> (counter | gauge, value)


def scrape(url: str) -> Series | None:
    """One scrape of ``url``'s /metrics as Prometheus ingests it, or None when it does not answer."""
    try:
        r = httpx.get(url + "/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out: Series = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            kind = "counter" if family.type in ("counter", "histogram", "summary") else "gauge"
            out[(sample.name, frozenset(sample.labels.items()))] = (kind, float(sample.value))
    return out


@dataclass
class Window:
    """Two scrapes of one instance, ``seconds`` apart: its counters' rates and its gauges' values in between."""

    instance: str
    before: Series | None
    after: Series | None
    seconds: float

    def value(self, name: str, **labels: str) -> float:
        assert self.after is not None
        return self.after[(name, frozenset(labels.items()))][1]

    def increase(self, name: str, **labels: str) -> float:
        assert self.before is not None and self.after is not None
        key = (name, frozenset(labels.items()))
        return self.after[key][1] - self.before.get(key, ("counter", 0.0))[1]


def window(served: Served | str, instance: str, seconds: float = 2.0, during: Callable[[], object] | None = None) -> Window:
    """Scrape, then ``during()`` (or wait ``seconds``), then scrape again."""
    url = served if isinstance(served, str) else served.url
    before, began = scrape(url), time.monotonic()
    if during is not None:
        during()
    else:
        time.sleep(seconds)
    after = scrape(url)
    return Window(instance, before, after, max(time.monotonic() - began, 0.1))


def _selector(name: str, labels: dict[str, str]) -> str:
    quoted = ", ".join('{}="{}"'.format(k, v.replace("\\", "\\\\").replace('"', '\\"')) for k, v in sorted(labels.items()))
    return f"{name}{{{quoted}}}"


def input_series(w: Window) -> list[dict[str, str]]:
    """The window as promtool input series, held for :data:`MINUTES` at 1-minute steps."""
    base = {"job": "idg", "instance": w.instance}
    up = w.after is not None
    out = [{"series": _selector("up", base), "values": f"{int(up)}x{MINUTES}"}]
    if w.after is None:
        return out
    for (name, labels), (kind, value) in sorted(w.after.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1]))):
        if kind == "counter":
            earlier = (w.before or {}).get((name, labels), (kind, 0.0))[1]
            per_minute = max(0.0, value - earlier) / w.seconds * 60
            values = f"{value:.6f}+{per_minute:.6f}x{MINUTES}"
        else:
            values = f"{value:.6f}x{MINUTES}"
        out.append({"series": _selector(name, dict(labels) | base), "values": values})
    return out


def severity(alert: str) -> str:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return str(rule["labels"]["severity"])
    raise AssertionError(f"no alert {alert} in {RULES}")


def firing(alert: str, instance: str, **labels: str) -> dict[str, Any]:
    """An expected alert: its labels (those of its series, its severity)."""
    return {"exp_labels": {"severity": severity(alert), "job": "idg", "instance": instance, **labels}}


def assert_alerts(tmp_path: Path, windows: list[Window], expected: dict[str, list[dict[str, Any]]]) -> None:
    """promtool evaluates the shipped rules on the windows' series at :data:`EVAL`: each alert of ``expected`` fires
    exactly as listed there (an empty list: silent)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [s for w in windows for s in input_series(w)],
        "alert_rule_test": [{"alertname": a, "eval_time": EVAL, "exp_alerts": exp} for a, exp in expected.items()]}]}
    (tmp_path / "alerts.test.yml").write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "test", "rules", "alerts.test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def _post(served: Served, path: str, **data: str) -> httpx.Response:
    return httpx.post(served.url + path, files={"file": ("a.png", image_bytes(), "image/png")}, data=data, timeout=60)


def _until(check: Callable[[], bool], limit_s: float, what: str, served: Served) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s} s:\n{served.log()[-3000:]}"
        time.sleep(0.05)


def _status(served: Served, path: str) -> str:
    try:
        return str(httpx.get(served.url + path, timeout=5).json().get("status"))
    except (httpx.HTTPError, ValueError):
        return ""


def test_metrics_answer_from_the_start_and_readiness_follows_a_start_that_does_not_end_and_a_stalled_device(
        tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.touch()  # the app's start-up (its lifespan, where a model loads) waits while this file exists
    # every simulated device call takes 6 s; a request's deadline is 0.5 s, the watchdog's grace 0.5 s more
    with serve_process(tmp_path / "server.log", wait_ready=False, IDG_TEST_HOLD_START=hold, IDG_SIMULATED_CALL_MS=6000,
                       IDG_REQUEST_TIMEOUT_S=0.5, IDG_WATCHDOG_GRACE_S=0.5, IDG_BATCH_WAIT_MS=0) as served:
        # starting: /metrics answers (idg_ready 0), /health/ready and the work routes 503
        _until(lambda: scrape(served.url) is not None, 30, "/metrics answered", served)
        starting = window(served, "idg:8000", 1.0)
        assert starting.value("idg_ready") == 0 and starting.value("idg_ready_processes") == 0
        assert starting.after is not None and any(name == "idg_build_info" for name, _ in starting.after)
        ready = httpx.get(served.url + "/health/ready", timeout=5)
        assert ready.status_code == 503 and ready.json() == {"status": "starting"}
        work = _post(served, "/predict")
        assert work.status_code == 503 and work.json()["error"]["code"] == "not_ready", work.text
        assert httpx.get(served.url + "/health/live", timeout=5).status_code == 200
        assert_alerts(tmp_path, [starting], {"IDGNotReady": [firing("IDGNotReady", "idg:8000")], "IDGDown": []})
        hold.unlink()
        _until(lambda: _status(served, "/health/ready") == "ready", 30, "the start-up ended", served)

        healthy = window(served, "idg:8000", 1.0)
        assert healthy.value("idg_ready") == 1 and healthy.value("idg_ready_processes") == 1
        assert_alerts(tmp_path, [healthy], {"IDGNotReady": [], "IDGDown": [], "IDGDeviceSaturated": []})

        # a device call that stalls past the request's deadline and the watchdog's grace
        answered: list[httpx.Response] = []
        caller = threading.Thread(target=lambda: answered.append(_post(served, "/predict")))
        began = time.monotonic()
        caller.start()
        _until(lambda: _status(served, "/health/ready") == "stuck", 10, "the worker counted as stuck", served)
        # a call is booked as it runs once it ran a second (that second at once): the window starts after
        _until(lambda: served.metric("idg_device_busy_seconds_total") > 0, 5, "the stalled call booked busy", served)
        stuck = window(served, "idg:8000", 2.0)
        caller.join(timeout=30)
        assert answered and answered[0].status_code == 504, answered
        # readiness follows the health state: 0 while /health/ready says stuck
        assert stuck.value("idg_ready") == 0 and stuck.value("idg_ready_processes") == 0
        # the stalled call is booked busy as it stalls (a second per second, to the watchdog's 0.25 s ticks), not all
        # at once when it ends
        busy = stuck.increase("idg_device_busy_seconds_total")
        assert stuck.seconds - 0.75 <= busy <= stuck.seconds + 0.6, (busy, stuck.seconds)
        _until(lambda: _status(served, "/health/ready") == "ready", 15, "readiness came back", served)
        ended = time.monotonic() - began
        total = served.metric("idg_device_busy_seconds_total")
        assert 5.5 <= total <= min(ended, 6.6), (total, ended)  # its end booked only the rest: never more than the call
        _until(lambda: served.metric("idg_ready") == 1, 5, "idg_ready back to 1 (the watchdog's next tick)", served)
        assert_alerts(tmp_path, [stuck], {"IDGNotReady": [firing("IDGNotReady", "idg:8000")], "IDGDown": []})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the traffic faults: a simulated device call takes 20 ms + 5 ms per image (a prediction 25 ms, an
    explanation of 1024 points 5 s), room for one explanation at a time, 2 s deadlines."""
    folder = tmp_path_factory.mktemp("served")  # its job store too (module-scoped: before the per-test IDG_DATA_DIR)
    with serve_process(folder / "server.log", IDG_SIMULATED_CALL_MS=20, IDG_SIMULATED_IMAGE_MS=5, IDG_MAX_QUEUE=1,
                       IDG_REQUEST_TIMEOUT_S=2, IDG_BATCH_WAIT_MS=0, IDG_REPLICAS_EXPECTED=2, IDG_DATA_DIR=folder / "data") as served:
        yield served


def test_a_full_queue_fires_queue_saturated_and_unavailable_answers(tmp_path: Path, served: Served) -> None:
    healthy = window(served, "idg:8000", during=lambda: [_post(served, "/predict") for _ in range(3)])

    def burst() -> None:
        """One explanation of 320 points (1.6 s) holds the queue's one place; seven more come meanwhile."""
        answers: list[int] = []

        def explain(steps: str, probe_steps: str) -> None:
            answers.append(_post(served, "/attribute", steps=steps, probe_steps=probe_steps, return_overlay="false").status_code)

        holder = threading.Thread(target=explain, args=("256", "64"))
        holder.start()
        _until(lambda: served.metric("idg_queue_depth") == 1, 10, "the explanation admitted", served)
        callers = [threading.Thread(target=explain, args=("8", "4")) for _ in range(7)]
        for c in callers:
            c.start()
        for c in [*callers, holder]:
            c.join(timeout=60)
        assert answers.count(503) >= 5, answers

    full = window(served, "idg:8000", during=burst)
    assert full.increase("idg_rejections_total", reason="queue_full") >= 5
    assert_alerts(tmp_path, [full], {
        "IDGQueueSaturated": [firing("IDGQueueSaturated", "idg:8000", reason="queue_full")],
        "IDGUnavailableAnswers": [firing("IDGUnavailableAnswers", "idg:8000")]})
    assert_alerts(tmp_path, [healthy], {"IDGQueueSaturated": [], "IDGUnavailableAnswers": []})


def test_server_errors_of_one_instance_fire_for_it_alone(tmp_path: Path, served: Served) -> None:
    """7% of one instance's answers are 504s (explanations past their deadline) beside a healthy instance with more
    traffic: the alert fires for that instance (a ratio over both would read about 2% and stay silent). Both
    instances are windows of the one server, the healthy one before the fault."""
    def traffic(predictions: int, late: int) -> None:
        codes = [_post(served, "/predict").status_code for _ in range(predictions)]
        codes += [_post(served, "/attribute", steps="512", probe_steps="512", return_overlay="false").status_code
                  for _ in range(late)]
        assert codes.count(200) == predictions and codes.count(504) == late, codes

    healthy = window(served, "healthy:8000", during=lambda: traffic(30, 0))
    failing = window(served, "failing:8000", during=lambda: traffic(13, 1))
    assert failing.increase("idg_http_requests_total", route="/attribute", status="504") == 1
    assert_alerts(tmp_path, [healthy, failing], {"IDGServerErrors": [firing("IDGServerErrors", "failing:8000")]})
    assert_alerts(tmp_path, [healthy], {"IDGServerErrors": []})


def test_failing_durable_job_images_fire_job_images_failing(tmp_path: Path, served: Served) -> None:
    """Half the images of a durable job are not images: each is answered with an error and the alert fires (the
    outcome counters exist at 0 from the start, so the first failures count); a job of good images stays silent."""
    def job(good: int, bad: int) -> None:
        files = [("files", (f"g{i}.png", image_bytes(), "image/png")) for i in range(good)]
        files += [("files", (f"b{i}.png", b"not an image", "image/png")) for i in range(bad)]
        r = httpx.post(served.url + "/jobs", files=files, data={"steps": "8", "probe_steps": "4"}, timeout=30)
        assert r.status_code == 202, r.text
        status = r.json()
        url = served.url + status["url"]  # links are paths unless IDG_PUBLIC_URL is set
        _until(lambda: httpx.get(url, timeout=10).json()["state"] == "done", 60, "the job finished", served)

    healthy = window(served, "idg:8000", during=lambda: job(3, 0))
    failing = window(served, "idg:8000", during=lambda: job(2, 2))
    assert failing.increase("idg_durable_job_images_total", outcome="failed") == 2
    assert failing.increase("idg_durable_job_images_total", outcome="answered") == 2
    assert_alerts(tmp_path, [failing], {"IDGJobImagesFailing": [firing("IDGJobImagesFailing", "idg:8000")]})
    assert_alerts(tmp_path, [healthy], {"IDGJobImagesFailing": []})


def test_a_replica_gone_from_discovery_fires_replicas_missing(tmp_path: Path, served: Served) -> None:
    """Two replicas expected (IDG_REPLICAS_EXPECTED=2): with both up it is silent; with one killed and gone from service
    discovery (a Ray Serve replica's target leaves within seconds: no series at all, not even ``up``) it fires. Both
    replicas are scrapes of the one server under two instance names."""
    one = window(served, "replica-a:9000", 1.0)
    other = window(served, "replica-b:9000", 1.0)
    assert one.value("idg_replicas_expected") == 2
    assert_alerts(tmp_path, [one], {"IDGReplicasMissing": [{"exp_labels": {"severity": severity("IDGReplicasMissing"), "job": "idg"}}],
                                    "IDGDown": []})
    assert_alerts(tmp_path, [one, other], {"IDGReplicasMissing": [], "IDGDown": []})


def _replica_pid(served: Served) -> int:
    r = httpx.get(served.url + "/health/ready", timeout=10)
    assert r.status_code == 200, r.text
    return int(r.headers["x-idg-replica"].rsplit(":", 1)[1])


@pytest.mark.slow
def test_a_killed_server_process_fires_processes_missing_and_a_killed_server_fires_down(tmp_path: Path) -> None:
    hold = tmp_path / "hold"  # absent: the processes start; present: a replacement's start-up waits
    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2, IDG_TEST_HOLD_START=hold) as served:
        _until(lambda: served.metric("idg_ready_processes") == 2, 60, "both processes ready", served)
        healthy = window(served, "idg:8000", 1.0)
        assert healthy.value("idg_processes_expected") == 2
        hold.touch()
        victim = _replica_pid(served)
        os.kill(victim, signal.SIGKILL)
        _until(lambda: "starting another in its place" in served.log(), 30, "the launcher replaced the process", served)
        missing = window(served, "idg:8000", 1.0)
        assert missing.value("idg_ready_processes") == 1 and missing.value("idg_processes_expected") == 2
        assert_alerts(tmp_path, [missing], {"IDGProcessesMissing": [firing("IDGProcessesMissing", "idg:8000")],
                                            "IDGNotReady": [], "IDGDown": []})
        assert_alerts(tmp_path, [healthy], {"IDGProcessesMissing": [], "IDGNotReady": []})
        hold.unlink()
        _until(lambda: served.metric("idg_ready_processes") == 2, 60, "the replacement ready", served)
        served.proc.kill()  # the launcher, and with it its processes
        served.proc.wait(timeout=30)
        _until(lambda: scrape(served.url) is None, 30, "the server gone", served)
        down = window(served, "idg:8000", 0.1)
        assert_alerts(tmp_path, [down], {"IDGDown": [firing("IDGDown", "idg:8000")]})


def _stop_postgres(url: str) -> None:
    """Stop the PostgreSQL server behind ``url`` at once (the job store goes down under the running service)."""
    import psycopg

    from tests.service.jobs.postgres_server import _as_user, _binary

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    prefix, _, _ = _as_user()
    pg_ctl = _binary("pg_ctl")
    assert pg_ctl is not None
    subprocess.run([*prefix, pg_ctl, "-D", str(row[0]), "-m", "immediate", "stop"], check=True, capture_output=True, timeout=60)


@pytest.mark.slow
def test_a_job_store_that_goes_down_fires_store_errors_and_not_ready(tmp_path: Path) -> None:
    from tests.service.jobs.postgres_server import postgres_server

    with postgres_server() as url, serve_process(tmp_path / "server.log", IDG_JOBS_DB_URL=url) as served:
        healthy = window(served, "idg:8000", 2.0)
        assert healthy.value("idg_ready") == 1
        _stop_postgres(url)
        _until(lambda: served.metric("idg_ready") == 0, 15, "readiness followed the store", served)
        down = window(served, "idg:8000", 2.5)
        assert down.increase("idg_durable_job_store_errors_total", operation="claim") >= 1
        assert down.value("idg_ready") == 0 and down.value("idg_ready_processes") == 0
        assert_alerts(tmp_path, [down], {"IDGJobStoreErrors": [firing("IDGJobStoreErrors", "idg:8000", operation="claim")],
                                         "IDGNotReady": [firing("IDGNotReady", "idg:8000")], "IDGDown": []})
        assert_alerts(tmp_path, [healthy], {"IDGJobStoreErrors": [], "IDGNotReady": []})
