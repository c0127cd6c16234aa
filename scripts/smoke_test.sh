#!/usr/bin/env bash
# Start the real service (uvicorn, default model) on a free loopback port and exercise every
# README curl example against a sample photo. Exits non-zero on the first wrong answer.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
IMG="${SMOKE_IMAGE:-../shared/data/imagenet-samples/n01580077_jay.JPEG}"
PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL="http://127.0.0.1:$PORT"
LOG=$(mktemp)
$PY -m app.server --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 120); do
    curl -sf "$URL/health/ready" >/dev/null && break
    kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "smoke: server died"; exit 1; }
    sleep 1
done
curl -sf "$URL/health/ready" | grep -q ready || { cat "$LOG"; echo "smoke: never ready"; exit 1; }
check() { # name, python condition on the JSON in d
    $PY -c "import json,sys; d=json.load(sys.stdin); assert $2, d" || { echo "smoke: $1 failed"; exit 1; }
    echo "smoke: $1 ok"
}
curl -sf "$URL/health/live" | check live "d['status'] == 'alive'"
curl -sf "$URL/models" | check models "d['models'][0]['name'] == 'efficientnet_lite0'"
curl -sf -F "file=@$IMG" "$URL/predict" | check predict "d['top_k'][0]['name'] == 'jay'"
curl -sf -F "file=@$IMG" -F method=idg -F steps=10 -F probe_steps=10 "$URL/attribute" \
    | check attribute "d['target']['name'] == 'jay' and d['heatmap_png'].startswith('iVBOR') and len(d['curve']['alphas']) == 10"
curl -sf -F "file=@$IMG" -F method=ig -F steps=8 -F target=207 "$URL/attribute" | check attribute-target "d['target']['index'] == 207"
code=$(curl -s -o /dev/null -w '%{http_code}' -F "file=@README.md" "$URL/predict")
[ "$code" = 415 ] || { echo "smoke: a text file gave $code, not 415"; exit 1; }
echo "smoke: bad input ok (415)"
curl -sf "$URL/metrics" | grep -q 'idg_http_requests_total{route="/attribute",status="200"}' || { echo "smoke: metrics"; exit 1; }
echo "smoke: metrics ok"
HEAT=$(mktemp --suffix=.png)
$PY -m app.cli --url "$URL" attribute "$IMG" --method idg --steps 10 --probe-steps 10 --out "$HEAT" > "$LOG.cli" \
    && grep -q "jay" "$LOG.cli" && [ "$(wc -l < "$LOG.cli")" -eq 12 ] && [ -s "$HEAT" ] || { cat "$LOG.cli"; echo "smoke: cli failed"; exit 1; }
rm -f "$HEAT" "$LOG.cli"
echo "smoke: cli ok"
echo "smoke: 8 passed, 0 failed"
