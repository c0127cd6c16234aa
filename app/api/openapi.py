"""The OpenAPI document at /openapi.json, made to say what the server accepts (checked by
schemathesis' positive-data and negative-data checks in tests/service/reliability/test_fuzz.py).

What the request models alone cannot state is added here, once, from the settings and the
methods' declarations:

- this server's bounds: ``top_k`` up to ``IDG_MAX_TOP_K``, step counts up to ``IDG_MAX_STEPS``,
  ``files`` one to ``IDG_MAX_BATCH_FILES`` images;
- which method takes which parameter, with that method's own range (one ``anyOf`` branch per
  method: the other methods' parameters absent, or null in JSON, where null means "not given"),
  and IDGI only on the path methods;
- a JSON ``image`` is non-empty base64 (an optional ``data:`` URL prefix, line breaks allowed);
  ``faithfulness`` lists insertion and/or deletion;
- a multipart form has no null (a field not sent, or sent empty, is not given), no fields beyond
  its own, and a non-empty ``file``; its booleans are true/false or 1/0.

What no schema can state stays in the descriptions and is refused with a 4xx: a ``target`` beyond
the chosen model's classes, an ``explain_if`` that does not parse, a request whose model passes
would exceed ``IDG_MAX_PASSES``, image bytes that are not a supported picture."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

from app.core.config import Settings
from app.schemas import METHOD_FIELDS
from idg_core.faithfulness import FAITHFULNESS_METRICS
from idg_core.methods import METHODS
from idg_core.postprocess import IDGI_METHODS

IMAGE_ROUTES = ("/predict", "/attribute", "/attribute/stream", "/attribute/batch", "/jobs")
_B64 = r"[A-Za-z0-9+/][ \t\n\r\f\v]*"
BASE64 = (rf"^(data:[^,]{{0,90}},)?[ \t\n\r\f\v]*({_B64}{_B64}{_B64}{_B64})*"
          rf"({_B64}{_B64}{_B64}{_B64}|{_B64}{_B64}=[ \t\n\r\f\v]*=|{_B64}{_B64}{_B64}=)[ \t\n\r\f\v]*$")
"""Non-empty standard base64, as :func:`app.api.requests.decode_base64` takes it: whole groups of
four characters with their padding, ASCII whitespace anywhere, an optional ``data:`` URL prefix."""
_NAMES = "|".join(FAITHFULNESS_METRICS)
FAITHFULNESS = rf"^\s*({_NAMES})?\s*(,\s*({_NAMES})?\s*)*$"
DEFAULT_METHOD = "idg"
JOINT: dict[str, tuple[tuple[str, tuple[str, ...], str, dict[str, Any]], ...]] = {
    "ig": (("rule", ("riemann_trapezoid", "adaptive"), "steps", {"minimum": 2}),),
}
"""A method's rules across two of its parameters (its ``Params.joint``), as the schema states them."""


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Serve FastAPI's document with this module's additions (built once, on first use)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = agreeing(build(), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def agreeing(doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``doc`` with the additions described in the module docstring (a copy; ``doc`` unchanged)."""
    doc = copy.deepcopy(doc)
    components = doc.get("components", {}).get("schemas", {})
    seen: set[int] = set()
    forms: set[int] = set()  # a form schema two routes share (the same object) is tightened once
    for route in IMAGE_ROUTES:
        content = doc["paths"][route]["post"]["requestBody"]["content"]
        form = content["multipart/form-data"]["schema"]
        if id(form) in forms:
            continue
        forms.add(id(form))
        _tighten(form, settings, json=False)
        form["additionalProperties"] = False
        props = form["properties"]
        if "file" in props:
            props["file"]["minLength"] = 1
        if "files" in props:
            props["files"] |= {"minItems": 1, "maxItems": settings.max_batch_files}
        if "archive" in props:  # POST /jobs: files (any number, within IDG_JOBS_MAX_IMAGES) or one archive
            props["files"] = {"type": "array", "items": {"type": "string", "format": "binary", "minLength": 1}, "minItems": 1,
                              "description": props["files"].get("description", "")}
            props["archive"] = {"type": "string", "format": "binary", "minLength": 1,
                                "description": props["archive"].get("description", "")}
            form["allOf"] = [{"anyOf": [{"required": ["files"]}, {"required": ["archive"]}]}]
        body = content.get("application/json", {}).get("schema")
        if body is None:
            continue
        ref = body.get("$ref", "").rsplit("/", 1)[-1]
        body = components[ref] if ref else body
        if id(body) not in seen:
            seen.add(id(body))
            _tighten(body, settings, json=True)
            body["properties"]["image"] |= {"minLength": 1, "pattern": BASE64}
    return doc


def _tighten(schema: dict[str, Any], settings: Settings, *, json: bool) -> None:
    props: dict[str, Any] = schema["properties"]
    if not json:
        for name, prop in props.items():
            if name not in ("file", "files"):
                props[name] = _form_field(_without_null(prop))
    for name in ("top_k",):
        if name in props:
            _branch(props[name])["maximum"] = settings.max_top_k
    for name in sorted({p for m in METHODS.values() for p in m.params.steps}):  # step counts, from each method's declaration
        if name in props:
            _branch(props[name])["maximum"] = settings.max_steps
    if "faithfulness" in props:
        _branch(props["faithfulness"])["pattern"] = FAITHFULNESS
    if "method" in props and any(name in props for name in METHOD_FIELDS):
        schema["anyOf"] = [_method_branch(name, props, json) for name in METHODS]


def _method_branch(method: str, props: dict[str, Any], json: bool) -> dict[str, Any]:
    """A request for ``method`` (the default method's: ``method`` absent too) and what it takes.
    One branch per method, in an ``anyOf`` (an ``if``/``then`` per method says the same, but
    schemathesis 4.32's coverage phase cannot check a multipart file against a conditional)."""
    takes = {p.name: p for p in METHODS[method].params if p.service}
    then: dict[str, Any] = {}
    for name in props:
        other = any(p.name == name and p.service for m in METHODS.values() for p in m.params) and name not in takes
        if other and name != "seed":  # seed is every request's (SmoothGrad draws it too)
            then[name] = {"type": "null"} if json else {"const": ""}  # null (JSON) or empty (form): not given
        elif name in takes and takes[name].kind in (int, float):
            p, bounds = takes[name], {}
            if p.low is not None:
                bounds["exclusiveMinimum" if p.low_open else "minimum"] = p.low
            if p.high is not None:
                bounds["maximum"] = p.high
            bounds = _tighter(bounds, _branch(props[name]))
            if bounds:
                then[name] = bounds if not json else {"anyOf": [bounds, {"type": "null"}]}
    if method not in IDGI_METHODS and "postprocess" in props:  # XRAI and Grad-CAM's post-steps apply to any method's map
        anyone = ["none", "xrai", "cam_regions", "cam_product"]
        then["postprocess"] = {"enum": anyone if json else [*anyone, ""]}
    branch: dict[str, Any] = {"properties": {"method": {"const": method}, **then}}
    if method != DEFAULT_METHOD:  # without "required", an absent method matches the default's branch only
        branch["required"] = ["method"]
    for field, chosen, needy, needs in JOINT.get(method, ()):  # ``field`` among ``chosen`` asks ``needs`` of ``needy``
        others = [v for v in _branch(props[field]).get("enum", []) if v not in chosen]
        branch["allOf"] = [*branch.get("allOf", []), {"anyOf": [
            {"properties": {field: {"enum": [*others, None if json else ""]}}}, {"properties": {needy: needs}}]}]
    return branch


def _tighter(bounds: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    """The ``bounds`` a method's branch states beyond those of the property it narrows (``shared``): a bound the property
    already holds (a ``seed`` from 0, ``probe_steps`` from 3, a ``threshold`` in [0, 1]) says nothing more there, and each
    one stated again is one more intersection for schemathesis' canonicalizer (jsonschema_rs), which gives up on a form
    past its budget of them (``OUTGREW_INTERSECTIONS``: POST /jobs' form, 11 methods by files-or-archive, could not be
    generated at all)."""
    low, high = shared.get("minimum"), shared.get("maximum")
    low_open = shared.get("exclusiveMinimum")
    out = dict(bounds)
    if "minimum" in out and ((low is not None and low >= out["minimum"]) or (low_open is not None and low_open >= out["minimum"])):
        del out["minimum"]
    if "exclusiveMinimum" in out and ((low_open is not None and low_open >= out["exclusiveMinimum"])
                                      or (low is not None and low > out["exclusiveMinimum"])):
        del out["exclusiveMinimum"]
    if "maximum" in out and high is not None and high <= out["maximum"]:
        del out["maximum"]
    return out


def _branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The value branch of a property: not its null (JSON) or empty (form) branch, and inside
    it the non-null one (itself when it has no ``anyOf``)."""
    for branch in prop.get("anyOf", []):
        if branch.get("type") != "null" and branch.get("const") != "":
            return _branch(branch)
    return prop


def _form_field(prop: dict[str, Any]) -> dict[str, Any]:
    """A form field as the server reads it: an empty value is not given (a blank input), and a
    boolean is true/false or 1/0."""
    meta = {k: v for k, v in prop.items() if k in ("title", "description", "default", "deprecated")}
    value = {k: v for k, v in prop.items() if k not in meta}
    if value.get("type") == "boolean":
        value = {"anyOf": [{"type": "boolean"}, {"enum": [0, 1]}]}
    return meta | {"anyOf": [value, {"const": ""}]}


def _without_null(prop: dict[str, Any]) -> dict[str, Any]:
    """A form field's schema without its null branch (a form has no null: a field not sent is not given)."""
    branches = [b for b in prop.get("anyOf", []) if b.get("type") != "null"]
    if "anyOf" not in prop or len(branches) == len(prop["anyOf"]):
        return prop
    out = {k: v for k, v in prop.items() if k != "anyOf" and not (k == "default" and v is None)}
    if len(branches) == 1:
        return out | branches[0]
    return out | {"anyOf": branches}
