"""A model that raises (a user's TorchScript file, loaded from IDG_MODELS as a user would) is answered on every door
with one sentence, the exception's type and first line, and the request's ID, never TorchScript's traceback (whose
message holds the model's source lines and file names): that goes to the log, under the request's ID (#71 items 2 and 5).

The doors: ``/predict``, ``/predict`` with ``explain_if``, ``/attribute``, ``/attribute/stream`` (its ``error`` event),
``/attribute/batch`` (an item's error), ``/v2`` HTTP plain and explained, ``ModelInfer`` over gRPC plain and explained,
and a durable job image's stored error. Each keeps its status (500, gRPC ``INTERNAL``)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from httpx import AsyncClient, Response
from torch import Tensor, nn

from app.core.config import Settings
from app.core.errors import MODEL_MESSAGE_CHARS, model_failure
from app.doors.request_id import RequestIdFilter
from app.main import create_app
from tests.service.conftest import image_bytes, serve

GREEN = image_bytes(color=(20, 250, 20))
"""Normalised green mean about 1.9: the model raises ValueError on it, in every call."""
RED = image_bytes(color=(250, 20, 20))
"""Normalised red mean about 1.9: predicted, but a gradient call on it fails (a matrix product of the wrong shapes)."""
SAYS_GREEN = "the model raised ValueError: bright green images are outside this model's domain"
SAYS_RED = "the model raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"
MODELS_TOML = "[models.raising]\ninput_size = 32\nmean = [0.5, 0.5, 0.5]\nstd = [0.25, 0.25, 0.25]\n"


class RaisesOnSomeImages(nn.Module):
    """3 classes from the channel means; raises on a bright green image (a ``raise``: TorchScript's ``builtins.ValueError``)
    and, in a gradient call only, on a bright red one (an operation that fails: ``RuntimeError``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: Tensor) -> Tensor:
        means = x.mean(dim=(2, 3))
        if bool((means[:, 1] > 1.5).any()):
            raise ValueError("bright green images are outside this model's domain")
        if x.requires_grad and bool((means[:, 0] > 1.5).any()):
            return torch.mm(x.flatten(1), self.fc.weight)
        return self.fc(means)


SOURCE_LINES = ("raise ValueError(", "torch.mm(x.flatten(1)", "means[:, 1] > 1.5")
"""The model's source, as TorchScript's traceback quotes it."""


@dataclass(frozen=True)
class Answer:
    """A door's answer to the raising model: its status (HTTP, or the gRPC code), its sentence, its request ID and the
    whole body it was read from."""

    door: str
    status: int | str
    message: str
    request_id: str
    body: str


def _contract(door: str, r: Response) -> Answer:
    error = r.json()["error"]
    assert error["request_id"] == r.headers["x-request-id"] and error["code"] == "model_error", r.text
    return Answer(door, r.status_code, error["message"], error["request_id"], r.text)


def _v2_body(explain: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(GREEN).decode()]}]}
    if explain:
        body["parameters"] = {"explain": True, "steps": 4, "probe_steps": 4}
    return body


