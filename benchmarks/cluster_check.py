"""``make cluster-check``: the Ray Serve deployment on a real two-node Ray cluster on this one machine.

Run by ``scripts/cluster_check.sh`` (as root), which creates three network namespaces joined by a bridge: ``svc``
(10.231.0.254: this driver, PostgreSQL, Prometheus), ``n1`` (10.231.0.1: the Ray head node) and ``n2`` (10.231.0.2: a
Ray worker node), and runs this module inside ``svc``. Each Ray node declares one CPU, so the two replicas of
``deploy/ray/serve.yaml`` (``num_cpus: 1``, ``min_replicas: 2``) must land one on each node. The check:

1. starts PostgreSQL (one job store for every replica, on 10.231.0.254), the head node and the worker node
   (``ray start --node-ip-address``), and deploys a copy of ``deploy/ray/serve.yaml`` with ``serve deploy`` in which
   only addresses, counts and the model are changed: the proxies listen on ``0.0.0.0`` of their node,
   ``IDG_JOBS_DB_URL`` names the shared store, and the factory is the tests' tiny model with a set delay per model call
   (``IDG_TEST_DELAY_S``), so the check measures the cluster, not a CPU's attributions;
2. checks that the replicas run on both nodes (each registers its metrics address, its node's IP, in
   ``/metrics/targets``), that a real Prometheus scrapes every one through that discovery (``http_sd_configs``), and
   sends interactive ``/attribute`` load through both nodes' proxies (every answer a 200, both replicas answering);
3. submits a durable job of ``--images`` images, kills the worker node (``kill -9`` of every process in its namespace:
   raylet, replica, proxy, agents) once a part of the job is answered, and reads the job's results: every image must
   be answered exactly once (the head's replica takes the dead one's claims once their lease runs out);
4. while the node is gone, waits for Prometheus to fire ``IDGReplicasMissing``, evaluated from a copy of
   ``deploy/monitoring/rules/idg.rules.yml`` whose ``for`` of that alert is shortened (5m -> ``--alert-for``);
5. stops everything it started. Its last log line is the summary, also written to ``--summary``.

With ``--autoscale`` (``make autoscale-check``, issue #64 item 2) it measures Serve's autoscaling instead: the same
cluster and config with ``min_replicas: 1``, ``max_replicas: 2`` and a ``downscale_delay_s`` of 30 s (shipped: 300), one
client for a while, then a step to ``--clients`` clients sent round-robin to the proxies of the nodes that have one (as
a load balancer with health checks would: Serve's proxy prefers its own node's replicas), then none. It records how
many seconds Serve took to run the second replica and to stop it again, and the latency and rate in each window.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import io
import json
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import yaml  # type: ignore[import-untyped]  # PyYAML, a dependency of ray[serve]; no stubs installed
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("cluster-check")
TINY_FACTORY = "tests.service.reliability.server_app:make_app"
PARAMS = {"method": "idg", "steps": "8", "probe_steps": "6", "return_attribution": "false", "return_overlay": "false"}
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}  # docs/ray.md: token auth off on this private net


class CheckFailed(RuntimeError):
    """A figure the check requires was not met."""


@dataclass
class Net:
    """The namespaces and addresses ``scripts/cluster_check.sh`` created."""

    head_ns: str
    worker_ns: str
    head_ip: str
    worker_ip: str
    svc_ip: str


@dataclass
class Figures:
    nodes: int = 0
    replicas: int = 0
    targets_scraped: int = 0
    interactive_sent: int = 0
    interactive_ok: int = 0
    proxies: int = 0
    job_images: int = 0
    answered_before_kill: int = 0
    taken_over: int = -1
    lost: int = -1
    duplicated: int = -1
    failed: int = -1
    by_replica: dict[str, int] = field(default_factory=dict)
    alert_after_s: float = -1.0
    job_after_kill_s: float = -1.0

    def line(self, elapsed_s: float) -> str:
        return (f"cluster-check: {self.nodes} nodes, {self.replicas} replicas, {self.job_images} job images, {self.lost} lost, "
                f"{self.duplicated} duplicated, {self.failed} failed, {self.answered_before_kill} answered before the kill, "
                f"{self.taken_over} taken over from the dead node, "
                f"{self.interactive_ok}/{self.interactive_sent} interactive 200 through {self.proxies} proxies, "
                f"{self.targets_scraped} replicas scraped by Prometheus, IDGReplicasMissing firing {self.alert_after_s:.0f} s "
                f"after the kill, job done {self.job_after_kill_s:.0f} s after it, {elapsed_s:.0f} s in all")


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, every_s: float = 1.0) -> Any:
    """Call ``probe`` until it returns something truthy (exceptions count as not yet); that value, or CheckFailed."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
            last = value
        except (httpx.HTTPError, ValueError, KeyError, OSError) as exc:
            last = exc
        time.sleep(every_s)
    raise CheckFailed(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


def in_ns(ns: str, *command: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *command]


def netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def kill_netns(ns: str) -> int:
    """SIGKILL every process in ``ns`` (all of them this check's: it created the namespace); how many."""
    pids = netns_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


class Postgres:
    """Debian's PostgreSQL (initdb + pg_ctl, as tests/service/jobs/postgres_server.py) as the ``postgres`` user, on
    ``host`` in this namespace, trusting the check's subnet."""

    def __init__(self, root: Path, host: str) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not bins:
            raise CheckFailed("PostgreSQL's pg_ctl is not installed (Debian package postgresql)")
        self.bin = bins[-1].parent
        self.dir, self.host = root / "pg", host
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.url = f"postgresql://idg@{host}:5432/postgres"

    def start(self) -> None:
        self.dir.mkdir()
        if self.prefix:
            user = pwd.getpwnam("postgres")
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        subprocess.run([*self.prefix, str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-U", "idg", "-A", "trust",
                        "--no-sync"], check=True, capture_output=True, timeout=120)
        subnet = self.host.rsplit(".", 1)[0] + ".0/24"
        with (self.dir / "data" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all idg {subnet} trust\n")
        options = f"-p 5432 -k {self.dir} -c listen_addresses={self.host} -c fsync=off -c max_connections=100"
        subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "log"), "-o",
                        options, "-w", "-t", "60", "start"], check=True, capture_output=True, timeout=90)

    def stop(self) -> None:
        if (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run([*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop"],
                           capture_output=True, timeout=60, check=False)


def ray_env() -> dict[str, str]:
    """Ray's processes (and the replicas they start) import the checkout: the tests' tiny model lives in tests/."""
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, **RAY_ENV, "PYTHONPATH": str(ROOT), "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}


def ray_start(root: Path, ns: str, ip: str, head_ip: str | None) -> None:
    """``ray start`` in namespace ``ns`` bound to ``ip`` with one CPU, its own temp dir, a small object store."""
    ray = str(Path(sys.executable).parent / "ray")
    role = ["--head", "--port=6379", f"--dashboard-host={ip}"] if head_ip is None else [f"--address={head_ip}:6379"]
    command = in_ns(ns, ray, "start", *role, f"--node-ip-address={ip}", "--num-cpus=1", "--num-gpus=0",
                    "--object-store-memory=150000000", f"--temp-dir={root / ns}", "--disable-usage-stats")
    with (root / f"ray-start-{ns}.log").open("w") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT, env=ray_env(), cwd=root, timeout=180)
    log.info("ray node up in %s at %s (%s)", ns, ip, "head" if head_ip is None else "worker")


def serve_config(root: Path, db_url: str, delay_s: float, autoscaling: dict[str, Any] | None = None) -> Path:
    """A copy of deploy/ray/serve.yaml: the proxies on every address of their node, the shared job store, the tiny model;
    ``autoscaling`` overrides keys of ``autoscaling_config`` (its ``min_replicas`` is then IDG_REPLICAS_EXPECTED too, as
    docs/ray.md asks). Every other setting stays as shipped."""
    config = yaml.safe_load((ROOT / "deploy" / "ray" / "serve.yaml").read_text())
    config["http_options"]["host"] = "0.0.0.0"
    app = config["applications"][0]
    app["args"]["factory"] = TINY_FACTORY
    app["runtime_env"]["env_vars"].update(IDG_JOBS_DB_URL=db_url, IDG_TEST_DELAY_S=str(delay_s), IDG_WARMUP="false")
    if autoscaling:
        app["deployments"][0]["autoscaling_config"].update(autoscaling)
        app["runtime_env"]["env_vars"]["IDG_REPLICAS_EXPECTED"] = str(app["deployments"][0]["autoscaling_config"]["min_replicas"])
    path = root / "serve.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def rules_copy(root: Path, alert_for: str) -> Path:
    """deploy/monitoring/rules/idg.rules.yml with IDGReplicasMissing's ``for: 5m`` shortened to ``alert_for``."""
    text = (ROOT / "deploy" / "monitoring" / "rules" / "idg.rules.yml").read_text()
    new, n = re.subn(r"(- alert: IDGReplicasMissing\n(?:[ \t]+\S.*\n)*?[ \t]+for: )5m", rf"\g<1>{alert_for}", text)
    if n != 1:
        raise CheckFailed("IDGReplicasMissing with `for: 5m` not found in deploy/monitoring/rules/idg.rules.yml")
    path = root / "prometheus" / "idg.rules.yml"
    path.parent.mkdir()
    path.write_text(new)
    return path


@contextmanager
def prometheus_running(root: Path, discovery_url: str, rules: Path, listen: str) -> Iterator[None]:
    """Prometheus scraping every replica found by the service's own discovery (GET /metrics/targets), every 2 s."""
    config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"}, "rule_files": [str(rules)],
              "scrape_configs": [{"job_name": "idg", "http_sd_configs": [{"url": discovery_url, "refresh_interval": "2s"}]}]}
    path = rules.parent / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    subprocess.run(["promtool", "check", "config", str(path)], check=True, capture_output=True, timeout=60)
    with (rules.parent / "prometheus.log").open("w") as out:
        prometheus = subprocess.Popen(["prometheus", f"--config.file={path}", f"--storage.tsdb.path={rules.parent / 'data'}",
                                       f"--web.listen-address={listen}"], stdout=out, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(30)
        except subprocess.TimeoutExpired:
            prometheus.kill()


def png(i: int) -> bytes:
    """A small image of its own: a colour and a diagonal from ``i``."""
    color = ((37 * i) % 256, (91 * i + 40) % 256, (173 * i + 80) % 256)
    img = Image.new("RGB", (48, 40), color)
    for k in range(40):
        img.putpixel(((k + i) % 48, k), (255 - color[0], 255 - color[1], 255 - color[2]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def replicas_on_nodes(client: httpx.Client, proxy: str) -> dict[str, str]:
    """replica -> the node IP its metrics are on (what /metrics/targets lists)."""
    groups = client.get(f"{proxy}/metrics/targets").raise_for_status().json()
    return {g["labels"]["replica"]: g["targets"][0].rsplit(":", 1)[0] for g in groups}


def interactive(client: httpx.Client, proxies: list[str], n: int, figures: Figures) -> None:
    """``n`` /attribute requests, 4 at a time, alternating between the nodes' proxies: each a 200; both replicas answer."""
    def one(i: int) -> tuple[str, int, str]:
        proxy = proxies[i % len(proxies)]
        answer = client.post(f"{proxy}/attribute", files={"file": (f"{i}.png", png(1000 + i), "image/png")}, data=PARAMS)
        return proxy, answer.status_code, answer.headers.get("x-idg-replica", "")

    with cf.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(n)))
    figures.interactive_sent = n
    figures.interactive_ok = sum(status == 200 for _, status, _ in answers)
    figures.proxies = len({proxy for proxy, status, _ in answers if status == 200})
    spread = Counter(replica for _, status, replica in answers if status == 200)
    log.info("interactive: %d/%d answered 200 through %d proxies, by replica %s", figures.interactive_ok, n, figures.proxies,
             dict(spread))
    if figures.interactive_ok != n or figures.proxies != len(proxies) or len(spread) < 2:
        raise CheckFailed(f"interactive load: {Counter(status for _, status, _ in answers)}, by replica {dict(spread)}")


def retried_images(url: str, job_id: str) -> int:
    """Images of the job claimed more than once: those the dead node held, taken over once their lease ran out."""
    import psycopg  # the postgres extra; scripts/cluster_check.sh checks it is there

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM images WHERE job_id = %s AND attempts > 1", (job_id,)).fetchone()
    return int(row[0]) if row else 0


def prom_query(client: httpx.Client, prom: str, query: str) -> list[dict[str, Any]]:
    answer = client.get(f"{prom}/api/v1/query", params={"query": query}).raise_for_status().json()
    return list(answer["data"]["result"])


def firing(client: httpx.Client, prom: str, name: str) -> bool:
    alerts = client.get(f"{prom}/api/v1/alerts").raise_for_status().json()["data"]["alerts"]
    return any(a["labels"].get("alertname") == name and a["state"] == "firing" for a in alerts)


@contextmanager
def cluster(args: argparse.Namespace, net: Net, root: Path, autoscaling: dict[str, Any] | None = None) -> Iterator[Postgres]:
    """PostgreSQL, the head node, the worker node and the app deployed with ``serve deploy``; on leaving, every process of
    both nodes killed and PostgreSQL stopped."""
    started = time.monotonic()
    postgres = Postgres(root, net.svc_ip)
    try:
        postgres.start()
        log.info("PostgreSQL job store at %s", postgres.url)
        ray_start(root, net.head_ns, net.head_ip, None)
        ray_start(root, net.worker_ns, net.worker_ip, net.head_ip)
        config = serve_config(root, postgres.url, args.delay_s, autoscaling)
        serve = str(Path(sys.executable).parent / "serve")
        subprocess.run([serve, "deploy", str(config), "-a", f"http://{net.head_ip}:8265"], check=True, capture_output=True,
                       env=ray_env(), cwd=root, timeout=180)
        log.info("serve deploy %s (deploy/ray/serve.yaml: proxies on 0.0.0.0, PostgreSQL, tiny model%s) after %.0f s", config.name,
                 f", autoscaling {autoscaling}" if autoscaling else "", time.monotonic() - started)
        yield postgres
    finally:
        for ns in (net.worker_ns, net.head_ns):
            kill_netns(ns)
        postgres.stop()


def node_death(args: argparse.Namespace, net: Net, root: Path, figures: Figures) -> None:
    """Steps 2-4 of the module's docstring: replicas on both nodes, Prometheus, interactive load, a job through a node's
    death, the alert."""
    started = time.monotonic()
    head, worker = f"http://{net.head_ip}:8000", f"http://{net.worker_ip}:8000"
    prom = f"http://{net.svc_ip}:9090"
    with cluster(args, net, root) as postgres, httpx.Client(timeout=60) as client:
        placed: dict[str, str] = wait_for(
            "a replica on each node, listed by both proxies",
            lambda: all(client.get(f"{p}/health/ready").status_code == 200 for p in (head, worker))
            and (r := replicas_on_nodes(client, head)) == replicas_on_nodes(client, worker)
            and set(r.values()) == {net.head_ip, net.worker_ip} and r, 240, 2)
        figures.nodes, figures.replicas = len(set(placed.values())), len(placed)
        log.info("replicas on the nodes: %s (%.0f s)", placed, time.monotonic() - started)

        with prometheus_running(root, f"{head}/metrics/targets", rules_copy(root, args.alert_for), f"{net.svc_ip}:9090"):
            up = wait_for("Prometheus scraping every replica through /metrics/targets",
                          lambda: {s["metric"]["replica"] for s in prom_query(client, prom, 'up{job="idg"} == 1')} == set(placed)
                          and prom_query(client, prom, 'count(count by (replica) (idg_replicas_expected{job="idg"}))'), 60)
            figures.targets_scraped = int(float(up[0]["value"][1]))
            log.info("Prometheus scrapes %d replicas (discovered through %s/metrics/targets)", figures.targets_scraped, head)

            interactive(client, [head, worker], args.interactive, figures)

            files = [("files", (f"img{i:03d}.png", png(i), "image/png")) for i in range(args.images)]
            job = client.post(f"{head}/jobs", files=files, data=PARAMS).raise_for_status().json()
            figures.job_images = args.images
            log.info("job %s: %d images submitted through the head's proxy", job["id"], args.images)

            def answered() -> int:
                return int(client.get(f"{head}/jobs/{job['id']}").raise_for_status().json()["done"])

            wait_for(f"{args.kill_after} images of the job answered", lambda: answered() >= args.kill_after, 300, 0.2)
            if firing(client, prom, "IDGReplicasMissing"):
                raise CheckFailed("IDGReplicasMissing fires while both replicas are up")
            killed = kill_netns(net.worker_ns)
            killed_at = time.monotonic()
            figures.answered_before_kill = answered()
            log.info("worker node killed: kill -9 of its %d processes (raylet, replica, proxy, agents) with %d/%d images answered",
                     killed, figures.answered_before_kill, args.images)

            wait_for("IDGReplicasMissing firing", lambda: firing(client, prom, "IDGReplicasMissing"), 180, 1)
            figures.alert_after_s = time.monotonic() - killed_at
            log.info("IDGReplicasMissing firing %.0f s after the kill (for: %s in the rules' copy)", figures.alert_after_s,
                     args.alert_for)

            status = wait_for("the job done", lambda: (s := client.get(f"{head}/jobs/{job['id']}").raise_for_status().json())
                              ["state"] == "done" and s, 300, 1)
            figures.job_after_kill_s = time.monotonic() - killed_at
            lines = [json.loads(line) for line in client.get(f"{head}/jobs/{job['id']}/results", params={"summary": "true"})
                     .raise_for_status().text.splitlines() if line.strip()]
            rows = [row for row in lines if "index" in row]
            seen = Counter(row["index"] for row in rows)
            figures.lost = sum(1 for i in range(args.images) if i not in seen)
            figures.duplicated = sum(n - 1 for n in seen.values() if n > 1)
            figures.failed = sum(1 for row in rows if row.get("status") != 200)
            figures.by_replica = dict(Counter(str(row.get("replica")) for row in rows))
            figures.taken_over = retried_images(postgres.url, job["id"])
            log.info("job %s: %s; %d result lines, answered by %s", job["id"], {k: status[k] for k in ("done", "failed", "total")},
                     len(rows), figures.by_replica)
            after = client.post(f"{head}/attribute", files={"file": ("after.png", png(999), "image/png")}, data=PARAMS)
            log.info("after the kill, the head's proxy answers %d from %s", after.status_code, after.headers.get("x-idg-replica"))
            if figures.lost or figures.duplicated or figures.failed or after.status_code != 200:
                raise CheckFailed(f"job: {figures.lost} lost, {figures.duplicated} duplicated, {figures.failed} failed; "
                                  f"after the kill {after.status_code}")
            if len([r for r in figures.by_replica if r in placed]) < 2:
                raise CheckFailed(f"the job's images were not answered by both replicas: {figures.by_replica}")


@dataclass
class Scaling:
    """Item 2 of issue #64: a load step on the autoscaled deployment; seconds and latencies (ms)."""

    settings: dict[str, Any] = field(default_factory=dict)
    clients: int = 0
    up_s: float = -1.0
    down_s: float = -1.0
    replicas_max: int = 0
    placed: dict[str, str] = field(default_factory=dict)
    windows: dict[str, tuple[int, float, float, float]] = field(default_factory=dict)  # n, p50, p95, answers/s
    answered_by: dict[str, list[int]] = field(default_factory=dict)  # answers of each replica, most first
    proxy_s: float = -1.0
    errors: int = 0

    def line(self, elapsed_s: float) -> str:
        lat = "; ".join(f"{name}: p50 {p50:.0f} ms p95 {p95:.0f} ms {rate:.1f}/s (by replica {self.answered_by.get(name)})"
                        for name, (n, p50, p95, rate) in self.windows.items())
        return (f"autoscale-check: 1 -> {self.replicas_max} replicas {self.up_s:.0f} s after a step to {self.clients} clients "
                f"(its node's proxy in the balancer {self.proxy_s:.0f} s later), back to 1 {self.down_s:.0f} s after the load "
                f"stopped; {lat}; {self.errors} errors; {elapsed_s:.0f} s in all "
                f"(autoscaling {self.settings})")


def serve_replicas(client: httpx.Client, dashboard: str) -> list[tuple[str, str, str]]:
    """(replica id, state, node IP) of the idg deployment's replicas, from Serve's REST API on the head's dashboard."""
    details = client.get(f"{dashboard}/api/serve/applications/").raise_for_status().json()
    replicas = details["applications"]["idg"]["deployments"]["idg"]["replicas"]
    return [(r["replica_id"], r["state"], r.get("node_ip") or "") for r in replicas]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def autoscale(args: argparse.Namespace, net: Net, root: Path, scaling: Scaling) -> None:
    """Autoscaling between 1 and 2 replicas (one CPU a node, so the second lands on the worker node): ``--baseline-s`` of
    one client, then ``--clients`` clients until Serve runs 2 replicas and ``--hold-s`` more, then none; how long Serve
    took to scale up and back down, and the latency in each window."""
    started = time.monotonic()
    scaling.settings = {"min_replicas": 1, "initial_replicas": 1, "max_replicas": 2, "downscale_delay_s": args.downscale_delay_s}
    head, worker, dashboard = f"http://{net.head_ip}:8000", f"http://{net.worker_ip}:8000", f"http://{net.head_ip}:8265"
    with cluster(args, net, root, scaling.settings), httpx.Client(timeout=120) as client:
        config = yaml.safe_load((root / "serve.yaml").read_text())["applications"][0]["deployments"][0]["autoscaling_config"]
        scaling.settings = config
        # the worker node has no proxy yet: Serve's EveryNode runs one on each node holding a replica (and the head)
        wait_for("one replica running, the head's proxy ready",
                 lambda: [x for x in serve_replicas(client, dashboard) if x[1] == "RUNNING"]
                 and client.get(f"{head}/health/ready").status_code == 200, 240, 2)
        log.info("one replica running (%.0f s); autoscaling_config %s", time.monotonic() - started, config)
        answers: list[tuple[float, float, int, str]] = []  # start, end (monotonic), status, replica
        step, stop = threading.Event(), threading.Event()
        pool = [head]  # the load balancer's proxies: a node's joins once its proxy answers its health check

        def load(k: int) -> None:
            """Client ``k``: the first from the baseline on, the others from the step; one request after another, taking
            the proxies of ``pool`` in turn as a round-robin load balancer would, until the stop."""
            if k > 0:
                step.wait()
            with httpx.Client(timeout=120) as own:
                i = 0
                while not stop.is_set():
                    t0 = time.monotonic()
                    try:
                        answer = own.post(f"{pool[(k + i) % len(pool)]}/attribute", data=PARAMS,
                                          files={"file": (f"{k}-{i}.png", png(k * 1000 + i), "image/png")})
                        status, replica = answer.status_code, answer.headers.get("x-idg-replica", "")
                    except httpx.HTTPError:
                        status, replica = 0, ""
                    answers.append((t0, time.monotonic(), status, replica))
                    i += 1

        def running() -> list[tuple[str, str, str]]:
            return [x for x in serve_replicas(client, dashboard) if x[1] == "RUNNING"]

        threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(args.clients)]
        phase: dict[str, float] = {"baseline": time.monotonic()}
        for t in threads:
            t.start()
        time.sleep(args.baseline_s)
        phase["step"] = time.monotonic()
        step.set()
        scaling.clients = args.clients
        log.info("load step: 1 -> %d clients", args.clients)
        up: list[tuple[str, str, str]] = wait_for("Serve scaling up to 2 replicas", lambda: len(r := running()) >= 2 and r,
                                                  180, 0.5)
        phase["scaled"] = time.monotonic()
        scaling.up_s = phase["scaled"] - phase["step"]
        scaling.replicas_max = len(up)
        scaling.placed = {rid: ip for rid, _, ip in up}
        log.info("scaled up to %d replicas %.0f s after the step: %s", len(up), scaling.up_s, scaling.placed)
        # Serve's proxy prefers the replicas of its own node (RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING, on by default):
        # the new replica gets traffic once the load balancer sends some to its node's proxy
        wait_for("the worker node's proxy answering its health check", lambda: client.get(f"{worker}/-/healthz").status_code == 200,
                 60, 0.5)
        pool.append(worker)
        phase["balanced"] = time.monotonic()
        scaling.proxy_s = phase["balanced"] - phase["scaled"]
        log.info("the worker node's proxy joins the load balancer %.0f s after the second replica ran", scaling.proxy_s)
        time.sleep(args.hold_s)
        phase["stopped"] = time.monotonic()
        stop.set()
        step.set()
        for t in threads:
            t.join(130)
        log.info("load stopped; waiting for Serve to scale down (downscale_delay_s %s)", config["downscale_delay_s"])
        wait_for("Serve scaling back down to 1 replica",
                 lambda: len(running()) == 1,
                 float(config["downscale_delay_s"]) + 180, 0.5)
        scaling.down_s = time.monotonic() - phase["stopped"]
        log.info("back to 1 replica %.0f s after the load stopped", scaling.down_s)
        bounds = {"1 client": (phase["baseline"], phase["step"]),
                  f"{args.clients} clients, 1 replica": (phase["step"], phase["scaled"]),
                  "2 replicas, 1 proxy": (phase["scaled"], phase["balanced"]),
                  "2 replicas, 2 proxies": (phase["balanced"], phase["stopped"])}
        for name, (t0, t1) in bounds.items():
            inside = [(end - start) * 1000 for start, end, status, _ in answers if t0 <= start < t1 and status == 200]
            scaling.windows[name] = (len(inside), quantile(inside, 0.5), quantile(inside, 0.95), len(inside) / max(t1 - t0, 1e-9))
            scaling.answered_by[name] = sorted(Counter(r for start, _, status, r in answers if t0 <= start < t1 and status == 200)
                                               .values(), reverse=True)
            log.info("%s: %d answers, p50 %.0f ms, p95 %.0f ms, %.1f/s, by replica %s", name, *scaling.windows[name],
                     scaling.answered_by[name])
        scaling.errors = sum(1 for _, _, status, _ in answers if status != 200)
        if scaling.errors or set(scaling.placed.values()) != {net.head_ip, net.worker_ip}:
            raise CheckFailed(f"{scaling.errors} errors; the replicas were on {scaling.placed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", type=Path, required=True, help="an empty temporary folder for every file the check writes")
    parser.add_argument("--head-ns", required=True)
    parser.add_argument("--worker-ns", required=True)
    parser.add_argument("--head-ip", default="10.231.0.1")
    parser.add_argument("--worker-ip", default="10.231.0.2")
    parser.add_argument("--svc-ip", default="10.231.0.254")
    parser.add_argument("--images", type=int, default=60, help="images in the durable job")
    parser.add_argument("--kill-after", type=int, help="kill the worker node once this many job images are answered "
                        "(default: a third of them)")
    parser.add_argument("--interactive", type=int, default=24, help="/attribute requests through the two proxies")
    parser.add_argument("--delay-s", type=float, help="IDG_TEST_DELAY_S: seconds each tiny model call takes (default 0.1; "
                        "0.3 with --autoscale, so that the replica, not the 2 cores' proxies and clients, limits the rate)")
    parser.add_argument("--alert-for", default="10s", help="IDGReplicasMissing's `for` in the rules' copy (shipped: 5m)")
    parser.add_argument("--summary", type=Path, help="also write the summary line here")
    parser.add_argument("--autoscale", action="store_true", help="instead: measure autoscaling (1 to 2 replicas) under a load step")
    parser.add_argument("--clients", type=int, default=8, help="--autoscale: clients in the load step")
    parser.add_argument("--baseline-s", type=float, default=15, help="--autoscale: seconds of one client before the step")
    parser.add_argument("--hold-s", type=float, default=20, help="--autoscale: seconds of load after the second replica runs")
    parser.add_argument("--downscale-delay-s", type=float, default=30,
                        help="--autoscale: autoscaling_config.downscale_delay_s (shipped: 300, so a check would wait 5 min)")
    args = parser.parse_args(argv)
    args.kill_after = args.images // 3 if args.kill_after is None else args.kill_after
    args.delay_s = (0.3 if args.autoscale else 0.1) if args.delay_s is None else args.delay_s
    logging.basicConfig(level=logging.INFO, format="cluster-check %(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(f"cluster-check: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    for tool in ("ip", "prometheus", "promtool", "runuser"):
        if shutil.which(tool) is None:
            log.error("cluster-check: %s is not installed", tool)
            return 2
    net = Net(args.head_ns, args.worker_ns, args.head_ip, args.worker_ip, args.svc_ip)
    figures: Figures | Scaling = Scaling() if args.autoscale else Figures()
    started = time.monotonic()
    code = 0
    try:
        if isinstance(figures, Scaling):
            autoscale(args, net, args.root, figures)
        else:
            node_death(args, net, args.root, figures)
    except (CheckFailed, subprocess.CalledProcessError, subprocess.TimeoutExpired, httpx.HTTPError) as exc:
        detail = exc.stderr.decode(errors="replace")[-2000:] if isinstance(exc, subprocess.CalledProcessError) and exc.stderr else ""
        log.error("cluster-check FAILED: %s %s", exc, detail)
        code = 1
    except (Exception, SystemExit) as exc:  # noqa: BLE001  # a bug or the 15-minute bound: still the figures so far
        log.exception("cluster-check FAILED: %s", exc)
        code = 1
    line = figures.line(time.monotonic() - started) + ("" if code == 0 else " (FAILED)")
    if args.summary:
        args.summary.write_text(line + "\n")
    log.info("%s", line)
    return code


if __name__ == "__main__":
    sys.exit(main())
