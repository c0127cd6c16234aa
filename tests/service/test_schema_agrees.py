"""The schema at /openapi.json and the server agree on each case schemathesis' ST202 found (issue 29):
a body the schema takes is not refused as malformed or invalid (no 400/422), and one it refuses is
refused. Each body is checked against the served schema (jsonschema) and sent to the real app."""

from __future__ import annotations

import base64
import functools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from app.api.routes.jobs import CALLBACK_PATTERN, URL_CHAR
from app.core.config import Settings
from app.jobs.callbacks import url_problem
from app.main import create_app
from tests.service.conftest import image_bytes, serve, tiny_classifier

PNG = base64.b64encode(image_bytes()).decode()
SETTINGS = Settings(models=["tiny"], warmup=False, max_batch_files=2)


@functools.cache
def _served_schema() -> dict[str, Any]:
    """What /openapi.json serves under SETTINGS: the same for every app built with them, so built once (0.3 s an app)."""
    doc: dict[str, Any] = create_app(SETTINGS, models={"tiny": tiny_classifier()}).openapi()
    return doc


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
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "polarity": "negative", "clip_percent_lowerbound": 50,
                    "color_map": "pink_green", "visualization": "outlines", "outline_share": 0.5}, True),
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "polarity": "sideways"}, False),
    ("/attribute", {"image": PNG, "steps": 2, "probe_steps": 3, "clip_percent_upperbound": 0}, False),
    ("/attribute", {"image": PNG, "steps": 513}, False),  # IDG_MAX_STEPS
    ("/predict", {"image": "data:image/png;base64," + PNG}, True),
]


@pytest.mark.parametrize(("route", "body", "valid"), JSON_CASES, ids=[f"{r} {json.dumps(b)[:60]}" for r, b, _ in JSON_CASES])
async def test_json_bodies_schema_and_server_agree(route: str, body: dict[str, Any], valid: bool) -> None:
    app = create_app(SETTINGS, models={"tiny": tiny_classifier()})
    assert _body_schema(_served_schema(), route, "application/json").is_valid(body) == valid
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
    assert _body_schema(_served_schema(), route, "multipart/form-data").is_valid(as_schema) == valid
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


# --- issue 59 item 8: what schemathesis' coverage phase found after issue 29 ---------------------------------------

def _infer_body(**given: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "data": [PNG]} | given]}


