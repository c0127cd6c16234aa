"""The service put together from its settings: :func:`running` is the app's lifespan (:func:`app.main.create_app`).

Start-up, in this order (readiness comes last): the process's runtime; the device; the models, loaded, calibrated,
tuned and (for benchmarks) on the simulated device; each model's call shapes; the worker, warmed up on its own thread;
the image threads; the service, its warm-up requests, the jobs, the frozen start-up objects; ready; the gRPC door.
Shutdown takes them apart in the reverse order. Each step is a small function of the settings' section it reads.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import torch
from fastapi import FastAPI

from app.core.config import ServerSettings, Settings, SimulatedSettings, WorkerSettings
from app.core.errors import ApiError
from app.core.image_threads import image_thread_pool, image_threads, processes_on_host
from app.core.model_loading import ModelLoadError, apply_calibrations, load_models, pick_device, warm_up
from app.doors.drain import Drain, wait_thread
from app.jobs.runner import start_jobs
from app.monitoring.prometheus import Metrics, weights_digest
from app.processes.launch import host_cores
from app.schemas import AttributeParams
from app.service import Service
from app.service.planning import plan_attribute
from app.worker.engine import Worker
from idg_core.call_shapes import CallShapes
from idg_models import ImageClassifier, keep_freed_memory
from idg_models.compiled import compiled_part
from idg_models.speed import model_precision, tune_all
from idg_serving.simulated import SharedTimeline, SimulatedAccelerator, Timeline

log = logging.getLogger("app")


@asynccontextmanager
async def running(app: FastAPI, settings: Settings, metrics: Metrics, drain: Drain,
                  models: dict[str, ImageClassifier] | None = None) -> AsyncIterator[None]:
    """Start the service on ``app.state`` (``service``, ``jobs``, ``ready``), serve, and stop it. ``models`` replaces
    loading ``settings.models`` (tests inject tiny ones)."""
    configure_process(settings)
    device = pick_device(settings.device)
    with torch_threads(settings, device):  # process-wide: as it was once the service stops
        loaded = await prepare_models(settings, device, metrics, models)
        check_defaults_fit(settings, loaded)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = settings.cudnn_benchmark
        shapes = call_shapes(settings, device, loaded)
        worker = build_worker(settings, loaded, device, metrics, shapes)
        await start_worker(worker, settings, loaded, shapes, metrics)
        with image_thread_pool(image_thread_count(settings)):  # closed on every way out, a failed start-up too
            app.state.service = service = Service(settings, loaded, worker, metrics, device)
            if settings.warmup:
                await service.warm_up_requests()
            app.state.jobs = await start_jobs(service, lambda: app.state.draining or not app.state.ready, app.state.doors)
            if settings.gc_freeze:
                await asyncio.to_thread(gc.collect)
                gc.freeze()  # start-up's objects live on: the cyclic collector's full passes no longer walk them under traffic
            app.state.ready = True
            metrics.set_ready(True)
            log.info("ready: %s on %s", ", ".join(loaded), device)
            grpc_server = None
            try:  # IDG_GRPC_PORT: the Open Inference Protocol over gRPC (a failure to open it stops what started)
                grpc_server = await start_grpc(app, settings) if settings.grpc_port else None
                yield
            finally:
                await stop(app, settings, metrics, drain, worker, grpc_server)


def check_defaults_fit(settings: Settings, models: dict[str, ImageClassifier]) -> None:
    """A :class:`ModelLoadError` where a default ``/attribute`` (no field but the model) could not run under this server's
    limits (``IDG_MAX_PASSES=1``, ``IDG_MAX_STEPS=2``): it had started ready and answered every such request 422."""
    for name, model in models.items():
        try:
            plan_attribute(settings, AttributeParams.model_validate({"model": name}), model)
        except ApiError as err:
            raise ModelLoadError(f"a default /attribute on {name} could not run under this server's limits (IDG_MAX_STEPS="
                                 f"{settings.max_steps}, IDG_MAX_PASSES={settings.max_passes}): {err.message}") from err


@contextmanager
def torch_threads(settings: Settings, device: torch.device) -> Iterator[None]:
    """Torch's intra-op threads while the service runs (process-wide; restored once it stops): ``IDG_TORCH_THREADS``,
    else 1 where the models run on an accelerator (a real one, or the simulated device), whose host does only small
    tensor work, in many threads at once; else torch's choice."""
    threads = settings.torch_threads or (1 if device.type != "cpu" or settings.simulated_call_ms is not None else None)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
        log.info("torch intra-op threads: %d (%s)", threads, "IDG_TORCH_THREADS" if settings.torch_threads else
                 "the models run on an accelerator: the host's tensor ops are small and run in many threads at once")
    try:
        yield
    finally:
        torch.set_num_threads(before)


def configure_process(settings: WorkerSettings) -> None:
    """The process's runtime, before anything loads: the GIL's switch interval, malloc."""
    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1000)
    if settings.keep_freed_memory:
        keep_freed_memory()


async def prepare_models(settings: Settings, device: torch.device, metrics: Metrics,
                         models: dict[str, ImageClassifier] | None = None) -> dict[str, ImageClassifier]:
    """The models as they will run on ``device``: loaded (or ``models``), calibrated, tuned (precision, memory format,
    batch norm folded, compiled), on the simulated device where set; each one's source, precision and weights digest
    (as loaded) in the metrics. A model that cannot be loaded or tuned is a :class:`ModelLoadError`."""
    loaded = models if models is not None else await asyncio.to_thread(
        load_models, settings.models, device, settings.models_file, settings.models_file_any_path)
    await asyncio.to_thread(apply_calibrations, loaded, device, settings)  # IDG_CALIBRATION_FILE / IDG_CALIBRATE_IMAGES
    digests = await asyncio.to_thread(lambda: {name: weights_digest(m.net) for name, m in loaded.items()})  # as loaded
    try:
        loaded = tune_all(loaded, device, precision=settings.precision, channels_last=settings.channels_last, compile=settings.compile,
                          fold_bn=settings.fold_bn, compile_sizes=settings.compile_sizes, batch_images=settings.batch_images(device))
    except ValueError as err:
        raise ModelLoadError(str(err)) from err
    metrics.init_models(loaded)
    for name, m in loaded.items():
        metrics.set_model_info(name, m.source, model_precision(m, device), digests[name])
    simulate_device(loaded, settings)
    return loaded


