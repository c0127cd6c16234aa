"""The Open Inference Protocol (KServe v2) routes in process: the same answers as /predict and
/attribute through the same queue, the tensor encodings, and every refusal in the protocol's error
form. tests/service/test_oip_client.py drives them with Triton's own client over a real socket."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from app.api import oip, oip_inference
from app.api.routes import v2
from idg_client import parse_attribution
from tests.service.conftest import AppFactory, image_bytes, serve

INFER = "/v2/models/tiny/infer"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def image_input(*images: bytes) -> dict[str, Any]:
    return {"name": "image", "shape": [len(images)], "datatype": "BYTES", "data": [b64(i) for i in images]}


def pixels(data: bytes) -> np.ndarray:
    """What the tiny model sees of an image file: ``(32, 32, 3)`` uint8 (36 -> 32 resize and crop, as the service does)."""
    from tests.models import tiny_classifier

    x = tiny_classifier().prepare(Image.open(io.BytesIO(data)).convert("RGB"))
    return np.rint(x.permute(1, 2, 0).numpy() * 255).astype(np.uint8)


def outputs(body: dict[str, Any]) -> dict[str, np.ndarray]:
    return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in body["outputs"]}


def npy(field: dict[str, Any]) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(field["data"])))


async def test_health_metadata_and_readiness(tiny_app: AppFactory) -> None:
    app = tiny_app()
    async with serve(app) as client:
        assert (await client.get("/v2/health/live")).json() == {"live": True}
        assert (await client.get("/v2/health/ready")).json() == {"ready": True}
        extensions = ["binary_tensor_data", "classification", "model_configuration", "statistics"]
        assert (await client.get("/v2")).json() == {"name": "idg-service", "version": app.version, "extensions": extensions}
        meta = (await client.get("/v2/models/tiny")).json()
        assert meta["name"] == "tiny" and meta["platform"] == "pytorch"
        assert {t["name"]: t["shape"] for t in meta["inputs"]} == {"image": [-1], "input": [-1, 3, 32, 32]}
        shapes = {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]}
        assert shapes["probabilities"] == ("FP32", [-1, 1000]) and shapes["attribution"] == ("FP32", [-1, 3, 32, 32])
        assert (await client.get("/v2/models/tiny/ready")).json() == {"name": "tiny", "ready": True}
        r = await client.get("/v2/models/other/ready")
        assert r.status_code == 404
        assert r.json() == {"error": "unknown model 'other'; loaded: tiny", "request_id": r.headers["x-request-id"]}


async def test_not_ready_answers_503_in_the_protocols_form(tiny_app: AppFactory) -> None:
    from httpx import ASGITransport, AsyncClient

    app = tiny_app()  # its lifespan never runs: models never load
    async with AsyncClient(transport=ASGITransport(app=app), base_url="http://test") as client:
        r = await client.get("/v2/health/ready")
        assert r.status_code == 503 and r.json() == {"ready": False}
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())]})
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert r.json() == {"error": "the service is starting: models are not loaded yet", "request_id": r.headers["x-request-id"]}
        assert (await client.get("/v2/health/live")).status_code == 200


async def test_an_image_file_and_its_pixels_in_either_layout_get_the_predict_answer(tiny_app: AppFactory) -> None:
    data = image_bytes(size=(60, 45))
    hwc = pixels(data)
    async with serve(tiny_app()) as client:
        predicted = (await client.post("/predict", files={"file": ("a.png", data)}, data={"top_k": "3"})).json()["top_k"]
        as_file = await client.post(INFER, json={"id": "r1", "inputs": [image_input(data)]})
        nchw = {"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": (hwc.transpose(2, 0, 1) / 255).tolist()}
        nhwc = {"name": "input", "shape": [1, 32, 32, 3], "datatype": "UINT8", "data": hwc.ravel().tolist()}
        answers = [as_file.json()] + [(await client.post(INFER, json={"inputs": [t]})).json() for t in (nchw, nhwc)]
    assert as_file.status_code == 200 and answers[0]["id"] == "r1" and answers[0]["model_name"] == "tiny"
    for body in answers:
        out = outputs(body)
        assert set(out) == {"probabilities", "predicted_class"}
        probs = out["probabilities"]
        assert probs.shape == (1, 1000) and abs(probs.sum() - 1) < 1e-4
        assert int(out["predicted_class"][0]) == predicted[0]["index"]
        for c in predicted:
            assert probs[0, c["index"]] == pytest.approx(c["probability"], rel=1e-5)


async def test_the_explanation_outputs_are_the_attribute_answer(tiny_app: AppFactory) -> None:
    data = image_bytes(color=(200, 60, 30))
    fields = {"method": "ig", "steps": 8, "target": 3, "faithfulness": "insertion,deletion"}
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", data)},
                              data={k: str(v) for k, v in fields.items()} | {"return_attribution": "true"})
        expected = r.json()
        v2 = await client.post(INFER, json={"inputs": [image_input(data, data)], "parameters": fields})
    assert v2.status_code == 200, v2.text
    out = outputs(v2.json())
    assert list(out) == ["probabilities", "predicted_class", "attribution", "target", "curve_alpha", "curve_value",
                         "insertion", "deletion"]
    attribution = npy(expected["attribution"]).astype(np.float32)  # /attribute's may be float16
    assert out["attribution"].shape == (2, 3, 32, 32)
    np.testing.assert_allclose(out["attribution"][0], attribution, rtol=2e-3, atol=1e-4 * np.abs(attribution).max())
    np.testing.assert_array_equal(out["attribution"][0], out["attribution"][1])
    assert out["target"].tolist() == [3, 3]
    assert out["curve_alpha"].shape == (2, 8)
    np.testing.assert_allclose(out["curve_alpha"][0], expected["curve"]["alphas"], rtol=1e-6)
    np.testing.assert_allclose(out["curve_value"][0], expected["curve"]["values"], rtol=1e-5, atol=1e-6)
    curve = next(o for o in v2.json()["outputs"] if o["name"] == "curve_value")
    assert curve["parameters"] == {"output": "logit", "input": "photo"}
    for metric in ("insertion", "deletion"):
        assert out[metric][0] == pytest.approx(expected["faithfulness"][metric], abs=1e-6)


async def test_the_regions_output_is_the_attribute_answers_region_labels(tiny_app: AppFactory) -> None:
    data = image_bytes(color=(30, 160, 90))
    fields = {"method": "ig", "steps": 4, "postprocess": "xrai"}
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", data)}, data={k: str(v) for k, v in fields.items()})
        v2 = await client.post(INFER, json={"inputs": [image_input(data)], "parameters": fields,
                                            "outputs": [{"name": "regions"}, {"name": "target"}]})
        plain = await client.post(INFER, json={"inputs": [image_input(data)], "parameters": {"steps": 4},
                                               "outputs": [{"name": "regions"}]})
        listed = await client.get("/v2/models/tiny")
    assert r.status_code == 200 and v2.status_code == 200, v2.text
    labels = parse_attribution(r.json()).regions
    assert labels is not None
    tensor = next(o for o in v2.json()["outputs"] if o["name"] == "regions")
    assert tensor["datatype"] == "INT32" and tensor["shape"] == [1, 32, 32]
    np.testing.assert_array_equal(outputs(v2.json())["regions"][0], labels.labels)  # the same ranks as /attribute's PNG
    assert plain.status_code == 422 and "output 'regions' needs the parameter postprocess=xrai or cam_regions" in plain.text
    assert {"name": "regions", "datatype": "INT32", "shape": [-1, 32, 32]} in listed.json()["outputs"]


async def test_asking_for_an_explanation_output_runs_the_default_explanation(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        asked = [{"name": "target"}, {"name": "curve_alpha"}]
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "outputs": asked})
        guided = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "outputs": [{"name": "curve_value"}],
                                                "parameters": {"method": "guided_ig", "steps": 4, "fraction": 0.5}})
        smooth = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "outputs": [{"name": "curve_value"}],
                                                "parameters": {"steps": 4, "probe_steps": 4, "smooth_samples": 2}})
    assert r.status_code == 200, r.text
    out = outputs(r.json())
    assert list(out) == ["target", "curve_alpha"] and out["curve_alpha"].shape[0] == 1
    assert guided.json()["outputs"][0]["parameters"] == {"output": "probability", "input": "photo"}
    assert smooth.json()["outputs"][0]["parameters"] == {"output": "logit", "input": "noisy_copy"}  # the first copy's path


async def test_the_images_of_one_request_share_model_calls(tiny_app: AppFactory) -> None:
    app = tiny_app(batch_wait_ms=100)
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net  # TinyNet: counts its calls
        net.calls.clear()
        images = [image_bytes(color=(10 * i, 50, 90)) for i in range(4)]
        r = await client.post(INFER, json={"inputs": [image_input(*images)], "outputs": [{"name": "predicted_class"}]})
    assert r.status_code == 200 and outputs(r.json())["predicted_class"].shape == (4,)
    assert sum(net.calls) == 4 and len(net.calls) < 4, net.calls  # one queue: predictions batched together


def binary_request(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {"Inference-Header-Content-Length": str(len(text))}


def split_binary(body: bytes, header_length: int) -> dict[str, np.ndarray | list[bytes]]:
    """Triton's binary answer: JSON header, then each binary output's bytes in order."""
    header, pos, out = json.loads(body[:header_length]), header_length, {}
    for o in header["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:  # this output's data is in the JSON
            continue
        raw, pos = body[pos:pos + size], pos + size
        if o["datatype"] == "BYTES":
            items, at = [], 0
            while at < len(raw):
                (n,) = struct.unpack_from("<I", raw, at)
                items.append(raw[at + 4:at + 4 + n])
                at += 4 + n
            out[o["name"]] = items
        else:
            out[o["name"]] = np.frombuffer(raw, {"FP32": "<f4", "INT64": "<i8"}[o["datatype"]]).reshape(o["shape"])
    assert pos == len(body)
    return out


async def test_binary_tensor_data_in_and_out(tiny_app: AppFactory) -> None:
    data = image_bytes()
    x = pixels(data).astype(np.float32) / 255  # NHWC
    header = {"inputs": [{"name": "input", "shape": [1, 32, 32, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}],
              "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}, {"name": "predicted_class"}]}
    body, headers = binary_request(header, x.tobytes())
    files = {"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 4 + len(data)}}
    body2, headers2 = binary_request({"inputs": [files], "outputs": [{"name": "probabilities", "parameters": {"classification": 2}}],
                                      "parameters": {"binary_data_output": True}}, struct.pack("<I", len(data)) + data)
    async with serve(tiny_app()) as client:
        r = await client.post(INFER, content=body, headers=headers)
        top = await client.post(INFER, content=body2, headers=headers2)
        plain = (await client.post(INFER, json={"inputs": [image_input(data)]})).json()
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream", r.text
    out = split_binary(r.content, int(r.headers["inference-header-content-length"]))
    expected = outputs(plain)
    np.testing.assert_allclose(out["probabilities"], expected["probabilities"], rtol=1e-5)
    assert json.loads(r.content[:int(r.headers["inference-header-content-length"])])["outputs"][1]["data"] == \
        expected["predicted_class"].tolist()  # not asked in binary: JSON data
    assert top.status_code == 200, top.text  # binary_data_output: every output in binary unless it says otherwise
    best = np.argsort(-expected["probabilities"][0])[:2]
    labels = [s.decode() for s in split_binary(top.content, int(top.headers["inference-header-content-length"]))["probabilities"]]
    assert [int(s.split(":")[1]) for s in labels] == best.tolist()
    assert float(labels[0].split(":")[0]) == pytest.approx(float(expected["probabilities"][0, best[0]]), rel=1e-5)


def _pixel_input(shape: list[int], values: Any, datatype: str = "FP32") -> dict[str, Any]:
    return {"inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": values}]}


REFUSALS: list[tuple[str, Any, int, str]] = [
    ("not JSON", b"{", 400, "the inference request is not valid"),
    ("no inputs", {"inputs": []}, 400, "inputs: List should have at least 1 item"),
    ("unknown input", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, 400, "send exactly one input"),
    ("wrong pixel shape", _pixel_input([1, 3, 16, 16], [0.5] * 768), 400, "must have the shape [1, 3, 32, 32] (NCHW)"),
    ("count mismatch", _pixel_input([1, 3, 32, 32], [0.5] * 10), 400, "needs 3072 elements, the data holds 10"),
    ("normalised pixels", _pixel_input([1, 3, 32, 32], [-1.5] * 3072), 400, "must hold pixels in [0, 1]"),
    ("uint8 overflow", _pixel_input([1, 32, 32, 3], [300] * 3072, "UINT8"), 400, "data holds an integer out of UINT8's range (0 to 255)"),
    ("uint8 negative", _pixel_input([1, 32, 32, 3], [-1] * 3072, "UINT8"), 400, "out of UINT8's range"),
    # a [0, 1] photo sent as UINT8: NumPy's cast had read it as 0s, a black image answered 200
    ("floats as uint8", _pixel_input([1, 32, 32, 3], [0.7] * 3072, "UINT8"), 400, "data holds float values, not UINT8 (integers: send"),
    ("strings as numbers", _pixel_input([1, 3, 32, 32], ["0.5"] * 3072), 400, "data holds str values, not FP32"),
    ("booleans as uint8", _pixel_input([1, 32, 32, 3], [True] * 3072, "UINT8"), 400, "data holds bool values, not UINT8"),
    ("beyond fp32", _pixel_input([1, 3, 32, 32], [1e39] * 3072), 400, "not a finite FP32"),
    ("FP16", _pixel_input([1, 3, 32, 32], [0.5] * 3072, "FP16"), 400, "datatype FP16 is not supported"),
    ("not base64", {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["%%%"]}]}, 400, "must be base64"),
    ("not an image", {"inputs": [image_input(b"hello")]}, 415, "not an image in a supported format"),
    # str(None) and str(1234) are valid base64: they had been decoded and refused as "not an image"
    ("null as an image", {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [None]}]}, 400,
     "BYTES elements in JSON must be base64 strings, got null"),
    ("number as an image", {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [1234]}]}, 400,
     "must be base64 strings, got 1234"),
    # checked as /attribute's JSON is: pydantic's lax mode had explained class 1 for target true, and taken "8" for 8
    ("boolean as target", {"inputs": [image_input(b"x")], "parameters": {"target": True}}, 422, "target: expected an integer, got true"),
    ("string as steps", {"inputs": [image_input(b"x")], "parameters": {"steps": "8"}}, 422, 'steps: expected an integer, got "8"'),
    ("too many images", {"inputs": [image_input(*[b"x"] * 5)]}, 413, "at most 4 images"),
    ("unknown output", {"inputs": [image_input(b"x")], "outputs": [{"name": "logits"}]}, 400, "unknown output 'logits'"),
    ("unknown parameter", {"inputs": [image_input(b"x")], "parameters": {"stepz": 3}}, 422, "parameter 'stepz' is not"),
    ("render-only parameter", {"inputs": [image_input(b"x")], "parameters": {"opacity": 0.3}}, 422, "parameter 'opacity' is not"),
    ("bad method", {"inputs": [image_input(b"x")], "parameters": {"method": "lime"}}, 422, "method: Input should be"),
    ("too many steps", {"inputs": [image_input(b"x")], "parameters": {"steps": 100}}, 422, "steps must be <= 12"),
    ("score not asked", {"inputs": [image_input(b"x")], "outputs": [{"name": "deletion"}]}, 422, "needs the parameter faithfulness"),
    ("explain false", {"inputs": [image_input(b"x")], "parameters": {"explain": False, "method": "ig"}}, 422, "explain is false"),
    # NumPy takes at most 64 dimensions: one element in 65 had been a 500 in the service's error form
    ("65 dimensions", _pixel_input([1] * 65, [0.5]), 400, "shape: List should have at most 8 items"),
    ("shape of strings", _pixel_input(["1"], [0.5]), 400, "shape.0: Input should be a valid integer"),
    ("shape of booleans", _pixel_input([True], [0.5]), 400, "shape.0: Input should be a valid integer"),
    # 1.0 is JSON Schema's integer 1, taken (tests/service/test_schema_agrees.py); a fraction is no dimension
    ("shape of fractions", _pixel_input([1.5], [0.5]), 400, "shape.0: Input should be a valid integer"),
    ("classification elsewhere", {"inputs": [image_input(b"x")], "outputs": [{"name": "target", "parameters": {"classification": 2}}]},
     400, "classification parameter"),
]


@pytest.mark.parametrize(("body", "status", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
async def test_refusals_come_in_the_protocols_error_form(tiny_app: AppFactory, body: Any, status: int, message: str) -> None:
    async with serve(tiny_app(max_batch_files=4, max_steps=12)) as client:
        r = await client.post(INFER, content=body) if isinstance(body, bytes) else await client.post(INFER, json=body)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error", "request_id"] and message in r.json()["error"], r.json()


BINARY_REFUSALS = [
    ("header longer than body", b"{}", "999", "is not a length within the body"),
    ("size beyond the bytes", {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 50}}]},
     None, "beyond the 4 binary bytes left"),
    ("bytes nobody claims", {"inputs": [image_input(b"x")]}, None, "4 binary bytes that no input"),
    ("BYTES length beyond", {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 4}}]},
     None, "declares 9 bytes, only 0 remain"),
]


@pytest.mark.parametrize(("header", "length", "message"), [r[1:] for r in BINARY_REFUSALS], ids=[r[0] for r in BINARY_REFUSALS])
async def test_broken_binary_bodies_are_refused(tiny_app: AppFactory, header: Any, length: str | None, message: str) -> None:
    body, headers = (header, {"Inference-Header-Content-Length": length}) if isinstance(header, bytes) else \
        binary_request(header, struct.pack("<I", 9))
    async with serve(tiny_app()) as client:
        r = await client.post(INFER, content=body, headers=headers)
    assert r.status_code == 400 and message in r.json()["error"], r.text


@pytest.mark.parametrize("length", [b"\xb2", "\u0663".encode(), b"-1", b"1e3", b" "], ids=["superscript two", "arabic three",
                                                                                           "negative", "exponent", "blank"])
async def test_a_header_length_that_is_not_ascii_digits_is_a_400(tiny_app: AppFactory, length: bytes) -> None:
    # "²".isdigit() is true and int("²") raises: it had been a 500 in the service's error form
    async with serve(tiny_app()) as client:
        r = await client.post(INFER, content=b'{"inputs": []}', headers={"Inference-Header-Content-Length": length})
    assert r.status_code == 400 and list(r.json()) == ["error", "request_id"], r.text
    assert "Inference-Header-Content-Length" in r.json()["error"]


async def test_the_content_type_is_json_binary_or_none(tiny_app: AppFactory) -> None:
    body = json.dumps({"inputs": [image_input(image_bytes())]}).encode()
    async with serve(tiny_app()) as client:
        for refused in ("text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "image/png"):
            r = await client.post(INFER, content=body, headers={"Content-Type": refused})
            assert r.status_code == 415 and list(r.json()) == ["error", "request_id"], (refused, r.text)
            assert refused.split(";")[0] in r.json()["error"] and "application/json" in r.json()["error"]
        for taken in ("application/json", "application/json; charset=utf-8", "Application/JSON", "application/octet-stream", None):
            r = await client.post(INFER, content=body, headers={} if taken is None else {"Content-Type": taken})
            assert r.status_code == 200, (taken, r.text)


def _on_the_loop(monkeypatch: pytest.MonkeyPatch, name: str) -> list[bool]:
    """Wraps ``v2.<name>``: each call appends whether it ran on the event loop (True) or in a thread (False)."""
    calls: list[bool] = []
    real = getattr(v2, name)

    def spy(*args: Any) -> Any:
        try:
            asyncio.get_running_loop()
            calls.append(True)
        except RuntimeError:
            calls.append(False)
        return real(*args)

    monkeypatch.setattr(v2, name, spy)
    return calls


async def test_a_large_answer_is_written_in_pieces_with_its_length(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # 105 MB of JSON for 32 explained images had held the event loop 2-6 s (/health/live waited), in a thread too (the C
    # encoder keeps the GIL): a large answer is written JSON_SLICE numbers at a time, the loop free between the pieces
    # (tests/service/reliability/test_large_answers.py measures /health/live meanwhile); a small one (a classification) at once
    at_once = _on_the_loop(monkeypatch, "write_infer_response")
    monkeypatch.setattr(oip_inference, "INLINE_ELEMENTS", 5000)  # the tiny model's attribution: 3 x 32 x 32 per image
    monkeypatch.setattr(oip, "JSON_SLICE", 1000)
    pieces: list[int] = []
    joined = v2._joined

    async def counted(made: Any) -> list[bytes]:
        def each() -> Any:
            for piece in made:
                pieces.append(len(piece))
                yield piece
        return await joined(each())

    monkeypatch.setattr(v2, "_joined", counted)
    two = [image_input(image_bytes(), image_bytes((9, 9, 9)))]
    async with serve(tiny_app()) as client:
        r = await client.post(INFER, json={"inputs": two})
        assert r.status_code == 200 and at_once == [True] and pieces == [], r.text
        explain = {"explain": True, "steps": 4, "probe_steps": 4}
        r = await client.post(INFER, json={"inputs": two, "parameters": explain})
        assert r.status_code == 200 and at_once == [True], r.text
        assert len(pieces) >= 2 * 3 * 32 * 32 // 1000 + 1 and max(pieces) < 1000 * 25  # 1000 numbers a piece at most
        assert int(r.headers["content-length"]) == len(r.content) and r.headers["content-type"] == "application/json"
        assert outputs(r.json())["attribution"].shape == (2, 3, 32, 32)
        r = await client.post(INFER, json={"inputs": two, "parameters": explain,
                                           "outputs": [{"name": "attribution", "parameters": {"binary_data": True}}, {"name": "target"}]})
        assert r.status_code == 200 and at_once == [True], r.text
        assert int(r.headers["content-length"]) == len(r.content) and r.headers["content-type"] == "application/octet-stream"
        binary = split_binary(r.content, int(r.headers["inference-header-content-length"]))
        assert np.asarray(binary["attribution"]).shape == (2, 3, 32, 32)


async def test_a_large_request_is_read_off_the_event_loop(tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # 10 MB of JSON numbers had held the event loop 1-4 s (/v2/health/live waited): a large body is read in an image
    # thread, a small one (an image of a few kB) on the loop
    read_on = _on_the_loop(monkeypatch, "read_infer_request")
    noise = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 300, 3), dtype=np.uint8)).save(noise, format="PNG")
    assert len(noise.getvalue()) > v2.LARGE_REQUEST_BYTES
    async with serve(tiny_app()) as client:
        assert (await client.post(INFER, json={"inputs": [image_input(image_bytes())]})).status_code == 200
        r = await client.post(INFER, json={"inputs": [image_input(noise.getvalue())]})
        assert r.status_code == 200 and read_on == [True, False], r.text


@pytest.mark.parametrize(("shape", "datatype", "status", "says"), [
    ([2_450_000], "FP32", 413, "at most 4 images (IDG_MAX_BATCH_FILES), this one 2450000"),
    ([5], "BYTES", 413, "at most 4 images (IDG_MAX_BATCH_FILES), this one 5"),
    ([1, 9_999_999], "UINT8", 400, "its shape [1, 9999999] holds 9999999 elements, more than 1 image(s) of 3072"),
    ([4, 3, 32, 33], "FP32", 400, "holds 12672 elements, more than 4 image(s) of 3072"),
], ids=["a batch of millions", "five files", "one image of millions of numbers", "four images a column too wide"])
async def test_a_request_too_large_is_refused_from_its_shapes_before_its_data_is_read(
    tiny_app: AppFactory, monkeypatch: pytest.MonkeyPatch, shape: list[int], datatype: str, status: int, says: str,
) -> None:
    # the limit had been checked after every element was decoded: 2.4 million elements took 4 s and 110 MB to refuse
    decoded: list[str] = []
    real = oip.decode_tensor
    monkeypatch.setattr(oip, "decode_tensor", lambda spec, raw: decoded.append(spec.name) or real(spec, raw))
    data = [b64(b"x")] * 5 if datatype == "BYTES" else [0] * 1000
    async with serve(tiny_app(max_batch_files=4)) as client:
        r = await client.post(INFER, json={"inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": data}]})
    assert r.status_code == status and says in r.json()["error"], r.text
    assert decoded == []


async def test_unknown_model_version_and_route_and_compression(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/v2/models/big/infer", json={"inputs": [image_input(b"x")]})
        assert r.status_code == 404 and r.json() == {"error": "unknown model 'big'; loaded: tiny", "request_id": r.headers["x-request-id"]}
        for path in ("/v2/models/tiny/versions/3", "/v2/models/tiny/versions/3/ready", "/v2/models/tiny/versions/01/config"):
            r = await client.get(path)
            assert r.status_code == 404 and "has one version, '1'" in r.json()["error"], path
        r = await client.post("/v2/models/tiny/versions/3/infer", json={"inputs": [image_input(image_bytes())]})
        assert r.status_code == 404 and list(r.json()) == ["error", "request_id"]
        r = await client.get("/v2/models/tiny/versions/1/nothing")
        assert r.status_code == 404 and "not a route" in r.json()["error"]
        r = await client.get("/v2/repository/index")
        assert r.status_code == 405 and r.headers["allow"] == "POST" and list(r.json()) == ["error", "request_id"]
        r = await client.post("/v2/repository/models/tiny/load")
        assert r.status_code == 404 and list(r.json()) == ["error", "request_id"]
        for method in ("PATCH", "OPTIONS", "TRACE"):  # every method in the protocol's form, not the REST contract's
            r = await client.request(method, INFER)
            assert r.status_code == 405 and r.headers["allow"] == "POST" and list(r.json()) == ["error", "request_id"], (method, r.text)
            r = await client.request(method, "/v2/nothing")
            assert r.status_code == 404 and list(r.json()) == ["error", "request_id"], (method, r.text)
        r = await client.post(INFER, content=b"\x1f\x8b", headers={"Content-Encoding": "gzip"})
        assert r.status_code == 415 and "Content-Encoding" in r.json()["error"]


async def test_version_one_is_the_model_and_triton_reads_its_config_and_the_index(tiny_app: AppFactory) -> None:
    body = {"inputs": [image_input(image_bytes())]}
    async with serve(tiny_app(max_batch_files=4)) as client:
        for path in ("", "/ready", "/config"):
            r1, r = await client.get(f"/v2/models/tiny/versions/1{path}"), await client.get(f"/v2/models/tiny{path}")
            assert r1.status_code == r.status_code == 200 and r1.json() == r.json(), path
        assert (await client.get("/v2/models/tiny")).json()["versions"] == ["1"]
        versioned, plain = await client.post("/v2/models/tiny/versions/1/infer", json=body), await client.post(INFER, json=body)
        assert versioned.status_code == 200 and outputs(versioned.json()).keys() == outputs(plain.json()).keys()
        np.testing.assert_array_equal(outputs(versioned.json())["probabilities"], outputs(plain.json())["probabilities"])
        config = (await client.get("/v2/models/tiny/config")).json()
        assert config["max_batch_size"] == 4 and config["platform"] == "pytorch"
        assert config["input"][0] == {"name": "image", "data_type": "TYPE_STRING", "dims": [1], "format": "FORMAT_NONE",
                                      "reshape": {"shape": []}}
        assert {t["name"]: t["dims"] for t in config["output"]}["curve_alpha"] == [-1]
        r = await client.post("/v2/repository/index", json={"ready": True})
        assert r.status_code == 200 and r.json() == [{"name": "tiny", "version": "1", "state": "READY"}]
        assert "model_configuration" in (await client.get("/v2")).json()["extensions"]


async def test_the_api_key_guards_everything_but_the_health_probes(tiny_app: AppFactory) -> None:
    body = {"inputs": [image_input(image_bytes())]}
    async with serve(tiny_app(api_key="s3cret")) as client:
        for path in ("/v2", "/v2/models/tiny", "/v2/models/tiny/ready"):
            r = await client.get(path)
            assert r.status_code == 401 and "API key" in r.json()["error"], path
        r = await client.post(INFER, json=body)
        assert r.status_code == 401 and list(r.json()) == ["error", "request_id"]
        r = await client.post(INFER, json=body, headers={"x-api-key": "wrong"})
        assert r.json() == {"error": "the API key is wrong", "request_id": r.headers["x-request-id"]}
        assert (await client.post(INFER, json=body, headers={"authorization": "Bearer s3cret"})).status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get("/v2/health/live")).status_code == 200


async def test_past_the_deadline_504_and_the_work_is_dropped(tiny_app: AppFactory) -> None:
    app = tiny_app(delay_s=0.05, request_timeout_s=0.5)
    async with serve(app) as client:
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "parameters": {"method": "guided_ig", "steps": 60}})
        assert r.status_code == 504
        assert r.json() == {"error": "the request did not finish within its deadline of 0.5 s", "request_id": r.headers["x-request-id"]}
        metrics = (await client.get("/metrics")).text
    assert 'idg_http_requests_total{route="/v2/models/{name}/infer",status="504"} 1.0' in metrics


def test_pixels_helper_matches_the_service_preprocessing() -> None:
    from tests.models import tiny_classifier

    data = image_bytes(size=(60, 45))
    x = tiny_classifier().prepare(Image.open(io.BytesIO(data)).convert("RGB"))
    assert torch.equal(torch.from_numpy(pixels(data)).permute(2, 0, 1).float() / 255, x)


async def test_the_services_top_k_bound_is_no_bound_on_the_protocol(tiny_app: AppFactory) -> None:
    # an answer of the protocol has every probability: IDG_MAX_TOP_K (a bound on /predict's top_k) must not refuse it
    async with serve(tiny_app(max_top_k=1)) as client:
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())]})
        assert r.status_code == 200 and outputs(r.json())["probabilities"].shape == (1, 1000), r.text
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "parameters": {"steps": 4, "probe_steps": 4}})
        assert r.status_code == 200 and outputs(r.json())["attribution"].shape == (1, 3, 32, 32), r.text


async def test_inference_statistics_count_each_models_submissions(tiny_app: AppFactory) -> None:
    app = tiny_app(warmup=False, request_timeout_s=0.5, delay_s=0.05)
    async with serve(app) as client:
        (before,) = (await client.get("/v2/models/tiny/stats")).json()["model_stats"]
        assert before["inference_count"] == 0 and before["inference_stats"]["success"] == {"count": 0, "ns": 0}
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes(), image_bytes((9, 9, 9)))]})
        assert r.status_code == 200
        r = await client.post(INFER, json={"inputs": [image_input(image_bytes())], "parameters": {"method": "guided_ig", "steps": 60}})
        assert r.status_code == 504
        (after,) = (await client.get("/v2/models/stats")).json()["model_stats"]
        assert (await client.get("/v2/models/tiny/versions/1/stats")).json()["model_stats"] == [after]
        assert (await client.get("/v2/models/big/stats")).status_code == 404
    assert after["name"] == "tiny" and after["version"] == "1" and after["inference_count"] == 2  # the images answered
    assert 1 <= after["execution_count"] <= app.state.metrics.executions["tiny"]  # the model calls (batches) run by then
    stats = after["inference_stats"]
    assert stats["success"]["count"] == stats["queue"]["count"] == stats["compute_infer"]["count"] == 2
    assert stats["success"]["ns"] >= stats["compute_infer"]["ns"] >= 2 * 50_000_000  # one 0.05 s model call each at least
    assert stats["fail"]["count"] == 1 and stats["fail"]["ns"] >= 500_000_000  # the late one, at its deadline
    assert after["last_inference"] > 1_700_000_000_000
