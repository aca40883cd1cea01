# tests/sh/lib/http_common.sh: shared by the tests/sh/http_*.sh scripts (not a
# test itself: tests/run.sh only runs tests/sh/*.sh). Starts `cumulo serve` on
# 127.0.0.1 with a free port (--port 0; the port is read from its stderr),
# counts checks, and kills every server it started when the script exits.
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
MODEL=$SHARED/models/stories260K-q8_0.gguf
pass=0
fail=0
. tests/sh/lib/need.sh
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
# check DESCRIPTION COMMAND...: one check, passes when COMMAND succeeds.
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
TMP=$(mktemp -d) # KEEP_TMP=DIR: a copy of it (server logs, client output) is left there
SERVER_PIDS=""
cleanup() {
    for p in $SERVER_PIDS; do kill "$p" 2>/dev/null; done
    for p in $SERVER_PIDS; do wait "$p" 2>/dev/null; done
    [ -n "$KEEP_TMP" ] && cp -r "$TMP" "$KEEP_TMP"; rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# start_server NAME [serve options...]: sets PORT and PID; log in $TMP/NAME.log.
start_server() {
    name=$1; shift
    "$BIN" serve "$MODEL" --port 0 --threads 1 "$@" 2>"$TMP/$name.log" &
    PID=$!
    SERVER_PIDS="$SERVER_PIDS $PID"
    i=0
    while ! grep -q 'ready:' "$TMP/$name.log" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 300 ] || ! kill -0 "$PID" 2>/dev/null; then
            echo "server '$name' did not start:" >&2; cat "$TMP/$name.log" >&2; PORT=0; return 1
        fi
        sleep 0.1
    done
    PORT=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\)\/.*/\1/p' "$TMP/$name.log" | head -1)
    URL=http://127.0.0.1:$PORT
}

stop_server() { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; }

# status URL [curl args...]: prints the HTTP status; the body goes to $TMP/body.
status() { u=$1; shift; curl -s -o "$TMP/body" -w '%{http_code}' --max-time 30 "$@" "$u"; }

# js EXPR FILE: evaluate EXPR with j = the JSON in FILE (node), print it.
js() { node -e 'const fs=require("fs");const j=JSON.parse(fs.readFileSync(process.argv[1],"utf8"));const v=('"$1"');process.stdout.write(typeof v==="string"?v:JSON.stringify(v))' "$2"; }

finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }

# sse_text FILE: the text of an SSE stream (chat deltas or completion text);
# fails unless the stream ends with "data: [DONE]". SSE comments (the server's
# ": keep-alive" while a request waits) are skipped, as clients skip them.
sse_text() {
    node -e '
const t=require("fs").readFileSync(process.argv[1],"utf8");let s="";
const evs=t.split("\n\n").filter(e=>e.length&&!e.startsWith(":"));if(evs[evs.length-1]!=="data: [DONE]")process.exit(3);
for(const ev of evs){if(ev==="data: [DONE]")continue;const j=JSON.parse(ev.slice(6));if(j.error)process.exit(4);
 const c=j.choices[0];if(!c)continue;s+=c.delta?(c.delta.content||""):c.text}
process.stdout.write(s)' "$1"
}

# metric NAME: the value of an unlabelled series on /metrics (auth: $AUTH_HDR if set).
metric() { curl -s ${AUTH_HDR:+-H "$AUTH_HDR"} "$URL/metrics" | sed -n "s/^$1 //p"; }

# serving_setup: what the serving tests (http_chunked, http_kvmem, http_prefix)
# start from: python3 (else a skip and exit), MODEL = a synthetic q4_0 llama
# (512 wide, 4 layers, 8 heads / 4 KV heads, context 4096), and $TMP/cl.py,
# the head of a client script: tests/sh/lib/serve_client.py imported as sc,
# sc.PORT from argv[1], mode = argv[2].
serving_setup() {
    need python3
    MODEL=$TMP/q4.gguf
    "$BIN" synth --arch llama --dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 1024 --type q4_0 \
        --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" --seed 9 -o "$MODEL" >/dev/null 2>&1 || {
        bad "synth"; finish; exit 1; }
    printf 'import sys\nsys.path.insert(0, "%s")\nimport serve_client as sc\nfrom serve_client import ids\n%s\n' \
        "$(pwd)/tests/sh/lib" 'sc.PORT, mode = int(sys.argv[1]), sys.argv[2]' >"$TMP/cl.py"
}
