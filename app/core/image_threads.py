"""The threads that decode uploads and render answers (``IDG_IMAGE_THREADS``): one pool per server process.

Decoding a photo and rendering its PNGs are CPU work kept off the event loop and off the worker thread. In
asyncio's default pool, ``min(32, cores + 4)`` threads in every server process, under load each of them is runnable,
and the kernel shares the cores evenly among runnable threads, so the worker and device threads, which feed the
device, got a thin slice of the cores and the device waited for them. The
pool now has one thread per core the process has (:func:`image_threads`): as many decodes per second (they are
CPU-bound: more threads than cores decode no faster), and the device's feeders no longer queue behind them
(measured: docs/results/speed.md, "The host side and server processes").

The pool is first come, first served, image by image: the 32 photos of one ``/attribute/batch`` (each under
:data:`~app.core.images.LARGE_DECODE_PIXELS`) are decoded before a photo that arrives after them, as are a job's. Three
kinds of work stay in asyncio's default pool: the jobs store's reads and writes (SQLite, PostgreSQL), which wait on
files and sockets (a slow database must not hold a decode's thread); unpacking a job's uploaded archive; and decodes
over ``LARGE_DECODE_PIXELS``, which take one of ``IDG_MAX_CONCURRENT_DECODES`` slots already and may run for a second:
in the image threads they would hold up every small photo behind them.

With ``IDG_PROCESSES=auto`` on CUDA the launcher tells each process the count it aims for before it knows how many
the GPU holds: a process left alone (the GPU held one, or the second failed to start) keeps its share, half the
host's cores (at least 4 threads: auto starts two only where the host has 4 cores for each). Elsewhere (Ray Serve
replicas, ``uvicorn --workers``) nothing tells a process it shares the host: set ``IDG_IMAGE_THREADS`` there
(``deploy/ray/serve.yaml`` does).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Literal, ParamSpec, TypeVar

from app.doors import tracing

log = logging.getLogger("app.image_threads")

PROCESSES_ON_HOST = "IDG_PROCESSES_ON_HOST"
"""Set by the launcher (:func:`app.processes.launch.serve_processes`) for its server processes: how many of them share
the host's cores. Unset: this process is alone."""

P = ParamSpec("P")
T = TypeVar("T")

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ThreadPoolExecutor] = weakref.WeakKeyDictionary()
"""Each running app's pool, by its event loop (tests run several apps in one process, each on a loop of its own)."""


def processes_on_host() -> int:
    """The server processes sharing this host's cores (the launcher's count; 1 outside a launcher or if unreadable)."""
    try:
        return max(1, int(os.environ.get(PROCESSES_ON_HOST, "1")))
    except ValueError:
        return 1


def image_threads(setting: int | Literal["auto"], cores: int, processes: int) -> tuple[int, str]:
    """How many decode/render threads one server process runs, and why: the setting's count, or with ``auto`` one per core
    the process has (the host's ``cores`` shared by ``processes``), at least one."""
    if setting != "auto":
        return setting, "IDG_IMAGE_THREADS"
    n = max(1, cores // max(1, processes))
    return n, f"auto: {cores} host core(s) / {processes} server process(es)"


@contextmanager
def image_thread_pool(count: int) -> Iterator[ThreadPoolExecutor]:
    """The running loop's pool of ``count`` threads (``idg-image_N``) for :func:`in_image_thread` while the block runs (an
    app's lifespan). However the block ends, the pool is forgotten (later calls go to asyncio's pool) and its threads end
    once their work is done. A second app opening one on the same loop takes the loop's calls over from the first's."""
    loop = asyncio.get_running_loop()
    old = _pools.pop(loop, None)
    if old is not None:
        old.shutdown(wait=False)
    pool = _pools[loop] = ThreadPoolExecutor(count, thread_name_prefix="idg-image")
    try:
        yield pool
    finally:
        if _pools.get(loop) is pool:
            del _pools[loop]
        pool.shutdown(wait=False)


async def in_image_thread(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the app's image threads, with the caller's context variables (as
    :func:`asyncio.to_thread`); in asyncio's default pool where no app opened one (the library's own callers)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    with tracing.span(tracing.stage(fn)):  # with IDG_TRACING: idg.decode, idg.render under the request's span
        if pool is None:
            return await asyncio.to_thread(fn, *args, **kwargs)
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await loop.run_in_executor(pool, call)
