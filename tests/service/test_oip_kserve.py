"""KServe's own REST client is served (issue #60): ``kserve.InferenceRESTClient.infer`` posts the body
``InferRequest.to_rest`` writes, which names the model (``model_name``) beside the path, and a generated ``id``; other
clients write ``model_version`` too (often empty). The door takes these fields, and refuses a body whose model or
version disagrees with the path (400, saying so) instead of answering for the path's model.

The bodies below are written as kserve 0.21's ``python/kserve/kserve/protocol/infer_type.py`` (``InferRequest.to_rest``)
and ``inference_client.py`` (``InferenceRESTClient.infer``) write them: JSON ``{"id", "model_name", "inputs"[,
"outputs"][, "parameters"]}`` posted without a Content-Type, or, where an input holds raw bytes, that JSON followed by
the bytes, with ``Inference-Header-Content-Length`` and ``content-type: application/octet-stream``. The last test drives
KServe's real clients (REST and gRPC) against a real server process, from ``.venv/peers/kserve`` (``scripts/setup.sh
dev`` installs the ``kserve`` package there, apart: it pins protobuf and psutil below this project's)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from httpx import AsyncClient

from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.reliability.server_app import ROOT, Served, serve_process
from tests.service.test_oip import b64

FILES = [image_bytes((30, 140, 220)), image_bytes((220, 60, 30), size=(60, 44))]


def kserve_json_body(model_name: str, **extra: Any) -> dict[str, Any]:
    """``InferRequest.to_rest`` of a BYTES input given as data (the JSON form): id, model_name, inputs."""
    return {"id": str(uuid.uuid4()), "model_name": model_name,
            "inputs": [{"name": "image", "shape": [len(FILES)], "datatype": "BYTES", "data": [b64(f) for f in FILES]}], **extra}


def kserve_binary_body(model_name: str) -> tuple[bytes, dict[str, str]]:
    """``InferRequest.to_rest`` of a BYTES input set with ``set_data_from_numpy`` (binary): the JSON, then the raw
    length-prefixed elements; and the headers ``InferenceRESTClient.infer`` adds."""
    raw = b"".join(struct.pack("<I", len(f)) + f for f in FILES)
    header = json.dumps({"id": str(uuid.uuid4()), "model_name": model_name, "inputs": [
        {"name": "image", "shape": [len(FILES)], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "predicted_class"}]}).encode()
    return header + raw, {"inference-header-content-length": str(len(header)), "content-type": "application/octet-stream"}


async def predicted(client: AsyncClient, content: bytes, headers: dict[str, str] | None = None, path: str = "tiny") -> Any:
    r = await client.post(f"/v2/models/{path}/infer", content=content, headers=headers or {})
    return r.status_code, r.json()


def classes(answer: dict[str, Any]) -> list[int]:
    return next(o["data"] for o in answer["outputs"] if o["name"] == "predicted_class")


async def test_kserves_json_and_binary_bodies_are_answered_as_the_plain_ones(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(warmup=False)) as client:
        plain = {"inputs": [{"name": "image", "shape": [2], "datatype": "BYTES", "data": [b64(f) for f in FILES]}]}
        status, expected = await predicted(client, json.dumps(plain).encode())
        assert status == 200, expected
        body = kserve_json_body("tiny")
        status, answer = await predicted(client, json.dumps(body).encode())  # no Content-Type, as kserve posts it
        assert status == 200, answer
        assert answer["id"] == body["id"] and answer["model_name"] == "tiny" and classes(answer) == classes(expected)
        content, headers = kserve_binary_body("tiny")
        status, answer = await predicted(client, content, headers)
        assert status == 200, answer
        assert classes(answer) == classes(expected)
        for version in ("", "1"):  # what other clients write beside model_name
            status, answer = await predicted(client, json.dumps(kserve_json_body("tiny", model_version=version)).encode())
            assert status == 200, answer
        status, answer = await predicted(client, json.dumps(kserve_json_body("tiny", model_version="1")).encode(),
                                         path="tiny/versions/1")
        assert status == 200, answer


@pytest.mark.parametrize(("extra", "says"), [
    ({"model_name": "other"}, "the body's model_name 'other' disagrees with the path's model 'tiny'"),
    ({"model_name": "tiny", "model_version": "2"}, "the body's model_version '2' is not a version of 'tiny': it has one, '1'"),
    ({"model_name": "tiny", "model_versions": "1"}, "model_versions: Extra inputs are not permitted"),  # still strict
])
async def test_a_body_that_names_another_model_or_version_is_refused_saying_so(
    tiny_app: AppFactory, extra: dict[str, str], says: str,
) -> None:
    app = tiny_app(warmup=False)
    async with serve(app) as client:
        app.state.service.models["tiny"].net.calls.clear()  # the start's own pass (it finds the default's Grad-CAM layer)
        status, answer = await predicted(client, json.dumps({**kserve_json_body("tiny"), **extra}).encode())
        assert status == 400 and says in answer["error"], answer
        assert app.state.service.models["tiny"].net.calls == []  # refused before any work


KSERVE_SITE = Path(os.environ.get("IDG_KSERVE_SITE") or ROOT / ".venv" / "peers" / "kserve")
"""Where ``kserve`` is installed apart (``scripts/setup.sh dev``: it pins protobuf and psutil below this project's)."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    if not (KSERVE_SITE / "kserve").is_dir():
        pytest.skip(f"KServe's client is not at {KSERVE_SITE}: scripts/setup.sh dev installs it there")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    with serve_process(tmp_path_factory.mktemp("kserve") / "server.log", IDG_GRPC_PORT=grpc_port) as s:
        yield s, grpc_port


def test_kserves_own_rest_and_grpc_clients_get_their_answers(served: tuple[Served, int]) -> None:
    """The ``kserve`` package's ``InferenceRESTClient`` (JSON and binary bodies) and ``InferenceGRPCClient``, unmodified,
    in a process of their own, against a real server; a body naming another model is refused with a 400 saying so; each
    reads XRAI's ranked regions where asked."""
    server, grpc_port = served
    env = {**os.environ, "PYTHONPATH": str(KSERVE_SITE)}
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "peers" / "kserve_client.py"), server.url,
                           f"127.0.0.1:{grpc_port}", "tiny"], input=json.dumps([b64(f) for f in FILES]), capture_output=True,
                          text=True, env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    for way in ("rest_json", "rest_binary", "grpc"):
        answer = found[way]
        assert answer["model_name"] == "tiny" and answer["shape"] == [len(FILES), 1000], (way, answer)
        assert answer["predicted"] == answer["argmax"], (way, answer)
    assert found["rest_other_model"].startswith("400") and "disagrees with the path's model 'tiny'" in found["rest_other_model"]
    for way in ("rest_regions", "grpc_regions"):  # the regions output alone, a rank per pixel: every rank from 1 on
        regions = found[way]
        assert regions["outputs"] == ["regions"] and regions["dtype"] == "int32" and regions["shape"] == [1, 32, 32], regions
        assert regions["ranks"] == list(range(1, len(regions["ranks"]) + 1)) and len(regions["ranks"]) > 1, regions
