#!/bin/sh
# serve_rss.sh: memory of `cumulo serve` with SLOTS slots at the model's full
# context (issue 22: "RSS with 16 slots at the model's full context: weights +
# the KV actually used + a bounded overhead"). Starts serve, reads its RSS
# idle, then drives SLOTS closed-loop streams (bench/serve_load.mjs) and,
# while they decode and once they are done, reads the RSS (/proc/PID/status
# VmRSS, and VmHWM for the peak) beside the weights (/api/cluster
# weights_bytes) and the KV in use (/metrics cumulo_kv_bytes_in_use, pages
# written) and pooled (cumulo_kv_bytes_pooled). overhead = RSS - weights -
# KV in use - KV pooled. A benchmark, not a test: nothing is asserted. One
# JSON line per sample on stdout.
#
#   sh bench/serve_rss.sh                                  # 1B Q4_0, 16 slots, the model's context
#   MODEL=... SLOTS=16 CTX=0 PROMPT=512 GEN=64 THREADS=2 CUMULO=build/cumulo sh bench/serve_rss.sh
#
# CTX=0 (the default) asks for the model's whole trained context (`cumulo
# info`'s "context: N trained"): KV pages are committed only as positions are
# written (src/model/kv_mem.c), so 16 slots of it reserve nothing up front.
# The weights figure is the model's tensors once; where the kernels' repacked
# layouts serve every pass (src/kernels/repack.c: Q4_0, Q4_K, Q5_K, Q6_K as
# each table repacks them) the file's pages under them are given back; a copy
# held beside the file's bytes (a mapped file) counts in the overhead
# (CUMULO_REPACK=0 passes through to serve and leaves them out).
set -u
cd "$(dirname "$0")/.." || exit 1
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
CUMULO=${CUMULO:-build/cumulo}
THREADS=${THREADS:-2}
SLOTS=${SLOTS:-16}
CTX=${CTX:-0}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
PORT=${PORT:-18590}
TMP=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT INT TERM

if [ "$CTX" = 0 ]; then
    CTX=$("$CUMULO" info "$MODEL" 2>/dev/null | sed -n 's/^context: *\([0-9][0-9]*\) trained.*/\1/p' | head -1)
    [ -n "$CTX" ] || { echo "serve_rss: no trained context in '$CUMULO info $MODEL'" >&2; exit 1; }
fi
echo "serve_rss: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, load" \
    "$(cut -d' ' -f1-3 /proc/loadavg); model $MODEL ($(stat -c %s "$MODEL") bytes), slots $SLOTS, ctx $CTX," \
    "prompt $PROMPT, gen $GEN, threads $THREADS" >&2
"$CUMULO" serve "$MODEL" --host 127.0.0.1 --port "$PORT" --threads "$THREADS" --slots "$SLOTS" --queue 64 \
    --ctx "$CTX" >"$TMP/serve.log" 2>&1 &
pid=$!
i=0
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
        echo "serve_rss: serve did not come up:" >&2
        tail -5 "$TMP/serve.log" >&2
        exit 1
    fi
    sleep 0.5
done

metric() { sed -n "s/^$1 \\([0-9.e+]*\\)\$/\\1/p" "$TMP/metrics" | head -1; }
kib() { sed -n "s/^$1:[^0-9]*\\([0-9]*\\) kB/\\1/p" "/proc/$pid/status"; }
sample() { # LABEL: one JSON line
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics" || return
    w=$(curl -sf "http://127.0.0.1:$PORT/api/cluster" | sed -n 's/.*"weights_bytes":\([0-9]*\).*/\1/p' | head -1)
    rss=$(($(kib VmRSS) * 1024))
    hwm=$(($(kib VmHWM) * 1024))
    used=$(metric cumulo_kv_bytes_in_use)
    pooled=$(metric cumulo_kv_bytes_pooled)
    cap=$(metric cumulo_kv_bytes_capacity)
    : "${w:=0}" "${used:=0}" "${pooled:=0}" "${cap:=0}"
    over=$((rss - w - used - pooled))
    mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
    echo "serve_rss $1: RSS $(mib $rss) MiB (peak $(mib $hwm)) = weights $(mib $w) + KV in use $(mib $used)" \
        "+ pooled $(mib $pooled) + overhead $(mib $over) MiB (KV budget $(mib $cap) MiB, $SLOTS slots x $CTX)" >&2
    printf '{"bench":"serve_rss","phase":"%s","slots":%s,"ctx":%s,"prompt":%s,"gen":%s,"rss_bytes":%s,"rss_peak_bytes":%s,' \
        "$1" "$SLOTS" "$CTX" "$PROMPT" "$GEN" "$rss" "$hwm"
    printf '"weights_bytes":%s,"kv_in_use_bytes":%s,"kv_pooled_bytes":%s,"kv_capacity_bytes":%s,"overhead_bytes":%s}\n' \
        "$w" "$used" "$pooled" "$cap" "$over"
}

sample idle
node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users "$SLOTS" --requests 1 --prompt "$PROMPT" \
    --gen "$GEN" --label serve_rss >"$TMP/load.out" 2>&1 &
load=$!
# while the streams decode: every 2 s until the load ends, the sample with the most KV in use kept
best=""
best_used=-1
while kill -0 "$load" 2>/dev/null; do
    sleep 2
    line=$(sample busy 2>/dev/null)
    u=$(echo "$line" | sed -n 's/.*"kv_in_use_bytes":\([0-9]*\).*/\1/p')
    if [ -n "$u" ] && [ "$u" -gt "$best_used" ]; then best=$line best_used=$u; fi
done
wait "$load"
tail -1 "$TMP/load.out" >&2
[ -n "$best" ] && echo "$best" # the busy sample with the most KV in use (JSON only)
sample done
