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
    echo "setup: installing torch==2.13.0 (CPU), torchvision==0.28.0 and the project${extras:+ with [$extras]} into .venv" >&2
    .venv/bin/python -m pip install -q torch==2.13.0 torchvision==0.28.0
    .venv/bin/python -m pip install -q -e ".${extras:+[$extras]}" torch==2.13.0 torchvision==0.28.0
    touch "$stamp"
fi
# The browser test drives Debian's Chromium (Playwright's own browser download is not reachable).
if [[ ",$extras," == *",dev,"* ]] && ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        echo "setup: installing Debian's chromium for the browser test (waits for another apt/dpkg run to finish)" >&2
        lock=(-o DPkg::Lock::Timeout=600)  # wait for the package manager's lock instead of failing
        apt-get "${lock[@]}" install -y -q chromium >/dev/null 2>&1 \
            || { apt-get "${lock[@]}" update -q >/dev/null && apt-get "${lock[@]}" install -y -q chromium >/dev/null; }
    else
        echo "setup: chromium is missing and cannot be installed here (needs root and apt-get); the browser test will skip" >&2
    fi
fi
