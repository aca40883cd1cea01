#!/bin/sh
# scripts/demo.sh: the README's first command. Starts three `cumulo node`
# processes on 127.0.0.1 (a temporary cluster key), spreads the default model
# (CUMULO_MODEL, else ../shared/models/stories260K-q8_0.gguf, else a synthetic
# model with a warning that its output is noise) across them and a
# `cumulo serve` on 127.0.0.1, prints the plan, streams a completion over the
# OpenAI API (SSE), and stops the server and the nodes cleanly.
set -e
cd "$(dirname "$0")/.."
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
MODEL=${CUMULO_MODEL:-$SHARED/models/stories260K-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
    echo "demo: warning: $MODEL not found; using a random-weight synth model (its output is noise)" >&2
    MODEL=build/demo-synth.gguf
    [ -f "$MODEL" ] || ./cumulo synth --arch llama --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --type q8_0 --seed 1 -o "$MODEL"
fi
TMP=$(mktemp -d)
PIDS=""
stop_nodes() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    PIDS=""
}
trap 'stop_nodes; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM
export CUMULO_KEY_FILE="$TMP/cluster.key"
./cumulo key >/dev/null
NODES=""
for name in alpha beta gamma; do
    ./cumulo node --bind 127.0.0.1 --port 0 --port-file "$TMP/$name.port" --name "$name" --no-mdns --threads 1 \
        --cache "$TMP/cache-$name" >"$TMP/$name.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    while [ ! -s "$TMP/$name.port" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s "$TMP/$name.port" ] || { echo "demo: node $name did not start:" >&2; cat "$TMP/$name.log" >&2; exit 1; }
    NODES="$NODES${NODES:+,}127.0.0.1:$(cat "$TMP/$name.port")"
    echo "demo: node $name on 127.0.0.1:$(cat "$TMP/$name.port")" >&2
done
# The nodes have no copy of the model: each receives only its stage's tensors.
./cumulo serve "$MODEL" --host 127.0.0.1 --port 0 --nodes "$NODES" --slots 4 >"$TMP/serve.out" 2>"$TMP/serve.log" &
PIDS="$PIDS $!"
i=0
while ! grep -q 'ready' "$TMP/serve.log" && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
grep -q 'ready' "$TMP/serve.log" || { echo "demo: serve did not start:" >&2; cat "$TMP/serve.log" >&2; exit 1; }
sed -n '/^node  *stage/,/^why:/p' "$TMP/serve.log"
PORT=$(sed -n 's/.*http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/serve.log" | head -1)
echo
printf 'Once upon a time'
curl -sN "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","max_tokens":200,"temperature":0.8,"seed":7,"stream":true}' |
    perl -MJSON::PP -ne '$| = 1; next unless s/^data: //; next if /^\[DONE\]/; my $j = eval { decode_json($_) } or next;
        print $j->{choices}[0]{text} // ""'
echo
stop_nodes
echo "demo: server and nodes stopped" >&2
