"""Each door is an object that states what is its own (app.doors.door), and the layer every door passes through
(app.doors.layer) runs any of them without knowing one by name; every door drains through the drain's public interface
(issue #74)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from starlette.datastructures import Headers

from app.api.failures import UnhandledErrorMiddleware
from app.core.errors import ApiError
from app.doors.asgi import HttpMiddleware
from app.doors.door import DOORS, GRPC, HTTP, JOB, api_key_refusal
from app.doors.drain import Drain, DrainMiddleware
from app.doors.keys import Key
from app.doors.layer import HttpAdmission, HttpDoor
from app.doors.replica import ReplicaHeaderMiddleware

APP = Path(__file__).resolve().parents[2] / "app"


def test_each_door_states_its_label_and_statuses() -> None:
    assert [d.name for d in DOORS] == ["http", "grpc", "job"]  # the metrics' door label, unchanged
    assert (HTTP.success, HTTP.failed, HTTP.client_gone) == ("200", "500", "499") == (JOB.success, JOB.failed, JOB.client_gone)
    assert (GRPC.success, GRPC.failed, GRPC.client_gone) == ("OK", "INTERNAL", "CANCELLED")
    assert HTTP.http_families and not GRPC.http_families and not JOB.http_families
    assert JOB.consumer and not HTTP.consumer and not GRPC.consumer
    assert {"UNKNOWN", "DATA_LOSS", "CANCELLED"} <= set(GRPC.alert_statuses) and "503" in HTTP.alert_statuses


def test_each_door_maps_the_services_errors_to_its_own_statuses() -> None:
    busy, missing, late = ApiError(503, "busy", code="busy"), ApiError(404, "no such model"), ApiError(504, "late")
    assert [HTTP.status_of(e) for e in (busy, missing, late)] == ["503", "404", "504"]
    assert [GRPC.status_of(e) for e in (busy, missing, late)] == ["RESOURCE_EXHAUSTED", "NOT_FOUND", "DEADLINE_EXCEEDED"]
    assert HTTP.server_failure("503") and not HTTP.server_failure("404")
    assert GRPC.server_failure("UNAVAILABLE") and not GRPC.server_failure("NOT_FOUND")


def test_each_door_states_where_the_callers_key_is_and_one_function_refuses_for_every_door() -> None:
    keys = [Key("a", "s3cret", admin=False)]
    sent, bearer, wrong = {"x-api-key": "s3cret"}, {"authorization": "Bearer s3cret"}, {"x-api-key": "guess"}
    for door in (HTTP, GRPC):  # HTTP's headers, gRPC's invocation metadata: the same names
        assert door.brings_key
        assert door.given_key(sent) == door.given_key(bearer) == "s3cret" and door.given_key({}) is None
        assert api_key_refusal(door, keys, sent) is None and api_key_refusal(door, [], {}) is None  # no keys: open to all
        missing, refused = api_key_refusal(door, keys, {}), api_key_refusal(door, keys, wrong)
        assert missing is not None and refused is not None and missing.status == refused.status == 401
        assert missing.message.startswith("this service needs an API key") and refused.message == "the API key is wrong"
    assert HTTP.given_key(Headers({"X-API-Key": "s3cret"})) == "s3cret"  # a request's headers, as the routes read them
    # a job's image runs under the key its job was submitted with, checked by that POST /jobs: it brings none, refused never
    assert not JOB.brings_key and JOB.given_key(sent) is None and api_key_refusal(JOB, keys, {}) is None


def test_only_the_keys_module_reads_the_keys_header_names() -> None:
    """Every door finds the caller's key through its door object (Door.given_key), none by reading the names itself."""
    reading = sorted(str(p.relative_to(APP)) for p in APP.rglob("*.py")
                     for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant) and n.value == "x-api-key")
    assert reading == ["doors/keys.py"], reading


def test_the_layer_names_no_door() -> None:
    tree = ast.parse((APP / "doors" / "layer.py").read_text())
    names = {d.name for d in DOORS}
    compared = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
                for c in (n.left, *n.comparators) if isinstance(c, ast.Constant) and c.value in names
                and not (isinstance(n.left, ast.Subscript) and ast.unparse(n.left) == "scope['type']")]
    assert not compared, f"app/doors/layer.py compares a door's name on lines {compared}"


def test_no_door_edits_the_drains_private_fields() -> None:
    touching = [p.relative_to(APP) for p in APP.rglob("*.py") if p.name != "drain.py" and "drain._tasks" in p.read_text()]
    assert not touching


async def test_a_tracked_call_is_counted_and_an_abort_is_the_drains_to_answer() -> None:
    drain = Drain()
    entered = asyncio.Event()
    outcome: list[str] = []

    async def call() -> None:
        with drain.track() as task:
            try:
                entered.set()
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not drain.absorb_abort(task):
                    raise
                outcome.append("answered 503")

    running = asyncio.create_task(call())
    await entered.wait()
    assert drain.active == 1
    assert drain.abort() == 1
    await running  # the abort was taken back: the call ended by answering, not cancelled
    assert outcome == ["answered 503"] and drain.active == 0 and not running.cancelled()


async def test_a_cancellation_that_is_not_the_drains_goes_on() -> None:
    drain = Drain()
    entered = asyncio.Event()

    async def call() -> None:
        with drain.track() as task:
            entered.set()
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                assert not drain.absorb_abort(task)
                raise

    running = asyncio.create_task(call())
    await entered.wait()
    running.cancel()  # the client went away
    await asyncio.gather(running, return_exceptions=True)
    assert running.cancelled() and drain.active == 0


def test_the_http_middleware_skeleton_is_written_once() -> None:
    written = sorted(str(p.relative_to(APP)) for p in APP.rglob("*.py") if "async def __call__(self, scope" in p.read_text())
    assert written == ["doors/asgi.py"], written
    for middleware in (ReplicaHeaderMiddleware, HttpDoor, DrainMiddleware, HttpAdmission, UnhandledErrorMiddleware):
        assert issubclass(middleware, HttpMiddleware), middleware
