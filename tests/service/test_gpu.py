"""The service on a CUDA device: concurrent requests batched on the GPU, memory reported, bad input isolated."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from app.core.config import Settings
from app.main import create_app
from idg_models import set_tf32
from tests.models import small_classifier
from tests.service.conftest import image_bytes, serve, tiny_classifier

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
async def test_concurrent_attributions_on_cuda(precision: str) -> None:
    tiny = tiny_classifier()
    app = create_app(Settings(models=["tiny"], device="cuda", precision=precision, channels_last=True, batch_wait_ms=50.0),
                     models={"tiny": tiny})
    async with serve(app) as client:
        info = (await client.get("/models")).json()
        assert info["device"].startswith("cuda")
        assert next(tiny.parameters()).is_cuda
        before = len(tiny.net.calls)
        colours = [(40, 120, 200), (200, 40, 10), (10, 200, 40), (120, 120, 120)]
        posts = [client.post("/attribute", files={"file": ("a.png", image_bytes(c), "image/png")},
                             data={"method": "idg", "steps": "16", "probe_steps": "16", "target": "3"}) for c in colours]
        bad = client.post("/attribute", files={"file": ("a.png", b"not an image", "image/png")})
        *answers, refused = await asyncio.gather(*posts, bad)
        assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
        assert refused.status_code == 415
        calls = tiny.net.calls[before:]
        assert len(calls) < 4 * 3, calls  # served one by one, each request needs >= 3 model calls
        metrics = (await client.get("/metrics")).text
        line = next(ln for ln in metrics.splitlines() if ln.startswith("idg_device_memory_bytes") and 'kind="peak"' in ln)
        assert float(line.split()[-1]) > 0
    set_tf32(False)  # the switches are process-wide: leave them as fp32 for the next test


async def test_on_cuda_every_call_runs_at_a_warmed_size_on_the_call_stream_and_answers_as_the_library() -> None:
    """The CUDA defaults: fixed call sizes (warmed before ready on the device stage's thread and stream),
    calls pipelined on their own stream. Mixed methods concurrently meet no unwarmed size, and an
    answer read across the streams is the library's own (a missing stream wait would read garbage)."""
    from tests.service.test_call_pipeline import _metric, _mixed_traffic

    app = create_app(Settings(models=["tiny"], device="cuda", precision="fp32", batch_wait_ms=5.0, max_batch_images=32),
                     models={"tiny": tiny_classifier()})
    codes, calls, metrics, info = await _mixed_traffic(app)
    assert set(codes) == {200}
    # TinyNet reads a CUDA value on the host in its forward (its poison check), which no graph can capture: eager, said in /models
    assert info["call_sizes"] == [8, 16, 32] and info["unwarmed_calls"] == 0 and info["cuda_graphs"] is False
    assert calls and set(calls) <= {8, 16, 32}, sorted(set(calls))
    assert _metric(metrics, "idg_unwarmed_calls") == 0
    fields = {"method": "idg", "steps": "9", "probe_steps": "5", "target": "3", "return_overlay": "false"}
    app = create_app(Settings(models=["tiny"], device="cuda", precision="fp32", max_batch_images=32), models={"tiny": tiny_classifier()})
    async with serve(app) as client:
        posts = [client.post("/attribute", files={"file": ("a.png", image_bytes((i * 20, 50, 90)), "image/png")}, data=fields)
                 for i in range(6)]
        served = [r.json() for r in await asyncio.gather(*posts)]
    library = create_app(Settings(models=["tiny"], device="cuda", precision="fp32", fixed_call_sizes=False, pipeline_depth=1,
                                  max_batch_images=32), models={"tiny": tiny_classifier()})
    async with serve(library) as client:
        for i, got in enumerate(served):
            r = await client.post("/attribute", files={"file": ("a.png", image_bytes((i * 20, 50, 90)), "image/png")}, data=fields)
            want = r.json()
            assert got["curve"]["alphas"] == want["curve"]["alphas"]
            assert max(abs(a - b) for a, b in zip(got["curve"]["logits"], want["curve"]["logits"], strict=True)) < 1e-3
    set_tf32(False)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_replayed_cuda_graph_answers_as_an_eager_call(precision: str) -> None:
    """Each captured (size, kind) gives the real rows' outputs of an eager call, whatever the padding rows
    and targets held before (static buffers reused across replays), and refuses a target out of range."""
    from idg_core.model_calls import RowSelect, run_call
    from idg_models import tune
    from idg_models.cuda_graphs import capture_graphs

    model = tune(small_classifier().cuda(), precision=precision, channels_last=False)
    graphs = capture_graphs(model, (4, 8), 16, torch.device("cuda"))
    assert set(graphs) == {(4, False), (4, True), (8, False), (8, True)}
    for size, n in ((8, 8), (8, 5), (4, 3), (8, 6)):
        x = torch.rand(size, 3, 16, 16).cuda()
        rows = RowSelect(torch.randint(0, 10, (n,)).cuda(), (torch.rand(n) > 0.5).cuda(), 9)
        for grad in (False, True):
            got = graphs[(size, grad)].run(x, rows)
            want = run_call(model, x, rows, grad)
            for g, w in zip(got, want, strict=True):
                assert (g is None) == (w is None)
                if g is not None and w is not None:
                    assert g.shape == w.shape and torch.allclose(g, w, atol=1e-4 if precision == "fp32" else 2e-2), (size, n, grad)
    zeros, x4 = torch.zeros(2, dtype=torch.long, device="cuda"), torch.rand(4, 3, 16, 16).cuda()
    with pytest.raises(ValueError, match="target must be < 10"):
        graphs[(4, False)].run(x4, RowSelect(zeros, None, 10))
    set_tf32(False)


def test_the_library_replays_graphs_and_answers_as_eagerly() -> None:
    """idg(..., shapes=graphed_shapes(...)): every call replays a captured graph (3 images' points in calls of 8, the
    last of each pass padded), and the attributions are eager's."""
    from idg_core import CallStats, idg
    from idg_models import tune
    from idg_models.cuda_graphs import graphed_shapes

    model = tune(small_classifier().cuda(), precision="fp32", channels_last=False)
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(2)).cuda()
    shapes = graphed_shapes(model, (8,), 16)
    assert set(shapes.graphs) == {(8, False), (8, True)}
    replays = dict.fromkeys(shapes.graphs, 0)
    for key, graph in shapes.graphs.items():
        real_run = graph.run
        def counted(inputs: torch.Tensor, rows: object, key: tuple[int, bool] = key, real_run: object = real_run) -> object:
            replays[key] += 1
            return real_run(inputs, rows)  # type: ignore[operator]
        graph.run = counted  # type: ignore[method-assign]
    stats = CallStats()
    got = idg(model, x, "black", [1, 2, 3], steps=13, probe_steps=13, batch_size=8, shapes=shapes, stats=stats)
    want = idg(model, x, "black", [1, 2, 3], steps=13, probe_steps=13, batch_size=8)
    assert min(replays.values()) >= 2 and sum(replays.values()) == stats.calls and set(stats.call_sizes) == {8}
    assert torch.allclose(got.attributions, want.attributions, atol=1e-5, rtol=1e-4)
    assert shapes.unwarmed_calls == 0 and shapes.real_rows + shapes.padded_rows == 8 * stats.calls and shapes.padded_rows > 0
    set_tf32(False)