def simulate_device(models: dict[str, ImageClassifier], settings: SimulatedSettings) -> None:
    """With ``IDG_SIMULATED_CALL_MS``, every model's calls on the simulated device: one device, so the models' calls share
    one timeline (the processes' file, with IDG_PROCESSES); only a stream's calls are booked on one."""
    if settings.simulated_call_ms is None:
        return
    path = settings.simulated_timeline
    timeline = (SharedTimeline(path) if path is not None else Timeline()) if settings.simulated_stream else None
    for m in models.values():
        m.net = SimulatedAccelerator(m.net, settings.simulated_call_ms, settings.simulated_image_ms,
                                     stream=settings.simulated_stream, timeline=timeline)
    log.warning("simulated device: every model call takes %g ms + %g ms per image (IDG_SIMULATED_CALL_MS)",
                settings.simulated_call_ms, settings.simulated_image_ms)


def call_shapes(settings: WorkerSettings, device: torch.device, models: dict[str, ImageClassifier]) -> dict[str, CallShapes]:
    """Each model's call sizes: fixed (a compiled model's are those it was compiled at) and captured as CUDA graphs
    where set, or any size."""
    fixed = settings.fixed_sizes_on(device)
    shapes = {}
    for name, m in models.items():
        part = compiled_part(m)
        sizes = settings.sizes_for(device, m.max_batch, part.sizes if part else None) if fixed else ()
        shapes[name] = CallShapes(sizes, use_graphs=settings.cuda_graphs and fixed and part is None)
    return shapes


def build_worker(settings: Settings, models: dict[str, ImageClassifier], device: torch.device, metrics: Metrics,
                 shapes: dict[str, CallShapes]) -> Worker:
    """The worker, not started: batch and round sizes for ``device``, its queues' bounds, the pipeline of calls."""
    return Worker(
        models, device, metrics, max_batch_images=settings.batch_images(device), max_round_images=settings.round_images(device),
        batch_wait_ms=settings.batch_wait_ms, max_queue=settings.max_queue, max_predict_queue=settings.predict_queue,
        watchdog_grace_s=settings.watchdog_grace_s, shapes=shapes, pipeline_depth=settings.pipeline_depth,
        launch_ahead=settings.launch_ahead,
    )


async def start_worker(worker: Worker, settings: Settings, models: dict[str, ImageClassifier], shapes: dict[str, CallShapes],
                       metrics: Metrics) -> None:
    """Start ``worker`` with the models' warm-up on its own thread, where requests run: its malloc arena is the one the
    first request would grow (its page faults made the first request slower when the warm-up ran elsewhere:
    docs/results/speed.md). Compiled graphs are made before ready even with IDG_WARMUP=false: else the first requests
    would wait for them."""
    await asyncio.to_thread(worker.start, partial(warm_up, models, worker.max_batch_images, settings.warmup, shapes,
                                                  worker.run_on_device))
    for name, model in models.items():
        if (part := compiled_part(model)) is not None:
            metrics.track_compiled(name, part)


def image_thread_count(settings: ServerSettings) -> int:
    """Threads that decode uploads and render answers (``IDG_IMAGE_THREADS``), logged with why."""
    threads, why = image_threads(settings.image_threads, host_cores(), processes_on_host())
    log.info("%d image thread(s) decode uploads and render answers (%s)", threads, why)
    return threads


async def start_grpc(app: FastAPI, settings: Settings) -> Any:
    """The Open Inference Protocol's gRPC server (:mod:`app.api.oip_grpc`), listening; a clear start-up error where the
    grpc extra is not installed or the port cannot be had."""
    try:
        from app.api.oip_grpc import start_grpc as start
    except ImportError as err:
        raise ModelLoadError(f"IDG_GRPC_PORT={settings.grpc_port} needs grpcio, protobuf and tritonclient: .venv/bin/pip "
                             f"install -e '.[grpc]' torch==2.13.0 ({err})") from err
    try:
        return await start(app, settings)
    except RuntimeError as err:
        raise ModelLoadError(str(err)) from err


async def stop(app: FastAPI, settings: Settings, metrics: Metrics, drain: Drain, worker: Worker, grpc_server: Any) -> None:
    """Not ready; the gRPC calls in flight end first, while the worker still runs; the jobs' images in the worker are
    given back to the store; then the worker stops (already drained by app.server, or finishing its work here)."""
    app.state.ready = False
    metrics.set_ready(False)
    if grpc_server is not None:
        await grpc_server.stop(settings.shutdown_grace_s)
    if settings.gc_freeze:
        gc.unfreeze()  # an app stopped in a process that goes on (tests, a reload) can be collected
    await app.state.jobs.stop()  # its images in the worker are dropped and given back to the store
    if drain.drained:  # app.server drained the requests already and is stopping the worker
        await wait_thread(drain.worker_stopper, 1.0)
    else:  # served some other way (plain uvicorn, tests): requests are gone, finish their jobs
        log.info("shutting down: finishing in-flight work (grace %.0f s)", settings.shutdown_grace_s)
        await asyncio.to_thread(worker.stop, settings.shutdown_grace_s)