INFER_CASES = [  # (body, the schema takes it, the server's status, what its error says)
    (_infer_body(shape=[1.0]), True, 200, ""),  # JSON Schema's integer: 1.0 is 1 (it had been a 400)
    (_infer_body(shape=[-1]), False, 400, "negative dimension"),
    (_infer_body(shape=[0], data=[]), False, 400, "holds no image"),
    (_infer_body(shape=[1, 1]), False, 400, "must be BYTES of shape [N]"),
    (_infer_body(datatype=""), False, 400, "datatype  is not supported"),
    (_infer_body(datatype="FP32"), False, 400, "data holds str values, not FP32"),
    (_infer_body(name="pixels"), False, 400, "send exactly one input"),
    ({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES"}]}, False, 400, "neither data nor binary_data_size"),
    (_infer_body(data=None), False, 400, "neither data nor binary_data_size"),
    (_infer_body(data="AAAA"), False, 400, "data must be a JSON array"),
    ({"inputs": [_infer_body()["inputs"][0]] * 2}, False, 400, "send exactly one input"),
]


@pytest.mark.parametrize(("body", "valid", "status", "message"), INFER_CASES, ids=[json.dumps(c[0])[:70] for c in INFER_CASES])
async def test_inference_bodies_schema_and_server_agree(body: dict[str, Any], valid: bool, status: int, message: str,
                                                        tmp_path: Any) -> None:
    app = create_app(Settings(models=["tiny"], warmup=False, data_dir=tmp_path), models={"tiny": tiny_classifier()})
    assert _body_schema(_served_schema(), "/v2/models/{name}/infer", "application/json").is_valid(body) == valid
    async with serve(app) as client:
        r = await client.post("/v2/models/tiny/infer", json=body)
    assert r.status_code == status and message in r.text, r.text[:500]


def _form_schema(doc: dict[str, Any], route: str, field: str) -> Draft202012Validator:
    schema = doc["paths"][route]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"][field]
    return Draft202012Validator(schema, format_checker=None)


CALLBACK_CASES = [  # (callback_url, the schema and the route take it)
    ("https://hooks.example.com:8443/idg?token=abc#frag", True),
    ("HTTP://user:pa%20ss@10.0.0.7:0000080/", True),
    ("http://h:/x", True),  # an empty port is no port
    ("http://" + "a" * 63 + ".example.com/", True),
    ("http://h:65536/", False),  # urlsplit: "Port out of range"
    ("http://h:8a/", False),
    ("http://" + "a" * 64 + ".example.com/", False),  # a label over 63
    ("http://" + ("a" * 60 + ".") * 5 + "com/", False),  # a host over 253
    ("http://h/\x1c", False),  # a control character JSON Schema's \S takes (Python's isspace refuses it)
    ("http://h/\x85", False),
    ("http://h/a b", False),
    ("http://:80/", False),
    ("ftp://h/", False),
]


@pytest.mark.parametrize(("url", "valid"), CALLBACK_CASES, ids=[repr(u[:50]) for u, _ in CALLBACK_CASES])
def test_callback_urls_schema_and_route_agree(url: str, valid: bool) -> None:
    schema = _form_schema(_served_schema(), "/jobs", "callback_url")
    assert schema.is_valid(url) == valid
    assert (url_problem(url) is None) == valid, url_problem(url)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(url=st.from_regex(CALLBACK_PATTERN, fullmatch=True).filter(lambda u: len(u) <= 2048))
def test_every_callback_url_the_schema_takes_the_route_takes(url: str) -> None:
    """Generated from the pattern as JSON Schema reads it (``$`` at the very end: Python's ``re.search`` would take a
    trailing newline, hence fullmatch). The other way round (a URL the route takes, the schema refuses) fails by
    decision for Unicode hosts, IPv6 literals and credentials outside RFC 3986's characters: docs/using.md."""
    assert url_problem(url) is None, url


def test_the_characters_a_callback_url_may_hold_are_the_routes() -> None:
    """JSON Schema's ``\\s`` is not Python's ``isspace`` (``\\x1c``, ``\\x85``, ``\\ufeff``): the schema names the characters."""
    one = re.compile(URL_CHAR)
    for c in map(chr, [*range(0x3100), 0xFEFF, 0x1F600, 0x10FFFF]):
        assert (one.fullmatch(c) is not None) == (url_problem("http://h/" + c) is None), hex(ord(c))


async def test_a_callback_url_the_schema_refuses_is_refused_by_the_route(tmp_path: Any) -> None:
    app = create_app(Settings(models=["tiny"], warmup=False, data_dir=tmp_path), models={"tiny": tiny_classifier()})
    assert not _form_schema(app.openapi(), "/jobs", "callback_url").is_valid("http://h:65536/")
    async with serve(app) as client:
        r = await client.post("/jobs", files=[("files", ("a.png", image_bytes(), "image/png"))],
                              data={"steps": "2", "probe_steps": "3", "callback_url": "http://h:65536/"})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("callback_url has a port out of range 0-65535"), r.text


@pytest.mark.parametrize(("route", "media"), [("/predict", "application/json"), ("/predict", "multipart/form-data"),
                                              ("/jobs", "multipart/form-data")])
async def test_a_blank_condition_is_refused_by_schema_and_server(route: str, media: str, tmp_path: Any) -> None:
    """JSON's "" (null is "not given" there) and a form's blanks are no condition: the schema says so (it had taken ""),
    the server answers 422. A form's empty field is not given, in both."""
    app = create_app(Settings(models=["tiny"], warmup=False, data_dir=tmp_path, max_batch_files=2), models={"tiny": tiny_classifier()})
    doc = app.openapi()
    blank = "" if media == "application/json" else "  "
    if media == "application/json":
        assert not _body_schema(doc, route, media).is_valid({"image": PNG, "explain_if": blank})
    else:
        assert not _form_schema(doc, route, "explain_if").is_valid(blank) and _form_schema(doc, route, "explain_if").is_valid("")
    async with serve(app) as client:
        if media == "application/json":
            r = await client.post(route, json={"image": PNG, "explain_if": blank})
        else:
            r = await client.post(route, files=[("file" if route == "/predict" else "files", ("a.png", image_bytes(), "image/png"))],
                                  data={"explain_if": blank})
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("explain_if: the condition is empty"), r.text
