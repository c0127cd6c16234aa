"""Triton's own gRPC client (``tritonclient.grpc``, from PyPI, unmodified) against a real server process
(``python -m app.server`` serving the tiny model, an API key set, ``IDG_GRPC_PORT`` open): the Open Inference Protocol
over gRPC answers what the HTTP door answers, with the service's deadline and errors as gRPC status codes.

The model takes 0.05 s a call and calls hold 4 images, so an explanation of 64 steps is about a second of work: a client
deadline shorter than that is answered by the deadline, and the work stops."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from app.core.errors import SHUTTING_DOWN
from app.core.model_loading import ModelLoadError
from app.doors.drain import drain
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.reliability.server_app import Served, serve_process
from tests.service.test_oip import pixels

grpcclient = pytest.importorskip("tritonclient.grpc", reason="grpcio or tritonclient is not installed (pip install -e '.[dev]')")
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "grpc-key"
AUTH = {"authorization": f"Bearer {KEY}"}
EXPLAIN = {"method": "idg", "preset": "fast", "steps": 8, "probe_steps": 6, "target": 5, "faithfulness": "insertion"}
"""An explanation's parameters: IDG's own map (preset=fast; the default's Grad-CAM product is zero where Grad-CAM's map is,
as it is for target 5 of the tiny model)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    port = free_port()
    with serve_process(tmp_path_factory.mktemp("grpc") / "server.log", IDG_API_KEY=KEY, IDG_MAX_STEPS=64, IDG_GRPC_PORT=port,
                       IDG_TEST_DELAY_S=0.05, IDG_MAX_BATCH_IMAGES=4, IDG_BATCH_WAIT_MS=0, IDG_MAX_UPLOAD_BYTES=100_000) as s:
        yield s, port


@pytest.fixture
def client(served: tuple[Served, int]) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(url=f"127.0.0.1:{served[1]}") as c:
        yield c


