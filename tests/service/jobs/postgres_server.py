"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql`` package (initdb + pg_ctl)
into a temporary directory, on a free loopback port, run as the ``postgres`` user (or ``nobody``
where there is none) when the tests run as root (PostgreSQL refuses root). Skips the test where the server or psycopg is absent."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _as_user() -> tuple[list[str], int | None, int | None]:
    """The command prefix (and uid, gid) to run PostgreSQL as a user other than root."""
    if os.geteuid() != 0:
        return [], None, None
    for name in ("postgres", "nobody"):
        try:
            user = pwd.getpwnam(name)
            break
        except KeyError:
            continue
    else:
        pytest.skip("running as root and there is neither a 'postgres' nor a 'nobody' user to run PostgreSQL as")
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root and runuser is missing")
    return [runuser, "-u", user.pw_name, "--"], user.pw_uid, user.pw_gid


class Server:
    """A running test server that the test may stop (as an outage would) and start again on the same port."""

    def __init__(self, prefix: list[str], pg_ctl: str, data: Path, log: Path, options: str, url: str) -> None:
        self._prefix, self._pg_ctl, self._data, self._log, self._options, self.url = prefix, pg_ctl, data, log, options, url

    def start(self) -> None:
        subprocess.run([*self._prefix, self._pg_ctl, "-D", str(self._data), "-l", str(self._log), "-o", self._options, "-w", "-t",
                        "60", "start"], check=True, capture_output=True, timeout=90)

    def stop(self, mode: str = "fast") -> None:
        """``fast``: clients are disconnected and the server shuts down cleanly; ``immediate``: as if it died."""
        subprocess.run([*self._prefix, self._pg_ctl, "-D", str(self._data), "-m", mode, "-w", "stop"], capture_output=True, timeout=60)

    def _processes(self) -> list[int]:
        """The postmaster's PID and its children's (the backends, the background workers), read from /proc."""
        postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
            except OSError:  # ended meanwhile
                continue
            if stat and int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                children.append(int(entry.name))
        return [postmaster, *children]

    @contextmanager
    def stalled(self) -> Iterator[None]:
        """Every process of the server stopped by SIGSTOP (not dead: its kernel still acknowledges every packet), the
        postmaster first so that it forks no more; continued by SIGCONT on leaving, whatever happened."""
        postmaster = int((self._data / "postmaster.pid").read_text().split()[0])
        stopped = [postmaster]
        try:
            os.kill(postmaster, signal.SIGSTOP)
            for pid in self._processes()[1:]:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            yield
        finally:
            for pid in reversed(stopped):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


@contextmanager
def postgres_cluster() -> Iterator[Server]:
    """Start a server (user ``idg``, trust authentication on loopback); yield it; stop it and delete its files."""
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
    pytest.importorskip("psycopg_pool", reason="the postgres extra (psycopg_pool) is not installed")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL's initdb / pg_ctl are not installed (Debian package postgresql)")
    prefix, uid, gid = _as_user()
    root = Path(tempfile.mkdtemp(prefix="idg-pg-"))  # not under pytest's root-only tmp dirs: the postgres user must reach it
    root.chmod(0o755)
    if uid is not None and gid is not None:
        os.chown(root, uid, gid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data, log = root / "data", root / "server.log"
    try:
        subprocess.run([*prefix, initdb, "-D", str(data), "-U", "idg", "-A", "trust", "--no-sync"], check=True, capture_output=True,
                       timeout=120)
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        server = Server(prefix, pg_ctl, data, log, options, f"postgresql://idg@127.0.0.1:{port}/postgres")
        server.start()
        try:
            yield server
        finally:
            server.stop("immediate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[str]:
    """Start a server; yield its URL; stop it."""
    with postgres_cluster() as server:
        yield server.url


def reset(url: str) -> None:
    """Drop the job tables, so each test starts from an empty store."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS images, jobs")
