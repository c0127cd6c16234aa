"""Drift metrics: each prediction counted by model and a fixed set of class ranges (bounded, comparable over time), its
top-1 probability and each explanation's attribution concentration as histograms, whichever door the request came
through (the service books them, off the worker's thread)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from app.monitoring.prometheus import DRIFT_CLASS_BINS, class_range, concentration
from tests.service.conftest import AppFactory, image_bytes, serve
from tests.service.test_oip import INFER, image_input


def test_the_class_ranges_cover_every_class_once_in_a_fixed_number_of_labels() -> None:
    for classes in (1, 7, DRIFT_CLASS_BINS, 21, 1000, 1001):
        bins = min(classes, DRIFT_CLASS_BINS)
        labels = [class_range(c * bins // classes, classes) for c in range(classes)]
        assert len(set(labels)) == bins
        for c, label in enumerate(labels):
            lo, _, hi = label.partition("-")
            assert int(lo) <= c <= int(hi or lo), (classes, c, label)
    assert class_range(0, 1000) == "0-49" and class_range(19, 1000) == "950-999" and class_range(3, 10) == "3"


def test_concentration_reads_0_05_for_an_even_map_and_1_for_one_on_few_pixels() -> None:
    assert abs((concentration(torch.ones(3, 20, 20)) or 0) - 0.05) < 1e-6
    spot = torch.zeros(3, 20, 20)
    spot[:, 4, 5] = -2.0  # the sign does not matter: the mass is |attribution|
    assert concentration(spot) == 1.0
    assert concentration(torch.zeros(3, 4, 4)) is None and concentration(torch.full((2, 2), float("nan"))) is None
    noisy = torch.randn(3, 50, 50, generator=torch.Generator().manual_seed(0))  # the share of the 125 largest of 2500 pixels
    flat = noisy.abs().sum(0).flatten().double()
    assert concentration(noisy) == pytest.approx(float(flat.topk(125).values.sum() / flat.sum()), rel=1e-6)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_predictions_and_explanations_of_every_door_are_booked(tiny_app: AppFactory) -> None:
    async with serve(tiny_app(warmup=False)) as client:
        before = _samples((await client.get("/metrics")).text)
        ranges = {dict(k[1])["classes"] for k in before if k[0] == "idg_predicted_classes_total"}
        assert len(ranges) == DRIFT_CLASS_BINS and all(v == 0 for k, v in before.items() if k[0] == "idg_predicted_classes_total")
        files = {"file": ("a.png", image_bytes(), "image/png")}
        top = (await client.post("/predict", files=files)).json()["top_k"][0]
        assert (await client.post(INFER, json={"inputs": [image_input(image_bytes())]})).status_code == 200
        r = await client.post("/attribute", files=files, data={"steps": "8", "probe_steps": "4", "return_overlay": "false"})
        assert r.status_code == 200
        after = _samples((await client.get("/metrics")).text)
    counted = {dict(k[1])["classes"]: v for k, v in after.items() if k[0] == "idg_predicted_classes_total" and v}
    assert counted == {class_range(top["index"] * DRIFT_CLASS_BINS // 1000, 1000): 2}, counted  # /predict and /v2 infer
    assert after[("idg_prediction_confidence_count", (("model", "tiny"),))] == 2
    assert abs(after[("idg_prediction_confidence_sum", (("model", "tiny"),))] - 2 * top["probability"]) < 1e-4
    assert after[("idg_attribution_concentration_count", (("model", "tiny"),))] == 1
    assert 0.05 <= after[("idg_attribution_concentration_sum", (("model", "tiny"),))] <= 1


async def test_drift_is_observed_off_the_workers_thread(tiny_app: AppFactory) -> None:
    """The worker's thread feeds the device: a drift metric read there (a GPU map's concentration) would wait for the
    device at every explanation. Predictions are observed where their host probabilities arrive, maps in an image thread."""
    app = tiny_app(warmup=False)
    seen: list[tuple[str, str]] = []
    metrics = app.state.metrics
    for name in ("observe_prediction", "observe_explanation"):
        original = getattr(metrics, name)

        def spy(*args: object, _original: Any = original, _name: str = name) -> Any:
            seen.append((_name, threading.current_thread().name))
            return _original(*args)

        setattr(metrics, name, spy)
    async with serve(app) as client:
        files = {"file": ("a.png", image_bytes(), "image/png")}
        assert (await client.post("/predict", files=files)).status_code == 200
        assert (await client.post(INFER, json={"inputs": [image_input(image_bytes())]})).status_code == 200
        r = await client.post("/attribute", files=files, data={"steps": "8", "probe_steps": "4", "return_overlay": "false"})
        assert r.status_code == 200
        explain = {"inputs": [image_input(image_bytes())], "outputs": [{"name": "attribution"}]}
        assert (await client.post(INFER, json=explain)).status_code == 200
    assert [n for n, _ in seen] == ["observe_prediction"] * 2 + ["observe_explanation"] * 2, seen
    assert {t for _, t in seen if not t.startswith("idg-image")} == {"MainThread"}, seen  # not idg-worker, idg-device
