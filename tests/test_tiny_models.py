"""The tests' own tiny models: building one leaves the global random state alone."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
from torch import nn

from tests.models import Linear, SmallCNN, TinyNet, tiny_classifier

BUILDERS: dict[str, Callable[[], object]] = {
    "SmallCNN": SmallCNN, "SmallCNN(seed=3)": partial(SmallCNN, seed=3), "Linear": Linear, "TinyNet": TinyNet,
    "tiny_classifier": tiny_classifier,
}


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
def test_building_a_model_leaves_the_global_random_state_unchanged(build: Callable[[], object]) -> None:
    torch.rand(5)  # some state other than a fresh seed's
    before = torch.random.get_rng_state()
    build()
    assert torch.equal(torch.random.get_rng_state(), before)


def test_a_seeded_model_has_the_weights_of_its_seed_whatever_the_global_state() -> None:
    torch.manual_seed(123)
    a = SmallCNN(seed=2)
    torch.rand(1000)
    b = SmallCNN(seed=2)
    with torch.random.fork_rng(devices=[]):  # the weights torch.manual_seed(2) then the layers gave before
        torch.random.default_generator.manual_seed(2)
        conv = nn.Conv2d(3, 8, 3, padding=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert torch.equal(a.body[0].weight, conv.weight)
    assert not torch.equal(a.body[0].weight, SmallCNN(seed=3).body[0].weight)
