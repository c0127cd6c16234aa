#!/usr/bin/env bash
# Durable jobs, end to end: submit N photos (the 65 samples, repeated) as one job, kill -9 the server
# mid-job, restart it on the same data directory, wait, fetch N answers and check each image was
# answered exactly once. Usage (from the checkout, after `make run` installed .venv):
#
#   scripts/jobs_demo.sh                                  # 1,000 photos, EfficientNet-Lite0, IDG preset fast
#   N=200 JOB_ARGS="--method ig --steps 4" scripts/jobs_demo.sh
#
# Settings: N, JOB_ARGS (idg-client job submit options), KILL_AFTER (answers before the kill), PORT,
# WORK (a directory for the photos, the data dir and the logs; default a new temporary one), PY,
# SAMPLES; any IDG_* variable (IDG_MODELS, ...) reaches the server.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
N=${N:-1000}
SAMPLES=${SAMPLES:-${IDG_IMAGENET_SAMPLES:-../shared/data/imagenet-samples}}
[ -d "$SAMPLES" ] || SAMPLES=samples  # no ImageNet folder: the checkout's own photos (samples/README.md)
PORT=${PORT:-8765}
WORK=${WORK:-$(mktemp -d -t idg-jobs-demo-XXXX)}
JOB_ARGS=${JOB_ARGS:---preset fast}
KILL_AFTER=${KILL_AFTER:-50}
URL=http://127.0.0.1:$PORT
export IDG_DATA_DIR=$WORK/data
CLI=("$PY" -m idg_client --url "$URL")
say() { echo "[jobs_demo $(date +%T)] $*" >&2; }

start_server() {  # $1: log name
    "$PY" -m app.server --port "$PORT" >"$WORK/$1.log" 2>&1 &
    echo $! >"$WORK/server.pid"
    for _ in $(seq 600); do
        curl -fs "$URL/health/ready" >/dev/null 2>&1 && { say "server $(cat "$WORK/server.pid") ready ($1)"; return; }
        kill -0 "$(cat "$WORK/server.pid")" 2>/dev/null || { cat "$WORK/$1.log" >&2; exit 1; }
        sleep 0.5
    done
    say "server not ready after 300 s"; exit 1
}
answered() { "${CLI[@]}" job status "$1" | "$PY" -c 'import json,sys; s=json.load(sys.stdin); print(s["done"] + s["failed"])'; }
trap 'kill "$(cat "$WORK/server.pid" 2>/dev/null)" 2>/dev/null || true' EXIT

mkdir -p "$WORK/photos"
"$PY" - "$SAMPLES" "$WORK/photos" "$N" <<'PY'
import os, sys
from pathlib import Path
samples = sorted(p for p in Path(sys.argv[1]).iterdir() if p.suffix.lower() in (".jpeg", ".jpg", ".png"))
out, n = Path(sys.argv[2]), int(sys.argv[3])
for i in range(n):  # each photo a file of its own name (links: no copies)
    src = samples[i % len(samples)]
    dst = out / f"{i:04d}_{src.name}"
    if not dst.exists():
        os.symlink(src.resolve(), dst)
PY
say "$N photos in $WORK/photos (the ${SAMPLES##*/} samples repeated); data dir $IDG_DATA_DIR"

start_server first
JOB=$("${CLI[@]}" job submit "$WORK/photos" $JOB_ARGS)
say "submitted job $JOB; waiting for $KILL_AFTER answers, then kill -9"
until [ "$(answered "$JOB")" -ge "$KILL_AFTER" ]; do sleep 0.5; done
BEFORE=$(answered "$JOB")
kill -9 "$(cat "$WORK/server.pid")"
wait "$(cat "$WORK/server.pid")" 2>/dev/null || true
say "killed the server with $BEFORE of $N answered"

start_server second
grep -h "took back" "$WORK/second.log" >&2 || true
"${CLI[@]}" job wait "$JOB"
"${CLI[@]}" job results "$JOB" --summary >"$WORK/answers.jsonl"
"$PY" - "$WORK/answers.jsonl" "$N" <<'PY'
import collections, json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
n = int(sys.argv[2])
indices = collections.Counter(a["index"] for a in lines)
statuses = collections.Counter(a["status"] for a in lines)
classes = collections.Counter(a["target"]["name"] for a in lines if a.get("target"))
print(f"{len(lines)} answers for {n} photos; images answered once: {sum(v == 1 for v in indices.values())}, "
      f"more than once: {sum(v > 1 for v in indices.values())}, missing: {n - len(indices)}; statuses {dict(statuses)}")
print("seq runs 1..N without gaps:", [a["seq"] for a in lines] == list(range(1, n + 1)))
print("most explained classes:", ", ".join(f"{k} x{v}" for k, v in classes.most_common(3)))
ok = len(lines) == n and len(indices) == n and max(indices.values()) == 1
sys.exit(0 if ok else 1)
PY
say "answers in $WORK/answers.jsonl"
