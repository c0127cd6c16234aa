"""The KubeRay manifest is a RayService the operator accepts (issue #64 item 4), checked offline: deploy/kuberay/rayservice.yaml
validates against KubeRay's own RayService CRD schema (deploy/kuberay/rayservice-crd.schema.json, v1.7.0, pruned by
scripts/kuberay_crd_schema.py; its ``$comment`` names the source), broken copies of it do not, it asks for Ray's token
authentication, and its embedded Serve config (serveConfigV2) agrees with deploy/ray/serve.yaml where the two should.

The CRD schema is OpenAPI v3 as Kubernetes reads it; it becomes JSON Schema (Draft 7) here: ``nullable`` admits null,
``x-kubernetes-*`` keys go (their CEL rules and list-map keys are not checked), and an object with declared fields and no
``x-kubernetes-preserve-unknown-fields`` refuses others, as ``kubectl apply``'s strict field validation does."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "deploy/kuberay/rayservice-crd.schema.json"
MANIFEST = ROOT / "deploy/kuberay/rayservice.yaml"


def draft7(node: Any) -> Any:
    """The CRD's OpenAPI v3 schema as a Draft 7 JSON Schema (see the module's docstring)."""
    if isinstance(node, list):
        return [draft7(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: draft7(value) for key, value in node.items()
           if not key.startswith("x-kubernetes-") and key not in ("nullable", "properties")}
    if "properties" in node:
        out["properties"] = {name: draft7(value) for name, value in node["properties"].items()}  # field names, not keywords
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft7Validator:
    schema = draft7(json.loads(SCHEMA.read_text()))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def manifest() -> dict[str, Any]:
    return dict(yaml.safe_load(MANIFEST.read_text()))


def errors(validator: jsonschema.Draft7Validator, document: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_the_schema_file_is_small_and_names_its_source() -> None:
    assert SCHEMA.stat().st_size < 64_000
    header = json.loads(SCHEMA.read_text())["$comment"]
    assert "github.com/ray-project/kuberay/blob/v1.7.0/ray-operator/config/crd/bases/ray.io_rayservices.yaml" in header
    assert "commit " in header and "pruned" in header.lower()


def test_the_manifest_validates_against_the_rayservice_crd(validator: jsonschema.Draft7Validator) -> None:
    document = manifest()
    assert (document["apiVersion"], document["kind"]) == ("ray.io/v1", "RayService")
    assert errors(validator, document) == []


def _string_for_integer(d: dict[str, Any]) -> None:
    d["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = "8"


def _required_missing(d: dict[str, Any]) -> None:
    del d["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]


def _misspelled_field(d: dict[str, Any]) -> None:
    cluster = d["spec"]["rayClusterConfig"]
    cluster["enableInTreeAutoScaling"] = cluster.pop("enableInTreeAutoscaling")


def _unknown_auth_mode(d: dict[str, Any]) -> None:
    d["spec"]["rayClusterConfig"]["authOptions"]["mode"] = "password"


def _container_without_name(d: dict[str, Any]) -> None:
    del d["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["name"]


def _port_as_string(d: dict[str, Any]) -> None:
    d["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "6379"


def _serve_config_as_mapping(d: dict[str, Any]) -> None:
    d["spec"]["serveConfigV2"] = yaml.safe_load(d["spec"]["serveConfigV2"])  # KubeRay wants the YAML as one string


@pytest.mark.parametrize(("break_it", "where"), [
    (_string_for_integer, "spec.rayClusterConfig.workerGroupSpecs.0.maxReplicas"),
    (_required_missing, "spec.rayClusterConfig.headGroupSpec"),
    (_misspelled_field, "spec.rayClusterConfig"),
    (_unknown_auth_mode, "spec.rayClusterConfig.authOptions.mode"),
    (_container_without_name, "spec.rayClusterConfig.workerGroupSpecs.0.template.spec.containers.0"),
    (_port_as_string, "spec.rayClusterConfig.headGroupSpec.template.spec.containers.0.ports.0.containerPort"),
    (_serve_config_as_mapping, "spec.serveConfigV2"),
])
def test_a_broken_copy_fails(validator: jsonschema.Draft7Validator, break_it: Any, where: str) -> None:
    document = copy.deepcopy(manifest())
    break_it(document)
    found = errors(validator, document)
    assert any(e.startswith(where + ":") for e in found), found


def test_ray_token_authentication_is_on() -> None:
    cluster = manifest()["spec"]["rayClusterConfig"]
    assert cluster["authOptions"]["mode"] == "token"
    # KubeRay refuses authOptions.mode token below Ray 2.52.0; the version is also the one the project pins.
    assert tuple(map(int, cluster["rayVersion"].split("."))) >= (2, 52, 0)
    assert f'"ray[serve]=={cluster["rayVersion"]}"' in (ROOT / "pyproject.toml").read_text()


def test_the_embedded_serve_config_agrees_with_serve_yaml() -> None:
    document = manifest()
    assert isinstance(document["spec"]["serveConfigV2"], str)
    kuberay = yaml.safe_load(document["spec"]["serveConfigV2"])
    local = yaml.safe_load((ROOT / "deploy/ray/serve.yaml").read_text())
    for key in ("proxy_location",):
        assert kuberay[key] == local[key], key
    for key in ("port", "request_timeout_s", "keep_alive_timeout_s"):
        assert kuberay["http_options"][key] == local["http_options"][key], key
    assert kuberay["http_options"]["host"] == "0.0.0.0"  # a pod's proxy must be reachable from its Service
    (k_app,), (l_app,) = kuberay["applications"], local["applications"]
    for key in ("name", "route_prefix", "import_path"):
        assert k_app[key] == l_app[key], key
    assert k_app["args"]["factory"] == l_app["args"]["factory"]
    k_env, l_env = k_app["runtime_env"]["env_vars"], l_app["runtime_env"]["env_vars"]
    # The same model and limits everywhere; the counts (IDG_REPLICAS_EXPECTED) and the CPU-only threads differ by design.
    for key in ("IDG_MODELS", "IDG_MAX_QUEUE", "IDG_MAX_PREDICT_QUEUE", "IDG_REPLICA_METRICS_PORTS"):
        assert str(k_env[key]) == str(l_env[key]), key
    (k_dep,), (l_dep,) = k_app["deployments"], l_app["deployments"]
    for key in ("name", "max_ongoing_requests", "backpressure_config", "health_check_period_s", "health_check_timeout_s",
                "graceful_shutdown_timeout_s"):
        assert k_dep[key] == l_dep[key], key


def test_the_gpu_workers_match_the_serve_deployment() -> None:
    """One replica per GPU: the deployment's num_gpus, the worker pods' GPUs and the autoscaling maximum agree."""
    spec = manifest()["spec"]
    (deployment,) = yaml.safe_load(spec["serveConfigV2"])["applications"][0]["deployments"]
    (workers,) = spec["rayClusterConfig"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert deployment["ray_actor_options"]["num_gpus"] == 1 == gpus == int(workers["rayStartParams"]["num-gpus"])
    assert deployment["autoscaling_config"]["max_replicas"] == workers["maxReplicas"] * gpus
    assert deployment["autoscaling_config"]["min_replicas"] <= workers["minReplicas"] * gpus