async def _grpc(explain: bool) -> Answer:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    request = pb.ModelInferRequest(model_name="raising", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[GREEN]))])
    if explain:
        request.parameters["explain"].bool_param = True
    async with grpc.aio.insecure_channel(f"127.0.0.1:{os.environ['IDG_GRPC_PORT']}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub_of(channel).ModelInfer(request, timeout=60)
    err = caught.value
    trailing = dict(err.trailing_metadata() or ())
    return Answer(f"gRPC ModelInfer{' explained' if explain else ''}", err.code().name, err.details() or "",
                  trailing["x-request-id"], f"{err.details()} {trailing}")


async def _every_door(client: AsyncClient) -> list[Answer]:
    green = {"file": ("green.png", GREEN)}
    answers = [
        _contract("/predict", await client.post("/predict", files=green)),
        _contract("/predict explain_if", await client.post("/predict", files={"file": ("red.png", RED)},
                                                            data={"explain_if": "confidence <= 1", "method": "ig"})),
        _contract("/attribute", await client.post("/attribute", files=green, data={"method": "ig", "steps": "4"})),
    ]
    r = await client.post("/attribute/stream", files=green, data={"method": "idg", "steps": "4", "probe_steps": "4"})
    assert r.status_code == 200, r.text
    blocks = [dict(line.split(": ", 1) for line in b.splitlines()) for b in r.text.strip().split("\n\n")]
    assert blocks[-1]["event"] == "error", r.text
    event = json.loads(blocks[-1]["data"])
    assert event["request_id"] == r.headers["x-request-id"], r.text  # item 5: the stream's error names its request too
    answers.append(Answer("/attribute/stream", event["status"], event["message"], event["request_id"], r.text))
    r = await client.post("/attribute/batch", files=[("files", ("a.png", GREEN)), ("files", ("b.png", GREEN))], data={"steps": "4"})
    assert r.status_code == 200 and r.json()["failed"] == 2, r.text
    for item in r.json()["items"]:
        answers.append(Answer("/attribute/batch", item["status"], item["error"]["message"], item["error"]["request_id"], r.text))
    for explain in (False, True):
        r = await client.post("/v2/models/raising/infer", json=_v2_body(explain))
        assert r.json()["request_id"] == r.headers["x-request-id"], r.text
        answers.append(Answer(f"/v2{' explained' if explain else ''}", r.status_code, r.json()["error"], r.json()["request_id"], r.text))
        answers.append(await _grpc(explain))
    r = await client.post("/jobs", files=[("files", ("green.png", GREEN))], data={"steps": "4", "probe_steps": "4"})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    for _ in range(600):
        if (await client.get(f"/jobs/{job}")).json()["state"] == "done":
            break
        await asyncio.sleep(0.05)
    results = await client.get(f"/jobs/{job}/results")
    (line,) = [json.loads(x) for x in results.text.splitlines()]
    assert line["error"]["code"] == "model_error", line
    answers.append(Answer("a job's image", line["status"], line["error"]["message"], line["error"]["request_id"],
                          results.text + (await client.get(f"/jobs/{job}")).text))
    return answers


@pytest.fixture
def raising_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The model saved as a user would (torch.jit.script, torch.jit.save), with its models file; and a free gRPC port."""
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(RaisesOnSomeImages()), tmp_path / "raising.ts")
    (tmp_path / "models.toml").write_text(MODELS_TOML)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("IDG_GRPC_PORT", str(s.getsockname()[1]))
    return tmp_path


async def test_a_raising_model_is_a_sentence_and_a_request_id_on_every_door_and_its_traceback_is_logged(
    raising_model: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.handler.addFilter(RequestIdFilter())  # as the service's handlers name the request of a line
    app = create_app(Settings(models=[f"raising=torchscript:{raising_model / 'raising.ts'}"], models_file=raising_model / "models.toml",
                              warmup=False, batch_wait_ms=5.0))
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(app) as client:
            answers = await _every_door(client)
    assert len({a.door for a in answers}) == 10
    for a in answers:
        assert a.status in (500, "INTERNAL"), a  # the status each door gave a raising model before: only the body changed
        says = SAYS_RED if a.door == "/predict explain_if" else SAYS_GREEN
        assert a.message.startswith(says), a  # the exception's type and its own line, nothing before or after it but its end
        assert "\n" not in a.message and len(a.message) <= len("the model raised RuntimeError: ") + MODEL_MESSAGE_CHARS, a
        for leak in ("Traceback", "TorchScript", "code/__torch__", "HERE", str(raising_model), __file__, Path(__file__).name,
                     *SOURCE_LINES):
            assert leak not in a.body, (leak, a)
    logged = {getattr(r, "request_id", None): logging.Formatter().formatException(r.exc_info)
              for r in caplog.records if r.levelno == logging.ERROR and r.exc_info}
    for a in answers:  # each answer's request: its whole traceback, the model's source lines included, in the log
        assert a.request_id in logged, (a, list(logged))
        assert "Traceback of TorchScript" in logged[a.request_id] and __file__ in logged[a.request_id], a
        source = "torch.mm(x.flatten(1)" if a.door == "/predict explain_if" else "raise ValueError("
        assert source in logged[a.request_id], a


def _raised(make: Any) -> BaseException:
    try:
        make()
    except Exception as err:  # noqa: BLE001 - the test's own raise
        return err
    raise AssertionError("nothing was raised")


class _Eager(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        raise OSError("\n  a first line " + "x" * 1000 + "\nand a second line")


def test_the_sentence_names_the_models_exception_by_its_type_and_first_line() -> None:
    scripted = torch.jit.script(RaisesOnSomeImages())
    err = _raised(lambda: scripted(torch.full((1, 3, 4, 4), 2.0)))
    assert model_failure(err) == SAYS_GREEN
    x = torch.zeros(1, 3, 4, 4)
    x[:, 0] = 2.0
    err = _raised(lambda: scripted(x.requires_grad_(True)))
    assert model_failure(err) == SAYS_RED + " (1x48 and 3x3)"
    eager = model_failure(_raised(lambda: _Eager()(x)))  # a Python model's: its type, its first line only, cut
    assert eager.startswith("the model raised OSError: a first line xx") and "second" not in eager and eager.endswith("x...")
    assert len(eager) == len("the model raised OSError: ") + MODEL_MESSAGE_CHARS
    cut = RuntimeError("The following operation failed in the TorchScript interpreter.\n  File \"/models/m.py\", line 3\n    x = y")
    assert model_failure(cut) == "the model raised an error in TorchScript's interpreter (RuntimeError; its traceback is in the log)"
    # the project's own sentences, raised in its own code (a model's output of the wrong shape), are said as they are
    from idg_core.model_calls import _logits

    ours = model_failure(_raised(lambda: _logits(torch.zeros(2), 2)))
    assert ours.startswith("the model failed on this request: the model must return float logits of shape"), ours
