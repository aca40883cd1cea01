#!/bin/sh
# scripts/demo.sh: the README's first command. Starts three `cumulo node`
# processes on 127.0.0.1 (a temporary cluster key), spreads the default model
# (CUMULO_MODEL, else ../shared/models/stories260K-q8_0.gguf) over this
# machine and the three nodes as a pipeline, prints the plan, streams a story
# from it, and stops the nodes. cumulo is its own client: no curl, perl or
# python. Without the default model it makes a random-weight model with
# cumulo's builtin vocabulary and says loudly that its text is noise.
# Any failure ends the demo with a non-zero exit and the reason on stderr.
# Run from a checkout it uses ./cumulo; installed (a package puts it in
# /usr/share/cumulo/demo.sh) it uses the cumulo on PATH; CUMULO_BIN overrides.
die() { echo "demo: FAILED: $*" >&2; exit 1; }
if [ -f "$(dirname "$0")/../Makefile" ] && [ -z "$CUMULO_BIN" ]; then
    cd "$(dirname "$0")/.." || exit 1
    BIN=./cumulo
    [ -x ./cumulo ] || die "./cumulo is not built (run 'make demo', which builds it)"
    SYNTH_DIR=build
    SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
else
    BIN=${CUMULO_BIN:-$(command -v cumulo)}
    [ -n "$BIN" ] && [ -x "$BIN" ] || die "cumulo is not installed (not on PATH)"
    SYNTH_DIR=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/cumulo
    SHARED=${CUMULO_SHARED:-/nonexistent}
fi
MODEL=${CUMULO_MODEL:-$SHARED/models/stories260K-q8_0.gguf}
RANDOM_MODEL=""
if [ ! -f "$MODEL" ]; then
    [ -n "$CUMULO_MODEL" ] && die "CUMULO_MODEL=$CUMULO_MODEL: no such file"
    RANDOM_MODEL=1
    echo "demo: $MODEL not found (no ../shared beside this checkout)." >&2
    echo "demo: using a RANDOM-WEIGHT model with cumulo's builtin vocabulary instead: its text is noise, not a story." >&2
    MODEL=$SYNTH_DIR/demo-synth.gguf
    if [ ! -f "$MODEL" ]; then
        mkdir -p "$SYNTH_DIR"
        "$BIN" synth --arch llama --dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn 768 --type q8_0 \
            --vocab builtin --seed 1 -o "$MODEL" >/dev/null 2>"$SYNTH_DIR/demo-synth.log" ||
            { cat "$SYNTH_DIR/demo-synth.log" >&2; die "cumulo synth could not write $MODEL"; }
    fi
fi
TMP=$(mktemp -d) || die "mktemp failed"
PIDS=""
stop_nodes() {
    for p in $PIDS; do kill -TERM "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    PIDS=""
}
trap 'stop_nodes; rm -rf "$TMP"' EXIT
trap 'exit 1' INT TERM
export CUMULO_KEY_FILE="$TMP/cluster.key"
"$BIN" key >/dev/null 2>"$TMP/key.log" || { cat "$TMP/key.log" >&2; die "cumulo key could not create a cluster key"; }
NODES=""
for name in alpha beta gamma; do
    "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/$name.port" --name "$name" --no-mdns --threads 1 \
        --cache "$TMP/cache-$name" >"$TMP/$name.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    while [ ! -s "$TMP/$name.port" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s "$TMP/$name.port" ] || { cat "$TMP/$name.log" >&2; die "node $name did not start within 10 s"; }
    NODES="$NODES${NODES:+,}127.0.0.1:$(cat "$TMP/$name.port")"
    echo "demo: node $name on 127.0.0.1:$(cat "$TMP/$name.port")" >&2
done
# The nodes have no copy of the model: each receives only its stage's tensors.
# The plan goes to stderr (shown: the table and why), the story to stdout.
echo "demo: $MODEL over this machine and 3 nodes:" >&2
PROMPT="Once upon a time"
"$BIN" run "$MODEL" --nodes "$NODES" -p "$PROMPT" -n 200 --temp 0.8 --seed 7 --threads 1 \
    >"$TMP/story" 2>"$TMP/run.log" &
RUN=$!
# The plan is printed before the first token: show it, then the story as it
# streams (GNU tail follows the file until the run ends; elsewhere the story
# is printed when it is complete).
i=0
while ! grep -q '^why:' "$TMP/run.log" && kill -0 $RUN 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
sed -n '/^node  *stage/,/^why:/p' "$TMP/run.log" >&2
echo >&2
tail -c +1 -f --pid=$RUN "$TMP/story" 2>/dev/null || { wait $RUN; cat "$TMP/story"; }
wait $RUN
rc=$?
echo
if [ $rc -ne 0 ]; then
    tail -20 "$TMP/run.log" >&2
    die "cumulo run over the cluster exited $rc"
fi
[ "$(wc -c <"$TMP/story")" -gt $((${#PROMPT} + 20)) ] || { tail -20 "$TMP/run.log" >&2; die "the cluster returned no story"; }
grep '^prompt:' "$TMP/run.log" >&2
stop_nodes
echo "demo: nodes stopped" >&2
[ -n "$RANDOM_MODEL" ] && echo "demo: (that text came from a random-weight model: noise by design; put ../shared beside this checkout for the real story)" >&2
echo "demo: ok. To serve a model over the OpenAI API with a dashboard: $BIN serve MODEL.gguf [--nodes ...]" >&2
exit 0
