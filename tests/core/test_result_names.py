"""The result's curve is named for what it holds: ``values`` with ``output`` (logit or probability); the names
``logits`` / ``probe_logits`` were never released in the library and are gone (the service's JSON keeps its own)."""

from __future__ import annotations

import pytest
import torch

from idg_core import METHODS
from tests.models import SmallCNN


@pytest.mark.parametrize(("name", "kwargs", "output"), [
    ("idg", {"steps": 4, "probe_steps": 5}, "logit"),
    ("ig", {"steps": 4}, "logit"),
    ("guided_ig", {"steps": 3}, "probability"),
    ("idg", {"steps": 4, "probe_steps": 5, "output": "probability"}, "probability"),
])
def test_values_say_which_output_they_hold(name: str, kwargs: dict, output: str) -> None:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = torch.rand(2, 3, 16, 16)
    res = METHODS[name](model, x, "black", [1, 2], **kwargs)
    assert res.output == output
    assert res.values.shape[0] == 2 and res.values.numel() > 0
    if output == "probability":
        assert bool((res.values >= 0).all() and (res.values <= 1).all())
    assert not hasattr(res, "logits") and not hasattr(res, "probe_logits")


def test_a_method_without_a_curve_says_so() -> None:
    res = METHODS["agi"](SmallCNN().eval(), torch.rand(1, 3, 16, 16), None, 1, max_iter=2, num_classes=10)
    assert res.output == "" and res.values.numel() == 0
