"""No 5xx from a number the schema allows: every numeric field of every image route, read from the
OpenAPI schema the app serves, at its documented extremes and one past them (and, where a side is
unbounded, at values no consumer can take: 2**64, 10**30, ±1e308, inf, nan), each with the method
that takes it. Every answer (the response, a stream's closing event, each batch item) is 200 or a
4xx; a field whose consumer has a hard limit (``seed``: ``torch.Generator.manual_seed`` takes
0..2**64-1; the service takes 0..2**53-1) is accepted at its bound and refused with 422 one past it."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from httpx import AsyncClient, Response

from app.core.config import Settings
from app.main import create_app
from idg_core.methods import METHODS, InvalidParameter
from tests.service.conftest import image_bytes, serve, tiny_classifier

ROUTES = ("/predict", "/attribute", "/attribute/stream", "/attribute/batch")
# small limits so that what the schema allows stays cheap on the tiny model
SETTINGS = Settings(models=["tiny"], warmup=False, max_steps=12, max_passes=400, max_batch_files=2, request_timeout_s=60)
CHEAP: dict[str, dict[str, Any]] = {  # the fewest passes of each method, beside the field under test
    "idg": {"steps": 2, "probe_steps": 3}, "ig": {"steps": 2}, "left_ig": {"steps": 2}, "guided_ig": {"steps": 2},
    "agi": {"max_iter": 1, "adversarial_classes": 1}, "eg": {"samples": 2}, "idg_eg": {"paths": 1, "steps": 2, "probe_steps": 3},
    "la": {"max_iter": 1, "classes": 1},
}
"""A method not listed runs at its defaults (a new method is exercised without an edit here)."""
QUIET = {"return_heatmap": False, "return_overlay": False}


def _numeric(prop: dict[str, Any]) -> dict[str, Any] | None:
    """The integer or number branch of a property's schema (``anyOf`` with null included), or None."""
    for branch in [prop, *prop.get("anyOf", [])]:
        if branch.get("type") in ("integer", "number"):
            return {**prop, **branch}
    return None


def _extremes(schema: dict[str, Any]) -> Iterator[tuple[Any, str]]:
    """(value, what it is): each documented bound and one past it; beyond an unbounded side,
    values no consumer takes."""
    integer = schema["type"] == "integer"
    low, high = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        low = schema["exclusiveMinimum"]
        yield low, "exclusive minimum (one past)"
        yield (low + 1 if integer else math.nextafter(low, math.inf)), "just inside the exclusive minimum"
    elif low is not None:
        yield low, "minimum"
        yield (low - 1 if integer else math.nextafter(low, -math.inf)), "one below the minimum"
    else:
        yield from ([(-(2**64), "-2**64"), (-(10**30), "-10**30")] if integer else [(-1e308, "-1e308"), (-math.inf, "-inf")])
    if high is not None:
        yield high, "maximum"
        yield (high + 1 if integer else math.nextafter(high, math.inf)), "one above the maximum"
    else:
        yield from ([(2**63, "2**63"), (2**64, "2**64"), (10**30, "10**30")] if integer else [(1e308, "1e308"), (math.inf, "inf")])
    if not integer:
        yield math.nan, "nan"


def _owners(field: str) -> list[str]:
    """The methods that take ``field`` (none: a field every method shares)."""
    return [m.name for m in METHODS.values() if any(p.name == field and p.service for p in m.params)]


def _cases() -> Iterator[tuple[str, str, Any, str, dict[str, Any]]]:
    """(route, field, value, what, other fields) for every numeric field of every image route."""
    docs = create_app(SETTINGS).openapi()["paths"]
    for route in ROUTES:
        props = docs[route]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]["properties"]
        for field, prop in props.items():
            schema = _numeric(prop)
            if schema is None:
                continue
            # seed is drawn by AGI and by SmoothGrad: both consumers get its extremes
            contexts = [{"method": "agi"}, {"method": "ig", "smooth_samples": 1}] if field == "seed" else (
                [{"method": m} for m in _owners(field)[:1]] or [{"method": "idg"}])
            for value, what in _extremes(schema):
                for context in contexts:
                    fields = QUIET | CHEAP.get(context["method"], {}) | context if route != "/predict" else {}
                    fields.pop(field, None)
                    yield route, field, value, what, fields


