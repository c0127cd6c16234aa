"""Ray as shipped fires its alerts (issue #60): the Serve configs set ``IDG_REPLICAS_EXPECTED`` equal to the autoscaling
minimum (unset, IDGReplicasMissing could never fire; above the minimum, it would fire whenever the autoscaler rightly
scales down), their settings load, their cap on requests per replica stays above the app's own bound (so a full replica
answers its own 503), and each replica's metrics port comes from a configured range (``IDG_REPLICA_METRICS_PORTS``),
not a random one: the first free port of it, on real sockets."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import ValidationError

from app.core.config import Settings
from app.monitoring.prometheus import Metrics

ROOT = Path(__file__).resolve().parents[2]


def serve_configs() -> dict[str, dict[str, Any]]:
    """The Serve config of each shipped file: deploy/ray/serve.yaml, and the one KubeRay's RayService embeds."""
    kuberay = yaml.safe_load((ROOT / "deploy/kuberay/rayservice.yaml").read_text())
    return {"deploy/ray/serve.yaml": yaml.safe_load((ROOT / "deploy/ray/serve.yaml").read_text()),
            "deploy/kuberay/rayservice.yaml": yaml.safe_load(kuberay["spec"]["serveConfigV2"])}


@pytest.mark.parametrize("name", list(serve_configs()))
def test_the_replicas_expected_equal_the_autoscaling_minimum(name: str) -> None:
    (application,) = serve_configs()[name]["applications"]
    (deployment,) = application["deployments"]
    env = application["runtime_env"]["env_vars"]
    assert "IDG_REPLICAS_EXPECTED" in env, f"{name}: IDGReplicasMissing cannot fire without IDG_REPLICAS_EXPECTED"
    assert int(env["IDG_REPLICAS_EXPECTED"]) == deployment["autoscaling_config"]["min_replicas"], name


@pytest.mark.parametrize("name", list(serve_configs()))
def test_the_configs_settings_load_and_a_full_replica_answers_its_own_503(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (application,) = serve_configs()[name]["applications"]
    (deployment,) = application["deployments"]
    for key, value in application["runtime_env"]["env_vars"].items():
        monkeypatch.setenv(key, str(value))
    settings = Settings()
    assert settings.replicas_expected == deployment["autoscaling_config"]["min_replicas"]
    assert settings.max_predict_queue >= settings.max_batch_files  # as given, not raised at start with a warning
    assert deployment["max_ongoing_requests"] > settings.max_queue + settings.predict_queue, name
    assert len(settings.metrics_ports) >= deployment["autoscaling_config"]["max_replicas"] or name.startswith("deploy/kuberay")


@pytest.mark.parametrize("given", ["9500", "9600-9500", "a-b", "0-10", "9500-70000"])
def test_a_port_range_that_is_not_one_is_refused(given: str) -> None:
    with pytest.raises(ValidationError, match="IDG_REPLICA_METRICS_PORTS must be LOW-HIGH"):
        Settings(replica_metrics_ports=given)


def test_the_default_range() -> None:
    assert Settings().metrics_ports == range(9500, 9600)


@contextmanager
def held(port: int) -> Iterator[None]:
    """``port`` on loopback taken by another listener for the duration."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def two_free_ports() -> int:
    """A port p such that p and p + 1 are free on loopback now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            with held(port), held(port + 1):
                return port
        except OSError:
            continue
    raise AssertionError("no two adjacent free ports")


def test_a_replica_serves_its_metrics_on_the_first_free_port_of_the_range() -> None:
    ray_serve = pytest.importorskip("app.ray_serve", reason="ray is not installed (pip install -e '.[ray]')")
    registry = Metrics().registry
    low = two_free_ports()
    with held(low):  # another replica of the node holds the first
        server = ray_serve.serve_metrics(registry, "127.0.0.1", range(low, low + 2))
        try:
            assert server.server_port == low + 1
            assert "idg_ready " in httpx.get(f"http://127.0.0.1:{low + 1}/metrics", timeout=10).text
            with pytest.raises(RuntimeError, match=rf"no free port .* IDG_REPLICA_METRICS_PORTS={low}-{low + 1}"):
                ray_serve.serve_metrics(registry, "127.0.0.1", range(low, low + 2))  # both taken now
        finally:
            server.shutdown()
            server.server_close()
