# One command each, on a fresh machine (Python 3.11, no GPU): `make run`, `make test`.
# scripts/setup.sh creates .venv with the CPU build of torch==2.13.0 (see README), each part once;
# `make run` stops quietly on Ctrl-C or SIGTERM (scripts/serve.sh).
PY := .venv/bin/python
# `make run` listens where IDG_HOST / IDG_PORT say, as the server does; HOST= / PORT= on the command line win
HOST ?= $(or $(IDG_HOST),127.0.0.1)
PORT ?= $(or $(IDG_PORT),8000)
SERVE_ARGS ?=

.PHONY: run test test-all demo lint bench eval docs cluster-check autoscale-check

run:
	@scripts/setup.sh
	@scripts/serve.sh --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test:
	scripts/setup.sh dev
	$(PY) -m ruff check idg_core idg_models idg_evaluation idg_serving app idg_client tests benchmarks
	$(PY) -m mypy
	$(PY) -m pytest
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir "$$(mktemp -d)"
	scripts/smoke_test.sh

# make test, then the tests marked slow (each over a few seconds on 2 cores: Ray, real browsers, Prometheus, every
# torchvision architecture...) and those marked gpu (they skip cleanly without CUDA); .ci/run runs it. The two-node
# cluster check is `make cluster-check` (.ci/run runs it first)
test-all: test
	scripts/setup.sh dev,bench
	$(PY) -m pytest -m "slow or gpu" --deselect tests/service/test_cluster_check.py

demo:
	scripts/setup.sh
	$(PY) -m idg_models.demo samples/coffee.jpg --out out/demo

bench:
	scripts/setup.sh dev,bench
	$(PY) -m benchmarks.run

# the evaluation: on the checkout's four photos in samples/ unless IMAGES= or IDG_IMAGENET_SAMPLES names a folder (the
# 65 ImageNet photos behind results/evaluation are not in the checkout: samples/README.md). samples/' names carry no
# ImageNet WNID: every method explains the model's own prediction (as with any photos), and Top-1 is not known; their
# report goes to out/evaluation, so that results/evaluation stays the 65 photos' (EVAL_OUT= chooses)
IMAGES ?= $(or $(IDG_IMAGENET_SAMPLES),samples)
EVAL_OUT ?= $(if $(filter samples samples/,$(IMAGES)),out/evaluation,results/evaluation)

eval:
	@[ -d "$(IMAGES)" ] || { echo "make eval: no photos at $(IMAGES): name a folder of photos with make eval IMAGES=/path (or IDG_IMAGENET_SAMPLES); WNID_class.JPEG names give Top-1" >&2; exit 2; }
	scripts/setup.sh bench
	$(PY) -m idg_evaluation --images "$(IMAGES)" --out "$(EVAL_OUT)" $(EVAL_ARGS)

# the documentation site (mkdocs.yml, docs/) at http://127.0.0.1:8001 while you edit it; `make test` builds it --strict
docs:
	scripts/setup.sh dev
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve -a 127.0.0.1:8001

# a real two-node Ray cluster on this machine (root: each node in a network namespace of its own), a durable job through
# a node's death, Prometheus and IDGReplicasMissing; ~2-3 min on 2 cores, at most 15 (docs/ray.md#cluster-check)
cluster-check:
	scripts/setup.sh dev
	scripts/cluster_check.sh

# the same cluster measuring Serve's autoscaling: 1 -> 2 replicas under a load step and back, seconds and latencies
# (~2.5 min; docs/ray.md#autoscaling-measured)
autoscale-check:
	scripts/setup.sh dev
	scripts/cluster_check.sh --autoscale
