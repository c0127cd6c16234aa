# GPU image: CUDA torch from PyPI (the default wheel carries its CUDA libraries), non-root user,
# one server process per container (run one container per GPU), started by the same launcher as
# `make run` (app/server.py: IDG_* settings, drain on SIGTERM, read timeouts).
# On SIGTERM it exits within IDG_SHUTDOWN_GRACE_S + 5 s: give `docker stop -t` (default 10 s) at
# least that (docker-compose.yml sets stop_grace_period).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    IDG_DEVICE=auto IDG_MODELS=efficientnet_lite0 IDG_HOST=0.0.0.0 IDG_PORT=8000
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 idg
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY idg_core ./idg_core
COPY idg_models ./idg_models
COPY idg_evaluation ./idg_evaluation
COPY idg_serving ./idg_serving
COPY app ./app
COPY idg_client ./idg_client
# The CUDA build of torch 2.13.0 with its matching torchvision (no compat shim needed here).
RUN pip install torch==2.13.0 torchvision==0.28.0 && pip install .
USER idg
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8000/health/ready || exit 1
CMD ["idg-serve"]
