# GPU image: CUDA torch from PyPI (the default wheel carries its CUDA libraries), non-root user,
# one uvicorn worker process per container (run one container per GPU).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    IDG_DEVICE=auto IDG_MODELS=efficientnet_lite0
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 idg
WORKDIR /srv
COPY pyproject.toml README.md ./
COPY idg_core ./idg_core
COPY app ./app
# The CUDA build of torch 2.13.0 with its matching torchvision (no compat shim needed here).
RUN pip install torch==2.13.0 torchvision==0.28.0 && pip install .
USER idg
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8000/health/ready || exit 1
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000", "--workers", "1", "--timeout-graceful-shutdown", "30"]
