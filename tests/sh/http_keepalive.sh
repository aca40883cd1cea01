#!/bin/sh
# http_keepalive.sh: a stream whose tokens come slower than the idle timeout
# (--timeout 2, every step slowed to 2.5 s by the test hook) still completes:
# the server sends SSE keep-alive comments while it waits.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
need curl python3
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
pass=0; fail=0
log=$(mktemp)
# --port 0: the server's own free port, read from its log (a port picked by
# another process and closed again can be taken before the server binds it);
# up to 30 s to start on a loaded machine
CUMULO_TEST_STEP_DELAY_MS=2500 "$BIN" serve "$SHARED/models/stories260K-q8_0.gguf" --port 0 --timeout 2 --threads 1 >"$log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait 2>/dev/null; rm -f "$log"' EXIT INT TERM
i=0
while ! grep -q 'ready:' "$log" && [ $i -lt 300 ] && kill -0 $srv 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
port=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\)\/.*/\1/p' "$log" | head -1)
[ -n "$port" ] || { echo "FAIL: the server did not start: $(tail -3 "$log")" >&2; echo "0 passed, 1 failed"; exit 1; }
out=$(curl -sN -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d '{"prompt":"Once","max_tokens":3,"stream":true,"temperature":0}')
if echo "$out" | grep -q '^: keep-alive'; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: no keep-alive comment" >&2; fi
if echo "$out" | grep -q '^data: \[DONE\]'; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: stream did not finish: $out" >&2; fi
n=$(echo "$out" | grep -c '"text"')
if [ "$n" -ge 3 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $n chunks" >&2; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
