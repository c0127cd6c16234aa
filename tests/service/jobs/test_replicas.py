"""Two replicas (two apps, each with its worker and runner) sharing jobs through a real PostgreSQL:
a job submitted to one is answered by both, every image exactly once, and either answers for it."""

from __future__ import annotations

import pytest

from tests.service.conftest import AppFactory, serve
from tests.service.jobs.helpers import images, results, submit, wait_done
from tests.service.jobs.postgres_server import reset

pytestmark = pytest.mark.slow


async def test_two_replicas_share_a_job_and_never_answer_an_image_twice(tiny_app: AppFactory, postgres_url: str) -> None:
    reset(postgres_url)
    # 0.1 s a model call: the job lasts past the second replica's first poll (POLL_S, 1 s) however fast the store is
    first, second = (tiny_app(delay_s=0.1, jobs_db_url=postgres_url, jobs_in_flight=2) for _ in range(2))
    async with serve(first) as a, serve(second) as b:
        job = await submit(a, images(24))
        status = await wait_done(b, job["id"])  # the other replica sees it
        assert (status["done"], status["failed"]) == (24, 0)
        lines = await results(b, job["id"], summary="true")
        assert [line["seq"] for line in lines] == list(range(1, 25)) and sorted(line["index"] for line in lines) == list(range(24))
        answered = (first.state.jobs.answered, second.state.jobs.answered)
        assert sum(answered) == 24 and min(answered) > 0, answered  # both worked on it
