"""``make cluster-check`` and ``make autoscale-check`` (scripts/cluster_check.sh, benchmarks/cluster_check.py) as tests: a
two-node Ray cluster, each node in a network namespace of its own, a durable job through a worker node's death, and
Serve scaling to the second node under a load step and back. Slow (1.5 and 2.5 minutes on the 2-core VM), so only with
``-m slow``; skipped with one line where network namespaces cannot be created (not root, or
a container without CAP_SYS_ADMIN) or a tool it needs is missing."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def netns_allowed() -> str | None:
    """None where this machine lets the check create network namespaces; otherwise why not."""
    if os.geteuid() != 0:
        return "cluster-check needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "cluster-check needs iproute2's ip"
    probe = f"idgc-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"cluster-check: this machine does not allow network namespaces (ip netns add: {made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def cluster_check(*args: str) -> str:
    """Run scripts/cluster_check.sh (skipping where it cannot run); its last line, after asserting it succeeded."""
    pytest.importorskip("ray.serve", reason="cluster-check needs ray[serve] (the ray extra)")
    pytest.importorskip("psycopg", reason="cluster-check needs psycopg (the postgres extra)")
    missing = [tool for tool in ("prometheus", "promtool", "runuser") if shutil.which(tool) is None]
    if missing or not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        pytest.skip(f"cluster-check needs Prometheus and PostgreSQL from Debian; missing: {missing or ['pg_ctl']}")
    why = netns_allowed()
    if why:
        pytest.skip(why)
    done = subprocess.run([str(ROOT / "scripts" / "cluster_check.sh"), *args], capture_output=True, text=True, timeout=960,
                          check=False)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, f"{last}\n{done.stderr[-4000:]}"
    return last


@pytest.mark.slow  # ~1.5 min on the 2-core VM: `make cluster-check`, not `make test`
def test_a_two_node_cluster_answers_every_job_image_once_through_a_node_death() -> None:
    last = cluster_check()
    figures = re.fullmatch(r"cluster-check: (\d+) nodes, (\d+) replicas, (\d+) job images, (\d+) lost, (\d+) duplicated, "
                           r"(\d+) failed, .*", last)
    assert figures, last
    nodes, replicas, images, lost, duplicated, failed = map(int, figures.groups())
    assert (nodes, replicas, lost, duplicated, failed) == (2, 2, 0, 0, 0) and images >= 60, last
    assert "IDGReplicasMissing firing" in last and "2 replicas scraped by Prometheus" in last, last


@pytest.mark.slow  # ~2.5 min on the 2-core VM: `make autoscale-check`
def test_serve_scales_to_a_second_node_under_a_load_step_and_back() -> None:
    last = cluster_check("--autoscale")
    figures = re.match(r"autoscale-check: 1 -> (\d+) replicas (\d+) s after .*back to 1 (\d+) s after the load stopped", last)
    assert figures, last
    replicas, up_s, down_s = map(int, figures.groups())
    assert replicas == 2 and 0 < up_s < 180 and 0 < down_s < 210, last
    both = re.search(r"2 replicas, 2 proxies: .*?\(by replica \[(\d+), (\d+)\]\)", last)  # the new replica answers too
    assert both and min(map(int, both.groups())) > 0, last
    assert "; 0 errors;" in last, last
