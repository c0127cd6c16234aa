"""Deleting a job answers at once: the store marks its one row (272 MB of answers had held ``DELETE /jobs/{id}`` 8 s,
past a client's 5 s timeout), every read, claim, answer and byte bound leaves the job out from then on, and its rows are
freed in the background a few images per transaction, after a restart too."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from app.jobs.sqlite import SqliteStore
from app.jobs.store import Answer, Store
from tests.service.conftest import AppFactory, serve
from tests.service.jobs.conftest import StoreFactory
from tests.service.jobs.helpers import images, submit, writes_meanwhile

BIG = "x" * 1_000_000
"""An answer's JSON of 1 MB (a photo's answer is about 230 kB: two PNGs as base64)."""


def rows(store: Store) -> tuple[int, int]:
    """The jobs and images rows there are, deleted or not (what the purge frees)."""
    with store._tx(write=False) as cur:  # noqa: SLF001 - the rows themselves
        cur.execute("SELECT COUNT(*) FROM jobs")
        jobs = int(cur.fetchone()[0])
        cur.execute("SELECT COUNT(*) FROM images")
        return jobs, int(cur.fetchone()[0])


def answered_job(store: Store, job_id: str, n: int, tenant: str | None = None) -> None:
    """A job of ``n`` images, all answered with :data:`BIG`."""
    store.create_job(job_id, {}, "http://hooks.example/done", [(f"{i}.png", b"img") for i in range(n)], 10**12, tenant=tenant)
    for claim in store.claim("r", n, 30.0):
        assert store.finish("r", claim.job_id, claim.index, Answer(200, {"ok": True}, {"big": BIG})) is not None


def test_a_deleted_job_is_gone_at_once_for_every_read_claim_answer_and_bound_and_its_rows_are_freed_by_the_purge(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    answered_job(store, "big", 8, tenant="alice")
    store.create_job("open", {}, None, [(f"{i}.png", b"img") for i in range(40)], 10**12, tenant="alice")
    store.create_job("other", {}, None, [("a.png", b"img")], 10**12, tenant="alice")
    (held,) = store.claim("r", 1, 30.0)  # the first image of "open" (its index 0 comes before "other"'s)
    assert held.job_id == "open"
    before = rows(store)
    assert store.delete_job("big") and store.delete_job("open")
    assert not store.delete_job("big")  # once
    assert rows(store) == before  # the deletion itself touched no image: one row marked each
    assert store.get_job("big") is None and store.get_job("open") is None
    assert [j.id for j in store.list_jobs(0, 10)[0]] == ["other"] and store.list_jobs(0, 10)[1] == 1
    assert [j.id for j in store.list_jobs(0, 10, tenant="alice")[0]] == ["other"]
    assert store.due_callbacks() == []  # "big" had its callback due: no longer
    # the 39 pending images of "open" come first in the claim's order: none is claimed, "other"'s is
    assert [c.job_id for c in store.claim("r2", 10, 30.0)] == ["other"]
    assert store.finish("r", "open", held.index, Answer(200, {}, {})) is None  # an answer of a deleted job: not stored
    # its bytes count against no bound: the whole store's bound is this job's own size
    store.create_job("next", {}, None, [("a.png", bytes(900))], 1000, tenant="alice", max_tenant_bytes=1000)
    other = make_store()  # another process (a restart) purges what this one deleted
    assert other.purge() == 2
    assert rows(other) == (2, 2)  # "other" and "next", an image each
    assert other.purge() == 0


def test_a_purge_takes_the_store_a_few_images_at_a_time(tmp_path: Path) -> None:
    """Another write waits one purge transaction at most, never the whole job's."""

    from app.jobs import sql

    store = SqliteStore(tmp_path)
    answered_job(store, "big", 64)  # 64 MB of answers: 4 transactions of 16
    store.create_job("live", {}, None, [("a.png", b"img")], 10**12)
    assert store.delete_job("big")
    with writes_meanwhile(store, "live") as waits:
        began = time.monotonic()
        assert store.purge() == 1
        took = time.monotonic() - began
    assert rows(store) == (1, 1)
    # the writer took turns between the purge's parts: no wait near the whole purge's time, as one transaction would make
    # (a margin for a loaded 2-core machine, where one part's commit alone took 0.9 s of a 1.7 s purge)
    assert waits and max(waits) < max(0.5, took * 0.7), (max(waits), took)
    assert sql.PURGE_ROWS < 64
    store.close()


async def test_delete_answers_at_once_and_the_rows_are_freed_behind_it(tiny_app: AppFactory) -> None:
    app = tiny_app()
    async with serve(app) as client:
        job = await submit(client, images(1))
        store = app.state.jobs.store
        await asyncio.to_thread(answered_job, store, "big", 48)  # 48 MB of answers
        began = time.monotonic()
        r = await client.delete("/jobs/big")
        took = time.monotonic() - began
        assert r.status_code == 200 and r.json() == {"id": "big", "deleted": True, "dropped_in_flight": 0}, r.text
        assert took < 1.0, took
        assert (await client.get("/jobs/big")).status_code == 404
        assert (await client.get("/jobs/big/results")).status_code == 404
        assert (await client.delete("/jobs/big")).status_code == 404
        for _ in range(600):  # freed in the background
            if await asyncio.to_thread(rows, store) == (1, 1):
                break
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(rows, store) == (1, 1)  # the submitted job's, kept
        assert (await client.get(f"/jobs/{job['id']}")).status_code == 200


async def test_a_job_deleted_but_not_yet_freed_is_freed_after_a_restart(tiny_app: AppFactory, tmp_path: Path) -> None:
    before = SqliteStore(tmp_path)  # a process that marked the job deleted and stopped before freeing it
    answered_job(before, "big", 6)
    assert before.delete_job("big")
    assert rows(before) == (1, 6)
    before.close()
    app = tiny_app(data_dir=tmp_path, warmup=False)
    async with serve(app) as client:
        for _ in range(600):
            if await asyncio.to_thread(rows, app.state.jobs.store) == (0, 0):
                break
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(rows, app.state.jobs.store) == (0, 0)
        assert (await client.get("/jobs")).json()["total"] == 0
