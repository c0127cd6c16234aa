"""The answers' and drift metrics: what each model predicts and how its explanations look (top-1 class ranges,
confidence, attribution concentration, faithfulness), /predict's explain_if outcomes, and the drift reference the
alerts compare them with (``IDG_DRIFT_REFERENCE``, :mod:`app.monitoring.drift_reference`). Declared here, gathered in the
app's one registry by :class:`app.monitoring.prometheus.Metrics`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

CONDITIONS = ("held", "not_held", "none")
DRIFT_CLASS_BINS = 20
SHARE_BUCKETS = tuple(i / 20 for i in range(1, 21))


class DriftMetrics:
    """The answers' and drift metric families (a part of :class:`app.monitoring.prometheus.Metrics`)."""

    def _declare_drift_metrics(self, r: CollectorRegistry) -> None:
        self.faithfulness = Histogram(
            "idg_faithfulness", "Faithfulness scores of returned maps (insertion / deletion AUC in [0, 1]) by model, method and metric",
            ["model", "method", "metric"], buckets=tuple(i / 20 for i in range(1, 21)), registry=r)
        self.predictions = Counter(
            "idg_predictions", "Predictions answered by /predict, by model and explain_if outcome (held, not_held, none: no condition)",
            ["model", "condition"], registry=r)
        self.explanations = Counter("idg_explanations", "Explanations returned by /predict because explain_if held, by model",
                                    ["model"], registry=r)
        self.predicted_classes = Counter(
            "idg_predicted_classes", f"Predictions by model and top-1 class: the class index for a model of at most "
            f"{DRIFT_CLASS_BINS} classes, else the range of indices (1/{DRIFT_CLASS_BINS} of them) it falls in: a fixed set "
            "of labels per model, comparable over time", ["model", "classes"], registry=r)
        self.confidence = Histogram("idg_prediction_confidence", "Top-1 probability of each prediction, by model", ["model"],
                                    buckets=SHARE_BUCKETS, registry=r)
        self.concentration = Histogram(
            "idg_attribution_concentration", "Share of each explanation's attribution mass (|attribution| summed over "
            "channels) in its top 5% of pixels, by model: 0.05 for a map spread evenly, 1 for one on a few pixels",
            ["model"], buckets=SHARE_BUCKETS, registry=r)
        self.drift_reference_classes = Gauge(
            "idg_drift_reference_class_share", "Share of the reference's predictions (IDG_DRIFT_REFERENCE) in each class range "
            "of idg_predicted_classes_total, by model", ["model", "classes"], registry=r, multiprocess_mode="livemax")
        self.drift_reference = Gauge(
            "idg_drift_reference", "The reference's mean (IDG_DRIFT_REFERENCE) by model and quantity: confidence (the top-1 "
            "probability, idg_prediction_confidence) or concentration (idg_attribution_concentration)", ["model", "quantity"],
            registry=r, multiprocess_mode="livemax")
        self.drift_reference_faithfulness = Gauge(
            "idg_drift_reference_faithfulness", "The reference's mean faithfulness (IDG_DRIFT_REFERENCE) by model, method and "
            "metric (idg_faithfulness)", ["model", "method", "metric"], registry=r, multiprocess_mode="livemax")
