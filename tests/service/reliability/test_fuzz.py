"""Schemathesis (OpenAPI-driven fuzzing) against the real app: tiny model, API key set, real uvicorn.

1. Every documented operation gets schemathesis' own requests, valid and invalid, with every
   check on: never a 5xx, every answer as documented (status code, content type, headers, JSON
   body), a valid request accepted and an invalid one refused (ST202 / ST201: the schema says what
   the server takes, see app/api/openapi.py), but the named exclusions (``POSITIVE_REFUSED``,
   ``NEGATIVE_ACCEPTED``: what JSON Schema cannot state, each with its reason; docs/http-api.md).
   Generated bodies run in CI, and the coverage phase (boundary and invalid values of every field,
   unexpected methods) on the /v2 inference body; over every route it is marked slow.
2. The image routes get pictures in their ``file`` / ``files`` / ``image`` fields: valid ones (PNG,
   JPEG, WebP, GIF, BMP, TIFF in several modes and sizes) and broken ones (truncated, bit-flipped,
   wrong magic, huge declared dimensions, a decompression bomb, bad base64), beside the generated
   fields or cheap valid ones: never a 5xx (streams and batch items included), a valid picture is
   never refused as a picture, and with valid fields it is explained.
3. Without the right key, every route but health and metrics answers 401 as documented; the page,
   its files and the docs need no key.

Bounded: ``IDG_FUZZ_EXAMPLES`` generated examples per operation (default 30; about a minute on two
cores), derandomized so CI sees the same cases each run; set ``IDG_FUZZ_SEED`` to explore others."""

from __future__ import annotations

import base64
import copy
import functools
import io
import json
import os
import re
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from PIL import Image

from app.core.config import Settings
from app.main import create_app
from idg_core.methods import METHODS
from tests.service.conftest import live_server, tiny_classifier

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[dev]')")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.core.failures import AcceptedNegativeData, FailureGroup  # noqa: E402
from schemathesis.openapi.checks import RejectedPositiveData  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

KEY = "fuzz-key"
GOOD = {"X-API-Key": KEY}
EXAMPLES = int(os.environ.get("IDG_FUZZ_EXAMPLES", "30"))
SEED = os.environ.get("IDG_FUZZ_SEED")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
# small bounds so that generated parameters stay cheap on the tiny model and the limits are hit often
BOUNDS: dict[str, Any] = {"models": ["tiny"], "warmup": False, "api_key": KEY, "max_steps": 64, "max_upload_bytes": 400_000,
                          "max_image_pixels": 250_000, "max_batch_files": 4, "request_timeout_s": 60}
"""The app's settings but its data directory: built in the fixtures, never at import, so that the jobs the fuzzing submits go to
a temporary directory and not to the checkout's ``data/`` (Settings() at import reads IDG_DATA_DIR before any test sets it)."""
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
                         suppress_health_check=list(HealthCheck), print_blob=True)


def _seeded(test: Any) -> Any:
    return seed(int(SEED))(test) if SEED is not None else test


# --- images: valid ones, then mutations of them -------------------------------------------------

FORMAT_MODES = {
    "PNG": ("RGB", "RGBA", "L", "LA", "P", "1", "I;16"),
    "JPEG": ("RGB", "L", "CMYK"),
    "WEBP": ("RGB", "RGBA"),
    "GIF": ("P", "L"),
    "BMP": ("RGB", "L", "P"),
    "TIFF": ("RGB", "RGBA", "L", "CMYK"),
}


