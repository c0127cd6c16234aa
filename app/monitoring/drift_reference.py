"""The drift reference: what a model predicts and how its explanations look on photos the operator calls normal.

The drift alerts (deploy/monitoring/rules/idg.rules.yml) compare the last 15 minutes of traffic with a reference, as
NannyML and Evidently compare with a reference window: a comparison with the service's own past (the last hour
against the last day) reads the same on a server with under an hour of history, so it cannot fire on the first day,
and fires again when traffic returns to normal after a shift.

Record one with ``idg-drift-reference`` (``python -m app.monitoring.drift_reference``): it sends each photo of a folder to
a running server that takes no other traffic (a staging server, or one not yet behind the load balancer) as a
prediction and as an explanation scored for faithfulness, reads that server's ``/metrics`` before and after, and writes
what those requests moved (the share of each predicted class range, the mean top-1 probability, the mean attribution
concentration, the mean faithfulness per method and metric) as JSON: the very computations the live metrics make.
``IDG_DRIFT_REFERENCE=/path/reference.json`` has every server export it at start-up (:meth:`Metrics.set_drift_reference
<app.monitoring.prometheus.Metrics.set_drift_reference>`), as ``idg_drift_reference_class_share{model, classes}``,
``idg_drift_reference{model, quantity}`` (``confidence``, ``concentration``) and
``idg_drift_reference_faithfulness{model, method, metric}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FORMAT = 1
"""The version of the reference file's layout."""
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")

log = logging.getLogger(__name__)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
"""One scrape of ``/metrics``: (sample name, labels) -> value."""


class DriftReferenceError(ValueError):
    """A reference file that cannot be used, or a recording that cannot be trusted (other traffic reached the server)."""


def parse_metrics(text: str) -> Samples:
    """A ``/metrics`` answer as its samples."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, frozenset(s.labels.items())): float(s.value)
            for family in text_string_to_metric_families(text) for s in family.samples}


def _moved(before: Samples, after: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """How much each sample of ``name`` whose labels include ``labels`` grew from ``before`` to ``after``."""
    wanted = set(labels.items())
    return {key: value - before.get((n, key), 0.0) for (n, key), value in after.items() if n == name and wanted <= key}


def _total(moved: Mapping[Any, float]) -> float:
    return sum(moved.values())


def reference_from_scrapes(before: Samples, after: Samples, models: Sequence[str], predictions: int,
                           explanations: int) -> dict[str, Any]:
    """The reference of ``models`` from two scrapes of one server taken around ``predictions`` predictions and
    ``explanations`` explanations per model: a :class:`DriftReferenceError` where the counts moved by anything else (other
    traffic reached the server meanwhile)."""
    out: dict[str, Any] = {}
    for model in models:
        classes = _moved(before, after, "idg_predicted_classes_total", model=model)
        counted = _total(_moved(before, after, "idg_prediction_confidence_count", model=model))
        explained = _total(_moved(before, after, "idg_attribution_concentration_count", model=model))
        if round(counted) != predictions or round(_total(classes)) != predictions or round(explained) > explanations:
            raise DriftReferenceError(
                f"{model}: the server counted {counted:.0f} predictions and {explained:.0f} explanations while this sent "
                f"{predictions} and {explanations}: other traffic reached it, record on a server that takes none")
        shares = {dict(key)["classes"]: value / predictions for key, value in sorted(classes.items(), key=lambda kv: sorted(kv[0]))}
        confidence = _total(_moved(before, after, "idg_prediction_confidence_sum", model=model)) / predictions
        concentration = (_total(_moved(before, after, "idg_attribution_concentration_sum", model=model)) / explained
                         if explained else None)
        faithfulness: dict[str, dict[str, float]] = {}
        for key, count in _moved(before, after, "idg_faithfulness_count", model=model).items():
            if count > 0:
                labels = dict(key)
                total = _total(_moved(before, after, "idg_faithfulness_sum", **labels))
                faithfulness.setdefault(labels["method"], {})[labels["metric"]] = round(total / count, 6)
        digests = [dict(key).get("digest") for (n, key) in after if n == "idg_model_info" and dict(key).get("model") == model]
        out[model] = {"digest": digests[0] if digests else None, "predictions": predictions, "explanations": round(explained),
                      "classes": {k: round(v, 6) for k, v in shares.items()}, "confidence": round(confidence, 6),
                      "concentration": None if concentration is None else round(concentration, 6), "faithfulness": faithfulness}
    return {"format": FORMAT, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "models": out}


def load_reference(path: Path) -> dict[str, Any]:
    """A reference file as :func:`reference_from_scrapes` wrote it, checked; a :class:`DriftReferenceError` naming what is
    wrong."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DriftReferenceError(f"IDG_DRIFT_REFERENCE {path}: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("models"), dict):
        raise DriftReferenceError(f"IDG_DRIFT_REFERENCE {path}: not a drift reference of format {FORMAT} (idg-drift-reference writes one)")
    for model, ref in data["models"].items():
        ok = (isinstance(ref, dict) and isinstance(ref.get("classes"), dict)
              and all(isinstance(v, (int, float)) for v in ref["classes"].values())
              and isinstance(ref.get("confidence"), (int, float))
              and (ref.get("concentration") is None or isinstance(ref["concentration"], (int, float)))
              and isinstance(ref.get("faithfulness", {}), dict)
              and all(isinstance(m, dict) and all(isinstance(v, (int, float)) for v in m.values())
                      for m in ref.get("faithfulness", {}).values()))
        if not ok:
            raise DriftReferenceError(f"IDG_DRIFT_REFERENCE {path}: model {model!r} lacks classes, confidence or well-formed "
                                 "concentration and faithfulness")
    return data


