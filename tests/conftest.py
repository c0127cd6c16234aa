"""Shared by every test."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

_SESSION_DATA = tempfile.mkdtemp(prefix="idg-test-data-")


def pytest_configure(config: pytest.Config) -> None:
    """Before any test module is imported: settings built at import or in a module-scoped fixture (before
    :func:`_own_data_dir` applies) keep their job store in a temporary directory, never in the checkout's data/."""
    os.environ["IDG_DATA_DIR"] = _SESSION_DATA


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_DATA, ignore_errors=True)


@pytest.fixture(autouse=True)
def _same_random_state_for_every_test() -> None:
    """Every test starts from the same global random state, so its own ``torch.rand`` draws do not
    depend on which tests ran before it (building a test model leaves that state alone: tests/models.py)."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every app a test starts keeps its job store (IDG_DATA_DIR) in a directory of its own, not the working directory."""
    monkeypatch.setenv("IDG_DATA_DIR", str(tmp_path_factory.mktemp("data")))


@pytest.fixture(autouse=True)
def _no_gc_freeze(monkeypatch: pytest.MonkeyPatch) -> None:
    """Apps started in the test process do not gc.freeze() at ready (IDG_GC_FREEZE=false): the full collection before the
    freeze walks every object the test run made so far, which doubled the time of the app-starting tests (15.7 s against 8.2 s
    for test_endpoints and test_bad_input). The freeze is tested where it is asked for (tests/service/test_config.py), and the
    smoke test runs the service at its defaults."""
    monkeypatch.setenv("IDG_GC_FREEZE", "false")
