"""The Python client and its CLI against the real app served by uvicorn on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from idg_client import AsyncClient, Attribution, Client, ServiceError
from idg_client.cli import main as cli
from tests.service.conftest import AppFactory, image_bytes, live_server


@pytest.fixture
def url(tiny_app: AppFactory) -> Iterator[str]:
    yield from live_server(tiny_app())


@pytest.fixture
def busy_url(tiny_app: AppFactory) -> Iterator[str]:
    yield from live_server(tiny_app(delay_s=0.05, max_queue=1, batch_wait_ms=0.0))


def test_sync_client_predict_and_attribute(url: str, tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(image_bytes())
    with Client(url) as c:
        pred = c.predict(path, top_k=3)
        assert pred.model == "tiny" and len(pred.top_k) == 3 and pred.top_k[0].probability >= pred.top_k[1].probability
        a = c.attribute(path, method="idg", steps=6, probe_steps=5, return_attribution=True, target=pred.top_k[0].index)
        assert isinstance(a.heatmap, Image.Image) and a.heatmap.size == (32, 32)
        assert a.curve.alphas.shape == (6,) and a.curve.probe_values.shape == (5,)
        assert a.curve.output == "logit" and a.curve.input == "photo"
        assert a.attribution.shape == (3, 32, 32)
        assert a.target.index == pred.top_k[0].index and a.parameters["steps"] == 6
        with pytest.raises(ServiceError) as err:
            c.attribute(b"not an image")
        assert err.value.status == 415 and "not an image" in err.value.message


def test_attribute_many_keeps_going_past_a_bad_image(url: str) -> None:
    images = [image_bytes(), b"junk", Image.new("RGB", (40, 40), (9, 90, 200))]
    with Client(url) as c:
        out = c.attribute_many(images, concurrency=3, steps=4, probe_steps=4)
    assert isinstance(out[0], Attribution) and isinstance(out[2], Attribution)
    assert isinstance(out[1], ServiceError) and out[1].status == 415


async def test_async_client_retries_503_honouring_retry_after(busy_url: str) -> None:
    async with AsyncClient(busy_url, retries=20, max_wait=0.2) as c:
        out = await c.attribute_many([image_bytes((i * 40, 10, 10)) for i in range(4)], concurrency=4, steps=10, probe_steps=10)
    assert all(isinstance(o, Attribution) for o in out), out  # every 503 (queue of 1) was retried
    async with AsyncClient(busy_url, retries=0) as c:
        results = await c.attribute_many([image_bytes() for _ in range(4)], concurrency=4, steps=10, probe_steps=10)
    assert any(isinstance(r, ServiceError) and r.status == 503 for r in results)


def test_cli_writes_the_heatmap_and_prints_the_curve(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    img = tmp_path / "x.png"
    img.write_bytes(image_bytes())
    out = tmp_path / "heat.png"
    assert cli(["--url", url, "attribute", str(img), "--method", "idg", "--steps", "5", "--probe-steps", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines()[2:] if line.strip()]
    assert "heatmap ->" in text and len(rows) == 5 and np.isfinite([float(r.split("\t")[0]) for r in rows]).all()
    assert Image.open(out).size == (32, 32)
    assert cli(["--url", url, "predict", str(img), "--top-k", "2"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    assert cli(["--url", url, "attribute", str(bad)]) == 1
    assert "error 415" in capsys.readouterr().err


def test_cli_says_in_one_line_that_the_service_is_unreachable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    img = tmp_path / "a.png"
    img.write_bytes(b"\x89PNG")
    assert cli(["--url", f"http://127.0.0.1:{port}", "predict", str(img)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"could not reach the service at http://127.0.0.1:{port}" in err and "IDG_URL" in err
    assert "Traceback" not in err


def test_a_proxys_plain_500_is_retried_but_the_services_json_500_is_not() -> None:
    """Ray Serve answers plain 'Internal Server Error' for a request in flight on a replica that died
    (tests/service/test_ray_serve.py); the same request is safe to resend. The service's own JSON 500
    is this request's failure: not retried."""
    import httpx

    ok = {"model": "m", "top_k": [{"index": 1, "name": "b", "probability": 0.9}], "timings": {}}
    for first, calls_expected, outcome in (
        (httpx.Response(500, text="Internal Server Error"), 2, "ok"),
        (httpx.Response(500, json={"error": {"status": 500, "code": "internal", "message": "internal error: X"}}), 1, "error"),
    ):
        calls: list[int] = []

        def handler(request: httpx.Request, first: httpx.Response = first, calls: list[int] = calls) -> httpx.Response:
            calls.append(1)
            return first if len(calls) == 1 else httpx.Response(200, json=ok)

        with Client("http://svc", transport=httpx.MockTransport(handler), max_wait=0.01) as c:
            if outcome == "ok":
                assert c.predict(image_bytes()).top_k[0].index == 1
            else:
                with pytest.raises(ServiceError, match="internal error"):
                    c.predict(image_bytes())
        assert len(calls) == calls_expected
