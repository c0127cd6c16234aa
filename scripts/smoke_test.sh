#!/usr/bin/env bash
# Start the real service (uvicorn, default model) on a free loopback port, check its answers against a sample
# photo and against what the docs say of them, then run every example of README.md and docs/ marked
# <!-- smoke --> (scripts/doc_examples.py). Exits non-zero on the first wrong answer.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
IMG="${SMOKE_IMAGE:-samples/coffee.jpg}"  # the checkout's own photo: EfficientNet-Lite0 says espresso (samples/README.md)
NAME="${SMOKE_IMAGE_CLASS:-espresso}"
PORT=$($PY -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
URL="http://127.0.0.1:$PORT"
LOG=$(mktemp)
DATA=$(mktemp -d)  # the job store of the examples' jobs: not the checkout's data/
export IDG_DATA_DIR="$DATA"
$PY -m app.server --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$LOG" "$DATA"' EXIT
for _ in $(seq 1 120); do
    curl -sf "$URL/health/ready" >/dev/null && break
    kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "smoke: server died"; exit 1; }
    sleep 1
done
curl -sf "$URL/health/ready" | grep -c ready >/dev/null || { cat "$LOG"; echo "smoke: never ready"; exit 1; }
# "curl | grep -c" (not "grep -q"): grep -q stops reading at the first match, curl then dies of SIGPIPE,
# and with pipefail a long enough answer (the metrics page) fails the check that matched.
OKS=$(mktemp)  # one line per passed check (check runs in a pipeline's subshell, so a variable would not count)
ok() { echo "smoke: $1 ok"; echo "$1" >> "$OKS"; }
check() { # name, python condition on the JSON in d
    $PY -c "import json,sys; d=json.load(sys.stdin); assert $2, d" || { echo "smoke: $1 failed"; exit 1; }
    ok "$1"
}
curl -sf "$URL/health/live" | check live "d['status'] == 'alive'"
curl -sf "$URL/models" | check models "d['models'][0]['name'] == 'efficientnet_lite0'"
curl -sf -F "file=@$IMG" "$URL/predict" | check predict "d['top_k'][0]['name'] == '$NAME'"
curl -sf -F "file=@$IMG" -F method=idg -F steps=10 -F probe_steps=10 "$URL/attribute" \
    | check attribute "d['target']['name'] == '$NAME' and d['heatmap_png'].startswith('iVBOR') and len(d['curve']['alphas']) == 10"
curl -sf -F "file=@$IMG" -F method=ig -F steps=8 -F target=207 "$URL/attribute" | check attribute-target "d['target']['index'] == 207"
# The README's other examples, with fewer steps than it shows (same routes and fields, less CPU):
curl -sf -F "file=@$IMG" -F method=guided_ig -F steps=5 -F return_attribution=true "$URL/attribute" | check return-attribution \
    "__import__('numpy').load(__import__('io').BytesIO(__import__('base64').b64decode(d['attribution']['data']))).shape == (3, 224, 224) \
     and d['curve']['output'] == 'probability' and len(d['curve']['values']) == 5"
# What the docs say about the answers (docs/using.md, docs/methods/index.md), compared with the answers themselves:
# the raw attribution's object (its keys, format and shape as the README's example shows them) ...
curl -sf -F "file=@$IMG" -F method=idg -F steps=4 -F probe_steps=4 -F return_attribution=true "$URL/attribute" | check readme-attribution \
    "(lambda r: set(d['attribution']) == set(r) and d['attribution']['format'] == r['format'] and d['attribution']['shape'] == r['shape'] \
     and d['attribution']['dtype'] in ('float16', 'float32'))(json.loads(__import__('re').search(r'attribution: (\{.*?\})\`', \
     open('docs/using.md').read()).group(1)))"
# ... and the cost of a default attribution (the preset the answer names), as the methods' page counts it
curl -sf -F "file=@$IMG" "$URL/attribute" | check readme-cost \
    "(lambda m: [d['parameters']['preset'], d['cost']['forward_passes'], d['cost']['backward_passes']] == [m.group(1), int(m.group(2)), \
     int(m.group(3))])(__import__('re').search(r'[|] .(\w+). [(]default[)] [|][^|]*[|] (\d+) / (\d+) [|]', open('docs/methods/index.md').read()))"
