"""Request IDs: ``X-Request-ID`` taken when safe (else made), echoed on every answer (success, refusal, error, probe),
named in the log lines written while the request runs (one line per answered request among them), and the Open
Inference Protocol answer's ``id`` when the request gives none. The standard metrics ride along: build and model info,
the process and Python collectors."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.doors.request_id import MAX_LENGTH, JsonFormatter, RequestIdFilter
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.reliability.server_app import serve_process
from tests.service.test_oip import INFER, image_input

MADE = re.compile(r"[0-9a-f]{32}")


def _files() -> dict[str, tuple[str, bytes, str]]:
    return {"file": ("a.png", image_bytes(), "image/png")}


async def test_a_safe_id_is_echoed_on_every_answer_and_an_unsafe_or_missing_one_is_replaced(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        given = {"X-Request-ID": "job-7:img.3_a=b+c/d"}
        answers = [await client.post("/predict", files=_files(), headers=given),
                   await client.post("/predict", files={"file": ("a.png", b"not an image", "image/png")}, headers=given),
                   await client.post("/attribute", files=_files(), data={"steps": "0"}, headers=given),
                   await client.get("/nowhere", headers=given),
                   await client.get("/health/ready", headers=given),
                   await client.get("/metrics", headers=given)]
        assert [r.status_code for r in answers] == [200, 415, 422, 404, 200, 200]
        assert {r.headers["x-request-id"] for r in answers} == {"job-7:img.3_a=b+c/d"}
        for unsafe in ("has space", "x" * (MAX_LENGTH + 1), "semi;colon", "tab\there", ""):
            r = await client.get("/health/live", headers={"X-Request-ID": unsafe})
            assert r.status_code == 200 and MADE.fullmatch(r.headers["x-request-id"]), (unsafe, r.headers)
        made = {(await client.get("/health/live")).headers["x-request-id"] for _ in range(3)}
        assert len(made) == 3 and all(MADE.fullmatch(m) for m in made)
        r = await client.get("/health/live", headers={"X-Request-ID": "y" * MAX_LENGTH})
        assert r.headers["x-request-id"] == "y" * MAX_LENGTH


async def test_the_log_lines_of_a_request_name_its_id(tiny_app: AppFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app()) as client:
            caplog.clear()
            r = await client.post("/predict", files=_files(), headers={"X-Request-ID": "abc-123"})
            assert r.status_code == 200
            await client.get("/health/ready", headers={"X-Request-ID": "probe-1"})
    lines = [(rec.name, rec.getMessage(), getattr(rec, "request_id", None)) for rec in caplog.records]
    mine = [line for line in lines if line[2] == "abc-123"]
    assert ("app.requests", mine[-1][1], "abc-123") == mine[-1] and mine[-1][1].startswith("POST /predict 200 in "), lines
    assert not [line for line in lines if line[2] == "probe-1"], lines  # probes are not logged one by one


async def test_json_log_lines_with_one_line_per_prediction_and_explanation(tiny_app: AppFactory,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    caplog.handler.setFormatter(JsonFormatter())
    with caplog.at_level(logging.INFO, logger="app"):
        async with serve(tiny_app(warmup=False, log_predictions=True)) as client:
            caplog.clear()
            top = (await client.post("/predict", files=_files(), headers={"X-Request-ID": "p-1"})).json()["top_k"][0]
            r = await client.post("/attribute", files=_files(), headers={"X-Request-ID": "a-1"},
                                  data={"steps": "8", "probe_steps": "4", "faithfulness": "insertion", "return_overlay": "false"})
            assert r.status_code == 200
    lines = [json.loads(line) for line in caplog.text.splitlines() if line.startswith("{")]
    by = {(line["logger"], line.get("request_id")): line for line in lines}
    prediction = by[("app.results", "p-1")]
    assert prediction["event"] == "prediction" and prediction["class"] == top["index"] and prediction["model"] == "tiny"
    assert abs(prediction["probability"] - top["probability"]) < 1e-3
    explanation = by[("app.results", "a-1")]
    assert explanation["event"] == "explanation" and explanation["target"] == r.json()["target"]["index"]
    assert 0.05 <= explanation["concentration"] <= 1 and 0 <= explanation["faithfulness_insertion"] <= 1
    request = by[("app.requests", "a-1")]
    assert request["status"] == 200 and request["path"] == "/attribute" and request["ms"] > 0


async def test_the_oip_answer_id_is_the_requests_own_or_its_request_id(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        own = await client.post(INFER, json={"id": "r1", "inputs": [image_input(image_bytes())]}, headers={"X-Request-ID": "h1"})
        none = await client.post(INFER, json={"inputs": [image_input(image_bytes())]}, headers={"X-Request-ID": "h2"})
        made = await client.post(INFER, json={"inputs": [image_input(image_bytes())]})
    assert own.json()["id"] == "r1" and own.headers["x-request-id"] == "h1"
    assert none.json()["id"] == "h2"
    assert made.json()["id"] == made.headers["x-request-id"] and MADE.fullmatch(made.json()["id"])


async def test_build_model_and_process_metrics_are_exported(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        text = (await client.get("/metrics")).text
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    build = samples["idg_build_info"]
    assert build.value == 1 and build.labels["version"] and build.labels["torch"] and build.labels["python"]
    model = samples["idg_model_info"]
    assert model.value == 1 and model.labels["model"] == "tiny" and model.labels["precision"] in ("fp32", "tf32", "bf16")
    assert re.fullmatch(r"[0-9a-f]{12}", model.labels["digest"]) and model.labels["source"]
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info", "python_gc_objects_collected_total"} \
        <= set(samples)
    # every known label at 0 from the start: a route's 5xx, a model's calls, each rejection reason
    assert 'idg_http_requests_total{route="/predict",status="500"} 0.0' in text
    assert 'idg_model_calls_total{model="tiny"}' in text and 'idg_rejections_total{reason="queue_full"} 0.0' in text



def test_the_server_writes_one_line_per_request_and_none_per_probe(tmp_path: Path) -> None:
    """The real launcher's log (``python -m app.server``): uvicorn's own access log had written a second line for every
    request and one for every probe and scrape, which the docs promise are left out."""
    with serve_process(tmp_path / "server.log") as served:
        before = len(served.log().splitlines())
        assert httpx.get(f"{served.url}/health/ready").status_code == 200
        assert httpx.get(f"{served.url}/metrics").status_code == 200
        assert httpx.post(f"{served.url}/predict", files=_files(), headers={"X-Request-ID": "one-line"}).status_code == 200
        time.sleep(0.3)  # the request's line is written as its answer ends
        lines = served.log().splitlines()[before:]
    requests = [line for line in lines if "/health" in line or "/metrics" in line or "/predict" in line]
    assert len(requests) == 1 and "app.requests [one-line]: POST /predict 200 in " in requests[0], lines