def test_a_network_that_reads_the_device_on_the_host_runs_eagerly() -> None:
    """TinyNet's forward reads a CUDA value on the host (its poison check): capture fails, no graph is kept."""
    from idg_models.cuda_graphs import capture_graphs

    assert capture_graphs(tiny_classifier().cuda(), (4, 8), 32, torch.device("cuda")) == {}
    assert (torch.rand(2).cuda() * 2).shape == (2,)  # the device still works (the service draws random numbers on the CPU)


async def test_the_service_replays_graphs_and_answers_as_without_them() -> None:
    fields = {"method": "idg", "steps": "9", "probe_steps": "5", "target": "3", "return_overlay": "false"}
    answers = []
    for graphs in (True, False):
        app = create_app(Settings(models=["small"], device="cuda", precision="fp32", max_batch_images=32, cuda_graphs=graphs,
                                  pipeline_depth=2 if graphs else 1), models={"small": small_classifier()})
        async with serve(app) as client:
            info = (await client.get("/models")).json()["models"][0]
            assert info["cuda_graphs"] is graphs and info["unwarmed_calls"] == 0
            posts = [client.post("/attribute", files={"file": ("a.png", image_bytes((i * 20, 50, 90)), "image/png")}, data=fields)
                     for i in range(6)]
            answers.append([r.json() for r in await asyncio.gather(*posts)])
    for got, want in zip(*answers, strict=True):
        assert got["curve"]["alphas"] == want["curve"]["alphas"]
        assert max(abs(a - b) for a, b in zip(got["curve"]["logits"], want["curve"]["logits"], strict=True)) < 1e-3
    set_tf32(False)


def test_two_server_processes_share_one_gpu_and_both_answer(tmp_path: Path) -> None:
    """IDG_PROCESSES=2 on CUDA: each process holds its own CUDA context and copy of the model on the one GPU, and
    both answer on the one port with the same numbers."""
    from tests.service.reliability.server_app import serve_process

    with serve_process(tmp_path / "server.log", IDG_PROCESSES=2, IDG_DEVICE="cuda") as served:
        answers: dict[str, list[float]] = {}
        deadline = time.monotonic() + 60
        while len(answers) < 2 and time.monotonic() < deadline:
            r = httpx.post(served.url + "/predict", files={"file": ("x.png", image_bytes(), "image/png")}, timeout=60)
            assert r.status_code == 200, r.text
            answers[r.headers["x-idg-replica"]] = [c["probability"] for c in r.json()["top_k"]]
        assert len(answers) == 2, served.log()
        first, second = answers.values()
        assert first == pytest.approx(second, abs=1e-4)
        assert served.log().count("ready: tiny on cuda") == 2


