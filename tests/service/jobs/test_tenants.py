"""Named API keys: each key sees, reads and deletes only the jobs it submitted (another's are 404, as
if they did not exist), an admin key every job, and the single IDG_API_KEY keeps working as the admin
key ``default``. The key's name, never the key, is in the job's status, the logs and the metrics. One
key's flood of requests cannot starve another's (each holds at most its share of the queue)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from app.core.config import Settings
from app.doors.keys import Key, load_keys, match
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.helpers import images, submit, wait_done

ALICE, BOB, OPS, LEGACY = "alice-secret-1", "bob-secret-2", "ops-secret-3", "legacy-secret-4"


def _as(key: str) -> dict[str, str]:
    return {"X-API-Key": key}


async def test_each_key_sees_and_deletes_only_its_own_jobs_and_an_admin_key_sees_all(
    tiny_app: AppFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app")  # whatever level an earlier test left the loggers at
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"# operators\nops:{OPS}:admin\n\n")
    app = tiny_app(api_key=LEGACY, api_keys=f"alice:{ALICE}, bob:{BOB}", api_keys_file=keys_file)
    async with serve(app) as client:
        ids = {}
        for name, key in (("alice", ALICE), ("bob", BOB)):
            client.headers["X-API-Key"] = key
            job = await submit(client, images(1))
            assert job["tenant"] == name
            ids[name] = job["id"]
            await wait_done(client, job["id"])
        del client.headers["X-API-Key"]
        for key, seen in ((ALICE, ["alice"]), (BOB, ["bob"]), (OPS, ["bob", "alice"]), (LEGACY, ["bob", "alice"])):
            page = (await client.get("/jobs", headers=_as(key))).json()
            assert [j["tenant"] for j in page["jobs"]] == seen and page["total"] == len(seen)
        theirs = ids["bob"]
        for method, path in (("GET", f"/jobs/{theirs}"), ("GET", f"/jobs/{theirs}/results"), ("DELETE", f"/jobs/{theirs}")):
            r = await client.request(method, path, headers=_as(ALICE))
            assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_job"), (method, path, r.text)
        assert (await client.get(f"/jobs/{theirs}", headers=_as(BOB))).json()["tenant"] == "bob"  # still there
        assert (await client.get(f"/jobs/{theirs}/results", headers=_as(OPS))).status_code == 200
        assert (await client.delete(f"/jobs/{theirs}", headers=_as(OPS))).status_code == 200  # the admin may
        assert (await client.get(f"/jobs/{ids['alice']}", headers=_as(ALICE))).status_code == 200
        assert (await client.post("/predict", files={"file": ("a.png", image_bytes())}, headers=_as(BOB))).status_code == 200
        for headers in ({}, _as("not-a-key")):
            assert (await client.get("/jobs", headers=headers)).status_code == 401
        metrics = (await client.get("/metrics")).text
    assert 'idg_durable_jobs_submitted_total{tenant="alice"} 1.0' in metrics
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "submitted by alice" in logged and "submitted by bob" in logged
    assert not any(secret in logged or secret in metrics for secret in (ALICE, BOB, OPS, LEGACY))


def test_keys_load_from_the_settings_and_the_file_and_malformed_ones_stop_the_start(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("carol:c-secret\n")
    keys = load_keys(Settings(models=["tiny"], api_key="k0", api_keys="a:k1,b:k2:admin", api_keys_file=keys_file))
    assert keys == [Key("default", "k0", True), Key("a", "k1", False), Key("b", "k2", True), Key("carol", "c-secret", False)]
    assert match(keys, "k2") == keys[2] and match(keys, "k") is None
    for bad in ("nokey", "a:", "bad name:k", "a:k1,a:k2", "a:k1,b:k1"):
        with pytest.raises(ValueError, match="API_KEYS|API keys"):
            load_keys(Settings(models=["tiny"], api_keys=bad))


async def test_one_key_flooding_cannot_starve_another_keys_requests(tiny_app: AppFactory) -> None:
    attribute = {"method": "ig", "steps": "4", "return_overlay": "false"}
    app = tiny_app(delay_s=0.05, api_keys=f"alice:{ALICE},bob:{BOB}", max_queue=4)  # IDG_KEY_SHARE 0.5: 2 requests per key
    async with serve(app) as client:

        async def explain(key: str) -> tuple[int, str, float]:
            started = time.perf_counter()
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes())}, data=attribute, headers=_as(key))
            return r.status_code, r.json().get("error", {}).get("code", ""), time.perf_counter() - started

        usual = (await explain(BOB))[2]
        flood = [asyncio.create_task(explain(ALICE)) for _ in range(12)]  # three times the whole queue
        await asyncio.sleep(0.05)
        status, code, seconds = await explain(BOB)
        flooded = await asyncio.gather(*flood)
    assert status == 200, code  # with key_share=1 alice's flood fills the queue and bob gets 503 busy
    assert seconds < 3 * usual + 1.0, (seconds, usual)
    assert {s for s, _, _ in flooded} == {200, 503} and {c for s, c, _ in flooded if s == 503} == {"key_share"}
    assert sum(s == 200 for s, _, _ in flooded) >= 2