BIG="${SMOKE_BIG_IMAGE:-}"  # over 500 KB: inlined in argv it would fail
if [ -z "$BIG" ]; then  # made from the cat photo, four times its size (no large file in the checkout)
    BIG="$DATA/smoke-big.jpg"  # 1804x1200, about 430 KB: over 500 KB in base64
    $PY -c "import sys; from PIL import Image; im = Image.open('samples/cat.jpg'); im.resize((im.width * 4, im.height * 4), Image.Resampling.BICUBIC).save(sys.argv[1], quality=97)" "$BIG"
fi
BODY=$(mktemp)
printf '{"image": "%s", "top_k": 3}' "$(base64 -w0 "$BIG")" > "$BODY"
TOP=$(curl -sf -F "file=@$BIG" "$URL/predict" | $PY -c "import json, sys; print(json.load(sys.stdin)['top_k'][0]['index'])")
curl -sf -H 'content-type: application/json' --data-binary "@$BODY" "$URL/predict" \
    | check predict-json "$(stat -c %s "$BODY") > 500_000 and len(d['top_k']) == 3 and d['top_k'][0]['index'] == $TOP"
rm -f "$BODY"
curl -sfN -F "file=@$IMG" -F method=idg -F steps=8 -F probe_steps=8 "$URL/attribute/stream" \
    | $PY -c "import sys; ev = [l[7:] for l in sys.stdin.read().splitlines() if l.startswith('event: ')]; \
assert ev[0] == 'accepted' and 'progress' in ev and ev[-1] == 'result', ev" || { echo "smoke: stream failed"; exit 1; }
ok "stream"
curl -sf -F "files=@$IMG" -F "files=@$BIG" -F steps=8 -F probe_steps=8 "$URL/attribute/batch" \
    | check batch "d['succeeded'] == 2 and d['failed'] == 0 and [i['status'] for i in d['items']] == [200, 200]"
for page in docs redoc; do  # the API docs load nothing from other hosts (they work offline)
    curl -sf "$URL/$page" | grep -Eq '(src|href|spec-url)="(https?:)?//' && { echo "smoke: /$page loads from another host"; exit 1; }
    curl -sf "$URL/$page" | grep -Eo '(src|href)="/docs-assets/[^"]+"' | cut -d'"' -f2 | while read -r asset; do
        curl -sf -o /dev/null "$URL$asset" || { echo "smoke: /$page asset $asset missing"; exit 1; }
    done
done
ok "docs offline"
code=$(curl -s -o /dev/null -w '%{http_code}' -F "file=@README.md" "$URL/predict")
[ "$code" = 415 ] || { echo "smoke: a text file gave $code, not 415"; exit 1; }
ok "bad input (415)"
curl -sf "$URL/metrics" | grep -c 'idg_http_requests_total{route="/attribute",status="200"}' >/dev/null || { echo "smoke: metrics"; exit 1; }
ok "metrics"
HEAT=$(mktemp --suffix=.png)
$PY -m idg_client --url "$URL" attribute "$IMG" --method idg --steps 10 --probe-steps 10 --out "$HEAT" > "$LOG.cli" \
    && grep -q "$NAME" "$LOG.cli" && [ "$(wc -l < "$LOG.cli")" -eq 12 ] && [ -s "$HEAT" ] || { cat "$LOG.cli"; echo "smoke: cli failed"; exit 1; }
rm -f "$HEAT" "$LOG.cli"
ok "cli"
curl -sf -F "file=@$IMG" -F method=idg -F steps=8 -F probe_steps=8 -F faithfulness=insertion,deletion "$URL/attribute" \
    | check faithfulness "0 <= d['faithfulness']['insertion'] <= 1 and 0 <= d['faithfulness']['deletion'] <= 1 and d['faithfulness']['steps'] == 28"
