"""All service settings, read from ``IDG_*`` environment variables (or a ``.env`` file), in sections.

Each section is a settings class of its own (server, limits, models, worker and device, the simulated device, jobs,
security, monitoring) whose docstring says what it governs; :class:`Settings` is all of them at once, so a setting
is ``settings.NAME`` and its variable ``IDG_NAME`` whichever section holds it. ``docs/settings.md`` is made from
these classes (``scripts/mkdocs_hooks.py``): one table per section, each field's ``description`` its line there.
A new setting goes into the section it belongs to, with a description (``tests/test_docs.py`` checks both).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from pathlib import Path
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

import torch
from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from idg_core.call_shapes import power_of_two_sizes
from idg_core.model_calls import default_batch_size
from idg_models.speed import Precision


def _split(value: object) -> object:
    """``"a, b,c"`` as ``["a", "b", "c"]`` (an environment variable holds a list as commas)."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _positive(value: list[int]) -> list[int]:
    if any(v < 1 for v in value):
        raise ValueError(f"batch sizes must be positive, got {value}")
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(_split)]
"""A list given as one comma-separated variable."""
BatchSizes = Annotated[list[int], NoDecode, BeforeValidator(_split), AfterValidator(_positive)]
"""Batch sizes given as one comma-separated variable, each >= 1."""


class Section(BaseSettings):
    """One section of the settings: its fields, read from ``IDG_<FIELD>``; ``title`` heads its table in the docs."""

    # an empty variable is an unset one (docker-compose passes ${X:-}: a path "" had meant the current folder); no
    # float takes infinity (IDG_SHUTDOWN_GRACE_S=inf had crashed the shutdown watchdog) or NaN
    model_config = SettingsConfigDict(env_prefix="IDG_", env_file=".env", extra="ignore", env_ignore_empty=True,
                                      allow_inf_nan=False)
    title: ClassVar[str]


class ServerSettings(Section):
    """The server processes: where they listen (HTTP and gRPC), how many run, their image threads, how long a
    shutdown may take, and the address clients reach them at."""

    title: ClassVar[str] = "Server"

    host: str = Field("127.0.0.1", description="Address python -m app.server listens on (0.0.0.0 in the Docker image)")
    port: int = Field(8000, ge=0, le=65535, description="Port python -m app.server listens on")
    grpc_port: int = Field(
        0, ge=0, le=65535, description="Port of the Open Inference Protocol over gRPC (KServe's GRPCInferenceService, as "
        "tritonclient.grpc calls it) on IDG_HOST, opened once ready; 0: off. Needs the grpc extra (.venv/bin/pip "
        "install -e '.[grpc]' torch==2.13.0). With IDG_PROCESSES > 1 every process listens on it (SO_REUSEPORT), the kernel spreading "
        "connections over them")
    processes: Annotated[int, Field(ge=1, le=64)] | Literal["auto"] = Field(
        "auto", description="Server processes python -m app.server runs on the one port, each with its own copy of the "
        "models on the same device and its own worker: more host (HTTP, decode, render, the worker's Python) per device, whose "
        "one process is bound by the GIL; /metrics sums them all (prometheus_client's multiprocess mode). auto: one on the CPU; "
        "on CUDA up to four, as many as the host has 4 cores for, the others started once the first is warm and only as many as "
        "the GPU's memory holds (app.processes.launch)")
    image_threads: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        "auto", description="Threads per server process that decode uploads and render answers (off the event loop and the "
        "worker). auto: one per host core the process has (its CPU affinity and cgroup quota, shared among IDG_PROCESSES): "
        "more CPU-bound threads than cores decode no faster and take the cores from the threads that feed the device "
        "(app.core.image_threads)")
    keep_alive_timeout_s: int = Field(
        95, ge=1, le=3600, description="Seconds an idle kept-alive connection stays open for the client's next request (uvicorn's "
        "timeout_keep_alive, whose default is 5). Longer than the idle time of the common clients' pools, so a client never "
        "sends a request on a connection the server is closing at that moment (the request is lost): httpx 5 s, aiohttp 15 s, "
        "a cloud load balancer's 60 s, Go's net/http 90 s (requests/urllib3 keep theirs without limit: they check the "
        "connection before reusing it). Ray Serve's proxy has its own (deploy/ray/serve.yaml: keep_alive_timeout_s)")
    shutdown_grace_s: float = Field(
        30.0, ge=0, description="On SIGTERM (python -m app.server): readiness 503 and new work refused at once; in-flight work may "
        "finish for this long, the rest is answered 503; the process exits within this + 5 s")
    public_url: str | None = Field(
        None, description="The service's address as its clients reach it (https://idg.example.org, with any path prefix): "
        "the links of POST /jobs, GET /jobs and the callbacks (url, results_url, next, Location) start with it. Unset: "
        "they are paths (/jobs/...). Never taken from the request's Host header, which any client may set")

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username:
            raise ValueError(f"IDG_PUBLIC_URL must be an http(s):// URL with a host and no query, got {value!r}")
        return value.rstrip("/")


