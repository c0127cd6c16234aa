"""explain_if: the condition language (parsed, never eval'd) and /predict with it on the real app."""

from __future__ import annotations

import base64
import re

import pytest
import torch

from app.service.explain_if import ConditionError, Facts, parse_condition
from idg_core.presets import DEFAULT_PRESET, preset_cost
from tests.service.conftest import AppFactory, image_bytes, serve

FACTS = Facts.of(torch.tensor([0.5, 0.3, 0.2]))  # confidence 0.5, margin 0.2, class 0


@pytest.mark.parametrize(("text", "held"), [
    ("confidence < 0.6", True), ("confidence >= 0.6", False), ("margin < 0.1", False), ("margin<=0.25", True),
    ("entropy > 1.0", True), ("entropy > 2.5", False), ("class in 3,17,207", False), ("CLASS IN 0", True),
    ("confidence < 0.1 or class in 0", True), ("confidence < 0.6 and margin < 0.1", False),
    ("margin < 0.1 or confidence < 0.6 and class in 0", True),  # and binds tighter than or
    ("(margin < 0.1 or confidence < 0.6) and class in 4", False), ("confidence != 0.5", False),
])
def test_conditions(text: str, held: bool) -> None:
    assert parse_condition(text)(FACTS) is held


def test_facts() -> None:
    assert FACTS.confidence == pytest.approx(0.5) and FACTS.margin == pytest.approx(0.2) and FACTS.predicted == 0
    assert FACTS.entropy == pytest.approx(-(0.5 * torch.log(torch.tensor(0.5)) + 0.3 * torch.log(torch.tensor(0.3))
                                            + 0.2 * torch.log(torch.tensor(0.2))).item(), rel=1e-5)


@pytest.mark.parametrize(("text", "column", "words"), [
    ("confidence <", 13, "a number"), ("conf < 1", 1, "confidence, margin"), ("class in 1,", 12, "class index"),
    ("confidence < 0.6 foo", 18, "'and', 'or'"), ("__import__('os')", 12, "unexpected character"), ("((margin < 1)", 14, "')'"),
    ("class 3", 7, "'in'"), ("class in 2.5", 10, "whole number"), ("", 1, "empty"), ("(" * 40 + "margin<1" + ")" * 40, 17, "nest"),
])
def test_errors_point_at_the_problem(text: str, column: int, words: str) -> None:
    with pytest.raises(ConditionError, match=re.escape(words)) as info:
        parse_condition(text)
    assert f"column {column}" in str(info.value)


async def test_predict_explains_only_when_the_condition_holds(tiny_app: AppFactory) -> None:
    app = tiny_app()
    default = preset_cost("idg", DEFAULT_PRESET)  # the explanation is the default answer: its passes, without the prediction
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())}, data={"explain_if": "confidence > 1.5"})
        assert r.status_code == 200, r.text
        assert r.json()["explained"] is False and r.json()["explanation"] is None and sum(net.calls) == 1  # /predict speed
        net.calls.clear()
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())},
                              data={"explain_if": "confidence <= 1 or margin < 0.1", "faithfulness": "insertion"})
        body = r.json()
        assert r.status_code == 200 and body["explained"] is True, r.text
        ex = body["explanation"]
        assert ex["target"]["index"] == body["top_k"][0]["index"] and ex["method"] == "idg" and ex["parameters"]["preset"] == DEFAULT_PRESET
        assert ex["faithfulness"]["insertion"] is not None
        # the prediction pass is not repeated: 1 + the default's passes + the score's steps + 1; the explanation's cost is
        # its own passes, without the prediction /predict made
        own = default.forward + ex["faithfulness"]["steps"] + 1
        assert ex["cost"] == {"forward_passes": own, "backward_passes": default.backward} and sum(net.calls) == 1 + own
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())}, data={"explain_if": "margin >= 0", "method": "ig",
                                                                                            "preset": "paper"})
        assert r.json()["explanation"]["parameters"]["steps"] == 50
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())})
        assert r.json()["explained"] is None and r.json()["explanation"] is None
        metrics = (await client.get("/metrics")).text
        for line in ('idg_predictions_total{condition="held",model="tiny"} 2.0',
                     'idg_predictions_total{condition="not_held",model="tiny"} 1.0',
                     'idg_predictions_total{condition="none",model="tiny"} 1.0',
                     'idg_explanations_total{model="tiny"} 2.0'):
            assert line in metrics


async def test_a_condition_that_does_not_parse_is_a_422_before_any_work(tiny_app: AppFactory) -> None:
    app = tiny_app()
    async with serve(app) as client:
        net = app.state.service.models["tiny"].net
        net.calls.clear()
        r = await client.post("/predict", json={"image": base64.b64encode(image_bytes()).decode(),
                                                "explain_if": "confidence < 0.6 or"})
        assert r.status_code == 422 and "column 20" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "invalid_parameter" and net.calls == []
        r = await client.post("/predict", files={"file": ("a.png", image_bytes())}, data={"explain_if": "margin < 1", "faithfulness": "x"})
        assert r.status_code == 422 and "faithfulness" in r.json()["error"]["message"]
