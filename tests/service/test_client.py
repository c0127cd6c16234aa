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
        a = c.attribute(path, method="idg", preset="fast", steps=6, probe_steps=5, return_attribution=True,
                        target=pred.top_k[0].index)  # fast: IDG alone, no noisy copies, so the curve is the photo's
        assert isinstance(a.heatmap, Image.Image) and a.heatmap.size == (32, 32)
        assert a.curve.alphas.shape == (6,) and a.curve.probe_values.shape == (5,)
        assert a.curve.output == "logit" and a.curve.input == "photo"
        assert a.attribution.shape == (3, 32, 32)
        assert a.target.index == pred.top_k[0].index and a.parameters["steps"] == 6
        # copies sharing one probe: the probe is the photo's, the samples the first copy's, and the client says which
        shared = c.attribute(path, steps=4, probe_steps=5, smooth_samples=2, smooth_probe="shared")
        own = c.attribute(path, steps=4, probe_steps=5, smooth_samples=2, smooth_probe="own")
        assert (shared.curve.input, shared.curve.probe_input) == ("noisy_copy", "photo")
        assert (own.curve.input, own.curve.probe_input) == ("noisy_copy", "noisy_copy") and a.curve.probe_input == "photo"
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


@pytest.fixture
def keyed_url(tiny_app: AppFactory) -> Iterator[str]:
    yield from live_server(tiny_app(api_key="s3cret-key"))


def test_cli_says_how_to_give_the_api_key_it_lacks_or_that_the_one_given_was_refused(
        keyed_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 names the command's own --api-key and IDG_API_KEY (the service's message names HTTP headers)."""
    img = tmp_path / "a.png"
    img.write_bytes(image_bytes())
    monkeypatch.delenv("IDG_API_KEY", raising=False)
    assert cli(["--url", keyed_url, "predict", str(img)]) == 1
    err = capsys.readouterr().err
    assert err == "error 401: this service needs an API key: give it with --api-key KEY or the IDG_API_KEY environment variable\n"
    assert cli(["--url", keyed_url, "--api-key", "wrong", "predict", str(img)]) == 1
    assert capsys.readouterr().err == "error 401: the service refused the API key given (--api-key or IDG_API_KEY): check it\n"
    monkeypatch.setenv("IDG_API_KEY", "s3cret-key")  # read when the command starts
    assert cli(["--url", keyed_url, "predict", str(img), "--top-k", "1"]) == 0


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


def test_cli_refuses_a_path_it_cannot_write_before_any_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the whole attribution had run first, then a traceback; the URL here answers nothing: refused before asking it
    img = tmp_path / "a.png"
    img.write_bytes(image_bytes())
    for out, says in ((tmp_path / "no" / "h.png", "does not exist"), (tmp_path / "h.xyz", "image extension")):
        assert cli(["--url", "http://127.0.0.1:9", "attribute", str(img), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and "could not reach" not in err and "Traceback" not in err, err


def test_cli_says_a_service_that_does_not_answer_in_time_did_not_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    img = tmp_path / "a.png"
    img.write_bytes(image_bytes())
    with socket.socket() as s:  # accepts connections (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        assert cli(["--url", f"http://127.0.0.1:{s.getsockname()[1]}", "--timeout", "0.5", "predict", str(img)]) == 2
    err = capsys.readouterr().err
    assert "did not answer within 0.5 s" in err and "--timeout" in err and "could not reach" not in err, err


def _mock(handler: object) -> Client:
    import httpx

    return Client("http://svc", transport=httpx.MockTransport(handler), max_wait=0.01)  # type: ignore[arg-type]


@pytest.mark.parametrize(("status", "body"), [
    (404, {"error": "not found"}), (400, ["a", "list"]), (200, {"ok": True}), (200, "<html>a page</html>"),
], ids=["another error form", "a list", "other JSON", "a web page"])
def test_another_server_at_the_url_is_a_service_error_not_a_traceback(status: int, body: object) -> None:
    import httpx

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body) if not isinstance(body, str) else httpx.Response(status, text=body)

    with _mock(handler) as c:
        for call in (lambda: c.predict(image_bytes()), lambda: c.attribute(image_bytes()), lambda: c.job("x"), lambda: c.jobs()):
            with pytest.raises(ServiceError) as caught:
                call()
            assert caught.value.status == status


def test_waiting_for_a_job_on_a_service_that_never_answers_ends() -> None:
    import socket
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.monotonic()
    with Client(f"http://127.0.0.1:{port}") as c, pytest.raises(httpx.TransportError):
        c.wait_job("x", poll_s=0.05, unreachable_s=0.3)  # it had polled forever
    assert time.monotonic() - began < 5


def test_a_cut_results_stream_ends_with_its_resume_point_and_a_busy_one_is_retried(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    import httpx

    class Cut(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield (json.dumps({"seq": 1, "index": 0}) + "\n").encode()
            raise httpx.RemoteProtocolError("peer closed connection")

    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:  # the store busy for now: retried as every other call is (it had been reported at once)
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"error": {"status": 503, "code": "store_unavailable",
                                                                                      "message": "try again"}})
        return httpx.Response(200, stream=Cut(), headers={"content-type": "application/x-ndjson"})

    with _mock(handler) as c:
        answers = c.job_results("x", follow=True)
        assert [a["seq"] for a in answers] == [1] and answers.end is None and answers.after == 1
    assert len(calls) == 2
    # the CLI: exit 4 and where to resume (it had been "could not reach the service", exit 2)
    monkeypatch.setattr("idg_client.cli.Client", lambda *a, **kw: _mock(handler))
    calls.clear()
    assert cli(["job", "results", "x", "--follow"]) == 4
    err = capsys.readouterr().err
    assert "ended (cut) after seq 1" in err, err


def test_cli_piped_into_a_reader_that_stops_ends_quietly(url: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    img = tmp_path / "a.png"
    img.write_bytes(image_bytes())
    # the curve's lines after the first two go to a closed pipe: a BrokenPipeError traceback before
    done = subprocess.run(f"{sys.executable} -m idg_client --url {url} attribute {img} --steps 64 --out {tmp_path / 'h.png'} | head -1",
                          shell=True, capture_output=True, text=True, timeout=120, check=False)
    assert done.stdout.startswith("tiny idg: class") and "Traceback" not in done.stderr, done.stderr
