"""Write deploy/kuberay/rayservice-crd.schema.json: KubeRay's RayService CRD schema (ray.io/v1), pruned to stay small.

The CRD is ~1 MB of YAML, almost all of it Kubernetes' PodTemplateSpec (twice) and the deprecated v1alpha1 copy. This
keeps the v1 openAPIV3Schema as KubeRay ships it for everything the manifest's RayService, its rayClusterConfig and
autoscalerOptions use, and cuts the subtrees that are Kubernetes' own types to open objects
(``x-kubernetes-preserve-unknown-fields``), except a pod template's containers' name, image, ports, env and resources.
Regenerate after a KubeRay upgrade::

    git --git-dir KUBERAY/.git show v1.7.0:ray-operator/config/crd/bases/ray.io_rayservices.yaml > /tmp/crd.yaml
    python scripts/kuberay_crd_schema.py /tmp/crd.yaml --version v1.7.0 --commit <sha of the tag's commit>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML; no stubs installed

OUT = Path(__file__).resolve().parents[1] / "deploy/kuberay/rayservice-crd.schema.json"
SOURCE = "https://github.com/ray-project/kuberay/blob/{version}/ray-operator/config/crd/bases/ray.io_rayservices.yaml"
OPEN: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
CONTAINER_KEPT = ("name", "image", "ports", "env", "resources")
# Kubernetes' own types (Service, NetworkPolicy rules, ...) and the status the operator writes: not the manifest's concern.
CUT_SPEC = ("serveService",)
CUT_CLUSTER = ("networkPolicy", "historyServerOptions", "gcsFaultToleranceOptions")


def pod_template(template: dict[str, Any]) -> dict[str, Any]:
    """A PodTemplateSpec with only its containers' kept fields checked; every other pod field is let through."""
    spec = template["properties"]["spec"]
    containers = spec["properties"]["containers"]
    item = containers["items"]
    return {
        "type": "object",
        "properties": {
            "metadata": OPEN,
            "spec": {
                "type": "object",
                "required": spec["required"],
                "x-kubernetes-preserve-unknown-fields": True,
                "properties": {"containers": {
                    **{k: v for k, v in containers.items() if k != "items"},
                    "items": {"type": "object", "required": item["required"], "x-kubernetes-preserve-unknown-fields": True,
                              "properties": {k: item["properties"][k] for k in CONTAINER_KEPT}},
                }},
            },
        },
    }


def prune(crd: dict[str, Any], version: str, commit: str) -> dict[str, Any]:
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = v1["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    cluster = spec["properties"]["rayClusterConfig"]
    head = cluster["properties"]["headGroupSpec"]
    head["properties"]["template"] = pod_template(head["properties"]["template"])
    head["properties"]["headService"] = OPEN
    worker = cluster["properties"]["workerGroupSpecs"]["items"]
    worker["properties"]["template"] = pod_template(worker["properties"]["template"])
    for key in CUT_SPEC:
        spec["properties"][key] = OPEN
    for key in CUT_CLUSTER:
        cluster["properties"][key] = OPEN
    schema["properties"]["status"] = OPEN
    header = (
        f"KubeRay's RayService CRD ({crd['metadata']['name']}, version v1), the openAPIV3Schema only, pruned. "
        f"Source: {SOURCE.format(version=version)} (KubeRay {version}, commit {commit}). "
        "Kept as shipped: spec (serveConfigV2, the thresholds, upgradeStrategy, ...), spec.rayClusterConfig's rayVersion, "
        "enableInTreeAutoscaling, authOptions, autoscalerOptions, tlsOptions, headGroupSpec and workerGroupSpecs (all "
        "their own fields). Pruned to an open object (x-kubernetes-preserve-unknown-fields): status, serveService, "
        "headGroupSpec.headService, rayClusterConfig's networkPolicy, historyServerOptions and gcsFaultToleranceOptions, "
        "the pod templates' metadata, and every pod spec field but containers, whose items keep only "
        f"{', '.join(CONTAINER_KEPT)}. The deprecated v1alpha1 version is left out. "
        "Written by scripts/kuberay_crd_schema.py; tests/service/test_kuberay_manifest.py validates the manifest with it."
    )
    return {"$comment": header, **schema}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path, help="ray.io_rayservices.yaml from KubeRay")
    parser.add_argument("--version", required=True, help="the KubeRay tag it came from, e.g. v1.7.0")
    parser.add_argument("--commit", required=True, help="that tag's commit")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    schema = prune(yaml.safe_load(args.crd.read_text()), args.version, args.commit)
    args.out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"{args.out}: {args.out.stat().st_size} bytes\n")


if __name__ == "__main__":
    main()