class LimitsSettings(Section):
    """What one request may send and ask for, and how many are admitted: deadlines, read timeouts, upload
    and image sizes, steps and passes of an attribution, the queues' bounds. Past a limit the request is refused
    (408, 413, 422 or 503), never run."""

    title: ClassVar[str] = "Limits"

    request_timeout_s: float = Field(120.0, gt=0, description="Deadline of each request; past it 504 and its work is dropped")
    header_timeout_s: float = Field(
        10.0, gt=0, description="Most seconds a client may take to send a request's headers (from connecting, or from the "
        "request's first byte on a kept-alive connection); beyond, 408 and the connection is closed")
    body_timeout_s: float = Field(60.0, gt=0, description="Most seconds a client may take to send a request body; beyond, 408 "
                                  "and the connection is closed. A body of declared length (Content-Length) may take longer: "
                                  "as long as it takes at IDG_MIN_UPLOAD_RATE")
    min_upload_rate: int = Field(
        500_000, ge=1, description="Bytes per second a request body with a declared length is given at least: it may take "
        "body_timeout_s or its length at this rate, whichever is longer (a 300 MB job at the default: 600 s), so the size "
        "limits and the timeout agree for slow links. A body without a declared length (chunked) has body_timeout_s")
    max_upload_bytes: int = Field(10_000_000, ge=1, description="Largest request body; beyond, 413")
    max_image_pixels: int = Field(40_000_000, ge=1, le=178_956_970, description="Largest decoded image (width x height); "
                                  "beyond, 413. At most Pillow's own limit against decompression bombs (178,956,970)")
    max_image_side: int = Field(
        16384, ge=1, description="Longest image side in pixels, checked from the header before decoding; beyond, 413 "
        "(16384 is WebP's own limit and above any camera's; with the aspect limit it bounds decoding cost by shape)")
    max_aspect_ratio: float = Field(
        20.0, ge=1, description="Largest longer-side / shorter-side ratio, checked from the header before decoding; beyond, "
        "422. Panoramas are up to about 12:1; at 20:1 the model's centre crop already sees only 1/20 of the image")
    max_concurrent_decodes: int = Field(
        2, ge=1, description="Images over 4 megapixels (after JPEG reduced-scale decoding) decoded at once; more wait their "
        "turn, so large uploads cannot take every CPU and thread. Smaller images never wait")
    max_batch_files: int = Field(32, ge=1, description="Most images in one /attribute/batch request")
    max_steps: int = Field(512, ge=2, description="Upper bound for steps / probe_steps / max_iter")
    max_top_k: int = Field(20, ge=1, description="Upper bound for top_k")
    max_passes: int | None = Field(
        None, ge=1, description="Most model passes (images through the model, gradient ones included) one attribution may cost "
        "at worst, known from its parameters before it runs; beyond, 422. Default 4 x max_steps")
    faithfulness_steps: int = Field(
        28, ge=1, le=224, description="Default steps of the faithfulness score (faithfulness=insertion,deletion): each metric "
        "costs steps + 1 forward passes, 2 x 29 = 58 for both at 28")
    max_queue: int = Field(64, ge=1, description="Requests admitted at once (queued or running); beyond, 503 + Retry-After")
    max_predict_queue: int = Field(
        16, ge=1, description="Predictions (/predict, and /v2 infer without an explanation: one per image) admitted at once, "
        "apart from max_queue (a burst of attributions cannot lock /predict out); beyond, 503 + Retry-After. Never below "
        "IDG_MAX_BATCH_FILES: a smaller value is raised to it, so one batch of the largest size the doors accept (the /v2 "
        "model config's max_batch_size) is admitted whole on an idle server")

    @property
    def predict_queue(self) -> int:
        """Predictions admitted at once: ``max_predict_queue``, raised to ``max_batch_files`` where below it (each image
        of a request holds one slot, so a smaller bound refused every predict-only batch above it, idle server or not)."""
        return max(self.max_predict_queue, self.max_batch_files)


