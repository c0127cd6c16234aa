"""Shared by every test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _same_random_state_for_every_test() -> None:
    """Every test starts from the same global random state, so its own ``torch.rand`` draws do not
    depend on which tests ran before it (building a test model leaves that state alone: tests/models.py)."""
    torch.manual_seed(0)
