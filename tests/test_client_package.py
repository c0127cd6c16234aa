"""The client is a package of its own (idg_client): it imports nothing from the server or the library (so it
installs without torch, with its own pyproject.toml) and its command is ``idg-client`` in both packagings.
The names it had before 0.1.0 (``app.client``, ``app.cli``) keep no alias: nothing was released under them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_client_imports_nothing_from_the_server_or_torch() -> None:
    code = ("import sys, idg_client, idg_client.cli; print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'app', 'idg_core', 'idg_serving', 'torch', 'fastapi', 'uvicorn', 'pydantic'}))")
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
