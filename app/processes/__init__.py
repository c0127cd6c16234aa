"""Several server processes on one port (``IDG_PROCESSES``): the launcher that starts and watches them (launch.py)
and their metrics (metrics.py: what runs, how many processes should answer, readiness)."""
