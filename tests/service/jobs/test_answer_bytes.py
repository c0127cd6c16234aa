"""An answer is kept once: the classes and scores its summary holds (``prediction``, ``target``, ``faithfulness``, read by
``?summary=true`` without the images) are not kept again in its full body, which gets them back when it is read; an
answer stored before (its body whole) reads as it did."""

from __future__ import annotations

import json

from app.jobs.store import Answer
from tests.service.jobs.conftest import StoreFactory

PREDICTION = [{"index": 7, "name": "cock-9f1e", "probability": 0.5}]
TARGET = {"index": 7, "name": "cock-9f1e", "probability": 0.5}
FAITH = {"insertion": 0.25, "deletion": 0.125}
RESULT = {"model": "tiny", "method": "idg", "prediction": PREDICTION, "target": TARGET, "parameters": {"target": 0},
          "heatmap_png": "iVBORw0KGgo" * 100, "faithfulness": FAITH, "curve": {"alphas": [0.0, 1.0]}}
SUMMARY = {"explained": True, "prediction": PREDICTION, "target": TARGET, "faithfulness": FAITH}


def stored_rows(store: object) -> list[tuple[str, str]]:
    with store._tx(write=False) as cur:  # type: ignore[attr-defined]  # noqa: SLF001 - the rows themselves
        cur.execute("SELECT summary, result FROM images ORDER BY idx")
        return [(r[0], r[1]) for r in cur.fetchall()]


def test_the_summary_s_classes_and_scores_are_kept_once_and_read_back_whole(make_store: StoreFactory) -> None:
    store = make_store()
    store.create_job("j", {}, None, [("a.png", b"img"), ("b.png", b"img")], 10**9)
    claims = store.claim("r", 2, 30.0)
    other = {**RESULT, "target": {**TARGET, "index": 8}}  # a body that disagrees with its summary is kept whole
    store.finish("r", "j", claims[0].index, Answer(200, SUMMARY, RESULT))
    store.finish("r", "j", claims[1].index, Answer(200, SUMMARY, other))
    (summary, result), (_, whole) = stored_rows(store)
    assert (summary + result).count("cock-9f1e") == 2  # once in the prediction, once in the target: the summary's
    assert whole.count("cock-9f1e") == 2  # kept whole (its own prediction and target)
    job = store.get_job("j")
    assert job is not None and job.bytes == sum(len(s) + len(r) for s, r in stored_rows(store))
    first, second = store.results("j", 0, 10, summary_only=False)
    assert json.loads(first.result or "") == RESULT and json.loads(second.result or "") == other
    assert json.loads(first.summary) == SUMMARY
    assert store.results("j", 0, 10, summary_only=True)[0].result is None


def test_an_answer_stored_whole_before_reads_as_it_did(make_store: StoreFactory) -> None:
    store = make_store()
    store.create_job("j", {}, None, [("a.png", b"img")], 10**9)
    (claim,) = store.claim("r", 1, 30.0)
    store.finish("r", "j", claim.index, Answer(200, SUMMARY, RESULT))
    with store._tx() as cur:  # type: ignore[attr-defined]  # noqa: SLF001 - the row as the previous version kept it
        cur.execute("UPDATE images SET result = ?", (json.dumps(RESULT, separators=(",", ":")),))
    (row,) = store.results("j", 0, 10, summary_only=False)
    assert json.loads(row.result or "") == RESULT
