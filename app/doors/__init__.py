"""What every door passes through. The doors themselves are the REST routes in app/api/routes/, the Open Inference
Protocol over HTTP in app/api/oip.py and over gRPC in app/api/oip_grpc.py, and a job's image in app/jobs/runner.py;
this folder holds what they all share: the one layer around the service call (layer.py), the door objects that state
what is each door's own (door.py), the HTTP middlewares' skeleton (asgi.py), graceful shutdown (drain.py), the API keys
(keys.py), request IDs (request_id.py), the replica header (replica.py), traces (tracing.py) and the doors' metrics
(metrics.py)."""
