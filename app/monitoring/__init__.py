"""What the service tells its operators: the app's one Prometheus registry that gathers every part's metrics
(prometheus.py, /metrics), the answers' and drift metrics (drift_metrics.py) and the drift reference the alerts compare
them with (drift_reference.py, ``idg-drift-reference``)."""
