"""The client is a package of its own (idg_client): it imports nothing from the server or the library (so it
installs without torch, with its own pyproject.toml) and its command is ``idg-client`` in both packagings.
The names it had before 0.1.0 (``app.client``, ``app.cli``) keep no alias: nothing was released under them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest

from idg_client.cli import main as cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_client_imports_nothing_from_the_server_or_torch() -> None:
    code = ("import sys, idg_client, idg_client.cli; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'app', 'idg_core', 'idg_models', 'idg_evaluation', 'idg_serving', 'torch', 'fastapi', 'uvicorn', 'pydantic'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_python_m_idg_client_is_the_command() -> None:
    out = subprocess.run([sys.executable, "-m", "idg_client", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "idg-client" in out.stdout, out.stderr


def test_both_packagings_declare_the_command_and_the_client_needs_only_its_own_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    client = tomllib.loads((ROOT / "idg_client" / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["idg-client"] == client["project"]["scripts"]["idg-client"] == "idg_client.cli:main"
    assert client["project"]["dependencies"] == project["project"]["optional-dependencies"]["client"]
    assert {d.split(">")[0] for d in client["project"]["dependencies"]} == {"httpx", "numpy", "pillow"}


def test_the_names_before_the_client_package_keep_no_alias() -> None:
    # by file, not by import: an editable install of another checkout would still find a module deleted here
    assert not (ROOT / "app" / "client.py").exists() and not (ROOT / "app" / "cli.py").exists()


# The command's arguments: refused by argparse (exit 2, the option named), before any request is made.


def _no_client(*args: Any, **kwargs: Any) -> NoReturn:
    raise AssertionError("the arguments should have been refused before a client was made")


def test_the_url_must_say_http_or_https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``IDG_URL=127.0.0.1:8712`` had been "could not reach the service (UnsupportedProtocol)": it was never tried."""
    monkeypatch.setattr("idg_client.cli.Client", _no_client)
    (tmp_path / "x.jpg").write_bytes(b"")
    monkeypatch.setenv("IDG_URL", "127.0.0.1:8712")
    assert cli(["predict", str(tmp_path / "x.jpg")]) == 2
    err = capsys.readouterr().err
    assert err == "error: IDG_URL/--url must start with http:// or https:// (got '127.0.0.1:8712')\n", err
    monkeypatch.delenv("IDG_URL")
    assert cli(["--url", "ftp://host", "job", "list"]) == 2
    assert "must start with http:// or https://" in capsys.readouterr().err


def test_a_url_with_http_or_https_is_taken(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def client(url: str, **kwargs: Any) -> NoReturn:
        seen.append(url)
        raise AssertionError("taken: no service to ask here")

    monkeypatch.setattr("idg_client.cli.Client", client)
    for url in ("http://127.0.0.1:8712", "HTTPS://idg.example"):
        with pytest.raises(AssertionError):
            cli(["--url", url, "job", "list"])
    assert seen == ["http://127.0.0.1:8712", "HTTPS://idg.example"]


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_the_timeout_must_be_a_positive_number_of_seconds(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--timeout -1`` had been "error: Timeout value out of range", from the socket, naming nothing."""
    monkeypatch.setattr("idg_client.cli.Client", _no_client)
    with pytest.raises(SystemExit) as exc:
        cli(["--url", "http://127.0.0.1:9", f"--timeout={value}", "predict", str(tmp_path / "x.jpg")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --timeout: " in err and "seconds > 0" in err, err


@pytest.mark.parametrize("value", ["-1", "0", "0.01", "nan"])
def test_job_wait_polls_at_most_twenty_times_a_second(value: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--poll -1`` had failed after one poll ("sleep length must be non-negative"); ``--poll 0`` polled ~50 times a second."""
    monkeypatch.setattr("idg_client.cli.Client", _no_client)
    with pytest.raises(SystemExit) as exc:
        cli(["--url", "http://127.0.0.1:9", "job", "wait", "ID", f"--poll={value}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "argument --poll: " in err and "at least 0.05" in err, err


def test_job_wait_takes_a_short_poll(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from idg_client.client import Client

    polls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        state = "done" if len(polls) > 1 else "running"
        return httpx.Response(200, json={"id": "ID", "state": state, "total": 2, "done": len(polls), "failed": 0})

    monkeypatch.setattr("idg_client.cli.Client", lambda url, **kw: Client(url, transport=httpx.MockTransport(handler)))
    assert cli(["--url", "http://idg.test", "--timeout", "5", "job", "wait", "ID", "--poll", "0.05"]) == 0
    assert polls == ["/jobs/ID", "/jobs/ID"] and capsys.readouterr().out == "ID done: 2 answered, 0 failed of 2\n"
