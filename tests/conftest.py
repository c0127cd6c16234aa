"""Shared by every test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _same_random_state_for_every_test() -> None:
    """Every test starts from the same global random state, so its own ``torch.rand`` draws do not
    depend on which tests ran before it (building a test model leaves that state alone: tests/models.py)."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every app a test starts keeps its job store (IDG_DATA_DIR) in a directory of its own, not the working directory."""
    monkeypatch.setenv("IDG_DATA_DIR", str(tmp_path_factory.mktemp("data")))
