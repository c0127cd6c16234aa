"""Serve the app: ``python -m app.server`` (or ``idg-serve``); the one way the Makefile, the
Docker image and the smoke test start it, so every setting below is honoured everywhere.

uvicorn, configured from the ``IDG_*`` settings, with two additions:

- **A shutdown that keeps its promise.** On SIGTERM (or Ctrl+C) the listening socket stays open
  while the app drains (:func:`app.doors.drain.drain`): readiness 503 and new work refused with a
  JSON 503 at once, in-flight work may finish for ``IDG_SHUTDOWN_GRACE_S``, what remains is
  answered with a JSON 503. Then uvicorn closes the connections (a client that does not read its
  answer is given :data:`CLOSE_S`), and a watchdog ends the process if anything still holds it at
  grace + :data:`EXIT_MARGIN_S`.
- **Read timeouts.** :class:`TimedH11Protocol` closes a connection whose request headers are not
  complete ``IDG_HEADER_TIMEOUT_S`` after it opened (or after the request's first byte on a kept-alive
  connection), with a JSON 408 when some bytes came; a body is bounded by ``IDG_BODY_TIMEOUT_S``:
  the app answers 408 when it reads the body (``app.api.requests.read_body``), and the protocol
  closes the connection :data:`BODY_BACKSTOP_S` later when nobody reads it.

With ``IDG_PROCESSES`` > 1 (or ``--processes``) it runs that many of these servers on the port, each its own
process with its own listening socket there, models and worker (:mod:`app.processes.launch`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from types import FrameType
from typing import Any

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.core.config import SettingsError, load_settings
from app.core.errors import error_body
from app.core.model_loading import ModelLoadError, pick_device
from app.doors.drain import drain
from app.doors.request_id import configure_logging
from app.processes.launch import SERVE_EARLY, auto_processes, host_cores, serve_processes, write_memory_report

log = logging.getLogger("app.server")

CLOSE_S = 2  # after the drain: how long uvicorn waits for answers still being written
EXIT_MARGIN_S = 4.5  # the watchdog's bound past the grace (the promise is grace + 5 s)
WATCHDOG_EXIT_CODE = 3
BODY_BACKSTOP_S = 2.0  # past IDG_BODY_TIMEOUT_S, the protocol closes a body nobody reads
LISTEN_POLL_S = 0.05  # a server process waiting for the port to open (another of its processes ready) looks this often
LINGER_S = 2.0  # after a 408: how long bytes still arriving are read and dropped before the close


@dataclass(frozen=True)
class ReadLimits:
    header_timeout_s: float
    body_timeout_s: float
    on_timeout: Callable[[str], None] | None = None
    min_upload_rate: float | None = None
    """Bytes per second a body of declared length is given at least (``IDG_MIN_UPLOAD_RATE``), as the app gives it."""
    max_body_bytes: int = 0
    """The largest body any route takes (``IDG_JOBS_MAX_UPLOAD_BYTES``, ``IDG_MAX_UPLOAD_BYTES``): a larger declared
    length is refused by the app (413) and gives no more time on the socket."""

    def body_s(self, declared: int | None) -> float:
        """The time a body may take: ``body_timeout_s``, or its declared length (up to ``max_body_bytes``) at
        ``min_upload_rate`` if longer. Uncapped, a declared 10 TB had kept a socket nobody read for 231 days."""
        if declared is None or not self.min_upload_rate:
            return self.body_timeout_s
        return max(self.body_timeout_s, min(declared, self.max_body_bytes) / self.min_upload_rate)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request: the headers within
    ``header_timeout_s``, then the body within ``body_timeout_s`` (+ the backstop)."""

    limits = ReadLimits(10.0, 60.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._phase = ""
        self._head_bytes = 0
        self._lingering = False
        self._body_s = self.limits.body_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the 408 is written: what still comes is read and dropped
            return
        if self.conn.their_state is h11.IDLE:
            if self._read_timer is None:  # the first byte of a new request on a kept-alive connection
                self._arm("headers")
            self._head_bytes += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.IDLE:
            pending = self.conn.trailing_data[0]
            if self._read_timer is None and pending:  # part of a pipelined request came with the previous one
                self._arm("headers")
                self._head_bytes = len(pending)
        elif state is h11.SEND_BODY:
            if self._phase == "headers":
                self._arm("body", self._declared_length())
        else:
            self._disarm()  # the request is in (or the connection is over)

    def _declared_length(self) -> int | None:
        """The Content-Length of the request being read (uvicorn's scope for it), None when it declares none."""
        headers = getattr(self, "scope", {}).get("headers", [])
        value = next((v for k, v in headers if k == b"content-length"), None)
        return int(value) if value is not None and value.isdigit() else None

    def _arm(self, phase: str, declared: int | None = None) -> None:
        """The deadline of reading the headers, or the body: the app's own (a body of declared length has its time at
        the minimum rate: a 300 MB job had been cut at the plain body timeout) and :data:`BODY_BACKSTOP_S` more."""
        self._disarm()
        self._body_s = self.limits.body_s(declared)
        seconds = self.limits.header_timeout_s if phase == "headers" else self._body_s + BODY_BACKSTOP_S
        self._phase, self._head_bytes = phase, 0
        self._read_timer = self.loop.call_later(seconds, self._timed_out, phase)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._read_timer, self._phase = None, ""

    def _timed_out(self, phase: str) -> None:
        self._read_timer, self._phase = None, ""
        if self.transport.is_closing():
            return
        who = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        answered = False
        if phase == "headers":
            if self._head_bytes:  # a silent connection is just closed; a slow request gets a reason
                seconds = self.limits.header_timeout_s
                self.transport.write(_raw_response(408, f"the request headers did not arrive within {seconds:g} s", "header_timeout"))
                log.info("closed the connection of %s: its request headers did not arrive within %g s", who, seconds)
                answered = True
        else:
            log.info("closed the connection of %s: its request body did not arrive within %g s", who, self._body_s)
        if self.limits.on_timeout is not None and (phase == "body" or self._head_bytes):
            self.limits.on_timeout(phase)
        if answered and self.transport.can_write_eof():
            self._linger()
        else:
            self.transport.close()

    def _linger(self) -> None:
        """Close after the client had the chance to read the 408: a socket closed with unread
        bytes in it (the client still trickling) resets the connection, and a reset can discard
        the answer before the client reads it. So: end our side, drop what still arrives, and
        close when the client does or after ``LINGER_S``."""
        self._lingering = True
        self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def _raw_response(status: int, message: str, code: str) -> bytes:
    """A whole JSON error response, for a connection whose request never reached the app."""
    body = json.dumps(error_body(status, message, code)).encode()
    head = (f"HTTP/1.1 {status} Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


def timed_protocol(limits: ReadLimits) -> type[TimedH11Protocol]:
    """A :class:`TimedH11Protocol` class bound to ``limits`` (uvicorn builds one per connection)."""
    return type("TimedH11Protocol", (TimedH11Protocol,), {"limits": limits})


class Server(uvicorn.Server):
    """uvicorn's server that drains the app before closing the sockets, with a hard exit bound."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self._watchdog: threading.Timer | None = None
        self.on_started: Callable[[], None] | None = None
        """Called once the app is ready and the sockets accept (a supervisor's child reports it)."""
        self.serve_early = True
        """Whether the sockets answer while the app starts (:meth:`_serve_early`); not where another process serves."""
        self.listen_when: Callable[[], bool] | None = None
        """Without :attr:`serve_early`: the sockets accept only once the app is ready and this says so (the port is
        open: another server process of the port is ready), polled every :data:`LISTEN_POLL_S`."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up (the app's lifespan: models load and warm up, then the sockets accept for good), with the
        sockets answering from the start: :meth:`_serve_early` serves the app on them while the lifespan runs."""
        given = sockets is not None
        if sockets is None and self.config.uds is None and self.config.fd is None:
            sockets = [self.config.bind_socket()]  # uvicorn's own bind, and its "Uvicorn running on" line, now
        early = await self._serve_early(sockets or []) if self.serve_early else []
        if not self.serve_early and self.listen_when is not None:
            self._listen_when_open(self.listen_when)
        try:
            await super().startup(sockets)
        finally:
            for server in early:  # the app's own servers accept from here on; connections open on these go on
                server.close()
        if self.started and given and sockets:  # uvicorn leaves the message to whoever gave the sockets: one of several processes
            host, port = sockets[0].getsockname()[:2]
            logging.getLogger("uvicorn.error").info("Uvicorn running on http://%s:%d (one of several server processes)", host, port)
        if self.started and self.on_started is not None and not self.should_exit:  # not if stopped while it waited to listen
            self.on_started()

    def _listen_when_open(self, is_open: Callable[[], bool]) -> None:
        """After the app's lifespan has started it (models loaded, warm), wait for ``is_open`` before uvicorn listens."""
        lifespan_startup = self.lifespan.startup

        async def startup() -> None:
            await lifespan_startup()
            if not is_open() and not self.lifespan.should_exit:
                log.info("ready: listening once another server process of the port is ready")
            while not is_open() and not self.lifespan.should_exit and not self.should_exit:
                await asyncio.sleep(LISTEN_POLL_S)

        self.lifespan.startup = startup

    async def _serve_early(self, sockets: list[socket.socket]) -> list[asyncio.Server]:
        """Serve the app on ``sockets`` while its lifespan starts it: ``/metrics`` answers (``idg_ready`` 0),
        ``/health/live`` 200 and ``/health/ready`` 503 "starting", the other routes a JSON 503 ``not_ready``, so a
        scrape sees a starting server rather than a refused connection. On a duplicate of each socket, closed when
        uvicorn's own servers take over (closing it leaves the socket listening)."""
        config = self.config
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=loop)

        return [await loop.create_server(protocol, sock=sock.dup(), ssl=config.ssl, backlog=config.backlog) for sock in sockets]

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._watchdog is None:
            bound = self.grace_s + EXIT_MARGIN_S
            log.info("%s: shutting down (grace %g s, exit within %g s)", signal.Signals(sig).name, self.grace_s, bound)
            self._watchdog = threading.Timer(bound, _hard_exit, args=(bound,))
            self._watchdog.daemon = True
            self._watchdog.start()
        super().handle_exit(sig, frame)

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once a signal (or the request limit) asks to exit
        await drain(self.app, self.grace_s, force=lambda: self.force_exit)


class StartupErrorFilter(logging.Filter):
    """uvicorn logs a failed start-up as Starlette's whole traceback; where the failure is a
    :class:`~app.core.model_loading.ModelLoadError` (a model that cannot load, a bad models file), whose
    sentence already says what is wrong and with which model, log that sentence alone."""

    MARK = "ModelLoadError: "

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if self.MARK in text:
            record.msg, record.args = "cannot start: " + text.rsplit(self.MARK, 1)[1].strip(), ()
        return True


def _hard_exit(bound: float) -> None:
    log.error("shutdown still not finished %g s after the signal: exiting now", bound)
    logging.shutdown()
    os._exit(WATCHDOG_EXIT_CODE)


def load_app(spec: str) -> FastAPI:
    """``module:attribute``: a FastAPI app, or a callable without arguments that returns one."""
    module, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(module), attr or "app")
    if not isinstance(obj, FastAPI) and callable(obj):
        obj = obj()
    if not isinstance(obj, FastAPI):
        raise SystemExit(f"--app {spec}: not a FastAPI app or a factory of one")
    return obj


def _app_or_exit(spec: str) -> FastAPI:
    """:func:`load_app`, or the start's one line and exit status 3 where its settings cannot be used (a keys file that
    cannot be read, tracing without its exporter)."""
    try:
        return load_app(spec)
    except SettingsError as err:
        log.error("cannot start: %s", err)
        sys.exit(3)


def build(app: FastAPI, host: str | None = None, port: int | None = None, log_level: str = "info") -> Server:
    """The server for ``app``, configured from its settings (``host``/``port`` override them)."""
    settings = app.state.settings
    metrics = app.state.metrics
    limits = ReadLimits(settings.header_timeout_s, settings.body_timeout_s, lambda phase: metrics.read_timeouts.labels(phase).inc(),
                        settings.min_upload_rate, max(settings.max_upload_bytes, settings.jobs_max_upload_bytes))
    config = uvicorn.Config(
        app, host=host or settings.host, port=settings.port if port is None else port, http=timed_protocol(limits),
        lifespan="on", log_level=log_level, timeout_graceful_shutdown=CLOSE_S,
        # idle kept-alive connections outlast the clients' pools (uvicorn's 5 s raced httpx's 5 s: a request lost)
        timeout_keep_alive=settings.keep_alive_timeout_s,
        # the access line is app.requests' (app.doors.layer: request ID, status, milliseconds; probes and scrapes left out);
        # uvicorn's own wrote a second line for every request and one for every probe, on the event loop
        access_log=False,
        # JSON logs: uvicorn's own lines go to the root logger's JSON handler too, rather than its text ones
        log_config=None if settings.log_format == "json" else LOGGING_CONFIG,
    )
    return Server(config, app, settings.shutdown_grace_s)


def _configure_logging(fmt: str = "text") -> None:
    configure_logging(fmt)
    logging.getLogger("uvicorn.error").addFilter(StartupErrorFilter())


def serve_child(spec: str, host: str | None, port: int | None, log_level: str, sock: socket.socket, ready: Event,
                opened: Event) -> None:
    """One of several server processes (:mod:`app.processes.launch`): the app on this process's socket of the port."""
    _configure_logging(load_settings().log_format)  # the launcher has read them already: valid
    app = _app_or_exit(spec)
    server = build(app, host, port, log_level)

    def started() -> None:
        try:  # with IDG_PROCESSES=auto the launcher starts the others by what the first holds on its GPU once warm
            settings = getattr(app.state, "settings", None)
            write_memory_report(getattr(getattr(app.state, "service", None), "device", None), bool(getattr(settings, "warmup", False)))
        except (OSError, RuntimeError) as err:
            log.warning("could not report this process's GPU memory to the launcher: %s", err)
        ready.set()
        opened.set()  # the port is open: the processes waiting for it listen

    server.on_started = started
    server.serve_early = os.environ.get(SERVE_EARLY) != "0"
    server.listen_when = opened.is_set
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


def _port(text: str) -> int:
    """``--port``: 0 to 65535 (it had been a bind() OverflowError traceback)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port number, 0 to 65535")
    return int(text)


def _host_error(host: str, name: str) -> str | None:
    """Why ``host`` is no address to listen on (its name does not resolve), or None."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        return f"{name}={host!r} is not an address or a name this machine resolves ({err})"
    return None


SUGGESTED_PORTS = range(8010, 8020)
"""Where the busy-port hint looks for a free port: none of them is used by any page or default (8000 the service, 8001
the docs site and the gRPC example, 8080 Ray's metrics export)."""


def _bind_error(host: str, port: int) -> OSError | None:
    """Why ``port`` cannot be bound at ``host`` now, or None (a bind and close, as uvicorn binds: a port in TIME_WAIT is free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return err
    return None


def _port_error(host: str, port: int, name: str) -> str | None:
    """Why ``port`` cannot be listened on at ``host`` (another program holds it), naming a port that is free now, or
    None. A bind and close now, before the models load: uvicorn's own bind after them had said only "[Errno 98] Address
    already in use"."""
    if port == 0:
        return None
    err = _bind_error(host, port)
    if err is None or err.errno != errno.EADDRINUSE:
        return None  # uvicorn's own bind says what else is wrong
    free = next((p for p in SUGGESTED_PORTS if p != port and _bind_error(host, p) is None), None)
    hint = f", e.g. `make run PORT={free}` or `idg-serve --port {free}`" if free is not None else ""
    return f"port {port} on {host} is in use (another server?): choose another with {name}{hint}"


def _processes(text: str) -> int | str:
    """``--processes``: a count of at least 1, or auto."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a count of at least 1, or auto")
    return int(text)


def _auto(device: str) -> tuple[int, bool]:
    """``IDG_PROCESSES=auto``: the processes to aim at on ``device`` (``IDG_DEVICE``), and whether more than one are
    started in stages (the others once the first is warm, as many as the GPU holds: :mod:`app.processes.launch`)."""
    try:
        cuda = pick_device(device).type == "cuda"
    except (ModelLoadError, RuntimeError):  # IDG_DEVICE=cuda without CUDA: the one process says so as it loads
        cuda = False
    n, why = auto_processes(cuda, host_cores())
    if n == 1:
        log.info("IDG_PROCESSES=auto: 1 server process: %s", why)
    return n, n > 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="idg-serve", description="Serve the IDG app; settings: IDG_* variables (docs/settings.md).")
    parser.add_argument("--host", help="listen address (default: IDG_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=_port, help="listen port (default: IDG_PORT, 8000)")
    parser.add_argument("--processes", type=_processes, help="server processes on the port, each with its own models and worker, "
                        "or auto (default: IDG_PROCESSES, auto: one on the CPU, up to four on CUDA, one per 4 host cores)")
    parser.add_argument("--app", default="app.main:app", help="module:attribute of the app or of a factory (default: app.main:app)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    args = parser.parse_args(argv)
    _configure_logging(os.environ.get("IDG_LOG_FORMAT") or "text")  # before the settings are read: their errors are logged
    try:
        settings = load_settings()
    except SettingsError as err:
        log.error("cannot start: %s", err)
        sys.exit(3)
    _configure_logging(settings.log_format)
    host_error = _host_error(args.host or settings.host, "--host" if args.host else "IDG_HOST")
    if host_error:  # before the models load; it had been uvicorn's "[Errno -2] Name or service not known" after them
        log.error("cannot start: %s", host_error)
        sys.exit(3)
    port = settings.port if args.port is None else args.port
    port_error = _port_error(args.host or settings.host, port, "--port" if args.port is not None else "IDG_PORT")
    if port_error:  # before the models load
        log.error("cannot start: %s", port_error)
        sys.exit(3)
    wanted = args.processes or settings.processes
    processes, staged = (wanted, False) if wanted != "auto" else _auto(settings.device)
    if processes > 1:
        host, port = args.host or settings.host, settings.port if args.port is None else args.port
        target = ("app.server:serve_child", (args.app, host, port, args.log_level))
        sys.exit(serve_processes(target, processes, host, port, settings.shutdown_grace_s, settings.simulated_call_ms is not None,
                                 staged=staged))
    app = _app_or_exit(args.app)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl+C it handled gracefully
        build(app, args.host, args.port, args.log_level).run()


if __name__ == "__main__":
    main()