def images(*files: bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("image", [len(files)], "BYTES")
    tensor.set_data_from_numpy(np.array(files, dtype=np.object_))
    return tensor


def refused(call: object, *args: object, **kwargs: object) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


def test_health_metadata_config_index_and_statistics(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()  # the health probes need no key
    assert client.is_model_ready("tiny", headers=AUTH) and client.is_model_ready("tiny", model_version="1", headers=AUTH)
    assert not client.is_model_ready("nope", headers=AUTH) and not client.is_model_ready("tiny", model_version="2", headers=AUTH)
    server = client.get_server_metadata(headers=AUTH, as_json=True)
    assert server["extensions"] == ["binary_tensor_data", "classification", "model_configuration", "statistics"]
    meta = client.get_model_metadata("tiny", model_version="1", headers=AUTH, as_json=True)
    assert meta["versions"] == ["1"] and [t["name"] for t in meta["inputs"]] == ["image", "input"]
    assert meta["outputs"][0] == {"name": "probabilities", "datatype": "FP32", "shape": ["-1", "1000"]}  # int64 as JSON strings
    config = client.get_model_config("tiny", headers=AUTH).config
    assert config.name == "tiny" and config.max_batch_size == 32
    assert [(t.name, t.dims) for t in config.input] == [("image", [1]), ("input", [3, 32, 32])]
    index = client.get_model_repository_index(headers=AUTH, as_json=True)["models"]
    assert index == [{"name": "tiny", "version": "1", "state": "READY"}]
    before = client.get_inference_statistics("tiny", headers=AUTH).model_stats[0].inference_stats.success.count
    client.infer("tiny", [images(image_bytes())], headers=AUTH)
    (stats,) = client.get_inference_statistics("tiny", model_version="1", headers=AUTH).model_stats
    assert stats.name == "tiny" and stats.inference_stats.success.count == before + 1
    assert [s.name for s in client.get_inference_statistics(headers=AUTH).model_stats] == ["tiny"]


def test_statistics_count_executions_as_batches_and_inferences_as_images(client: grpcclient.InferenceServerClient,
                                                                          served: tuple[Served, int]) -> None:
    """Triton's definitions: ``inference_count`` is the images answered, ``execution_count`` the model executions (a batch
    of several images is one). Eight images in one request share calls of up to 4 (IDG_MAX_BATCH_IMAGES): fewer
    executions than inferences, and as many as the worker's model calls (``idg_model_calls_total``)."""
    calls = 'idg_model_calls_total{model="tiny"}'

    def counts() -> tuple[int, int]:
        (stats,) = client.get_inference_statistics("tiny", headers=AUTH).model_stats
        return int(stats.inference_count), int(stats.execution_count)

    (inferences, executions), called = counts(), served[0].metric(calls)
    x = np.stack([pixels(image_bytes(color=(30 * i, 90, 200 - 20 * i))) for i in range(8)]).astype(np.float32) / 255
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    assert client.infer("tiny", [tensor], headers=AUTH).as_numpy("probabilities").shape == (8, 1000)
    (inferences_after, executions_after), called_after = counts(), served[0].metric(calls)
    assert inferences_after - inferences == 8
    assert 2 <= executions_after - executions < inferences_after - inferences  # 4 images a call at most: 2 calls or more
    assert executions_after - executions == called_after - called
    http = httpx.get(served[0].url + "/v2/models/tiny/stats", headers=AUTH, timeout=10).json()["model_stats"][0]
    assert (http["inference_count"], http["execution_count"]) == (inferences_after, executions_after)  # both doors say it


def test_probabilities_are_the_http_doors(client: grpcclient.InferenceServerClient, served: tuple[Served, int]) -> None:
    files = [image_bytes(color=(20, 90, 200)), image_bytes(color=(200, 90, 20), size=(70, 50))]
    expected = [httpx.post(served[0].url + "/predict", files={"file": ("a.png", f)}, data={"top_k": "2"}, headers=AUTH,
                           timeout=60).json() for f in files]
    result = client.infer("tiny", [images(*files)], model_version="1", request_id="batch-1", headers=AUTH,
                          outputs=[grpcclient.InferRequestedOutput("probabilities"), grpcclient.InferRequestedOutput("predicted_class")])
    probs, best = result.as_numpy("probabilities"), result.as_numpy("predicted_class")
    assert probs.shape == (2, 1000) and probs.dtype == np.float32 and result.get_response().id == "batch-1"
    for i, answer in enumerate(expected):
        assert int(best[i]) == answer["top_k"][0]["index"]
        for c in answer["top_k"]:
            assert probs[i, c["index"]] == pytest.approx(c["probability"], rel=1e-5)
    top = client.infer("tiny", [images(*files)], outputs=[grpcclient.InferRequestedOutput("probabilities", class_count=2)],
                       headers=AUTH).as_numpy("probabilities")  # Triton's classification extension: "probability:index:label"
    assert top.shape == (2, 2) and [int(s.decode().split(":")[1]) for s in top[1]] == [c["index"] for c in expected[1]["top_k"]]


def test_an_explanation_of_pixels_is_the_http_doors(client: grpcclient.InferenceServerClient, served: tuple[Served, int]) -> None:
    data = image_bytes(color=(120, 30, 160))
    x = (pixels(data).astype(np.float32) / 255)[None]  # (1, 32, 32, 3): NHWC
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    names = ("attribution", "target", "curve_alpha", "curve_value", "insertion")
    result = client.infer("tiny", [tensor], outputs=[grpcclient.InferRequestedOutput(n) for n in names], headers=AUTH,
                          parameters=EXPLAIN)
    attribution = result.as_numpy("attribution")
    assert attribution.shape == (1, 3, 32, 32) and np.isfinite(attribution).all() and np.abs(attribution).max() > 0
    assert result.as_numpy("target").tolist() == [5]
    assert result.get_output("curve_value").parameters["output"].string_param == "logit"
    same = httpx.post(served[0].url + "/attribute", files={"file": ("a.png", data)}, headers=AUTH, timeout=60,
                      data={k: str(v) for k, v in EXPLAIN.items()}).json()
    np.testing.assert_allclose(result.as_numpy("curve_value")[0], same["curve"]["values"], rtol=1e-5, atol=1e-6)
    assert float(result.as_numpy("insertion")[0]) == pytest.approx(same["faithfulness"]["insertion"], abs=1e-6)


def test_errors_are_status_codes_with_the_services_message(client: grpcclient.InferenceServerClient) -> None:
    one = images(image_bytes())
    err = refused(client.infer, "resnet", [one], headers=AUTH)
    assert err.status() == "StatusCode.NOT_FOUND" and "unknown model 'resnet'" in err.message()
    err = refused(client.infer, "tiny", [one], model_version="2", headers=AUTH)
    assert err.status() == "StatusCode.NOT_FOUND" and "has one version, '1'" in err.message()
    err = refused(client.infer, "tiny", [one], headers=AUTH, parameters={"method": "idg", "steps": 1000})
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "steps must be <= 64, got 1000" in err.message()
    err = refused(client.infer, "tiny", [one], headers=AUTH, parameters={"target": True})  # a bool_param: not class 1
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "target: expected an integer, got true" in err.message()
    wrong = grpcclient.InferInput("input", [1, 3, 8, 8], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 3, 8, 8), np.float32))
    err = refused(client.infer, "tiny", [wrong], headers=AUTH)
    assert err.status() == "StatusCode.INVALID_ARGUMENT" and "must have the shape [1, 3, 32, 32]" in err.message()
    err = refused(client.infer, "tiny", [images(b"not an image")], headers=AUTH)
    assert err.status() == "StatusCode.INVALID_ARGUMENT", err.message()
    err = refused(client.infer, "tiny", [images(b"x" * 150_000)], headers=AUTH)  # over IDG_MAX_UPLOAD_BYTES: the service's refusal
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED" and "IDG_MAX_UPLOAD_BYTES" in err.message(), err.message()
    err = refused(client.infer, "", [one], headers=AUTH)  # no model: not the default one, as /attribute's
    assert err.status() == "StatusCode.NOT_FOUND" and "name a model: tiny" in err.message()
    err = refused(client.infer, "tiny", [one])
    assert err.status() == "StatusCode.UNAUTHENTICATED" and "API key" in err.message()
    err = refused(client.get_model_metadata, "tiny", headers={"x-api-key": "wrong"})
    assert err.status() == "StatusCode.UNAUTHENTICATED" and "wrong" in err.message()
    assert client.get_model_metadata("tiny", headers={"x-api-key": KEY}).name == "tiny"  # the HTTP door's header works too


