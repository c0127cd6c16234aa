"""The request's method fields come from the methods' declarations: a field the chosen method does
not take is a 422 that names the method's parameters, the answer lists only what the method used,
one name per method, and GET /models and the OpenAPI document show the declared parameters."""

from __future__ import annotations

import pytest

from app.core.config import Settings
from app.schemas import METHOD_FIELDS, AttributeCommon, AttributeParams
from idg_core import METHODS
from idg_core.methods import POST_STEPS
from tests.service.conftest import AppFactory, image_bytes, serve


@pytest.mark.parametrize(("fields", "method_name", "bad"), [
    ({"method": "ig", "placement": "authors"}, "ig", "placement"),
    ({"method": "agi", "steps": "8"}, "agi", "steps"),
    ({"method": "idg", "fraction": "0.3"}, "idg", "fraction"),
    ({"method": "guided_ig", "probe_steps": "5"}, "guided_ig", "probe_steps"),
])
async def test_a_field_the_method_does_not_take_is_a_422_naming_its_parameters(
    tiny_app: AppFactory, fields: dict, method_name: str, bad: str,
) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        for path in ("/attribute", "/attribute/stream"):
            r = await client.post(path, files={"file": ("a.png", image_bytes())}, data=fields)
            assert r.status_code == 422, r.text
            message = r.json()["error"]["message"]
            assert message.startswith(f"{method_name} takes no parameter '{bad}'; its parameters are "), message
            assert all(p.name in message for p in METHODS[method_name].params if p.service)
        assert net.calls == []  # refused before any model call


async def test_bad_values_get_the_methods_own_reason(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        for fields, words in (({"method": "guided_ig", "fraction": "0"}, "one feature at a time"),
                              ({"method": "left_ig", "threshold": "2"}, "threshold must be a number in [0.0, 1.0]"),
                              ({"method": "idg", "steps": "1"}, "steps must be >= 2, got 1"),
                              ({"method": "ig", "rule": "simpson"}, "rule")):
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
            assert r.status_code == 422 and words in r.json()["error"]["message"], (fields, r.text)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"method": "ig", "steps": "4"}, {"steps", "rule", "output"}),  # gausslegendre: no probe to report
    ({"method": "ig", "steps": "4", "rule": "adaptive"}, {"steps", "rule", "probe_steps", "output"}),
    ({"method": "idg", "steps": "4", "uniform": "true"}, {"steps", "uniform", "importance", "output"}),  # no probe, no placement
    ({"method": "idg", "steps": "4"}, {"steps", "uniform", "importance", "probe_steps", "placement", "output"}),
    ({"method": "left_ig", "steps": "4", "threshold": "0.5"}, {"steps", "threshold", "output"}),
    ({"method": "agi", "max_iter": "2"}, {"epsilon", "max_iter", "adversarial_classes", "num_classes", "seed", "early_stop", "output"}),
])
async def test_the_answer_lists_only_what_the_method_used(tiny_app: AppFactory, fields: dict, expected: set) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=fields)
        assert r.status_code == 200, r.text
        used = r.json()["parameters"]
        post = set(POST_STEPS) | {"smooth_seed"}  # the preset's post-steps, listed beside (the default's copies and product)
        assert set(used) - {"baseline", "preset", "target"} - post == expected
        assert all(used[k] == int(v) if v.isdigit() else True for k, v in fields.items() if k != "method")
        if "threshold" in fields:
            assert used["threshold"] == 0.5


async def test_one_name_per_method(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data={"method": "integrated_gradients"})
        assert r.status_code == 422 and "method" in r.json()["error"]["message"]
        listed = (await client.get("/models")).json()
    assert set(listed["methods"]) == set(listed["method_parameters"]) == set(METHODS)
    for name, params in listed["method_parameters"].items():
        declared = {p.name: p for p in METHODS[name].params}
        for p in params:
            d = declared[p["name"]]
            listed = (p["default"], p["minimum"], p["maximum"], p["choices"], p["description"])
            high = Settings().max_steps if d.step else d.high  # a count of model passes: the server's cap, as /openapi.json says
            assert listed == (d.default, d.low, high, list(d.choices), d.help)
        assert {p["name"] for p in params} == {p.name for p in METHODS[name].params if p.service}


def test_every_declared_service_parameter_is_a_documented_request_field() -> None:
    declared = {p.name for m in METHODS.values() for p in m.params if p.service}
    assert declared == set(METHOD_FIELDS) | (declared & set(AttributeCommon.model_fields))
    schema = AttributeParams.model_json_schema()["properties"]
    for name in METHOD_FIELDS:
        owners = [m for m in METHODS.values() if name in m.params]
        assert all(f"{m.name}: {m.params[name].help.rstrip('.')}" in schema[name]["description"] for m in owners)