curl -sf -F "file=@$IMG" -F method=ig -F steps=8 -F postprocess=idgi "$URL/attribute" | check idgi "d['parameters']['postprocess'] == 'idgi'"
curl -sf -F "file=@$IMG" -F method=ig -F steps=4 -F smooth_samples=2 "$URL/attribute" | check smoothgrad "d['cost']['backward_passes'] == 8"
curl -sf -F "file=@$IMG" -F "explain_if=confidence > 0.99" "$URL/predict" | check explain-if-not "d['explained'] is False and d['explanation'] is None"
curl -sf -F "file=@$IMG" -F "explain_if=confidence < 0.99 or margin < 0.1" -F preset=fast "$URL/predict" \
    | check explain-if "d['explained'] is True and d['explanation']['target']['name'] == '$NAME'"
code=$(curl -s -o /dev/null -w '%{http_code}' -F "file=@$IMG" -F "explain_if=confidence <" "$URL/predict")
[ "$code" = 422 ] || { echo "smoke: a bad explain_if gave $code, not 422"; exit 1; }
curl -sf "$URL/metrics" | grep -c 'idg_faithfulness_bucket' >/dev/null || { echo "smoke: faithfulness metrics"; exit 1; }
ok "monitoring"

# Every example of the README and the docs marked <!-- smoke -->, as written (paths and port made local), in a
# scratch directory holding the files they name.
EX=$(mktemp -d)
mkdir -p "$EX/photos" "$EX/incoming"
for f in photo.jpg a.jpg b.jpg jay.jpg photos/a.jpg incoming/one.jpg; do cp "$IMG" "$EX/$f"; done
cp "$BIG" "$EX/photos/b.jpg"
tar -czf "$EX/photos.tar.gz" -C "$EX" photos
ROOT=$(pwd)
$PY scripts/doc_examples.py --port "$PORT" --root "$ROOT" > "$EX/examples.sh"
(cd "$EX" && bash examples.sh) | tee "$EX/examples.out" || { rm -rf "$EX"; echo "smoke: docs examples failed"; exit 1; }
grep -c " ok$" "$EX/examples.out" > /dev/null || { rm -rf "$EX"; echo "smoke: no docs example ran"; exit 1; }
rm -rf "$EX"
ok "docs examples"

# Your own model: the README's four examples (one env var each; scripted ones with their models file),
# on tiny random models saved as a user would (scripts/make_tiny_models.py), each in its own server.
kill $PID 2>/dev/null; wait $PID 2>/dev/null || true
OWN=$(mktemp -d)
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$LOG" "$OWN" "$DATA"' EXIT
$PY scripts/make_tiny_models.py "$OWN" timm hf_vit torchscript export > "$OWN/specs.tsv" 2>/dev/null
own() { # kind, expected classes, extra env
    local spec; spec=$(awk -F'\t' -v k="$1" '$1 == k {print $2}' "$OWN/specs.tsv")
    env IDG_MODELS="$spec" $3 $PY -m app.server --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
    PID=$!
    for _ in $(seq 1 60); do
        curl -sf "$URL/health/ready" >/dev/null && break
        kill -0 $PID 2>/dev/null || { cat "$LOG"; echo "smoke: $1 server died"; exit 1; }
        sleep 0.5
    done
    local size; size=$(curl -sf "$URL/models" | $PY -c "import json,sys; m=json.load(sys.stdin)['models'][0]; assert m['classes'] == $2, m; print(m['input_size'])")
    curl -sf -F "file=@$IMG" "$URL/predict" | check "own-$1-predict" "len(d['top_k']) == 5"
    curl -sf -F "file=@$IMG" -F method=idg -F steps=6 -F probe_steps=6 -F return_attribution=true "$URL/attribute" \
        | check "own-$1-attribute" "d['attribution']['shape'] == [3, $size, $size]"
    kill $PID; wait $PID 2>/dev/null || true
}
own timm 37 ""
own hf_vit 10 ""
own torchscript 10 "IDG_MODELS_FILE=$OWN/models.toml"
own export 10 "IDG_MODELS_FILE=$OWN/models.toml"
ok "your own model (timm, hf, torchscript, export)"
echo "smoke: $(wc -l < "$OKS") passed, 0 failed"
rm -f "$OKS"
