#!/bin/sh
# serve_compare.sh: `cumulo serve` (two builds: before/after) and llama.cpp's
# llama-server side by side under the same load (bench/serve_load.mjs), plus
# llama-batched-bench, interleaved: for each concurrency every server gets its
# turn before the next concurrency starts, so all of them sample the same
# minutes of a shared, noisy machine. A benchmark, not a test: nothing is
# asserted. Every result is one JSON line on stdout (serve_load's), labelled.
#
#   sh bench/serve_compare.sh                       # defaults below
#   MODEL=... THREADS=2 SLOTS=16 USERS="1 4 8 16" GEN=64 PROMPT=16 \
#   CUMULO_A=/path/to/old/cumulo CUMULO_B=build/cumulo LLAMA_SERVER=... sh bench/serve_compare.sh
#   CUMULO_A=build/cumulo ARGS_A="" ARGS_B="-fa" ...     # one binary, two option sets
#
# REQS requests per user back to back (default 3): one request per user is a
# single short burst whose ramp (prefill, the first and last steps) dominates
# and whose figure swings run to run; several per user measure the steady
# state (the users' requests overlap as they would on a real server).
#
# Unset CUMULO_A / LLAMA_SERVER / BATCHED_BENCH (or empty) leave that column out.
set -u
cd "$(dirname "$0")/.." || exit 1
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
THREADS=${THREADS:-2}
SLOTS=${SLOTS:-16}
USERS=${USERS:-1 4 8 16}
GEN=${GEN:-64}
PROMPT=${PROMPT:-16}
REQS=${REQS:-3}
ARGS_A=${ARGS_A-}
ARGS_B=${ARGS_B-}
CUMULO_A=${CUMULO_A-}
CUMULO_B=${CUMULO_B:-build/cumulo}
# llama.cpp's native build without AMX: its AMX build segfaults on quantized
# models on an AMX CPU (llama.cpp issue 20824); without AMX it is the anchor
LLAMACPP_BIN=${LLAMACPP_BIN:-/work/cache/llamacpp-native/noamx/bin}
LLAMA_SERVER=${LLAMA_SERVER-$LLAMACPP_BIN/llama-server}
BATCHED_BENCH=${BATCHED_BENCH-$LLAMACPP_BIN/llama-batched-bench}
CTX=${CTX:-4096}
PORT0=${PORT0:-18500}
TMP=$(mktemp -d)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM

wait_up() { # URL
    i=0
    while [ $i -lt 300 ]; do
        curl -sf "$1/health" >/dev/null 2>&1 && return 0
        sleep 1
        i=$((i + 1))
    done
    echo "serve_compare: $1 did not come up" >&2
    return 1
}

names=""
start() { # NAME PORT CMD...
    name=$1 port=$2
    shift 2
    "$@" >"$TMP/$name.log" 2>&1 &
    pids="$pids $!"
    if wait_up "http://127.0.0.1:$port"; then names="$names $name:$port"; else cat "$TMP/$name.log" >&2; fi
}

echo "serve_compare: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs," \
    "load $(cut -d' ' -f1-3 /proc/loadavg); model $MODEL, threads $THREADS, slots $SLOTS, prompt $PROMPT, gen $GEN" >&2
p=$PORT0
if [ -n "$CUMULO_A" ]; then
    start before $p "$CUMULO_A" serve "$MODEL" --port $p --threads "$THREADS" --slots "$SLOTS" --queue 64 --ctx "$CTX" $ARGS_A
    p=$((p + 1))
fi
start after $p "$CUMULO_B" serve "$MODEL" --port $p --threads "$THREADS" --slots "$SLOTS" --queue 64 --ctx "$CTX" $ARGS_B
p=$((p + 1))
if [ -n "$LLAMA_SERVER" ] && [ -x "$LLAMA_SERVER" ]; then
    # same slots, threads and per-slot context; continuous batching is on by default
    start llama-server $p "$LLAMA_SERVER" -m "$MODEL" --port $p -t "$THREADS" -tb "$THREADS" -np "$SLOTS" \
        -c $((CTX * SLOTS)) --no-webui
    p=$((p + 1))
fi

for u in $USERS; do
    for np in $names; do
        name=${np%%:*} port=${np##*:}
        # warm-up request (page faults, first-touch of caches) not counted
        node bench/serve_load.mjs --url "http://127.0.0.1:$port" --users 1 --gen 4 --prompt "$PROMPT" >/dev/null 2>&1
        node bench/serve_load.mjs --url "http://127.0.0.1:$port" --users "$u" --requests "$REQS" --gen "$GEN" \
            --prompt "$PROMPT" --label "$name" --seed "$u" | tail -1
    done
    if [ -n "$BATCHED_BENCH" ] && [ -x "$BATCHED_BENCH" ]; then
        # n_ctx a multiple of the sequences' 256-rounded need: llama.cpp
        # splits it per sequence and crashed on "n_ctx is not divisible by n_seq_max"
        "$BATCHED_BENCH" -m "$MODEL" -c $((((PROMPT + GEN + 255) / 256 * 256) * u)) -b 2048 -ub 512 -npp "$PROMPT" -ntg "$GEN" \
            -npl "$u" -t "$THREADS" 2>/dev/null | awk -v u="$u" -F'|' '/^\|[ ]+[0-9]/ {
                gsub(/ /, ""); printf("{\"bench\":\"llama-batched-bench\",\"label\":\"llama-batched-bench\",\"users\":%s,\"tg_tps\":%s,\"pp_tps\":%s,\"total_tps\":%s}\n", u, $9, $7, $11) }'
    fi
done
