#!/bin/sh
# tests/sh/finetune_dash.sh: `cumulo finetune --dashboard PORT` (issue 17):
# a 2-stage pipeline (this machine and one `cumulo node`) trains stories260K
# F32 with the page on; /train.json shows the run's loss curve (one point a
# step, falling), tokens/s and both machines with their layers; the page
# refuses a foreign Host header and every method but GET; headless Chromium
# (/usr/bin/chromium, scripts/setup.sh installs it; without it that part is
# a skip, never a pass) renders the page: the loss polyline has a point per
# step and the machines table names the node.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
. tests/sh/lib/finetune_data.sh
M=$SHARED/models/stories260K-f32.gguf
STEPS=24
finetune_data >"$TMP/data.jsonl"
need curl python3

cc_start_node a --no-mdns --models "$SHARED/models"
A=127.0.0.1:$NODE_PORT
[ -n "$NODE_PORT" ] && ok || { bad "node did not start"; echo "$pass passed, $fail failed"; exit 1; }
# the page stays up after the run (CUMULO_TEST_DASH_HOLD_MS) for the checks below
CUMULO_TEST_DASH_HOLD_MS=120000 "$BIN" finetune "$M" --data "$TMP/data.jsonl" --out "$TMP/d.gguf" --steps $STEPS --ctx 32 \
    --batch 2 --threads 1 --nodes "$A" --data-parallel 1 --dashboard 0 2>"$TMP/ft.err" &
FT=$!
CC_PIDS="$CC_PIDS $FT"
cc_wait_grep "$TMP/ft.err" "dashboard on http://127.0.0.1:[0-9]+/" 300 && ok || bad "no dashboard line: $(cat "$TMP/ft.err")"
URL=$(grep -oE "http://127.0.0.1:[0-9]+" "$TMP/ft.err" | head -1)
k=0
while ! curl -s "$URL/train.json" | grep -q '"status":"done'; do
    k=$((k + 1))
    if [ $k -gt 600 ] || ! kill -0 $FT 2>/dev/null; then break; fi
    sleep 0.5
done
curl -s "$URL/train.json" >"$TMP/t.json"
res=$(python3 - "$TMP/t.json" "$STEPS" "$NODE_PORT" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); steps = int(sys.argv[2]); port = sys.argv[3]
pts = j["points"]
bad = []
if not j["status"].startswith("done"): bad.append("status %r" % j["status"])
if j["step"] != steps or j["steps"] != steps: bad.append("step %s/%s" % (j["step"], j["steps"]))
if [p[0] for p in pts] != list(range(1, steps + 1)): bad.append("steps of the points %s" % [p[0] for p in pts])
if not (pts and pts[-1][1] < 0.5 * pts[0][1]): bad.append("the loss did not fall: %s" % [p[1] for p in pts])
vals = [p[2] for p in pts if p[2] is not None]
if not vals: bad.append("no validation loss")
if not (j["tok_per_s"] and j["tok_per_s"] > 0): bad.append("tok/s %s" % j["tok_per_s"])
n = j["nodes"]
if len(n) != 2 or not n[0]["local"] or n[1]["local"] or not n[1]["addr"].endswith(":" + port) or \
   n[0]["first_layer"] != 0 or n[0]["last_layer"] != n[1]["first_layer"] or n[1]["last_layer"] != 5:
    bad.append("nodes %s" % n)
print("ok %d points, loss %.4f -> %.4f, %d evals, %.0f tok/s" % (len(pts), pts[0][1], pts[-1][1], len(vals), j["tok_per_s"]) if not bad else "; ".join(bad))
PY
)
echo "# /train.json: $res"
case "$res" in ok*) ok ;; *) bad "/train.json: $res" ;; esac
# the safe defaults
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: rebind.example' "$URL/train.json")" = 403 ] && ok || bad "a foreign Host header was served"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: localhost:1' "$URL/train.json")" = 200 ] && ok || bad "Host localhost refused"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST -d x "$URL/train.json")" = 405 ] && ok || bad "POST was not refused"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/nothing")" = 404 ] && ok || bad "an unknown path was not 404"

# the page in a browser
if [ -x /usr/bin/chromium ]; then
    timeout 120 /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --virtual-time-budget=5000 \
        --dump-dom "$URL/" >"$TMP/dom.html" 2>"$TMP/chromium.err"
    res=$(python3 - "$TMP/dom.html" "$STEPS" "$NODE_PORT" <<'PY'
import re, sys
d = open(sys.argv[1]).read(); steps = int(sys.argv[2]); port = sys.argv[3]
bad = []
m = re.search(r'<polyline id="loss" points="([^"]*)"', d)
pts = m.group(1).split() if m else []
if len(pts) != steps: bad.append("the loss polyline has %d points for %d steps" % (len(pts), steps))
ys = [float(p.split(",")[1]) for p in pts]
if ys and not ys[-1] > ys[0]: bad.append("the curve does not fall on screen (y %s -> %s)" % (ys[0], ys[-1]))
if not re.search(r'id="step">%d/%d<' % (steps, steps), d): bad.append("no step %d/%d" % (steps, steps))
if "this machine" not in d or ("127.0.0.1:" + port) not in d: bad.append("the machines table lacks this machine or the node")
print("ok %d points drawn" % len(pts) if not bad else "; ".join(bad))
PY
)
    echo "# chromium: $res"
    case "$res" in ok*) ok ;; *) bad "chromium: $res ($(tail -3 "$TMP/chromium.err"))" ;; esac
else
    echo "skip: /usr/bin/chromium missing (scripts/setup.sh installs it): the page was not rendered"
fi
kill "$FT" 2>/dev/null
wait "$FT" 2>/dev/null
[ -s "$TMP/d.gguf" ] && ok || bad "no adapter written"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
