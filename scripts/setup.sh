#!/usr/bin/env bash
# Create .venv and install the project with the CPU build of torch 2.13.0 (the local file on these
# machines; a bare "torch" would pull CUDA wheels). Usage: scripts/setup.sh [extras], e.g. "dev,bench".
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
stamp=".venv/.installed-${extras:-base}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/python -m pip install -q torch==2.13.0 torchvision==0.28.0
    .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}" torch==2.13.0 torchvision==0.28.0
    touch "$stamp"
fi
