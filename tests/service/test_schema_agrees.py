"""The schema at /openapi.json and the server agree on each case schemathesis' ST202 found (issue 29):
a body the schema takes is not refused as malformed or invalid (no 400/422), and one it refuses is
refused. Each body is checked against the served schema (jsonschema) and sent to the real app."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from app.core.config import Settings
from app.main import create_app
from tests.service.conftest import image_bytes, serve, tiny_classifier

PNG = base64.b64encode(image_bytes()).decode()
SETTINGS = Settings(models=["tiny"], warmup=False, max_batch_files=2)


def _body_schema(doc: dict[str, Any], route: str, media: str) -> Draft202012Validator:
    schema = doc["paths"][route]["post"]["requestBody"]["content"][media]["schema"]
    return Draft202012Validator({**schema, "components": doc.get("components", {})})


JSON_CASES = [  # (route, body, the schema takes it)
    ("/predict", {"image": ""}, False),  # empty: 400 "the uploaded file is empty"
    ("/attribute", {"image": ""}, False),
    ("/attribute/stream", {"image": "not base64!"}, False),  # 400 "image is not valid base64"
    ("/attribute", {"image": "QUJD="}, False),  # bad padding
    ("/attribute", {"image": PNG, "rule": None, "steps": 2, "probe_steps": 3}, True),  # null: not given (idg takes no rule)
    ("/attribute", {"image": PNG, "method": "ig", "rule": "uniform", "steps": 2, "placement": None}, True),
    ("/attribute", {"image": PNG, "rule": "uniform"}, False),  # idg takes no rule: 422
    ("/attribute", {"image": PNG, "method": "left_ig", "steps": 1}, False),  # left_ig needs 2
    ("/attribute", {"image": PNG, "method": "ig", "rule": "adaptive", "steps": 1}, False),  # adaptive needs 2
    ("/attribute", {"image": PNG, "method": "guided_ig", "steps": 2, "postprocess": "idgi"}, False),  # IDGI: path methods only
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "return_input": 1}, False),  # JSON's types: no 1 for true
    ("/attribute", {"image": PNG, "steps": "2", "probe_steps": 3}, False),
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "faithfulness": "deletion, insertion"}, True),
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "faithfulness": "both"}, False),
    ("/attribute", {"image": PNG, "top_k": 21}, False),  # IDG_MAX_TOP_K
    ("/attribute", {"image": PNG, "steps": 513}, False),  # IDG_MAX_STEPS
    ("/predict", {"image": "data:image/png;base64," + PNG}, True),
]


@pytest.mark.parametrize(("route", "body", "valid"), JSON_CASES, ids=[f"{r} {json.dumps(b)[:60]}" for r, b, _ in JSON_CASES])
async def test_json_bodies_schema_and_server_agree(route: str, body: dict[str, Any], valid: bool) -> None:
    app = create_app(SETTINGS, models={"tiny": tiny_classifier()})
    assert _body_schema(app.openapi(), route, "application/json").is_valid(body) == valid
    async with serve(app) as client:
        r = await client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    if valid:
        assert r.status_code == 200 and "event: error" not in r.text, r.text[:500]
    else:
        assert r.status_code in (400, 415, 422), r.text[:500]


FORM_CASES = [  # (route, fields as the schema sees them, files, the schema takes it)
    ("/attribute/batch", {"steps": 2, "probe_steps": 3}, [], False),  # no files: 422
    ("/attribute/batch", {"steps": 2, "probe_steps": 3}, ["files"] * 3, False),  # more than IDG_MAX_BATCH_FILES: 413
    ("/attribute/batch", {"steps": 2, "probe_steps": 3, "rule": ""}, ["files"], True),  # an empty field is not given
    ("/attribute", {"steps": 2, "probe_steps": 3, "return_input": 1}, ["file"], True),  # a form's booleans take 1/0
    ("/attribute", {"steps": 2, "probe_steps": 3, "extra": "x"}, ["file"], False),  # unknown field: 422
]


@pytest.mark.parametrize(("route", "fields", "files", "valid"), FORM_CASES, ids=[f"{r} {f} {len(n)}" for r, f, n, _ in FORM_CASES])
async def test_forms_schema_and_server_agree(route: str, fields: dict[str, Any], files: list[str], valid: bool) -> None:
    app = create_app(SETTINGS, models={"tiny": tiny_classifier()})
    as_schema: dict[str, Any] = dict(fields)
    for name in set(files):
        as_schema[name] = "<bytes>" if name == "file" else ["<bytes>"] * files.count(name)
    assert _body_schema(app.openapi(), route, "multipart/form-data").is_valid(as_schema) == valid
    async with serve(app) as client:
        uploads = [(name, ("a.png", image_bytes(), "image/png")) for name in files]
        r = await client.post(route, data={k: str(v) for k, v in fields.items()}, files=uploads or None,
                              headers={} if files else {"content-type": "multipart/form-data; boundary=x"},
                              content=None if files else b"--x--\r\n")
    if valid:
        assert r.status_code == 200 and all(i["status"] == 200 for i in r.json().get("items", [])), r.text[:500]
    else:
        assert r.status_code in (413, 422), r.text[:500]


async def test_a_form_field_sent_twice_is_refused() -> None:
    async with serve(create_app(SETTINGS, models={"tiny": tiny_classifier()})) as client:
        r = await client.post("/attribute", files=[("file", ("a.png", image_bytes(), "image/png"))],
                              data={"steps": ["2", "40"], "probe_steps": "3"})
    assert r.status_code == 422 and r.json()["error"]["message"] == "steps: given more than once", r.text


@pytest.mark.parametrize("route", ["/attribute", "/predict"])
async def test_a_file_sent_twice_is_refused_not_the_last_one_answered(route: str) -> None:
    two = [("file", ("a.png", image_bytes(), "image/png")), ("file", ("b.png", image_bytes((9, 9, 9)), "image/png"))]
    async with serve(create_app(SETTINGS, models={"tiny": tiny_classifier()})) as client:
        r = await client.post(route, files=two, data={"steps": "2", "probe_steps": "3"} if route == "/attribute" else {})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("file: given 2 times; send one image"), r.text
