"""Every refusal is counted where it happened (issue #74): under the route or RPC it refused and in
``idg_rejections_total`` with its reason. An API key past its share of the queue (``IDG_KEY_SHARE``) is refused before
HTTP's routing, and its 503s had been counted under ``route="unmatched"`` and in no rejection reason, so an alert on
``/attribute``'s refusals missed a flood; over gRPC the same refusal is RESOURCE_EXHAUSTED under ``ModelInfer``. The
service runs for real (the tiny model, a model call held 0.2 s so one key's two calls overlap); only the counts are read."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.test_oip_grpc import free_port

ALICE, BOB = "alice-secret-1", "bob-secret-2"
ATTRIBUTE = {"method": "ig", "steps": "4", "return_overlay": "false"}


def counts(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_a_keys_share_refused_over_http_is_counted_under_its_route_and_as_a_rejection(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.2, warmup=False, api_keys=f"alice:{ALICE},bob:{BOB}", max_queue=2)  # a share of 1 per key
    async with serve(app) as client:
        before = counts((await client.get("/metrics")).text)
        assert value(before, "idg_rejections_total", reason="key_share") == 0  # created at 0 from the start

        async def explain() -> tuple[int, str]:
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=ATTRIBUTE, headers={"X-API-Key": ALICE})
            return r.status_code, r.json().get("error", {}).get("code", "")

        answers = await asyncio.gather(*[explain() for _ in range(4)])
        refused = sum(a == (503, "key_share") for a in answers)
        assert refused >= 1 and all(a in ((200, ""), (503, "key_share")) for a in answers), answers
        after = counts((await client.get("/metrics")).text)
    assert value(after, "idg_rejections_total", reason="key_share") == refused
    assert value(after, "idg_requests_total", door="http", route="/attribute", status="503") == refused
    assert value(after, "idg_http_requests_total", route="/attribute", status="503") == refused
    assert value(after, "idg_http_requests_total", route="/attribute", status="200") == len(answers) - refused
    assert value(after, "idg_requests_total", door="http", route="unmatched", status="503") == 0


async def test_a_keys_share_refused_over_grpc_is_counted_under_model_infer_and_as_a_rejection(tiny_app: AppFactory) -> None:
    grpc = pytest.importorskip("grpc")
    pb = pytest.importorskip("tritonclient.grpc.service_pb2", reason="grpcio or tritonclient is not installed")
    port = free_port()
    app = tiny_app(delay_s=0.2, warmup=False, grpc_port=port, api_keys=f"alice:{ALICE},bob:{BOB}", max_queue=2)
    request = pb.ModelInferRequest(model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="image", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[image_bytes()]))])
    request.parameters["method"].string_param = "ig"
    request.parameters["steps"].int64_param = 4
    stub_of = pytest.importorskip("tritonclient.grpc.service_pb2_grpc").GRPCInferenceServiceStub
    async with serve(app) as client, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stub_of(channel)

        async def infer() -> str:
            try:
                await stub.ModelInfer(request, metadata=(("x-api-key", ALICE),), timeout=30)
            except grpc.aio.AioRpcError as err:
                return f"{err.code().name}: {err.details()}"
            return "OK"

        answers = await asyncio.gather(*[infer() for _ in range(4)])
        refused = sum(a.startswith("RESOURCE_EXHAUSTED") for a in answers)
        assert refused >= 1 and answers.count("OK") + refused == len(answers), answers
        after = counts((await client.get("/metrics")).text)
    assert value(after, "idg_rejections_total", reason="key_share") == refused
    assert value(after, "idg_requests_total", door="grpc", route="ModelInfer", status="RESOURCE_EXHAUSTED") == refused