def test_auto_processes_on_cuda_start_a_second_once_the_first_is_warm_when_the_gpu_holds_it(tmp_path: Path) -> None:
    """IDG_PROCESSES=auto (the default) on CUDA with the tiny model, which fits a GPU many times: the launcher starts one
    process, reads what it holds once warm, starts the second, and both answer."""
    from app.processes.launch import auto_processes, host_cores
    from tests.service.reliability.server_app import serve_process

    want = auto_processes(True, host_cores())[0]
    with serve_process(tmp_path / "server.log", IDG_PROCESSES="auto", IDG_DEVICE="cuda", IDG_WARMUP="true") as served:
        deadline = time.monotonic() + 120
        while f"IDG_PROCESSES=auto: {want} server process" not in served.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"IDG_PROCESSES=auto: {want} server process" in served.log(), served.log()
        replicas: set[str] = set()
        while len(replicas) < want and time.monotonic() < deadline:
            r = httpx.post(served.url + "/predict", files={"file": ("x.png", image_bytes(), "image/png")}, timeout=60)
            assert r.status_code == 200, r.text
            replicas.add(r.headers["x-idg-replica"])
        assert len(replicas) == want, served.log()


class _Sleeps(torch.nn.Module):
    """The wrapped network, then a kernel of ``cycles`` GPU clock cycles (it spins on the device, not the host: 10^9
    cycles are 0.5-0.7 s at a data-centre GPU's 1.4-2 GHz), queued behind the call's outputs."""

    def __init__(self, net: torch.nn.Module, cycles: int) -> None:
        super().__init__()
        self.net, self.cycles = net, cycles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)  # first: the tiny network reads a value on the host, which waits for the device
        torch.cuda._sleep(self.cycles)  # then the long kernel, which only the end thread waits for
        return out


def _thread_cpu_s(name: str) -> float:
    """CPU seconds of this process's threads whose OS name is ``name`` (the stage names its threads)."""
    total = 0.0
    for task in Path("/proc/self/task").iterdir():
        if (task / "comm").read_text().strip() == name:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def test_the_end_thread_sleeps_while_a_call_runs_on_the_gpu() -> None:
    """The thread that waits for each call's end waits on a blocking CUDA event: a default event's synchronize spins a
    host core for as long as the kernels run, taken from decode and render (a core per server process)."""
    from app.monitoring.prometheus import Metrics
    from app.worker.engine import Worker
    from app.worker.jobs import Job
    from idg_core.types import AttributionResult, Plan, Query

    device = torch.device("cuda")
    model = tiny_classifier().to(device)
    model.net = _Sleeps(model.net, 10**9)

    def plan() -> Plan:
        yield [Query.at(torch.rand(1, 3, 32, 32, device=device), 0, grad=False, output="logit")]
        return AttributionResult(attributions=torch.zeros(1, 3, 2, 2))

    worker = Worker({"tiny": model}, device, Metrics(), max_batch_images=8, max_round_images=8, batch_wait_ms=0, max_queue=8)
    worker.start()
    loop = asyncio.get_running_loop()
    try:
        before, started = _thread_cpu_s("idg-device-done"), time.monotonic()
        job = Job("tiny", plan(), "attribute", time.monotonic() + 30, loop, loop.create_future())
        worker.submit(job)
        await asyncio.wait_for(job.future, 20)
        took, spent = time.monotonic() - started, _thread_cpu_s("idg-device-done") - before
    finally:
        worker.stop(1)
    assert took >= 0.3, took  # the call did run a good part of a second on the GPU
    assert spent < took / 5, f"the end thread spent {spent:.2f} s of CPU waiting for a {took:.2f} s call"


async def test_the_worker_reads_a_calls_outputs_without_waiting_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker thread's plans read each call's values, arg-max classes and a prediction's logits from host copies
    made behind the call on its stream: under CUDA's sync debug mode no synchronisation comes from the worker thread
    (the H200's profile had found three to five per attribution, each waiting behind the next model call), and the
    answers are those of the same requests one at a time."""
    import threading
    import warnings

    app = create_app(Settings(models=["small"], device="cuda", precision="fp32", max_batch_images=32),
                     models={"small": small_classifier()})
    fields = {"method": "idg", "steps": "9", "probe_steps": "5", "return_overlay": "false"}

    def post(client: httpx.AsyncClient, i: int) -> Any:
        return client.post("/attribute", files={"file": ("a.png", image_bytes((i * 20, 50, 90)), "image/png")}, data=fields)

    async with serve(app) as client:
        alone = [(await post(client, i)).json() for i in range(4)]  # one at a time (and the warm-up of every path)
        threads: list[str] = []

        def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
            if "synchroniz" in str(message):
                threads.append(threading.current_thread().name)

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            monkeypatch.setattr(warnings, "showwarning", show)
            torch.cuda.set_sync_debug_mode("warn")
            try:
                together = [r.json() for r in await asyncio.gather(*(post(client, i) for i in range(4)))]
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert "idg-worker" not in threads, threads
    for got, want in zip(together, alone, strict=True):
        assert got["target"] == want["target"] and got["curve"]["alphas"] == want["curve"]["alphas"]
        assert max(abs(a - b) for a, b in zip(got["curve"]["logits"], want["curve"]["logits"], strict=True)) < 1e-3
