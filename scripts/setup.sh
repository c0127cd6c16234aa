#!/usr/bin/env bash
# Create .venv and install the project with the CPU build of torch 2.13.0 (the local file on these
# machines; a bare "torch" would pull CUDA wheels). Usage: scripts/setup.sh [extras], e.g. "dev,bench".
#
# Installs once: each part (the base install, each extra) has its own stamp, .venv/.installed-<part>,
# newer than pyproject.toml once that part is in; only the parts without one are installed. So
# `make run` after `make test` installs nothing ("dev" includes the base), and `make bench` after it
# installs only the "bench" extra. It says what it does, and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
say() { echo "setup: $*" >&2; }

fresh() { [ -f ".venv/.installed-$1" ] && [ ! pyproject.toml -nt ".venv/.installed-$1" ]; }
fresh_base() {  # every install includes the base: a fresh stamp of any part will do
    local stamp
    for stamp in .venv/.installed-*; do
        if [ -f "$stamp" ] && fresh "${stamp#.venv/.installed-}"; then return 0; fi
    done
    return 1
}

if [ ! -x .venv/bin/python ]; then
    say "creating the virtual environment .venv (python3 -m venv)"
    python3 -m venv .venv
fi
missing=()  # the parts to install
new=()  # the extras among them
if ! fresh_base; then missing+=(base)
elif here=$(pwd) && ! (cd / && "$here/.venv/bin/python" -c 'import os, sys, app
sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(app.__file__))) != os.path.realpath(sys.argv[1]))' "$here") 2>/dev/null; then
    say "the project in .venv is not this checkout (moved or copied here?): installing it again"
    missing+=(base)
fi
IFS=, read -r -a wanted <<< "$extras"
for part in "${wanted[@]}"; do
    if [ -n "$part" ] && ! fresh "$part"; then missing+=("$part"); new+=("$part"); fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    new_extras=$(IFS=,; echo "${new[*]}")
    started=$SECONDS
    say "installing into .venv: torch==2.13.0 (CPU), torchvision==0.28.0 and the project${new_extras:+ with [$new_extras]}"
    say "(the first time: about 1 GB of wheels, several minutes; pip's own lines follow)"
    # pip without -q, but only the lines that show progress: a silent pip reads as a hang
    show() { grep -E --line-buffered '^(Collecting|Downloading|Installing collected|Successfully installed)' >&2 || true; }
    .venv/bin/python -m pip install --progress-bar off torch==2.13.0 torchvision==0.28.0 | show
    .venv/bin/python -m pip install --progress-bar off -e ".${new_extras:+[$new_extras]}" torch==2.13.0 torchvision==0.28.0 | show
    for part in base "${missing[@]}"; do touch ".venv/.installed-$part"; done
    say "installed ${missing[*]} in $((SECONDS - started)) s"
fi
# `import torchvision` (and `import timm`) in any script run by this .venv's Python: PyPI's torchvision is compiled for
# CUDA torch and, beside the CPU torch, fails to import unless two op schemas are declared first. A .pth file in
# site-packages (run by Python at start-up) puts idg_models/_torchvision_hook.py's import finder in place, loaded by its
# path (not through idg_models, which imports torch); it acts only when torchvision.extension is imported. Always
# checked: cheap, and it follows the checkout if it moves.
hook="$PWD/idg_models/_torchvision_hook.py"
pth="import os, sys, importlib.util as u; p = '$hook'; s = os.path.isfile(p) and u.spec_from_file_location('_idg_torchvision_hook', p); m = s and u.module_from_spec(s); s and (sys.modules.setdefault(s.name, m), s.loader.exec_module(m), m.install())"
for site in .venv/lib/python3*/site-packages; do
    if [ -d "$site" ] && [ "$(cat "$site/idg_torchvision.pth" 2>/dev/null)" != "$pth" ]; then
        say "writing $site/idg_torchvision.pth (import torchvision and timm work beside the CPU torch)"
        printf '%s\n' "$pth" > "$site/idg_torchvision.pth"
    fi
