"""The newcomer's path: ``scripts/setup.sh`` installs each part once and says what it does, and
``make run`` (a real make, a real server process) stops quietly on SIGTERM and on Ctrl-C."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of setup.sh beside a pyproject.toml, with a .venv whose python only logs what pip was asked."""
    root = tmp_path / "repo"
    shutil.copy(ROOT / "scripts" / "setup.sh", _mkdir(root / "scripts") / "setup.sh")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    _executable(root / ".venv" / "bin" / "python", '#!/bin/sh\necho "$@" >> "$(dirname "$0")/../../pip.log"\n')
    for program in ("chromium", "promtool", "initdb"):  # present: setup does not reach for apt-get
        _executable(tmp_path / "bin" / program, "#!/bin/sh\n")
    return root


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _setup(repo: Path, extras: str = "") -> tuple[list[str], str]:
    """Run setup.sh; the pip commands it ran (new ones only) and what it said."""
    log = repo / "pip.log"
    before = log.read_text().splitlines() if log.exists() else []
    env = {**os.environ, "PATH": f"{repo.parent / 'bin'}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/setup.sh", *([extras] if extras else [])], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    after = log.read_text().splitlines() if log.exists() else []
    return [line for line in after[len(before):] if "-e" in line.split()], done.stderr


def test_setup_installs_each_part_once_and_says_so(repo: Path) -> None:
    installs, said = _setup(repo, "dev")  # make test
    assert [i.split(" -e ")[1].split()[0] for i in installs] == [".[dev]"]
    assert "installing into .venv" in said and re.search(r"installed base dev in \d+ s", said), said
    installs, said = _setup(repo)  # make run after make test: nothing to install, nothing said
    assert installs == [] and said == ""
    installs, _ = _setup(repo, "dev,bench")  # make bench: only what is new
    assert [i.split(" -e ")[1].split()[0] for i in installs] == [".[bench]"]
    assert _setup(repo, "bench") == ([], "")
    time.sleep(1.1)  # a pyproject.toml newer than the stamps (mtime resolution) asks for the install again
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    installs, _ = _setup(repo)
    assert [i.split(" -e ")[1].split()[0] for i in installs] == ["."]


def test_setup_takes_a_venv_installed_before_the_base_had_its_own_stamp(repo: Path) -> None:
    (repo / ".venv" / ".installed-dev").touch()  # what `make test` left before this change
    assert _setup(repo) == ([], "")


# --- make run, for real -----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


needs_venv = pytest.mark.skipif(
    shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists(),
    reason="needs make and the project's .venv (made by `make test`)",
)


@needs_venv
@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM to make", "Ctrl-C (SIGINT to the process group)"])
def test_make_run_stops_quietly(how: str, tmp_path: Path) -> None:
    port = _free_port()
    out = tmp_path / "make.log"
    with open(out, "wb") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "run", f"PORT={port}", "SERVE_ARGS=--app tests.service.reliability.server_app:make_app"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "IDG_WARMUP": "false"},
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert make.poll() is None, out.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"not ready in 120 s:\n{out.read_text()}")
        if how.startswith("SIGTERM"):
            make.send_signal(signal.SIGTERM)
        else:
            os.killpg(make.pid, signal.SIGINT)
        make.wait(timeout=60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    said = out.read_text()
    assert "make: ***" not in said and "Traceback" not in said, said
    assert "shutting down" in said  # the server drained (its own log line)
    with pytest.raises(httpx.ConnectError):  # and is gone, not orphaned
        httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=2)


def test_settings_made_anywhere_in_the_tests_keep_their_state_out_of_the_checkout() -> None:
    """Settings built at a test module's import once sent the jobs of the fuzz tests to the checkout's data/."""
    from app.core.config import Settings

    assert not Settings(models=["tiny"]).data_dir.resolve().is_relative_to(ROOT)


def test_make_run_listens_where_idg_host_and_idg_port_say_and_its_own_arguments_win() -> None:
    def planned(*args: str, **env: str) -> str:
        plain = {k: v for k, v in os.environ.items() if not k.startswith(("IDG_", "MAKE", "MFLAGS"))}  # under `make test` too
        done = subprocess.run(["make", "-n", "--no-print-directory", "run", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True, env=plain | env)
        return next(line for line in done.stdout.splitlines() if "serve.sh" in line).strip()

    assert planned().endswith("scripts/serve.sh --host 127.0.0.1 --port 8000")
    assert planned(IDG_HOST="0.0.0.0", IDG_PORT="8713").endswith("scripts/serve.sh --host 0.0.0.0 --port 8713")
    assert planned("PORT=9", IDG_PORT="8713").endswith("--port 9")


def test_setup_installs_again_where_the_venvs_project_is_another_checkout(repo: Path) -> None:
    """A .venv whose editable install points at another folder (the checkout moved, or a copy shares it) imports none
    of this checkout's code: setup says so and installs the project again, even with every stamp fresh."""
    _setup(repo, "dev")
    python = repo / ".venv" / "bin" / "python"  # `import app` from elsewhere finds another checkout: the check fails
    _executable(python, '#!/bin/sh\n[ "$1" = "-c" ] && exit 1\necho "$@" >> "$(dirname "$0")/../../pip.log"\n')
    installs, said = _setup(repo)
    assert [i.split(" -e ")[1].split()[0] for i in installs] == ["."] and "not this checkout" in said, said
