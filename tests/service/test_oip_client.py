"""Triton's own HTTP client (``tritonclient.http``, from PyPI) against a real server process
(``python -m app.server`` serving the tiny model on loopback, an API key set): the Open Inference
Protocol as existing clients speak it, binary tensor data and the classification extension included."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.service.conftest import image_bytes
from tests.service.reliability.server_app import Served, serve_process
from tests.service.test_oip import pixels

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed (pip install -e '.[dev]')")
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "oip-key"


def auth() -> dict[str, str]:
    """The key's header, a new dict each call: tritonclient adds its own headers to the dict it is given."""
    return {"X-API-Key": KEY}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_process(tmp_path_factory.mktemp("oip") / "server.log", IDG_API_KEY=KEY, IDG_MAX_STEPS=64) as s:
        yield s


@pytest.fixture
def client(served: Served) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(url=f"127.0.0.1:{served.port}", network_timeout=60) as c:
        yield c


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny", headers=auth()) and not client.is_model_ready("nope", headers=auth())
    extensions = ["binary_tensor_data", "classification", "model_configuration", "statistics"]
    assert client.get_server_metadata(headers=auth())["extensions"] == extensions
    meta = client.get_model_metadata("tiny", headers=auth())
    assert [t["name"] for t in meta["inputs"]] == ["image", "input"] and meta["outputs"][0]["shape"] == [-1, 1000]


def test_image_files_as_bytes_get_the_predict_answer(client: httpclient.InferenceServerClient, served: Served) -> None:
    files = [image_bytes(color=(20, 90, 200)), image_bytes(color=(200, 90, 20), size=(70, 50))]
    expected = [httpx.post(served.url + "/predict", files={"file": ("a.png", f)}, data={"top_k": "2"}, headers=auth(), timeout=60).json()
                for f in files]
    images = httpclient.InferInput("image", [2], "BYTES")
    images.set_data_from_numpy(np.array(files, dtype=np.object_))  # binary by default: length-prefixed bytes after the JSON
    asked = [httpclient.InferRequestedOutput("probabilities"), httpclient.InferRequestedOutput("predicted_class", binary_data=False)]
    result = client.infer("tiny", [images], outputs=asked, request_id="batch-1", headers=auth())
    probs, best = result.as_numpy("probabilities"), result.as_numpy("predicted_class")
    assert probs.shape == (2, 1000) and probs.dtype == np.float32 and result.get_response()["id"] == "batch-1"
    for i, answer in enumerate(expected):
        assert int(best[i]) == answer["top_k"][0]["index"]
        for c in answer["top_k"]:
            assert probs[i, c["index"]] == pytest.approx(c["probability"], rel=1e-5)
    top = client.infer("tiny", [images], outputs=[httpclient.InferRequestedOutput("probabilities", class_count=2)], headers=auth())
    labels = top.as_numpy("probabilities")  # Triton's classification extension: "probability:index:label"
    assert labels.shape == (2, 2)
    assert [int(s.decode().split(":")[1]) for s in labels[1]] == [c["index"] for c in expected[1]["top_k"]]
    assert labels[1][0].decode().split(":", 2)[2] == expected[1]["top_k"][0]["name"]