class ModelsSettings(Section):
    """Which models load and how they are prepared before ready: sources and the models file, precision and
    its calibration, memory format, batch-norm folding, torch.compile, warm-up."""

    title: ClassVar[str] = "Models"

    models: CommaList = Field(
        default=["efficientnet_lite0"],
        description="Comma-separated models to load: a packaged name (efficientnet_lite0|1|2), "
        "ARCH=/path/to/weights.pth for torchvision ResNet-50/101/152 and ResNeXt, or NAME=SOURCE with SOURCE one of "
        "timm:ARCH:WEIGHTS, hf:FOLDER, torchscript:PATH, export:PATH, torchvision:ARCH:WEIGHTS. The first is the default.",
    )
    models_file: Path | None = Field(
        None, description="A TOML file with one [models.NAME] table per model: input_size, resize_size, crop_size, "
        "interpolation, mean, std, num_classes, labels (a file, one class name per line), max_batch; a key there overrides "
        "what the model's source says (scripted and exported models need input_size, mean and std)")
    models_file_any_path: bool = Field(
        False, description="Let the models file's labels paths point outside its folder (absolute, or ../); off: such a "
        "path stops start-up with an error, so a models file cannot make the service read and show any file")
    precision: Precision | Literal["auto"] = Field(
        "auto", description="Arithmetic of the models: auto (on CUDA, TF32, or bf16 autocast for a model whose bf16 faithfulness "
        "was checked or calibrated; IEEE fp32 on CPU: idg_models.default_precision), fp32 (IEEE), tf32 (CUDA matrix units) "
        "or bf16 autocast")
    calibration_file: Path | None = Field(
        None, description="A JSON file written by idg-calibrate: each model it names (same source and weights) whose precision "
        "is auto runs in bf16 on CUDA only where that calibration kept its faithfulness; shown in /models")
    calibrate_images: Path | None = Field(
        None, description="A folder of your photos: at start-up, before ready, calibrate each model whose precision is auto on "
        "the first 64 (bf16 against IEEE fp32, as idg-calibrate does) and use the decision; with IDG_CALIBRATION_FILE, a "
        "model stored there is not calibrated again and new decisions are added to the file")
    channels_last: bool | Literal["auto"] = Field(
        "auto", description="Run convolutions in channels-last memory format: auto (on the CPU, and on CUDA with bf16: "
        "idg_models.default_channels_last), true or false")
    fold_bn: bool = Field(True, description="Fold eval-mode batch norm into the convolution before it at start-up (the same "
                          "function up to float rounding, without batch norm's passes; idg_models.fold_batchnorm)")
    compile: bool = Field(
        False, description="torch.compile the models during warm-up, before ready, once per batch size of compile_sizes (calls "
        "are padded to the nearest, so traffic never compiles); slower start. In bf16 its attributions differ from eager's (on "
        "the H200, random-weight models: cosine 0.48-0.65 on the worst photo; docs/results/speed.md)")
    compile_sizes: BatchSizes = Field(
        default=[], description="Comma-separated batch sizes to compile (each is 2 graphs: forward, and forward for a gradient); "
        "default: the largest model call and its halves, at most 5 (8 -> 1,2,4,8; 128 -> 8,...,128)")
    warmup: bool = Field(True, description="Run a forward and backward pass per model before reporting ready")

    @field_validator("models")
    @classmethod
    def _not_empty(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("IDG_MODELS must name at least one model")
        return value


class WorkerSettings(Section):
    """The device and the worker thread that feeds it: batch sizes of model calls and of a worker round,
    fixed call sizes and CUDA graphs, the pipeline of calls in flight, the watchdog, and the process's runtime
    (torch threads, the GIL's switch interval, malloc, the garbage collector)."""

    title: ClassVar[str] = "Worker and device"

    device: str = Field("auto", description="auto (CUDA when present), cpu, cuda or cuda:N")
    max_batch_images: int | None = Field(
        None, ge=1, le=4096, description="Most images (path points) in one model call; default 8 on CPU (small batches stay in "
        "cache), 128 on CUDA")
    max_round_images: int | None = Field(
        None, ge=1, description="Points taken into one worker round (bounds how long /predict waits); default max(64, 4 x batch)")
    batch_wait_ms: float = Field(5.0, ge=0, le=1000, description="How long an idle worker waits for more work to batch")
    fixed_call_sizes: bool | Literal["auto"] = Field(
        "auto", description="Run every model call at one of a few batch sizes (call_sizes), padded up, each warmed forward and "
        "with a gradient before ready: auto (on for CUDA, where a batch size a process has not run costs cuDNN seconds; off on "
        "the CPU, where it costs nothing and padding would), true or false. /models lists the sizes and the warm-up seconds; "
        "/metrics counts calls at a size not warmed (idg_unwarmed_calls)")
    call_sizes: BatchSizes = Field(
        default=[], description="Comma-separated batch sizes of model calls with fixed_call_sizes; default: powers of two from 8 "
        "(CUDA; 1 on the CPU) up to the largest model call, or the compiled sizes with IDG_COMPILE")
    cuda_graphs: bool = Field(
        True, description="With fixed call sizes on CUDA, capture each size's call (forward, and forward with the input gradient) "
        "as a CUDA graph during warm-up and replay it: one launch instead of hundreds, so a network of many small kernels is not "
        "bound by the host launching them (not with IDG_COMPILE; a network that cannot be captured runs eagerly, logged)")
    cudnn_benchmark: bool = Field(
        False, description="torch.backends.cudnn.benchmark: let cuDNN time its kernels for each new shape (with fixed call "
        "sizes, once per size during warm-up)")
    pipeline_depth: int = Field(
        2, ge=1, le=8, description="Model calls handed to the device at once: with 2, the worker gathers call k+1's inputs and "
        "books call k's answers while call k+1 waits behind call k, so the device does not wait for the host")
    launch_ahead: int = Field(
        2, ge=1, le=8, description="Model calls launched on an asynchronous device (CUDA, a simulated stream) at once: with 2, call k+1 "
        "is queued on the device behind call k, so the device goes on without waiting for the host's Python between calls; 1: "
        "a call is launched only once the one before it ended")
    watchdog_grace_s: float = Field(
        10.0, gt=0, description="If the worker still holds a request this long past its deadline, that request fails, readiness "
        "answers 503 and new work is refused until the worker returns")
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads of torch's own parallel ops (intra-op) in each server process. Default: torch's "
        "choice (one per core) where the models run on the CPU; 1 where they run on an accelerator (CUDA, or the simulated "
        "device), where the host's tensor work is small copies and sums done in many decode and render threads at once, and "
        "spreading each over every core only forks, spins and joins (measured: docs/results/speed.md)")
    keep_freed_memory: bool = Field(
        True, description="glibc malloc keeps freed tensor memory for reuse instead of returning it to the kernel after every "
        "model call (idg_models.keep_freed_memory): faster on the CPU; resident memory then stays at its peak")
    switch_interval_ms: float | None = Field(
        None, gt=0, le=100, description="Python's GIL switch interval (sys.setswitchinterval) in milliseconds; unset: Python's 5 ms. "
        "The worker thread releases the GIL at every torch op and may wait up to this long to get it back while the event loop "
        "holds it")
    gc_freeze: bool = Field(
        True, description="gc.freeze() once ready: the objects start-up made (~250,000: torch, FastAPI, the models) leave the cyclic "
        "garbage collector's full passes, each of which otherwise holds the GIL under traffic, stalling every thread")

    def batch_images(self, device: torch.device) -> int:
        """Images per model call on ``device``: the setting, or the device's default (:func:`default_batch_size`)."""
        return self.max_batch_images or default_batch_size(device)

    def round_images(self, device: torch.device) -> int:
        return self.max_round_images or max(64, 4 * self.batch_images(device))

    def fixed_sizes_on(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.fixed_call_sizes == "auto" else self.fixed_call_sizes

    def sizes_for(self, device: torch.device, max_batch: int | None = None, compiled: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """The fixed call sizes of a model on ``device`` (its own ``max_batch`` bounds them; a compiled
        model's are the sizes it was compiled at)."""
        if compiled:
            return compiled
        limit = min(self.batch_images(device), max_batch or self.batch_images(device))
        if self.call_sizes:
            if max(self.call_sizes) > limit:  # had been clamped without a word
                log.warning("IDG_CALL_SIZES %s: sizes above this model's largest call, %d (IDG_MAX_BATCH_IMAGES or its max_batch), "
                            "run at %d", ",".join(map(str, self.call_sizes)), limit, limit)
            sizes = sorted({min(s, limit) for s in self.call_sizes})
            return tuple(sizes if sizes[-1] == limit else [*sizes, limit])
        return power_of_two_sizes(limit, 8 if device.type == "cuda" else 1)


class SimulatedSettings(Section):
    """A simulated accelerator for benchmarks and tests without a GPU (:mod:`idg_serving.simulated`): every model
    call takes a set time with the GIL released and returns the model's real outputs. Off unless
    ``IDG_SIMULATED_CALL_MS`` is set."""

    title: ClassVar[str] = "Simulated device"

    simulated_call_ms: float | None = Field(
        None, ge=0, description="For benchmarks and tests without a GPU: every model call takes this many milliseconds (+ "
        "simulated_image_ms per image) with the GIL released, as a GPU kernel does, and returns the model's real outputs "
        "(idg_serving.simulated); unset: off")
    simulated_stream: bool = Field(
        True, description="The simulated device behaves as a CUDA stream (a call returns at once and its time is booked on the "
        "device's own timeline, after the calls before it); false: each call holds the launching thread for its time")
    simulated_image_ms: float = Field(0.0, ge=0, description="Milliseconds per image added to simulated_call_ms")
    simulated_timeline: Path | None = Field(
        None, description="A file that several processes' simulated devices share as one device (a call begins once the calls "
        "launched before it in any of them have ended); python -m app.server sets it for its processes with IDG_PROCESSES > 1")


class JobsSettings(Section):
    """Durable jobs (``/jobs``): where they are stored (SQLite under the data folder, or PostgreSQL), their
    size limits, retention, how many of their images run at once, claims, and signed callbacks."""

    title: ClassVar[str] = "Jobs"

    data_dir: Path = Field(Path("data"), description="Where the service keeps its state: the job store (jobs.sqlite3, SQLite "
                           "in WAL mode) unless IDG_JOBS_DB_URL names another")
    jobs_db_url: str | None = Field(None, description="postgresql://user:password@host/db: keep jobs in PostgreSQL, shared by "
                                    "several replicas (needs the postgres extra); default: SQLite under IDG_DATA_DIR")
    jobs_store_timeout_s: float = Field(
        5.0, gt=0, le=300, description="How long one job store operation waits for the store (SQLite: another process's write "
        "lock; PostgreSQL: a working connection, or any answer: an operation a stalled server answers nothing for this long "
        "is ended, its connection closed, once a new connection too gets no answer for as long, at least 2 s) before the "
        "store counts as unreachable: the request answers 503 with "
        "Retry-After, the job runner waits and tries again, idg_durable_job_store_up is 0 (readiness is not touched: "
        "/predict and /attribute still answer)")
    jobs_max_images: int = Field(10_000, ge=1, description="Most images in one job (POST /jobs); beyond, 413")
    jobs_max_upload_bytes: int = Field(300_000_000, ge=1, description="Largest POST /jobs body, and most bytes one job's "
                                       "images may take once its archives are unpacked (all its uploads together); beyond, 413")
    jobs_unpack_at_once: int = Field(2, ge=1, description="Job submissions (POST /jobs) parsed and unpacked at once per "
                                     "process; more wait their turn with their bodies spooled to disk (IDG_DATA_DIR), so that "
                                     "memory holds at most about twice this many times IDG_JOBS_MAX_UPLOAD_BYTES")
    jobs_max_bytes: int = Field(5_000_000_000, ge=1, description="Most bytes the job store holds (images not yet answered, "
                                "answers), checked when a job is submitted; beyond, 507")
    jobs_max_bytes_per_key: int = Field(
        1_000_000_000, ge=1, description="Most bytes the jobs of one API key hold in the job store (their images not yet "
        "answered, their answers: what IDG_JOBS_MAX_BYTES counts), checked when a job is submitted; beyond, 413 "
        "quota_exceeded. Every key has it, admin keys too; without keys it does not apply. The default, a fifth of "
        "IDG_JOBS_MAX_BYTES's, leaves room for four others however much one key sends; with one key, set it to "
        "IDG_JOBS_MAX_BYTES")
    jobs_retention_s: float = Field(7 * 86400.0, gt=0, description="Finished jobs are deleted this long after they finished")
    jobs_in_flight: int = Field(2, ge=1, description="Images of jobs in the worker at once (per process), at a lower priority "
                                "than any request; each holds one IDG_MAX_QUEUE slot")
    jobs_lease_s: float = Field(30.0, gt=0, description="A claimed image whose process stops renewing its claim for this "
                                "long (it died) is taken up by another; a process restarted on the same host takes back its "
                                "dead predecessor's claims at once")
    callback_secret: str | None = Field(
        None, description="Signs each job callback: X-IDG-Timestamp (Unix seconds) and X-IDG-Signature: sha256=<hex "
        "HMAC-SHA256 of the timestamp, '.', and the raw body, keyed with this secret>; the receiver recomputes it and "
        "refuses old timestamps. Unset: callbacks are not signed")
    jobs_seal_key: str | None = Field(
        None, min_length=16, description="Seals the secrets of the jobs' callback URLs in the job store (user, password, query "
        "values, fragment; AES-256-GCM under the SHA-256 of this text, e.g. openssl rand -base64 32): a reader of the "
        "database sees them as ***. Unset: a key made on first start in IDG_DATA_DIR/jobs.key (mode 0600). Replicas "
        "sharing a PostgreSQL store (IDG_JOBS_DB_URL) must share it; a job whose URL was sealed under another key fails "
        "its callback, saying so")

    @field_validator("jobs_db_url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"IDG_JOBS_DB_URL must be a postgresql:// URL, got {value.split('://')[0]}://...")
        return value or None


class SecuritySettings(Section):
    """Who may call: the API key or named keys per tenant, each key's share of the queue, whether
    ``/metrics`` needs a key, and the origins CORS allows."""

    title: ClassVar[str] = "Security"

    api_key: str | None = Field(None, description="If set, requests must send it as X-API-Key or 'Authorization: Bearer'; "
                                "readiness then answers only its status to a caller without the key")
    api_keys: CommaList = Field(
        default=[], description="Named API keys, comma-separated NAME:KEY, or NAME:KEY:admin: any of them is let in as "
        "IDG_API_KEY is; each key sees, reads and deletes only the jobs it submitted (another's are 404), an admin key "
        "every job. The key's name (never the key) is in the logs, the job's status (tenant) and the metrics. "
        "IDG_API_KEY, if set too, is the admin key named 'default'")
    api_keys_file: Path | None = Field(
        None, description="A file of named API keys as IDG_API_KEYS takes them, one NAME:KEY[:admin] per line (blank lines "
        "and # comments skipped): keys kept out of the environment")
    key_share: float = Field(
        0.5, gt=0, le=1, description="With several API keys: the fraction of IDG_MAX_QUEUE one key may hold in requests at "
        "once (POSTs to /predict, /attribute..., /v2 infer, /jobs); past it that key gets 503 (code key_share) with Retry-After "
        "while the others still find room")
    metrics_need_key: bool = Field(
        False, description="With IDG_API_KEY set, /metrics answers 401 without the key too (Prometheus sends it with "
        "'authorization: {credentials: KEY}' in its scrape config). Off by default: scrapes usually come over a protected network")
    cors_origins: CommaList = Field(default=[], description="Comma-separated origins allowed by CORS")


class MonitoringSettings(Section):
    """What the service tells its operators besides ``/metrics``: the log format, one log line per prediction,
    OpenTelemetry traces, and how many replicas should be up."""

    title: ClassVar[str] = "Monitoring"

    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or as one JSON object per line (time, level, logger, message, request_id and "
        "the line's own fields) for a log pipeline")
    log_predictions: bool = Field(
        False, description="One log line per prediction (model, class, probability) and per explanation (model, target, "
        "attribution concentration, faithfulness scores), with its request ID: for pipelines (IDG_LOG_FORMAT=json)")
    tracing: bool = Field(
        False, description="OpenTelemetry traces (the tracing extra): a span per HTTP request and, under it, the queue wait, "
        "the time in the worker and each model call of its jobs, over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT")
    replicas_expected: int | None = Field(
        None, ge=1, description="How many replicas of this service should answer (Ray Serve replicas, Kubernetes pods, "
        "servers behind one load balancer): exported as idg_replicas_expected, and IDGReplicasMissing fires when fewer are "
        "up for 5 minutes (a replica that died and left service discovery has no target for IDGDown); unset: no such alert. "
        "Under Ray Serve keep it equal to the deployment's autoscaling min_replicas (deploy/ray/serve.yaml)")
    drift_reference: Path | None = Field(
        None, description="A JSON file written by idg-drift-reference (what the models predict and how their explanations "
        "look on photos you call normal): exported as idg_drift_reference*, and the drift alerts (IDGPredictionsShifted, "
        "IDGConfidenceFalling, IDGExplanationsShifted, IDGFaithfulnessFalling) compare the last 15 minutes with it; unset: "
        "no drift alert fires. A file that cannot be read stops start-up")
    replica_metrics_ports: str = Field(
        "9500-9599", description="Under Ray Serve (app.ray_serve): the ports, LOW-HIGH, from which each replica serves its own "
        "/metrics on its node, the first free one (two replicas on a node take two), so a firewall or a static scrape "
        "config can name them; none free stops the replica's start, naming this setting")

    @field_validator("replica_metrics_ports")
    @classmethod
    def _port_range(cls, value: str) -> str:
        low, sep, high = value.partition("-")
        if not (sep and low.strip().isdigit() and high.strip().isdigit() and 1 <= int(low) <= int(high) <= 65535):
            raise ValueError(f"IDG_REPLICA_METRICS_PORTS must be LOW-HIGH, two ports with LOW <= HIGH, got {value!r}")
        return f"{int(low)}-{int(high)}"

    @property
    def metrics_ports(self) -> range:
        """``replica_metrics_ports`` as the ports it names."""
        low, _, high = self.replica_metrics_ports.partition("-")
        return range(int(low), int(high) + 1)


SECTIONS: tuple[type[Section], ...] = (
    ServerSettings, LimitsSettings, ModelsSettings, WorkerSettings, SimulatedSettings, JobsSettings, SecuritySettings,
    MonitoringSettings,
)
"""The sections in the order the settings reference lists them."""


class Settings(
    ServerSettings, LimitsSettings, ModelsSettings, WorkerSettings, SimulatedSettings, JobsSettings, SecuritySettings,
    MonitoringSettings,
):
    """Every setting of the service: all the sections at once (``settings.NAME``, ``IDG_NAME``). Fields belong in a
    section, not here."""

    title: ClassVar[str] = "All settings"


OTHER_VARIABLES = frozenset({
    "IDG_URL",  # the client's service address
    "IDG_SERVE_EARLY", "IDG_PROCESSES_ON_HOST", "IDG_MEMORY_REPORT_DIR", "IDG_PROCESSES_EXPECTED",  # set by the launcher
    "IDG_BENCH_READY_S", "IDG_BENCH_PROFILE",  # the benchmarks'
})
"""``IDG_*`` variables that are not settings but are read all the same (by the client, the launcher's processes, the
benchmarks): not reported as unknown."""

log = logging.getLogger(__name__)


class SettingsError(ValueError):
    """Settings that cannot be used; its message names each ``IDG_*`` variable at fault, on one line."""


def _dotenv_names(path: Path = Path(".env")) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    names = (line.strip().removeprefix("export ").split("=", 1)[0].strip() for line in lines if "=" in line)
    return [n for n in names if n.upper().startswith("IDG_")]


def unknown_variables() -> list[str]:
    """One warning each for the ``IDG_*`` names in the environment or ``.env`` that no setting reads (a typo, say
    ``IDG_MAX_QUEU``, had been ignored without a word), with the nearest setting's name."""
    known = {f"IDG_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    seen = [n for n in os.environ if n.upper().startswith("IDG_")] + _dotenv_names()
    out = []
    for name in dict.fromkeys(n.upper() for n in seen):
        if name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=1)
            out.append(f"unknown setting {name}, ignored" + (f" (did you mean {near[0]}?)" if near else ""))
    return out


def load_settings() -> Settings:
    """The settings from the environment and ``.env``: unknown ``IDG_*`` names logged as warnings, and values that
    cannot be used a :class:`SettingsError` whose one line names each variable, its value and what it must be
    (pydantic's own error named the field, ``max_queue``, in 17 lines with a traceback)."""
    _warn_once(unknown_variables())
    try:
        settings = Settings()
    except ValidationError as err:
        said: dict[str, list[str]] = {}  # per variable: a value of a union type fails each alternative, one error each
        for e in err.errors():
            name = f"IDG_{str(e['loc'][0]).upper()}" if e.get("loc") else "a setting"
            said.setdefault(f"{name}={os.environ.get(name, e.get('input'))!r}", []).append(e["msg"])
        raise SettingsError("; ".join(f"invalid setting {which}: {_alternatives(msgs)}" for which, msgs in said.items())) from None
    _warn_once(without_effect(settings))
    return settings


_QUOTED = re.compile(r"'[^']*'(?:, '[^']*')*(?: or '[^']*')?")


def _alternatives(messages: list[str]) -> str:
    """pydantic's messages for one value as one: a union's ("Input should be 'fp32', 'tf32' or 'bf16'", "Input should be
    'auto'") as "Input should be 'fp32', 'tf32', 'bf16' or 'auto'" (they had read as two errors of one setting)."""
    messages = list(dict.fromkeys(messages))
    prefix = "Input should be "
    if len(messages) == 1 or not all(m.startswith(prefix) for m in messages):
        return "; ".join(messages)
    options: list[str] = []
    for m in messages:
        tail = m.removeprefix(prefix)
        options += re.findall(r"'[^']*'", tail) if _QUOTED.fullmatch(tail) else [tail]
    return prefix + ", ".join(options[:-1]) + " or " + options[-1]


_WARNED: set[str] = set()


def _warn_once(warnings: list[str]) -> None:
    """Log each warning once per process: the launcher reads the settings, then the app it imports reads them again."""
    for warning in warnings:
        if warning not in _WARNED:
            _WARNED.add(warning)
            log.warning("%s", warning)


def without_effect(settings: Settings) -> list[str]:
    """One warning each for settings given that the others make void (they had been ignored without a word)."""
    given = settings.model_fields_set  # those the environment or .env set
    out = []
    if settings.metrics_need_key and not (settings.api_key or settings.api_keys or settings.api_keys_file):
        out.append("IDG_METRICS_NEED_KEY=true but no key is set (IDG_API_KEY, IDG_API_KEYS, IDG_API_KEYS_FILE): /metrics, as "
                   "every route, is open to all")
    if "call_sizes" in given and settings.fixed_call_sizes is False:
        out.append("IDG_CALL_SIZES is ignored: IDG_FIXED_CALL_SIZES=false")
    if "compile_sizes" in given and not settings.compile:
        out.append("IDG_COMPILE_SIZES is ignored: IDG_COMPILE is not true")
    if "simulated_image_ms" in given and settings.simulated_call_ms is None:
        out.append("IDG_SIMULATED_IMAGE_MS is ignored: IDG_SIMULATED_CALL_MS is not set")
    if "simulated_timeline" in given and settings.simulated_call_ms is None:
        out.append("IDG_SIMULATED_TIMELINE is ignored: IDG_SIMULATED_CALL_MS is not set")
    calibrating = [n for n, f in (("IDG_CALIBRATION_FILE", "calibration_file"), ("IDG_CALIBRATE_IMAGES", "calibrate_images")) if f in given]
    if calibrating and settings.precision != "auto":
        out.append(f"{' and '.join(calibrating)} ignored: IDG_PRECISION={settings.precision} is explicit (a calibration "
                   "decides bf16 only for auto)")
    if "max_predict_queue" in given and settings.max_predict_queue < settings.max_batch_files:
        out.append(f"IDG_MAX_PREDICT_QUEUE={settings.max_predict_queue} is raised to IDG_MAX_BATCH_FILES={settings.max_batch_files}: "
                   "each image holds one slot, and a batch the doors accept must fit an idle queue")
    if settings.max_queue < settings.max_batch_files:
        out.append(f"IDG_MAX_QUEUE={settings.max_queue} is below IDG_MAX_BATCH_FILES={settings.max_batch_files}: an explained batch "
                   f"of more than {settings.max_queue} images is always refused (503); raise IDG_MAX_QUEUE or lower IDG_MAX_BATCH_FILES")
    cores = os.cpu_count() or 1
    if settings.torch_threads is not None and settings.torch_threads > cores:
        out.append(f"IDG_TORCH_THREADS={settings.torch_threads} is more than this machine's {cores} cores: torch's threads then "
                   "wait for each other (1000 on 2 cores made a prediction 30x slower)")
    return out