done
# Debian packages the dev tests drive: Chromium for the browser test (Playwright's own browser download
# is not reachable), Prometheus for the monitoring tests (promtool checks and unit-tests the rules,
# a slow test runs the server itself) and PostgreSQL for the job store's tests (each starts its own
# throwaway server with initdb and pg_ctl, which Debian keeps in /usr/lib/postgresql/<version>/bin, off
# the PATH). Each test skips cleanly where its program is missing.
have() { command -v "$1" >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/$1" >/dev/null; }
if [[ ",$extras," == *",dev,"* ]]; then
    for wanted in chromium:chromium prometheus:promtool postgresql:initdb; do
        package="${wanted%%:*}" program="${wanted#*:}"
        have "$program" && continue
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            export DEBIAN_FRONTEND=noninteractive
            say "installing Debian's $package for the tests that need $program (waits for another apt/dpkg run to finish)"
            if [ "$package" = postgresql ]; then  # the tests start their own servers: no 'main' cluster running on port 5432
                mkdir -p /etc/postgresql-common/createcluster.d
                echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/idg-tests.conf
            fi
            lock=(-o DPkg::Lock::Timeout=600)  # wait for the package manager's lock instead of failing
            apt-get "${lock[@]}" install -y -q "$package" >/dev/null 2>&1 \
                || { apt-get "${lock[@]}" update -q >/dev/null && apt-get "${lock[@]}" install -y -q "$package" >/dev/null; }
        else
            say "$program is missing and cannot be installed here (needs root and apt-get); the tests that need it will skip"
        fi
    done
fi
# KServe's own Python clients for tests/service/test_oip_kserve.py, in a folder of their own (.venv/peers/kserve, put
# on PYTHONPATH by that test's client process only): kserve 0.21 pins protobuf and psutil below this project's, so
# it cannot live in .venv itself. About 430 MB, a minute, once (its stamp); where it cannot be had, that test skips.
KSERVE=kserve==0.21.0
if [[ ",$extras," == *",dev,"* ]] && [ ! -f ".venv/peers/kserve/.installed-$KSERVE" ]; then
    say "installing KServe's client ($KSERVE) apart, into .venv/peers/kserve, for the test of peers' clients"
    rm -rf .venv/peers/kserve
    if .venv/bin/python -m pip install --progress-bar off -q --target .venv/peers/kserve "$KSERVE" >/dev/null 2>&1; then
        mkdir -p .venv/peers/kserve && touch ".venv/peers/kserve/.installed-$KSERVE"
    else
        rm -rf .venv/peers/kserve
        say "could not install $KSERVE; tests/service/test_oip_kserve.py's client test will skip"
    fi
fi
# PAIR's XRAI (PyPI saliency 0.2.1, pure Python, needs only numpy and scikit-image, both in .venv) for
# tests/core/test_xrai.py, which holds the xrai post-step's segments and region order against it: installed without its
# dependencies into a folder of its own (.venv/peers/saliency, put on sys.path by that test only), once (its stamp);
# where it cannot be had, that test skips.
SALIENCY=saliency==0.2.1
if [[ ",$extras," == *",dev,"* ]] && [ ! -f ".venv/peers/saliency/.installed-$SALIENCY" ]; then
    say "installing PAIR's saliency ($SALIENCY) apart, into .venv/peers/saliency, for the XRAI test"
    rm -rf .venv/peers/saliency
    if .venv/bin/python -m pip install --progress-bar off -q --no-deps --target .venv/peers/saliency "$SALIENCY" >/dev/null 2>&1; then
        mkdir -p .venv/peers/saliency && touch ".venv/peers/saliency/.installed-$SALIENCY"
    else
        rm -rf .venv/peers/saliency
        say "could not install $SALIENCY; tests/core/test_xrai.py's comparison with it will skip"
    fi
fi
# pytorch-grad-cam (PyPI grad-cam 1.5.7) for tests/core/test_gradcam.py, which holds the gradcam and gradcam_pp maps
# against its GradCAM and GradCAMPlusPlus on the same layer: installed without its dependencies (torch, torchvision,
# numpy, scipy, matplotlib and tqdm are in .venv; its own pins would pull CUDA wheels) into a folder of its own
# (.venv/peers/gradcam, put on sys.path by that test and by the rows benchmark,
# benchmarks/gradcam_peer.py), with what `import pytorch_grad_cam` truly needs beside them:
# OpenCV (headless), ttach and scikit-learn with its pure-Python dependencies. About 210 MB, once (its stamp); where it
# cannot be had, that test's comparisons skip.
GRADCAM=grad-cam==1.5.7
GRADCAM_DEPS=(ttach==0.0.3 opencv-python-headless==5.0.0.93 scikit-learn==1.9.1 joblib==1.6.0 threadpoolctl==3.8.0
              cloudpickle==3.1.3 narwhals==2.29.0)
if [[ ",$extras," == *",dev,"* ]] && [ ! -f ".venv/peers/gradcam/.installed-$GRADCAM" ]; then
    say "installing pytorch-grad-cam ($GRADCAM) apart, into .venv/peers/gradcam, for the Grad-CAM test"
    rm -rf .venv/peers/gradcam
    if .venv/bin/python -m pip install --progress-bar off -q --no-deps --target .venv/peers/gradcam "$GRADCAM" "${GRADCAM_DEPS[@]}" >/dev/null 2>&1 \
        && PYTHONPATH=.venv/peers/gradcam .venv/bin/python -c "import pytorch_grad_cam" >/dev/null 2>&1; then
        mkdir -p .venv/peers/gradcam && touch ".venv/peers/gradcam/.installed-$GRADCAM"
    else
        rm -rf .venv/peers/gradcam
        say "could not install $GRADCAM; tests/core/test_gradcam.py's comparisons with it will skip"
    fi
fi