def _images(folder: Path) -> list[Path]:
    found = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not found:
        raise DriftReferenceError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    return found


def record(url: str, folder: Path, models: Sequence[str] = (), fields: Mapping[str, str] | None = None,
           timeout_s: float = 300.0) -> dict[str, Any]:
    """Send every image of ``folder`` to the server at ``url`` as a prediction (``/predict``) and an explanation
    (``/attribute`` with ``fields``, faithfulness insertion and deletion unless they say otherwise) per model of
    ``models`` (default: every model the server loaded), and return the reference those requests moved its metrics by."""
    import httpx

    images = _images(folder)
    form = {"faithfulness": "insertion,deletion", "return_overlay": "false", **(fields or {})}
    with httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s) as client:
        def scrape() -> Samples:
            r = client.get("/metrics")
            r.raise_for_status()
            return parse_metrics(r.text)

        before = scrape()
        names = list(models) or sorted({dict(k)["model"] for (n, k) in before if n == "idg_model_info"})
        if not names:
            raise DriftReferenceError(f"{url}/metrics names no loaded model (idg_model_info)")
        for name in names:
            for image in images:
                files = {"file": (image.name, image.read_bytes())}
                for path, data in (("/predict", {"model": name}), ("/attribute", {**form, "model": name})):
                    r = client.post(path, files=files, data=data)
                    if r.status_code != 200:
                        raise DriftReferenceError(f"{path} of {image} by {name} answered {r.status_code}: {r.text[:300]}")
            log.info("%s: %d images predicted and explained", name, len(images))
        after = scrape()
    return reference_from_scrapes(before, after, names, len(images), len(images))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="idg-drift-reference", description="Record the drift reference of a server's models from a folder of photos "
        "you call normal, for IDG_DRIFT_REFERENCE: the server must take no other traffic meanwhile.")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    parser.add_argument("--images", type=Path, required=True, help="a folder of reference photos (a few hundred: the traffic you expect)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--model", action="append", default=[], help="a model to record (repeat; default: every loaded model)")
    parser.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                        help="a form field of each /attribute request (repeat): the method and steps your clients use, e.g. "
                        "method=idg or steps=32 (default: the server's defaults, faithfulness=insertion,deletion)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    fields = dict(f.split("=", 1) for f in args.field if "=" in f)
    if len(fields) != len(args.field):
        parser.error("--field takes KEY=VALUE")
    import httpx

    try:
        reference = record(args.url, args.images, args.model, fields)
    except (DriftReferenceError, OSError, httpx.HTTPError) as err:
        log.error("%s", err)
        return 1
    args.out.write_text(json.dumps(reference, indent=1) + "\n")
    log.info("wrote %s (%s)", args.out, ", ".join(reference["models"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
