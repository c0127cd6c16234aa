"""Small edges a newcomer met (issue #46): a wrong method or a trailing slash answers a JSON error that says what
to do, an unknown field's 422 names the fields there are, the page's icon is served, /models gives the same step
bounds as /openapi.json, and idg-client takes every preset the server takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from idg_client.cli import main as cli
from idg_core.methods._common import PRESET_NAMES
from tests.service.conftest import AppFactory, image_bytes, live_server, serve


async def test_a_wrong_method_is_a_json_405_naming_the_methods_the_path_takes(tiny_app: AppFactory, tmp_path: Path) -> None:
    async with serve(tiny_app(data_dir=tmp_path)) as client:
        r = await client.get("/attribute")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"] == {"status": 405, "code": "method_not_allowed", "request_id": r.headers["x-request-id"],
                                     "message": "GET is not allowed on /attribute; it takes POST"}
        r = await client.delete("/jobs")
        assert r.status_code == 405 and r.json()["error"]["message"].endswith("it takes GET, POST")


async def test_a_trailing_slash_is_a_json_404_naming_the_route_not_an_empty_redirect(tiny_app: AppFactory, tmp_path: Path) -> None:
    async with serve(tiny_app(data_dir=tmp_path)) as client:
        r = await client.post("/predict/", files={"file": ("a.png", image_bytes())})
        assert r.status_code == 404 and "location" not in r.headers
        assert r.json()["error"]["message"] == "no route /predict/; the route is /predict, without the trailing slash"
        r = await client.get("/nothing/")
        assert r.status_code == 404 and r.json()["error"]["message"] == "Not Found"


async def test_an_unknown_field_names_the_fields_of_the_route(tiny_app: AppFactory, tmp_path: Path) -> None:
    async with serve(tiny_app(data_dir=tmp_path)) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"stepz": "3"})
        message = r.json()["error"]["message"]
        assert r.status_code == 422 and message.startswith("stepz: unknown field; the fields here are ")
        assert {"steps", "probe_steps", "method", "preset", "target"} <= set(message.split("are ")[1].split(", "))
        r = await client.post("/predict", json={"image": "aGk=", "topk": 3})
        message = r.json()["error"]["message"]
        assert r.status_code == 422 and message.startswith("topk: unknown field; the fields here are ")
        assert {"image", "top_k"} <= set(message.split("are ")[1].split(", "))


async def test_the_page_icon_is_served(tiny_app: AppFactory, tmp_path: Path) -> None:
    async with serve(tiny_app(data_dir=tmp_path)) as client:
        r = await client.get("/favicon.ico")
        assert r.status_code == 200 and r.headers["content-type"] == "image/x-icon"
        assert r.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header


async def test_models_gives_the_step_bounds_the_schema_gives(tiny_app: AppFactory, tmp_path: Path) -> None:
    async with serve(tiny_app(data_dir=tmp_path, max_steps=100)) as client:
        listed = {p["name"]: p for p in (await client.get("/models")).json()["method_parameters"]["idg"]}
        schema = (await client.get("/openapi.json")).json()
    form = schema["paths"]["/attribute"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
    for name in ("steps", "probe_steps"):
        assert listed[name]["maximum"] == 100
        assert set(_maxima(form[name])) == {100}, form[name]
    assert listed["uniform"]["maximum"] is None


def _maxima(schema: object) -> list[object]:
    if isinstance(schema, dict):
        return ([schema["maximum"]] if "maximum" in schema else []) + [m for v in schema.values() for m in _maxima(v)]
    if isinstance(schema, list):
        return [m for v in schema for m in _maxima(v)]
    return []


@pytest.fixture
def url(tiny_app: AppFactory, tmp_path: Path) -> Iterator[str]:
    yield from live_server(tiny_app(data_dir=tmp_path / "data"))


def test_the_cli_takes_every_preset_the_server_takes(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    img = tmp_path / "x.png"
    img.write_bytes(image_bytes())
    for preset in PRESET_NAMES:
        assert cli(["--url", url, "job", "submit", str(img), "--method", "ig", "--preset", preset, "--steps", "3"]) == 0, preset
        assert len(capsys.readouterr().out.strip()) == 32
    assert cli(["--url", url, "attribute", str(img), "--preset", "quality", "--steps", "3", "--probe-steps", "3",
                "--out", str(tmp_path / "h.png")]) == 0
    capsys.readouterr()
    assert cli(["--url", url, "job", "submit", str(img), "--preset", "cheap"]) == 1
    assert "preset" in capsys.readouterr().err  # the server's 422 names the presets it takes