CASES = list(_cases())


def _form(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan")
    return str(value).lower() if isinstance(value, bool) else str(value)


async def _send(client: AsyncClient, route: str, fields: dict[str, Any], as_json: bool = False) -> Response:
    if as_json:
        body = {"image": base64.b64encode(image_bytes()).decode(), **fields}
        return await client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
    form = {k: _form(v) for k, v in fields.items()}
    name = "files" if route == "/attribute/batch" else "file"
    return await client.post(route, files=[(name, ("a.png", image_bytes(), "image/png"))], data=form)


def outcomes(response: Response, route: str) -> list[int]:
    """The status of each answer: the response's, a stream's closing event's, or each batch item's."""
    if response.status_code != 200:
        return [response.status_code]
    if route == "/attribute/batch":
        return [item["status"] for item in response.json()["items"]]
    if route == "/attribute/stream":
        last = response.text.strip().split("\n\n")[-1].split("\n")
        assert last[0] in ("event: result", "event: error"), response.text[-500:]
        return [200 if last[0] == "event: result" else json.loads(last[1].removeprefix("data: "))["status"]]
    return [200]


@pytest.mark.parametrize("route", ROUTES)
async def test_every_numeric_field_at_its_extremes_gets_200_or_4xx(route: str) -> None:
    cases = [c for c in CASES if c[0] == route]
    assert cases, f"no numeric field found for {route}"
    wrong = []
    async with serve(create_app(SETTINGS, models={"tiny": tiny_classifier()})) as client:
        for _, field, value, what, fields in cases:
            for as_json in ((False, True) if route in ("/predict", "/attribute") else (False,)):
                if as_json and isinstance(value, float) and not math.isfinite(value):
                    continue  # JSON has no inf or nan
                r = await _send(client, route, fields | {field: value}, as_json)
                statuses = outcomes(r, route)
                if not all(s == 200 or 400 <= s < 500 for s in statuses):
                    wrong.append(f"{field}={value} ({what}, {'json' if as_json else 'form'}, {fields}): {statuses} {r.text[:300]}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("context", [{"method": "agi", **CHEAP["agi"]}, {"method": "ig", "steps": 2, "smooth_samples": 1}],
                         ids=["agi", "smoothgrad"])
@pytest.mark.parametrize("route", ["/attribute", "/attribute/stream", "/attribute/batch"])
async def test_seed_takes_what_the_generator_takes(route: str, context: dict[str, Any]) -> None:
    """The service takes 0..2**53-1 (exact in every JSON client; ``torch.Generator.manual_seed``, its
    consumer, takes up to 2**64-1): both ends answer 200; one past either, and 2**64, a 422."""
    async with serve(create_app(SETTINGS, models={"tiny": tiny_classifier()})) as client:
        for seed in (0, 2**53 - 1):
            r = await _send(client, route, QUIET | context | {"seed": seed})
            assert outcomes(r, route) == [200], r.text[:500]
        for seed in (-1, 2**53, 2**64):
            r = await _send(client, route, QUIET | context | {"seed": seed})
            assert r.status_code == 422 and r.json()["error"]["message"].startswith("seed:"), r.text[:500]


def test_the_library_refuses_a_seed_the_generator_cannot_take() -> None:
    params = METHODS["agi"].params
    assert params.validate({"seed": 2**53 - 1})["seed"] == 2**53 - 1
    for seed in (2**53, 2**64):
        with pytest.raises(InvalidParameter, match="seed"):
            params.validate({"seed": seed})