def test_pixels_and_an_explanation(client: httpclient.InferenceServerClient, served: Served) -> None:
    data = image_bytes(color=(120, 30, 160))
    x = (pixels(data).astype(np.float32) / 255)[None]  # (1, 32, 32, 3): NHWC
    tensor = httpclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    asked = [httpclient.InferRequestedOutput(n) for n in ("attribution", "target", "curve_alpha", "curve_value", "insertion")]
    # preset=fast: IDG's own map (the default's Grad-CAM product is zero where Grad-CAM's map is, as it is for this target
    # of the tiny model), through a door that carries the preset as any other parameter
    result = client.infer("tiny", [tensor], outputs=asked, headers=auth(), parameters={
        "method": "idg", "preset": "fast", "steps": 8, "probe_steps": 6, "target": 5, "faithfulness": "insertion"})
    attribution = result.as_numpy("attribution")
    assert attribution.shape == (1, 3, 32, 32) and np.isfinite(attribution).all() and np.abs(attribution).max() > 0
    assert result.as_numpy("target").tolist() == [5]
    alphas, values = result.as_numpy("curve_alpha"), result.as_numpy("curve_value")
    assert alphas.shape == values.shape == (1, 8) and np.all(np.diff(alphas[0]) > 0) and alphas[0, 0] >= 0 and alphas[0, -1] <= 1
    assert 0 <= float(result.as_numpy("insertion")[0]) <= 1
    same = httpx.post(served.url + "/attribute", files={"file": ("a.png", data)}, headers=auth(), timeout=60,
                      data={"method": "idg", "preset": "fast", "steps": "8", "probe_steps": "6", "target": "5",
                            "faithfulness": "insertion"}).json()
    np.testing.assert_allclose(values[0], same["curve"]["values"], rtol=1e-5, atol=1e-6)
    assert float(result.as_numpy("insertion")[0]) == pytest.approx(same["faithfulness"]["insertion"], abs=1e-6)
    # XRAI's regions as an INT32 tensor, in binary as tritonclient asks by default
    regions = client.infer("tiny", [tensor], outputs=[httpclient.InferRequestedOutput("regions")], headers=auth(),
                           parameters={"method": "ig", "steps": 4, "postprocess": "xrai"}).as_numpy("regions")
    assert regions.dtype == np.int32 and regions.shape == (1, 32, 32) and regions.min() == 1
    assert set(np.unique(regions).tolist()) == set(range(1, int(regions.max()) + 1))  # every rank from 1 on


def test_model_version_one_the_config_the_repository_index_and_statistics(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("tiny", model_version="1", headers=auth())
    assert not client.is_model_ready("tiny", model_version="2", headers=auth())
    assert client.get_model_metadata("tiny", model_version="1", headers=auth())["versions"] == ["1"]
    config = client.get_model_config("tiny", model_version="1", headers=auth())
    assert config == client.get_model_config("tiny", headers=auth())
    assert config["name"] == "tiny" and config["max_batch_size"] == 32
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("image", "TYPE_STRING", [1]),
                                                                                 ("input", "TYPE_FP32", [3, 32, 32])]
    assert config["output"][0] == {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [1000]}
    assert client.get_model_repository_index(headers=auth()) == [{"name": "tiny", "version": "1", "state": "READY"}]
    images = httpclient.InferInput("image", [1], "BYTES")
    images.set_data_from_numpy(np.array([image_bytes()], dtype=np.object_))
    versioned = client.infer("tiny", [images], model_version="1", headers=auth()).as_numpy("probabilities")
    np.testing.assert_array_equal(versioned, client.infer("tiny", [images], headers=auth()).as_numpy("probabilities"))
    with pytest.raises(InferenceServerException) as other:
        client.infer("tiny", [images], model_version="2", headers=auth())
    assert other.value.status() == "404" and "has one version, '1'" in other.value.message()
    (stats,) = client.get_inference_statistics("tiny", model_version="1", headers=auth())["model_stats"]
    assert stats["name"] == "tiny" and stats["inference_stats"]["success"]["count"] >= 2  # the two answers above
    assert client.get_inference_statistics(headers=auth())["model_stats"][0]["name"] == "tiny"


def test_errors_reach_the_client_with_the_services_message(client: httpclient.InferenceServerClient) -> None:
    images = httpclient.InferInput("image", [1], "BYTES")
    images.set_data_from_numpy(np.array([image_bytes()], dtype=np.object_))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("tiny", [images], headers=auth(), parameters={"method": "idg", "steps": 1000})
    assert refused.value.status() == "422" and refused.value.message() == "steps must be <= 64, got 1000"
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("resnet", headers=auth())
    assert unknown.value.status() == "404" and "unknown model 'resnet'" in unknown.value.message()
    with pytest.raises(InferenceServerException) as keyless:
        client.infer("tiny", [images])
    assert keyless.value.status() == "401" and "API key" in keyless.value.message()


def test_the_metrics_count_the_v2_routes(client: httpclient.InferenceServerClient, served: Served) -> None:
    images = httpclient.InferInput("image", [1], "BYTES")
    images.set_data_from_numpy(np.array([image_bytes()], dtype=np.object_))
    before = served.metric('idg_http_requests_total{route="/v2/models/{name}/infer",status="200"}')
    client.infer("tiny", [images], headers=auth())
    assert served.metric('idg_http_requests_total{route="/v2/models/{name}/infer",status="200"}') == before + 1


def test_log_has_no_traceback(served: Served) -> None:
    assert "Traceback" not in served.log(), served.log()[-3000:]
