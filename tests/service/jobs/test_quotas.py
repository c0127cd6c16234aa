"""Stored bytes are bounded per API key (IDG_JOBS_MAX_BYTES_PER_KEY: 413 ``quota_exceeded``) and in all
(IDG_JOBS_MAX_BYTES: 507 ``storage_full``), checked in the transaction that would store the job, so a refused job
leaves nothing behind (issue 59, item 7). Against real stores, and through the app on a real SQLite store."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from app.jobs.store import QuotaExceeded, Store, StoreFull
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.jobs.conftest import StoreFactory
from tests.service.jobs.helpers import FAST

TOTAL, PER_KEY, IMAGE = 1000, 600, 100
"""The store's bound, each key's, and the bytes of one image in the store tests."""


def _create(store: Store, tenant: str | None, n: int) -> str:
    job_id = uuid.uuid4().hex
    store.create_job(job_id, {}, None, [(f"i{i}.png", bytes(IMAGE)) for i in range(n)], TOTAL, tenant,
                     max_tenant_bytes=PER_KEY)
    return job_id


def _count(store: Store) -> tuple[int, int]:
    """Jobs and images rows."""
    with store.transaction(write=False) as cur:  # type: ignore[attr-defined]  # both SQL stores have it
        cur.execute("SELECT COUNT(*) FROM jobs")
        jobs = int(cur.fetchone()[0])
        cur.execute("SELECT COUNT(*) FROM images")
        return jobs, int(cur.fetchone()[0])


def test_a_key_past_its_quota_or_a_full_store_stores_nothing_of_the_job(make_store: StoreFactory) -> None:
    store = make_store()
    first = _create(store, "alice", 5)  # alice 500, all 500
    with pytest.raises(QuotaExceeded, match=r"key 'alice' hold 500 bytes in the job store; this job's 200 more would pass "
                       r"IDG_JOBS_MAX_BYTES_PER_KEY \(600\)"):
        _create(store, "alice", 2)
    assert _count(store) == (1, 5)
    _create(store, "alice", 1)  # alice 600: at the bound, not beyond
    _create(store, "bob", 4)  # bob 400, all 1000: the store's bound
    with pytest.raises(StoreFull, match="IDG_JOBS_MAX_BYTES"):
        _create(store, "carol", 1)  # within carol's quota, not the store's
    with pytest.raises(QuotaExceeded):  # past both: the key's own bound is the one it can do something about
        _create(store, "alice", 1)
    assert _count(store) == (3, 10)
    store.delete_job(first)  # alice 100, all 500: her deleted job's bytes are hers again
    _create(store, "alice", 5)
    store.purge()  # the deleted job's rows, freed in the background
    assert _count(store) == (3, 10)
    for job in store.list_jobs(0, 10)[0]:
        store.delete_job(job.id)
    _create(store, None, 7)  # no key (none configured): only the store's bound
    store.purge()
    assert _count(store) == (1, 7)


def _rows(path: Path) -> tuple[int, int, int]:
    """Jobs rows, images rows, and images answered, read on a connection of its own."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        jobs, answered = conn.execute("SELECT COUNT(*), COALESCE(SUM(done + failed), 0) FROM jobs").fetchone()
        return int(jobs), int(conn.execute("SELECT COUNT(*) FROM images").fetchone()[0]), int(answered)


async def test_past_its_quota_a_key_gets_413_and_past_the_store_s_bound_anyone_gets_507(tiny_app: AppFactory) -> None:
    """Three keys, each may hold 3 images' bytes, the store 5; the model slow (2 s a call) so that no image is answered
    (its bytes then become its answer's) while the bounds are checked: the test reads the store to be sure."""
    photo = image_bytes()
    size = len(photo)
    keys = {"alice": "alice-key-1", "bob": "bob-key-2", "carol": "carol-key-3"}
    app = tiny_app(delay_s=2.0, warmup=False, jobs_in_flight=1, api_keys=",".join(f"{n}:{k}" for n, k in keys.items()),
                   jobs_max_bytes_per_key=3 * size, jobs_max_bytes=5 * size)
    async with serve(app) as client:
        path = app.state.jobs.store.path

        async def post(key: str, n: int, status: int, code: str | None = None) -> str:
            """The job's id (202), or the error's message, checked to store nothing."""
            before = _rows(path)
            files = [("files", (f"p{i}.png", photo, "image/png")) for i in range(n)]
            r = await client.post("/jobs", files=files, data=FAST, headers={"X-API-Key": keys[key]})
            assert r.status_code == status, (key, n, r.text)
            if code is None:
                return str(r.json()["id"])
            error = r.json()["error"]
            assert (error["status"], error["code"]) == (status, code), error
            assert _rows(path) == before, (key, n)  # nothing of it stored
            return str(error["message"])

        first = await post("alice", 2, 202)
        says = await post("alice", 2, 413, "quota_exceeded")  # 4 images' bytes > 3
        assert f"key 'alice' hold {2 * size} bytes" in says and f"IDG_JOBS_MAX_BYTES_PER_KEY ({3 * size})" in says, says
        await post("alice", 1, 202)  # at her bound
        await post("bob", 2, 202)  # bob's own quota; the store at its bound
        says = await post("carol", 1, 507, "storage_full")
        assert f"IDG_JOBS_MAX_BYTES ({5 * size})" in says, says
        assert _rows(path) == (3, 5, 0)  # and none answered yet: the bytes counted were the images'
        r = await client.delete(f"/jobs/{first}", headers={"X-API-Key": keys["alice"]})
        assert r.status_code == 200, r.text
        await post("alice", 2, 202)  # her deleted job's bytes are hers, and the store's, again
        assert _rows(path)[2] == 0
        for key in keys.values():  # the runner drops them before its next model call: the app stops without waiting
            for job in (await client.get("/jobs", headers={"X-API-Key": key})).json()["jobs"]:
                assert (await client.delete(f"/jobs/{job['id']}", headers={"X-API-Key": key})).status_code == 200