@pytest.mark.parametrize(("size", "whose"), [(150_000, "the service's"), (250_000, "grpc's")], ids=["over the limit", "over grpc's cap"])
def test_a_message_over_the_upload_limit_is_refused_counted_and_logged_under_its_rpc(
        client: grpcclient.InferenceServerClient, served: tuple[Served, int], size: int, whose: str) -> None:
    """A message over IDG_MAX_UPLOAD_BYTES (100,000 bytes here) is RESOURCE_EXHAUSTED, and every such refusal is the
    service's to count: under ModelInfer, in ``idg_rejections_total{reason="message_too_large"}``, and in the access log
    with its request ID. Up to twice the limit the service reads it and answers with its own message; beyond, grpc refuses
    it unread (its own message), and the service still counts and logs it."""
    server = served[0]
    counted = 'idg_requests_total{door="grpc",route="ModelInfer",status="RESOURCE_EXHAUSTED"}'
    rejected = 'idg_rejections_total{reason="message_too_large"}'
    before = (server.metric(counted), server.metric(rejected))
    rid = f"too-large-{size}"
    err = refused(client.infer, "tiny", [images(b"x" * size)], headers={**AUTH, "x-request-id": rid})
    assert err.status() == "StatusCode.RESOURCE_EXHAUSTED", err.message()
    if whose == "the service's":
        assert "over the limit of 100000 bytes (IDG_MAX_UPLOAD_BYTES)" in err.message(), err.message()
    else:
        assert "larger than max" in err.message(), err.message()
    for _ in range(100):  # grpc's own refusal answers the client first; the service counts it a moment later
        if server.metric(counted) > before[0]:
            break
        time.sleep(0.02)
    assert (server.metric(counted), server.metric(rejected)) == (before[0] + 1, before[1] + 1)
    line = next((line for line in server.log().splitlines() if f"[{rid}]" in line and "gRPC ModelInfer" in line), None)
    assert line is not None and "RESOURCE_EXHAUSTED" in line, server.log()[-3000:]
    assert client.infer("tiny", [images(image_bytes())], headers=AUTH).as_numpy("probabilities").shape == (1, 1000)


