"""The coverage phase over every operation: each field at its boundaries and past them, one at a time, a few hundred
requests per operation (slow). A module of its own because schemathesis builds these cases when the module is collected
(about 40 s on 2 cores), and a module whose every test is slow is not collected at all where ``-m`` leaves the slow
tests out (``make test``; tests/conftest.py's ``ALL_SLOW_MODULES``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings

from tests.service.reliability.test_fuzz import FUZZ_SETTINGS, GOOD, coverage, fuzz_app, fuzz_url, validate_with_every_check

pytestmark = pytest.mark.slow
__all__ = ["fuzz_app", "fuzz_url"]  # the fuzzed app's fixtures: this module's own instance of each


@coverage.parametrize()
@settings(FUZZ_SETTINGS, max_examples=10_000)
def test_every_field_at_its_boundaries_gets_the_documented_answer(case: Any, fuzz_url: str) -> None:
    response = case.call(base_url=fuzz_url, headers=GOOD, timeout=120)
    validate_with_every_check(case, response)
