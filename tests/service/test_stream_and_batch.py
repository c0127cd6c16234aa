"""Progress as Server-Sent Events, and the multi-image batch endpoint."""

from __future__ import annotations

import json

from tests.service.conftest import AppFactory, image_bytes, serve


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_stream_reports_progress_then_the_result(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        # preset=fast: the stages of IDG alone (the default adds Grad-CAM's layer gradients beside the probe, and noisy copies)
        r = await client.post("/attribute/stream", files={"file": ("a.png", image_bytes())},
                              data={"preset": "fast", "steps": "6", "probe_steps": "5"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        names = [e for e, _ in events]
        assert names[0] == "accepted" and names[-1] == "result"
        assert names.index("queued") < names.index("started") < names.index("progress")
        progress = [d for e, d in events if e == "progress"]
        assert [(d["done"], d["next"], d["points"]) for d in progress] == [("prediction", "probe", 5), ("probe", "main pass", 6)]
        assert events[-1][1]["curve"]["alphas"] and events[-1][1]["heatmap_png"]


async def test_stream_reports_errors_as_events(tiny_app: AppFactory) -> None:
    async with serve(tiny_app()) as client:
        r = await client.post("/attribute/stream", files={"file": ("a.txt", b"not an image")})
        (last_event, payload) = _events(r.text)[-1]
        assert last_event == "error" and payload["status"] == 415
        r = await client.post("/attribute/stream", files={"file": ("a.png", image_bytes())}, data={"steps": "0"})
        assert r.status_code == 422  # parameters are checked before the stream opens


async def test_batch_gives_each_image_its_own_status(tiny_app: AppFactory) -> None:
    app = tiny_app(batch_wait_ms=100.0, max_batch_images=256, max_round_images=512)
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        files = [
            ("files", ("good1.png", image_bytes())),
            ("files", ("bad.txt", b"plain text")),
            ("files", ("good2.png", image_bytes((5, 5, 250)))),
        ]
        r = await client.post("/attribute/batch", files=files,
                              data={"preset": "fast", "steps": "5", "probe_steps": "5", "return_overlay": "false"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [i["status"] for i in body["items"]] == [200, 415, 200]
        assert body["succeeded"] == 2 and body["failed"] == 1
        assert body["items"][1]["error"]["message"].startswith("the file is not an image")
        assert body["items"][0]["result"]["curve"]["alphas"]
        assert len(net.calls) == 3  # both good images share the predict, probe and main calls


async def test_batch_limits(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(max_batch_files=2)) as client:
        files = [("files", (f"{i}.png", image_bytes())) for i in range(3)]
        r = await client.post("/attribute/batch", files=files)
        assert r.status_code == 413 and r.json()["error"]["message"] == "a batch holds at most 2 images"
        r = await client.post("/attribute/batch", data={"steps": "5"}, files={"other": ("a", b"x")})
        assert r.status_code == 422 and "files" in r.json()["error"]["message"]
