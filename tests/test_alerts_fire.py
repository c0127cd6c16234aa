"""Each alert of deploy/monitoring/rules fires on its own fault, caused on a real server process, and stays silent
while that server is healthy.

A test starts ``python -m app.server`` (the tiny model; a simulated device where calls must take time), causes the
fault (a device call that stalls past the deadline, a start-up that does not end, a full queue, 504s, a server
process killed, the whole server killed, a slow device, a fast device behind a busy host, inputs that change), and
scrapes the real ``/metrics`` twice a few seconds apart. Those two scrapes become a ``promtool test rules`` file: each
counter goes on at the rate measured between them and each gauge stays at its value for 30 minutes (what Prometheus
would have scraped had the state lasted), with the ``job`` and ``instance`` labels Prometheus adds and ``up`` 1 (0 for
a server that did not answer). The drift alerts compare the last 15 minutes with the reference the server exports
(recorded by ``idg-drift-reference`` from red patches): their series are phases, a healthy window's rates and the fault
window's one after the other (:data:`Phases`). promtool then evaluates the shipped rules
that the tested alerts read on them; the rules' annotations are stripped, as the unit tests (idg.rules.test.yml) check
their text.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from app.monitoring import drift_reference
from app.monitoring.prometheus import STORE_OPERATIONS
from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import APP, ROOT, Served, serve_process
from tests.test_monitoring import PROMTOOL, RULES

log = logging.getLogger(__name__)
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


Phases = list[tuple[Window, int]]
"""One instance in each window's state for so many minutes, one after the other (the drift alerts: the healthy window's
rates, the fault's, the healthy window's again)."""


def input_series(w: Window | Phases, step: int = 1) -> list[dict[str, str]]:
    """The window as promtool input series, held for :data:`MINUTES` at ``step``-minute steps; or the phases, one after
    the other, each counter going on from where the phase before left it at the rate of its own window."""
    phases = [(w, MINUTES)] if isinstance(w, Window) else w
    base = {"job": "idg", "instance": phases[0][0].instance}
    # each phase but the last gives its steps' samples, the last one more (a single window: MINUTES + 1, as before)
    counts = [m // step + (i == len(phases) - 1) for i, (_, m) in enumerate(phases)]
    out = [{"series": _selector("up", base), "values": " ".join(f"{int(p.after is not None)}x{n - 1}"
                                                                for (p, _), n in zip(phases, counts, strict=True))}]
    keys = sorted({k for p, _ in phases for k in (p.after or {})}, key=lambda k: (k[0], sorted(k[1])))
    for name, labels in keys:
        segments, total = [], None
        for (p, _), n in zip(phases, counts, strict=True):
            kind, value = (p.after or {}).get((name, labels), ("gauge", None))
            if value is None:  # not in this phase's scrape: no samples
                segments.append(" ".join(["_"] * n))
                continue
            if kind == "counter":
                earlier = (p.before or {}).get((name, labels), (kind, 0.0))[1]
                per_step = max(0.0, value - earlier) / p.seconds * 60 * step
                start = value if total is None else total + per_step
                segments.append(f"{start:.6f}+{per_step:.6f}x{n - 1}")
                total = start + per_step * (n - 1)
            else:
                segments.append(f"{value:.6f}x{n - 1}")
        out.append({"series": _selector(name, dict(labels) | base), "values": " ".join(segments)})
    return out


def _names(expr: str) -> set[str]:
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))


def rules_for(alerts: Iterable[str]) -> tuple[dict[str, Any], set[str]]:
    """The shipped rules cut to ``alerts`` and the recording rules they read (annotations stripped), and every name
    their expressions read: what promtool needs to evaluate them (a day of samples of every series and rule takes it
    a minute)."""
    rules = yaml.safe_load(RULES.read_text())
    records = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    todo = [r["expr"] for g in rules["groups"] for r in g["rules"] if r.get("alert") in alerts]
    needed = {"up"}
    while todo:
        for name in _names(todo.pop()) - needed:
            needed.add(name)
            if name in records:
                todo.append(records[name])
    for group in rules["groups"]:
        group["rules"] = [r for r in group["rules"] if r.get("alert") in alerts or r.get("record") in needed]
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return rules, needed


def severity(alert: str) -> str:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return str(rule["labels"]["severity"])
    raise AssertionError(f"no alert {alert} in {RULES}")


def firing(alert: str, instance: str, **labels: str) -> dict[str, Any]:
    """An expected alert: its labels (those of its series, its severity)."""
    return {"exp_labels": {"severity": severity(alert), "job": "idg", "instance": instance, **labels}}


def assert_alerts(tmp_path: Path, windows: Sequence[Window | Phases], expected: dict[str, list[dict[str, Any]]],
                  eval_time: str = EVAL, step: int = 1) -> None:
    """promtool evaluates the shipped rules on the windows' series (``step`` minutes apart, the rules evaluated as often)
    at ``eval_time``: each alert of ``expected`` fires exactly as listed there (an empty list: silent)."""
    rules, needed = rules_for(expected)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    series = [s for w in windows for s in input_series(w, step) if s["series"].split("{", 1)[0] in needed]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": f"{step}m", "tests": [{
        "interval": f"{step}m", "input_series": series,
        "alert_rule_test": [{"alertname": a, "eval_time": eval_time, "exp_alerts": exp} for a, exp in expected.items()]}]}
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
def grpc_port() -> int:
    """The gRPC port of :func:`served` (the Open Inference Protocol over gRPC)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, grpc_port: int) -> Iterator[Served]:
    """One server for the traffic faults: a simulated device call takes 20 ms + 5 ms per image (a prediction 25 ms, an
    explanation of 1024 points 5 s), room for one explanation at a time, 2 s deadlines; HTTP and gRPC."""
    folder = tmp_path_factory.mktemp("served")  # its job store too (module-scoped: before the per-test IDG_DATA_DIR)
    with serve_process(folder / "server.log", IDG_SIMULATED_CALL_MS=20, IDG_SIMULATED_IMAGE_MS=5, IDG_MAX_QUEUE=1,
                       IDG_REQUEST_TIMEOUT_S=2, IDG_BATCH_WAIT_MS=0, IDG_REPLICAS_EXPECTED=2, IDG_DATA_DIR=folder / "data",
                       IDG_GRPC_PORT=grpc_port) as served:
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


