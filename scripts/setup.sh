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
# Debian packages the dev tests drive: Chromium for the browser test (Playwright's own browser download
# is not reachable) and Prometheus for the monitoring tests (promtool checks and unit-tests the rules,
# a slow test runs the server itself). Each test skips cleanly where its program is missing.
if [[ ",$extras," == *",dev,"* ]]; then
    for wanted in chromium:chromium prometheus:promtool; do
        package="${wanted%%:*}" program="${wanted#*:}"
        command -v "$program" >/dev/null 2>&1 && continue
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            echo "setup: installing Debian's $package for the tests that need $program (waits for another apt/dpkg run to finish)" >&2
            lock=(-o DPkg::Lock::Timeout=600)  # wait for the package manager's lock instead of failing
            apt-get "${lock[@]}" install -y -q "$package" >/dev/null 2>&1 \
                || { apt-get "${lock[@]}" update -q >/dev/null && apt-get "${lock[@]}" install -y -q "$package" >/dev/null; }
        else
            echo "setup: $program is missing and cannot be installed here (needs root and apt-get); the tests that need it will skip" >&2
        fi
    done
fi
