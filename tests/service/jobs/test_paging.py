"""Paging through jobs and results: integers past what the stores take are a 422, not a 500 or a cut
stream; the pages of GET /jobs follow a cursor, so jobs submitted between two pages shift nothing."""

from __future__ import annotations

from tests.service.conftest import AppFactory, serve
from tests.service.jobs.helpers import images, results, submit, wait_done

TOO_BIG = str(2**63)  # one past SQLite's INTEGER and PostgreSQL's BIGINT
BIGGEST = str(2**63 - 1)


async def test_offsets_past_the_stores_integers_are_a_422_and_the_largest_is_an_empty_page(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        job = await submit(client, images(1))
        await wait_done(client, job["id"])
        for path in ("/jobs", f"/jobs/{job['id']}/results"):
            r = await client.get(path, params={"offset": TOO_BIG})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", r.text
            assert "offset" in r.json()["error"]["message"]
        page = await client.get("/jobs", params={"offset": BIGGEST})
        assert page.status_code == 200 and page.json()["jobs"] == [] and page.json()["total"] == 1
        assert await results(client, job["id"], offset=BIGGEST) == []  # a whole (empty) stream, not a cut one
        assert len(await results(client, job["id"])) == 1


async def test_pages_follow_a_cursor_that_new_submissions_do_not_shift(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        first_three = [(await submit(client, images(1, start=i)))["id"] for i in range(3)]
        page = (await client.get("/jobs", params={"limit": 2})).json()
        assert [j["id"] for j in page["jobs"]] == first_three[::-1][:2] and "cursor=" in page["next"]
        newer = [(await submit(client, images(1, start=10 + i)))["id"] for i in range(2)]  # with offsets, these shifted the
        # next page by two: it repeated two jobs of the first page
        second = (await client.get(page["next"].replace("http://test", ""))).json()
        assert [j["id"] for j in second["jobs"]] == first_three[:1] and second["next"] is None
        everything = (await client.get("/jobs")).json()
        assert [j["id"] for j in everything["jobs"]] == (first_three + newer)[::-1] and everything["total"] == 5
        for bad in ("12_zz", "x", "1.5_" + "a" * 65):
            r = await client.get("/jobs", params={"cursor": bad})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_parameter", r.text