def test_server_errors_over_grpc_fire_server_errors(tmp_path: Path, served: Served, grpc_port: int) -> None:
    """The same fault over gRPC (Triton's client): 7% of one instance's ModelInfer calls end DEADLINE_EXCEEDED (the
    service's 504), and the alert fires for it as for HTTP's 504s."""
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="grpcio or tritonclient is not installed (pip install -e '.[dev]')")
    from tritonclient.utils import InferenceServerException

    def traffic(predictions: int, late: int) -> None:
        image = grpcclient.InferInput("image", [1], "BYTES")
        image.set_data_from_numpy(np.array([image_bytes()], dtype=np.object_))
        codes = []
        with grpcclient.InferenceServerClient(url=f"127.0.0.1:{grpc_port}") as client:
            for params in [{}] * predictions + [{"method": "idg", "steps": 512, "probe_steps": 512}] * late:
                try:
                    client.infer("tiny", [image], parameters=params)
                    codes.append("OK")
                except InferenceServerException as err:
                    codes.append(str(err.status()))
        assert codes.count("OK") == predictions and codes.count("StatusCode.DEADLINE_EXCEEDED") == late, codes

    healthy = window(served, "healthy:8000", during=lambda: traffic(30, 0))
    failing = window(served, "failing:8000", during=lambda: traffic(13, 1))
    assert failing.increase("idg_requests_total", door="grpc", route="ModelInfer", status="DEADLINE_EXCEEDED") == 1
    assert failing.increase("idg_http_requests_total", route="/attribute", status="504") == 0  # none over HTTP
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
    discovery (a Ray Serve replica's target leaves within seconds: no series at all, not even ``up``) it fires; with
    both gone, IDGNoReplicaUp fires. Both replicas are scrapes of the one server under two instance names."""
    one = window(served, "replica-a:9000", 1.0)
    other = window(served, "replica-b:9000", 1.0)
    assert one.value("idg_replicas_expected") == 2
    assert_alerts(tmp_path, [one], {"IDGReplicasMissing": [{"exp_labels": {"severity": severity("IDGReplicasMissing"), "job": "idg"}}],
                                    "IDGDown": [], "IDGNoReplicaUp": []})
    assert_alerts(tmp_path, [one, other], {"IDGReplicasMissing": [], "IDGDown": [], "IDGNoReplicaUp": []})
    # both gone: no series at all, not even the expected count; IDGReplicasMissing and IDGDown cannot see it
    assert_alerts(tmp_path, [], {"IDGNoReplicaUp": [{"exp_labels": {"severity": severity("IDGNoReplicaUp")}}],
                                 "IDGReplicasMissing": [], "IDGDown": []})


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
def test_a_job_store_that_goes_down_fires_store_errors_and_leaves_the_instance_ready(tmp_path: Path) -> None:
    """Readiness is "can answer interactive work": the store's outage is its own alert, not IDGNotReady, and a client
    polling its job (each GET a 503 ``store_unavailable``) beside a few predictions is no unavailability of the
    interactive doors: IDGUnavailableAnswers stays silent (it had fired, the /jobs 503s over half the answers). The
    store's gauge is 0 by the time the first of those 503s is answered."""
    from tests.service.jobs.postgres_server import postgres_server

    with postgres_server() as url, serve_process(tmp_path / "server.log", IDG_JOBS_DB_URL=url) as served:
        r = httpx.post(served.url + "/jobs", files=[("files", ("a.png", image_bytes(), "image/png"))],
                       data={"steps": "8", "probe_steps": "4"}, timeout=30)
        assert r.status_code == 202, r.text
        job_url = served.url + r.json()["url"]
        _until(lambda: httpx.get(job_url, timeout=10).json()["state"] == "done", 60, "the job finished", served)
        healthy = window(served, "idg:8000", during=lambda: [_post(served, "/predict") for _ in range(3)])
        assert healthy.value("idg_ready") == 1 and healthy.value("idg_durable_job_store_up") == 1
        _stop_postgres(url)
        first = httpx.get(job_url, timeout=30)  # the first operation after the outage: it fails, and the gauge with it
        assert (first.status_code, first.json()["error"]["code"]) == (503, "store_unavailable"), first.text
        assert served.metric("idg_durable_job_store_up") == 0
        claims = 'idg_durable_job_store_errors_total{operation="claim"}'
        failed = served.metric(claims)

        def polled() -> None:
            """The client polls its job (each GET 503 after the store's timeout) and predicts; the window holds the
            runner's next failed claim (it waits longer after each: 2 s, then 4, then 5)."""
            codes = [httpx.get(job_url, timeout=30).status_code for _ in range(2)]
            codes += [_post(served, "/predict").status_code for _ in range(3)]
            assert codes == [503, 503, 200, 200, 200], codes
            _until(lambda: served.metric(claims) > failed, 15, "another failed claim", served)

        down = window(served, "idg:8000", during=polled)
        assert down.increase("idg_durable_job_store_errors_total", operation="claim") >= 1
        assert down.increase("idg_requests_total", door="http", route="/jobs/{job_id}", status="503") == 2
        assert down.value("idg_ready") == 1 and down.value("idg_ready_processes") == 1
        assert down.value("idg_durable_job_store_up") == 0
        assert httpx.get(served.url + "/health/ready", timeout=10).status_code == 200
        failing = [op for op in STORE_OPERATIONS if down.increase("idg_durable_job_store_errors_total", operation=op) > 0]
        assert_alerts(tmp_path, [down], {"IDGJobStoreErrors": [firing("IDGJobStoreErrors", "idg:8000", operation=op) for op in failing],
                                         "IDGUnavailableAnswers": [], "IDGNotReady": [], "IDGDown": []})
        assert_alerts(tmp_path, [healthy], {"IDGJobStoreErrors": [], "IDGUnavailableAnswers": [], "IDGNotReady": []})


# ---- drift: what the model predicts and how its explanations look, against the reference the operator recorded -----

DRIFT_ALERTS = ("IDGPredictionsShifted", "IDGConfidenceFalling", "IDGExplanationsShifted", "IDGFaithfulnessFalling")
ATTRIBUTE_FIELDS = {"steps": "8", "probe_steps": "4", "faithfulness_steps": "8"}  # the clients' explanations (_steered_traffic)


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def red_patch() -> bytes:
    """A healthy input of the steerable model: a 7x7 red patch on grey (class "red" at 0.94, the map on the patch)."""
    img = Image.new("RGB", (36, 36), (128, 128, 128))
    img.paste((255, 0, 0), (15, 15, 22, 22))
    return _png(img)


def noisy_grey() -> bytes:
    """What a broken camera sends: a grey checkerboard (+-40) with a green tint of one level: class "green" at 0.2, its
    map spread evenly over the noise (concentration 0.05), its insertion AUC half the patch's."""
    img = Image.new("RGB", (36, 36))
    img.putdata([(128 + n, 129 + n, 128 + n) for i in range(36) for j in range(36) for n in [40 if (i + j) % 2 else -40]])
    return _png(img)


@pytest.fixture(scope="module")
def steered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server of the steerable model (and the tiny one) on a fast simulated device (1 ms a call, no batch wait): the
    drift reference's recording, and a device that waits for its host (the host's share of each call, the model's real outputs)."""
    folder = tmp_path_factory.mktemp("steered")
    with serve_process(folder / "server.log", IDG_TEST_MODEL="steer", IDG_SIMULATED_CALL_MS=1, IDG_BATCH_WAIT_MS=0,
                       IDG_DATA_DIR=folder / "data") as served:
        yield served


def _steered_traffic(served: Served, image: bytes, rounds: int = 4) -> None:
    """Two clients at once, each ``rounds`` times a prediction and an explanation scored for faithfulness."""
    codes: list[int] = []

    def client() -> None:
        for _ in range(rounds):
            file = {"file": ("a.png", image, "image/png")}
            codes.append(httpx.post(served.url + "/predict", files=file, timeout=60).status_code)
            codes.append(httpx.post(served.url + "/attribute", files=file, timeout=60, data={
                **ATTRIBUTE_FIELDS, "return_overlay": "false", "faithfulness": "insertion,deletion"}).status_code)

    clients = [threading.Thread(target=client) for _ in range(2)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(timeout=60)
    assert codes == [200] * 4 * rounds, codes


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, steered: Served) -> Path:
    """The drift reference of the steerable model as an operator records it: ``idg-drift-reference`` (its ``main``, over
    loopback) sends a folder of red patches, the photos called normal, to the steerable server with no other traffic,
    with the explanation fields the clients use."""
    folder = tmp_path_factory.mktemp("reference")
    photos = folder / "photos"
    photos.mkdir()
    for i in range(4):
        (photos / f"red-{i}.png").write_bytes(red_patch())
    out = folder / "reference.json"
    fields = [f"--field={k}={v}" for k, v in ATTRIBUTE_FIELDS.items()]
    assert drift_reference.main(["--url", steered.url, "--images", str(photos), "--out", str(out), "--model", "steer", *fields]) == 0
    return out


@pytest.fixture(scope="module")
def referenced(tmp_path_factory: pytest.TempPathFactory, reference: Path) -> Iterator[Served]:
    """A server of the steerable model started with that reference (IDG_DRIFT_REFERENCE), as :func:`steered` otherwise."""
    folder = tmp_path_factory.mktemp("referenced")
    with serve_process(folder / "server.log", IDG_TEST_MODEL="steer", IDG_SIMULATED_CALL_MS=1, IDG_BATCH_WAIT_MS=0,
                       IDG_DATA_DIR=folder / "data", IDG_DRIFT_REFERENCE=reference) as served:
        yield served


def test_the_recorded_reference_is_what_the_server_saw_and_a_server_exports_it(reference: Path, referenced: Served,
                                                                                 steered: Served) -> None:
    """The reference holds what the red patches moved the steerable server's metrics by (class "0" only, the top-1
    probability 0.94, maps on the patch, their faithfulness by method and metric), and a server given it exports it; a
    recording that other traffic reaches is refused, not written."""
    ref = json.loads(reference.read_text())["models"]["steer"]
    log.info("the reference: %s", ref)
    assert ref["predictions"] == 4 and ref["explanations"] == 4
    assert ref["classes"]["0"] == 1 and sum(ref["classes"].values()) == 1 and len(ref["classes"]) > 1, ref["classes"]
    assert 0.9 < ref["confidence"] < 0.97 and ref["concentration"] > 0.5, ref
    assert set(ref["faithfulness"]["idg"]) == {"insertion", "deletion"}, ref["faithfulness"]
    exported = scrape(referenced.url)
    assert exported is not None
    assert exported[("idg_drift_reference", frozenset({"model": "steer", "quantity": "confidence"}.items()))][1] == ref["confidence"]
    assert exported[("idg_drift_reference_class_share", frozenset({"model": "steer", "classes": "0"}.items()))][1] == 1
    insertion = ("idg_drift_reference_faithfulness", frozenset({"model": "steer", "method": "idg", "metric": "insertion"}.items()))
    assert exported[insertion][1] == ref["faithfulness"]["idg"]["insertion"]
    # two red patches sent while the command sent one: the counts say so, and no reference comes of it
    before = drift_reference.parse_metrics(httpx.get(steered.url + "/metrics", timeout=5).text)
    for _ in range(2):
        assert httpx.post(steered.url + "/predict", files={"file": ("a.png", red_patch(), "image/png")}, timeout=60).status_code == 200
    after = drift_reference.parse_metrics(httpx.get(steered.url + "/metrics", timeout=5).text)
    with pytest.raises(drift_reference.DriftReferenceError, match="other traffic reached it"):
        drift_reference.reference_from_scrapes(before, after, ["steer"], 1, 0)


def test_a_drift_reference_that_cannot_be_used_stops_the_start_naming_the_setting(tmp_path: Path) -> None:
    """A reference file without the confidence of its model: the server does not start (exit 3, the start's one line
    names IDG_DRIFT_REFERENCE), rather than start with drift alerts that can never fire."""
    bad = tmp_path / "reference.json"
    bad.write_text(json.dumps({"format": drift_reference.FORMAT, "models": {"steer": {"classes": {"0": 1.0}}}}))
    env = {**os.environ, "IDG_WARMUP": "false", "IDG_HOST": "127.0.0.1", "IDG_PROCESSES": "1", "IDG_TEST_MODEL": "steer",
           "IDG_DRIFT_REFERENCE": str(bad)}
    done = subprocess.run([sys.executable, "-m", "app.server", "--app", APP, "--port", "0"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "cannot start: IDG_DRIFT_REFERENCE" in done.stderr + done.stdout and "'steer'" in done.stderr + done.stdout, done.stderr


def test_traffic_unlike_the_reference_fires_the_drift_alerts_from_the_first_hour_and_traffic_like_it_does_not(
        tmp_path: Path, referenced: Served) -> None:
    """A server started with the reference of red patches: noisy grey frames (a camera gone noisy) from its start fire
    every drift alert for the model within 25 minutes (an hour against a day compared nothing yet); red patches keep them
    silent, from the start and after 40 minutes of grey frames as soon as the last 15 minutes are red again: a return to
    normal fires nothing. Both windows are the one server, before and after its inputs changed."""
    healthy = window(referenced, "idg:8000", during=lambda: _steered_traffic(referenced, red_patch()))
    shifted = window(referenced, "idg:8000", during=lambda: _steered_traffic(referenced, noisy_grey()))
    for w, cls in ((healthy, "0"), (shifted, "1")):
        assert w.increase("idg_predicted_classes_total", model="steer", classes=cls) == 8
        assert w.value("idg_drift_reference", model="steer", quantity="confidence") > 0.9
    mean = {labels.get("metric", n): shifted.increase(f"{n}_sum", **labels) / shifted.increase(f"{n}_count", **labels)
            for n, labels in (("idg_prediction_confidence", {"model": "steer"}), ("idg_attribution_concentration", {"model": "steer"}),
                              ("idg_faithfulness", {"model": "steer", "method": "idg", "metric": "insertion"}),
                              ("idg_faithfulness", {"model": "steer", "method": "idg", "metric": "deletion"}))}
    log.info("windows %.1f s and %.1f s; shifted: %s", healthy.seconds, shifted.seconds, mean)
    assert mean["idg_prediction_confidence"] < 0.3 and mean["idg_attribution_concentration"] < 0.1, mean
    # the grey frames' insertion AUC is far under the reference's, their deletion AUC under it too (better): only insertion fires
    assert mean["insertion"] < 0.5 * healthy.value("idg_drift_reference_faithfulness", model="steer", method="idg", metric="insertion")
    assert mean["deletion"] < healthy.value("idg_drift_reference_faithfulness", model="steer", method="idg", metric="deletion")
    fired = {a: [{"exp_labels": {"severity": severity(a), "model": "steer"} | ({"method": "idg", "metric": "insertion"}
                                                                          if a == "IDGFaithfulnessFalling" else {})}]
             for a in DRIFT_ALERTS}
    silent: dict[str, list[dict[str, Any]]] = dict.fromkeys(DRIFT_ALERTS, [])
    assert_alerts(tmp_path, [[(shifted, 40)]], fired, "25m")
    assert_alerts(tmp_path, [[(healthy, 40)]], silent, "25m")
    # red for 20 minutes, grey for 40, red for 60: firing in the grey, silent 20 and 59 minutes after it
    after_shift = [[(healthy, 20), (shifted, 40), (healthy, 60)]]
    assert_alerts(tmp_path, after_shift, fired, "55m")
    for at in ("80m", "119m"):
        assert_alerts(tmp_path, after_shift, silent, at)


def test_a_fast_device_behind_a_busy_host_fires_device_waits_for_host(tmp_path: Path, steered: Served) -> None:
    """Six clients' explanations by the tiny model (128 + 16 points) keep requests in the worker: the device (1 ms a
    call) waits for the host steps between its calls (gathering points, launching each call: the tiny model's real
    forward and backward passes, on the host) most of the time. Six clients with long requests, not two with short
    ones: on a busy 2-core machine the clients' own turns between requests leave the worker empty (idle for no work,
    not for the host) for part of the window (two clients: a third of it, the host's share 0.21-0.24; four, with two
    evaluation processes beside the suite: 0.28)."""
    def explanations() -> None:
        codes: list[int] = []

        def client() -> None:
            codes.extend(_post(steered, "/attribute", model="tiny", steps="128", probe_steps="16", return_overlay="false").status_code
                         for _ in range(3))

        clients = [threading.Thread(target=client) for _ in range(6)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=120)
        assert codes == [200] * 18, codes

    host_bound = window(steered, "idg:8000", during=explanations)
    busy = host_bound.increase("idg_device_busy_seconds_total") / host_bound.seconds
    host = host_bound.increase("idg_device_idle_seconds_total", cause="host") / host_bound.seconds
    log.info("the device busy %.2f of the window, idle for the host %.2f", busy, host)
    assert host > 0.3 and busy < 0.7, (host, busy)
    assert_alerts(tmp_path, [host_bound], {"IDGDeviceWaitsForHost": [firing("IDGDeviceWaitsForHost", "idg:8000", cause="host")],
                                           "IDGDeviceSaturated": []})


# ---- a slow device: slow answers, a saturated device -------------------------------------------------------------

@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server whose simulated device takes 1.5 s a call (a prediction is one call, an explanation by IG of a given
    class two), with 5.5 s deadlines (IDGSlowExplanations: over 2.75 s)."""
    folder = tmp_path_factory.mktemp("slow")
    with serve_process(folder / "server.log", IDG_SIMULATED_CALL_MS=1500, IDG_BATCH_WAIT_MS=0, IDG_REQUEST_TIMEOUT_S=5.5,
                       IDG_DATA_DIR=folder / "data") as served:
        yield served


def test_a_slow_device_fires_slow_answers_and_device_saturated(tmp_path: Path, slow: Served, steered: Served) -> None:
    """An explanation (two 1.5 s calls), and a prediction that comes while its first call runs (one call, after that
    one): the prediction takes over 2.5 s, the explanation over half its 5.5 s deadline, and the device is busy all
    the window (from the explanation's admission to its answer). The steerable server's quick answers on its fast device
    are the healthy window: all silent there; and the slow device waits for no host."""
    answers: dict[str, tuple[int, float]] = {}

    def timed(path: str, **data: str) -> None:
        began = time.monotonic()
        status = _post(slow, path, **data).status_code
        answers[path] = (status, time.monotonic() - began)

    explaining = threading.Thread(target=timed, args=("/attribute",),
                                  kwargs={"method": "ig", "target": "1", "steps": "8", "return_overlay": "false"})
    explaining.start()
    _until(lambda: slow.metric("idg_queue_depth") >= 1, 5, "the explanation admitted", slow)
    before, began = scrape(slow.url), time.monotonic()
    timed("/predict")
    explaining.join(timeout=30)
    slowed = Window("idg:8000", before, scrape(slow.url), time.monotonic() - began)
    assert answers["/predict"][0] == 200 and answers["/predict"][1] > 2.5, answers
    assert answers["/attribute"][0] == 200 and answers["/attribute"][1] > 2.75, answers
    busy = slowed.increase("idg_device_busy_seconds_total") / slowed.seconds
    log.info("answers %s, the device busy %.2f of the window", answers, busy)
    assert busy > 0.9, busy
    fired = ["IDGSlowPredictions", "IDGSlowExplanations", "IDGDeviceSaturated"]
    assert_alerts(tmp_path, [slowed], {
        "IDGSlowPredictions": [firing("IDGSlowPredictions", "idg:8000", door="http", route="/predict")],
        "IDGSlowExplanations": [firing("IDGSlowExplanations", "idg:8000", door="http", route="/attribute")],
        "IDGDeviceSaturated": [firing("IDGDeviceSaturated", "idg:8000")], "IDGDeviceWaitsForHost": []})
    quick = window(steered, "idg:8000", during=lambda: _steered_traffic(steered, red_patch(), rounds=2))
    assert_alerts(tmp_path, [quick], dict.fromkeys(fired, []))