def encode(fmt: str, mode: str, width: int, height: int, noise_seed: int) -> bytes:
    """A noise picture (never a flat colour, so never TinyNet's poison) saved as ``fmt``/``mode``."""
    rng = np.random.default_rng(noise_seed)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    if mode == "I;16":
        img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 257)  # 16-bit grey
    elif mode != "RGB":
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@st.composite
def valid_images(draw: st.DrawFn) -> bytes:
    fmt = draw(st.sampled_from(sorted(FORMAT_MODES)))
    mode = draw(st.sampled_from(FORMAT_MODES[fmt]))
    width = draw(st.integers(1, 96))
    height = draw(st.integers(-(-width // 20), min(96, 20 * width)))  # within the service's 20:1 aspect limit
    return encode(fmt, mode, width, height, draw(st.integers(0, 2**16)))


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def huge_png(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` x ``height`` (valid CRC) over a few bytes of data."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + _png_chunk(b"IEND", b"")


def huge_jpeg(data: bytes, width: int, height: int) -> bytes:
    """A real JPEG with its SOF0 frame header rewritten to declare ``width`` x ``height``."""
    at = data.find(b"\xff\xc0")
    if at < 0:
        return data
    return data[:at + 5] + struct.pack(">HH", height, width) + data[at + 9:]


@st.composite
def broken_images(draw: st.DrawFn) -> bytes:
    data = draw(valid_images())
    kind = draw(st.sampled_from(["truncate", "flip", "magic", "huge_png", "huge_jpeg", "bomb", "sliver", "empty", "junk"]))
    if kind == "truncate":
        return data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(out) - 1))
            out[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    if kind == "magic":
        magic = draw(st.sampled_from(
            [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"BM", b"RIFF\0\0\0\0WEBP", b"II*\0", b"%PDF-", b"\0\0\0\0"]))
        return magic + data[len(magic):]
    dims = st.integers(1, 65_535)  # what a JPEG frame header can declare; PNG takes these too
    if kind == "huge_png":
        return huge_png(draw(dims), draw(dims))
    if kind == "huge_jpeg":
        return huge_jpeg(encode("JPEG", "RGB", 16, 16, 0), draw(dims), draw(dims))
    if kind == "bomb":  # a real image over the pixel limit that compresses to little
        buf = io.BytesIO()
        Image.new("L", (draw(st.integers(501, 1500)), draw(st.integers(501, 1500)))).save(buf, format="PNG")
        return buf.getvalue()
    if kind == "sliver":  # a real image over the aspect limit
        long, short = draw(st.integers(21, 400)), draw(st.integers(1, 2))
        return encode("PNG", "RGB", *draw(st.permutations([long * short, short])), 0)
    if kind == "empty":
        return b""
    return draw(st.binary(max_size=256))


IMAGES = st.one_of(valid_images().map(lambda d: (d, True)), broken_images().map(lambda d: (d, False)))


@st.composite
def base64_text(draw: st.DrawFn, data: bytes) -> str:
    """``data`` as the JSON ``image`` field: plain, as a data: URL, or base64 broken on purpose."""
    text = base64.b64encode(data).decode()
    how = draw(st.sampled_from(["plain", "plain", "data_url", "unpadded", "bad_char", "urlsafe"]))
    if how == "data_url":
        return "data:image/png;base64," + text
    if how == "unpadded":
        return text.rstrip("=")
    if how == "bad_char":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from(["!", " ", "é", "\n", "-"])) + text[i:]
    if how == "urlsafe":
        return base64.urlsafe_b64encode(data).decode()
    return text


# the right key, as X-API-Key or as a bearer token (wrong and missing keys: see the test after)
BEARER = {"Authorization": f"Bearer {KEY}"}
AUTH = st.sampled_from([GOOD, BEARER])


@st.composite
def sane_fields(draw: st.DrawFn, path: str) -> dict[str, Any]:
    """Cheap valid parameters, so that the picture is what decides the answer."""
    if path == "/predict":
        return {"top_k": draw(st.integers(1, 5))}
    method = draw(st.sampled_from(list(METHODS)))
    fields: dict[str, Any] = {"method": method}
    for name in METHODS[method].params.steps:  # its own step counts, small (a parameter it does not take is a 422)
        low = int(METHODS[method].params[name].low or 1)
        fields[name] = draw(st.integers(low, low + 3))
    return fields | draw(st.fixed_dictionaries({}, optional={"return_attribution": st.booleans(), "signed": st.booleans(),
                                                             "return_input": st.booleans(), "target": st.integers(0, 999)}))


# --- the app and its schema ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(**BOUNDS, data_dir=tmp_path_factory.mktemp("fuzz-data")), models={"tiny": tiny_classifier()})


@pytest.fixture(scope="module")
def fuzz_url(fuzz_app: FastAPI) -> Iterator[str]:
    yield from live_server(fuzz_app)


# What a schema-valid request may still get (ST202, positive_data_acceptance): 413 and 415 judge the
# image bytes and their size, which no schema describes; 503/504 are load. 400 and 422 are not among
# them: a valid request refused as malformed or invalid is a disagreement between schema and server.
ACCEPTED = ["2xx", "401", "403", "404", "409", "413", "415", "429", "503", "504", "5xx"]
# What an invalid request may get (ST201, negative_data_rejection): any refusal, 413 included (too many files).
REFUSED = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
@dataclass(frozen=True)
class Exclusion:
    """A disagreement between schema and server kept by design (docs/using.md, "What the server takes"): where schemathesis
    reports it (``operation`` and the answer's ``status`` and error ``message``, both regular expressions) and why."""

    name: str
    operation: str
    status: int
    message: str
    reason: str

    def covers(self, case: Any, response: Any) -> bool:
        if response.status_code != self.status or not re.search(self.operation, f"{case.method} {case.operation.path}"):
            return False
        error = response.json().get("error")
        return bool(re.search(self.message, error if isinstance(error, str) else error["message"]))


IMAGE_POSTS = r"^POST /(attribute|predict|jobs)"
POSITIVE_REFUSED = (
    Exclusion("target_beyond_classes", IMAGE_POSTS, 422, r"^target must be < \d+ \(the model's classes\)",
              "each model has its own classes (GET /models lists them); one schema serves every model"),
    Exclusion("adversarial_classes_beyond_classes", IMAGE_POSTS, 422, r"^adversarial_classes must be in \[",
              "AGI's adversarial classes are bounded by the model's classes, as target is"),
    Exclusion("model_passes_limit", IMAGE_POSTS, 422, r"may cost up to \d+ model passes, more than the limit",
              "a product of several fields (steps, probe steps, paths, smooth_samples...) against IDG_MAX_PASSES: each "
              "field's own bound is stated, and each is reachable with the others small"),
    Exclusion("explain_if_grammar", r"^POST /(predict|jobs)", 422, r"^explain_if: ",
              "a grammar (in the field's description), not a regular language the schema could state; a blank one is stated"),
    Exclusion("clip_bounds_order", IMAGE_POSTS, 422, r"^clip_percent_lowerbound \(.*\) must be below clip_percent_upperbound",
              "two fields' values compared with each other: JSON Schema states each one's range, not their order"),
    Exclusion("visualization_fields_together", IMAGE_POSTS, 422,
              r"^signed=true shows both signs|^outlier_perc and .* are two ways to scale|^outline_share is the share of the image",
              "optional rendering fields that exclude each other (signed with one polarity, outlier_perc with a clip bound, "
              "outline_share without outlines): the schema states the fields as one anyOf branch per method, and stating "
              "these pairs would multiply those branches, as POST /jobs' files-or-archive did past schemathesis' budget "
              "of intersections; the server's 422 names both fields"),
    Exclusion("xrai_order_needs_xrai", IMAGE_POSTS, 422, r"^xrai_order orders XRAI's regions: it needs postprocess=xrai",
              "an optional field that applies only beside another field's value (postprocess=xrai); stating it would "
              "split every method's anyOf branch in two, as the rendering fields would"),
    Exclusion("job_archive_whole", r"^POST /jobs", 422, r"archive could not be read|^the (tar|zip) archive",
              "a file that starts as an archive must be a whole one: bytes no schema describes"),
    Exclusion("oip_tensor_contents", r"^POST /v2/models/", 400,
              r"needs \d+ elements, the data holds|must be base64|data holds .* values, not|out of \w+'s range|not a finite"
              r"|must have the shape .* for this model|must hold pixels in \[0, 1\]",
              "a tensor's elements against its shape and datatype, and the model's image size: the protocol's tensors are "
              "typed by their own fields, which JSON Schema cannot tie to the elements; the protocol answers 400"),
    Exclusion("oip_outputs_and_names", r"^POST /v2/models/", 400,
              r"^unknown output|requested twice|classification parameter|^the body's model_(name|version)",
              "outputs are the model's (GET /v2/models/NAME lists them), and the body's model_name must be the path's"),
    Exclusion("oip_parameters", r"^POST /v2/models/", 422, r"",
              "the request's parameters are /attribute's fields, by name and type, checked as /attribute checks them; the "
              "schema types them as the protocol does (string, number or boolean)"),
)
"""The refusals a schema-valid request may get (ST202). Everything else a valid request gets in 400 or 422 fails."""


def _sent_as_not_given(failure: Exception, case: Any) -> bool:
    """A form field whose generated value goes on the wire as no part at all (an empty list) or as empty parts (``""``,
    ``[""]``): a form's empty field is not given, so the request sent lacks the field, which the schema allows (/jobs'
    ``files: []`` beside an ``archive``; ``early_stop: []`` for agi; an ``output`` sent empty)."""
    if not (case.media_type or "").startswith("multipart/") or not isinstance(case.body, dict):
        return False
    text = _text(failure)
    return any(all(getattr(part, "data", part) in ("", b"") for part in (value if isinstance(value, list) else [value]))
               and (f"/properties/{name}/" in text or f"{name}: " in text) for name, value in case.body.items())


def _another_branch(failure: Exception, case: Any) -> bool:
    """Negative data that breaks ``required`` in one ``anyOf`` branch: the per-method branches (one requires ``method``;
    without it the request matches the default method's branch and runs IDG) or /jobs' files-or-archive. The request sent
    still matches another branch, so the server rightly accepts it."""
    text = _text(failure)
    return "violates `required` at /" in text and "anyOf/" in text


@functools.cache
def _served_spec() -> dict[str, Any]:
    """The schema the app serves at /openapi.json, built once (building the app loads nothing: models load in its
    lifespan); callers that may change it take a copy."""
    return create_app(Settings(**BOUNDS)).openapi()


def _negated_branch_matches_another(failure: Exception, case: Any) -> bool:
    """Negative data made by negating a constraint inside one branch of an ``anyOf`` (a form field's ``const: ""``
    branch, a boolean's ``enum: [0, 1]`` branch) whose value still matches another branch: the body as generated
    validates against the operation's schema, so the server rightly accepts it (``rule: "uniform"`` for ig, negated
    from the empty-field branch)."""
    import jsonschema

    data = getattr(getattr(getattr(case, "meta", None), "phase", None), "data", None)
    mutations = getattr(data, "mutations", None)
    if not mutations or not all("/anyOf/" in (m.schema_pointer or "") for m in mutations) or not isinstance(case.body, dict):
        return False
    pointer = "/".join(("#/paths", case.operation.path.replace("~", "~0").replace("/", "~1"), case.method.lower(),
                        "requestBody/content", (case.media_type or "").replace("/", "~1"), "schema"))
    root = {**_served_spec(), "$ref": pointer}
    body = {k: [("" if isinstance(x, bytes) or hasattr(x, "data") else x) for x in v] if isinstance(v, list)
            else ("" if isinstance(v, bytes) or hasattr(v, "data") else v) for k, v in case.body.items()}
    return jsonschema.Draft202012Validator(root).is_valid(body)


NEGATIVE_ACCEPTED = {"sent_as_not_given": _sent_as_not_given, "another_branch": _another_branch,
                     "negated_branch_matches_another": _negated_branch_matches_another}
"""Schemathesis's invalid requests that are valid as sent (ST201): each named, with its reason in its docstring."""


def _text(failure: Exception) -> str:
    return str(failure) + " " + str(getattr(failure, "message", ""))


def _schema(phases: dict[str, Any]) -> Any:
    """Schemathesis' schema over :func:`_served_spec`, given a copy: nothing it does to its dict reaches the validator's."""
    return schemathesis.openapi.from_dict(copy.deepcopy(_served_spec()), config=schemathesis.Config.from_dict({
        "generation": {"mode": "all"}, "phases": phases,
        # schemathesis stops reading an event stream after 20 events (its default), which cut a 50-step Guided IG
        # stream after its 17th progress event, ending it without `result` or `error`: read every event
        "max-stream-events": 10_000,
        "checks": {"positive_data_acceptance": {"expected-statuses": ACCEPTED}, "negative_data_rejection": {"expected-statuses": REFUSED}},
        # the /v2 routes' model: a generated name is a 404 before the body is read (issue 59: the coverage phase had never
        # reached the inference body's checks from here)
        "parameters": {"path.name": "tiny"},
    }))


# generated requests, EXAMPLES per operation (CI); the coverage phase (each field at its boundaries and past
# them, one at a time: a few hundred requests per operation) runs over every operation in test_fuzz_coverage.py (slow)
schema = _schema({"coverage": {"enabled": False}})
coverage = _schema({"examples": {"enabled": False}, "fuzzing": {"enabled": False}})
"""The coverage phase alone (:func:`_schema`'s phases)."""


def validate_with_every_check(case: Any, response: Any) -> None:
    """Every schemathesis check (ST202 and ST201 included, with the statuses above), but the named exclusions:
    ``POSITIVE_REFUSED`` for a valid request's refusal, ``NEGATIVE_ACCEPTED`` for an invalid one's acceptance."""
    try:
        case.validate_response(response)
    except FailureGroup as group:
        if all(_excluded(f, case, response) for f in group.exceptions):
            return
        raise


def _excluded(failure: Exception, case: Any, response: Any) -> bool:
    if isinstance(failure, RejectedPositiveData):
        return any(e.covers(case, response) for e in POSITIVE_REFUSED)
    if isinstance(failure, AcceptedNegativeData):
        return any(excused(failure, case) for excused in NEGATIVE_ACCEPTED.values())
    return False


@schema.parametrize()
@FUZZ_SETTINGS
@_seeded
def test_generated_requests_get_no_5xx_and_the_documented_answer(case: Any, fuzz_url: str) -> None:
    response = case.call(base_url=fuzz_url, headers=GOOD, timeout=120)
    validate_with_every_check(case, response)


@coverage.include(method="POST", path_regex=r"^/v2/models/").parametrize()
@settings(FUZZ_SETTINGS, max_examples=10_000)
def test_inference_fields_at_their_boundaries_get_the_documented_answer(case: Any, fuzz_url: str) -> None:
    """The coverage phase's subset that runs in CI (a few seconds; issue 59: the /v2 body's schema had taken inputs the door
    refuses: no data, a negative or empty shape, a datatype or name it does not read)."""
    response = case.call(base_url=fuzz_url, headers=GOOD, timeout=120)
    validate_with_every_check(case, response)


def outcomes(response: Any, path: str) -> list[int]:
    """The status of each answer: the response's, a stream's closing event's, or each batch item's."""
    if response.status_code != 200:
        return [response.status_code]
    if path == "/attribute/batch":
        return [item["status"] for item in response.json()["items"]]
    if path == "/attribute/stream":
        events = [block.split("\n") for block in response.text.strip().split("\n\n")]
        last, payload = events[-1][0].removeprefix("event: "), json.loads(events[-1][1].removeprefix("data: "))
        assert events[0][0] == "event: accepted" and last in ("result", "error"), response.text[-500:]
        return [200 if last == "result" else payload["status"]]
    return [200]


@schema.include(path_regex=r"^/(predict|attribute)").parametrize()
@schema.given(image=IMAGES, data=st.data(), auth=AUTH)
@FUZZ_SETTINGS
@_seeded
def test_images_and_broken_images_get_no_5xx_and_the_documented_answer(
    case: Any, image: tuple[bytes, bool], data: st.DataObject, auth: dict[str, str], fuzz_url: str,
) -> None:
    raw, valid = image
    path = case.operation.path
    # the generated body (valid or not), or cheap valid fields, with the picture in its field
    plain_fields = isinstance(case.body, dict) and data.draw(st.booleans(), label="plain fields")
    if plain_fields:
        case.body = data.draw(sane_fields(path), label="fields")
    positive = plain_fields or (case.meta is not None and case.meta.generation.mode.is_positive)
    sent_plainly = False  # the picture went out as its bytes (multipart) or as plain base64 (JSON)
    extra: list[bytes] = []
    if isinstance(case.body, dict):
        if case.media_type == "application/json":
            text = data.draw(base64_text(raw), label="image (base64)")
            case.body["image"] = text
            sent_plainly = text == base64.b64encode(raw).decode()
        elif path == "/attribute/batch":
            extra = data.draw(st.lists(valid_images(), max_size=2), label="more files")
            case.body["files"] = [raw, *extra]
            sent_plainly = True
        else:
            case.body["file"] = raw
            sent_plainly = True
    response = case.call(base_url=fuzz_url, headers=auth, timeout=120)
    case.validate_response(response, checks=CHECKS)
    statuses = outcomes(response, path)
    assert all(s < 500 for s in statuses), response.text[-1000:]
    if positive and sent_plainly:  # a valid picture in a valid request is never refused as a picture
        refused = [s for s, ok in zip(statuses, [valid, *[True] * len(extra)], strict=False) if ok and s in (400, 413, 415)]
        assert not refused, response.text[-1000:]
    if plain_fields and valid and sent_plainly:  # ... and with cheap valid fields it is explained
        assert statuses[0] == 200, response.text[-1000:]


OPEN = ("/health/live", "/health/ready", "/metrics", "/v2/health/live", "/v2/health/ready")  # for load balancers and Prometheus: no key


@schema.parametrize()
@schema.given(auth=st.sampled_from([{}, {"X-API-Key": "wrong"}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + KEY}]))
@settings(FUZZ_SETTINGS, max_examples=4)
def test_without_the_right_key_only_the_open_routes_answer(case: Any, auth: dict[str, str], fuzz_url: str) -> None:
    response = case.call(base_url=fuzz_url, headers=auth, timeout=120)
    case.validate_response(response, checks=CHECKS)
    if case.path in OPEN:
        assert response.status_code != 401
    else:
        assert response.status_code == 401, response.text
        error = response.json()["error"]
        message = error if case.path.startswith("/v2") else error["message"]  # the Open Inference Protocol's form on /v2
        assert message == ("the API key is wrong" if "wrong" in str(auth) else
                           "this service needs an API key: send it as X-API-Key or 'Authorization: Bearer <key>'")


@pytest.mark.parametrize("path", ["/", "/static/app.js", "/static/samples/coffee.jpg", "/docs", "/openapi.json", *OPEN])
def test_the_page_its_files_the_docs_health_and_metrics_need_no_key(path: str, fuzz_url: str) -> None:
    assert httpx.get(fuzz_url + path, timeout=60).status_code == 200