def test_bytes_that_are_no_request_message_are_invalid_argument(served: tuple[Served, int]) -> None:
    grpc = pytest.importorskip("grpc")
    with grpc.insecure_channel(f"127.0.0.1:{served[1]}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        with pytest.raises(grpc.RpcError) as caught:
            infer(b"\xff\xff\xff", metadata=tuple(AUTH.items()), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert caught.value.details().startswith("the request is not a ModelInferRequest message")


def test_a_short_client_deadline_is_the_services_and_the_work_stops(client: grpcclient.InferenceServerClient,
                                                                     served: tuple[Served, int]) -> None:
    server = served[0]
    late = 'idg_rejections_total{reason="deadline"}'
    before = server.metric(late)
    began = time.monotonic()
    err = refused(client.infer, "tiny", [images(image_bytes())], headers=AUTH, client_timeout=0.5,
                  parameters={"method": "idg", "preset": "fast", "steps": 64, "probe_steps": 16})  # about 1 s of calls
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED", err.message()
    assert time.monotonic() - began < 1.0
    for _ in range(20):  # its work leaves the worker at once, not after its 1 s
        if server.metric("idg_queue_depth") == 0:
            break
        time.sleep(0.02)
    assert server.metric("idg_queue_depth") == 0 and time.monotonic() - began < 1.0
    # dropped by the service's own deadline (the call's, counted from arrival), not only as a call the client left: without
    # it the work would be counted as reason="client_disconnected" once grpc cancels the call
    for _ in range(100):  # counted as the waiter gives up, which may come a moment after the queue let the work go
        if server.metric(late) > before or server.metric('idg_rejections_total{reason="client_disconnected"}') > 0:
            break
        time.sleep(0.02)
    assert server.metric(late) == before + 1
    assert client.infer("tiny", [images(image_bytes())], headers=AUTH).as_numpy("probabilities").shape == (1, 1000)


def test_log_has_no_traceback(served: tuple[Served, int]) -> None:
    log = served[0].log()
    assert "Open Inference Protocol over gRPC on 127.0.0.1:" in log and "Traceback" not in log, log[-3000:]



@pytest.mark.parametrize(("grace_s", "answered"), [(10.0, True), (0.1, False)], ids=["within the grace", "past it"])
async def test_a_shutdown_drains_grpc_calls_in_flight(tiny_app: AppFactory, grace_s: float, answered: bool) -> None:
    # a call in flight is counted by the drain as an HTTP request is: answered when it ends within the grace, else
    # UNAVAILABLE with the shutdown's sentence; a call after the drain began is refused UNAVAILABLE at once
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2")
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    port = free_port()
    app = tiny_app(delay_s=0.1, grpc_port=port, warmup=False, batch_wait_ms=0.0, max_batch_images=4)
    request = pb.ModelInferRequest(model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[image_bytes()]))])
    for k, v in {"method": "idg", "steps": 16, "probe_steps": 4}.items():
        setattr(request.parameters[k], "string_param" if isinstance(v, str) else "int64_param", v)
    async with serve(app), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stub_of(channel)
        call = asyncio.ensure_future(stub.ModelInfer(request, timeout=30))
        for _ in range(200):
            if app.state.drain.active == 1:
                break
            await asyncio.sleep(0.01)
        assert app.state.drain.active == 1
        drained = asyncio.create_task(drain(app, grace_s))
        await asyncio.sleep(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await stub.ModelInfer(request, timeout=10)
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE and late.value.details() == SHUTTING_DOWN
        if answered:
            assert list((await call).outputs[0].shape) == [1, 1000]
        else:
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await call
            assert cut.value.code() == grpc.StatusCode.UNAVAILABLE and cut.value.details() == SHUTTING_DOWN
        await drained
        assert app.state.drain.active == 0


async def test_a_grpc_port_that_cannot_open_stops_the_start_with_its_reason(tiny_app: AppFactory,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:  # held without SO_REUSEPORT: no other socket may bind it
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = tiny_app(grpc_port=taken.getsockname()[1], warmup=False)
        with pytest.raises(ModelLoadError, match="cannot listen for gRPC on 127.0.0.1:"):
            async with serve(app):
                pass
    assert not app.state.ready and not app.state.service.worker._thread.is_alive()  # noqa: SLF001 - what had started is stopped
    monkeypatch.setitem(sys.modules, "app.api.oip_grpc", None)  # as where grpcio or tritonclient is not installed
    missing = r"IDG_GRPC_PORT=\d+ needs grpcio, protobuf and tritonclient: \.venv/bin/pip install -e '\.\[grpc\]' torch==2\.13\.0"
    with pytest.raises(ModelLoadError, match=missing):
        async with serve(tiny_app(grpc_port=free_port(), warmup=False)):
            pass
