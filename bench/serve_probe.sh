#!/bin/sh
# serve_probe.sh: the issue-22 time-to-first-token probe, two cumulo builds
# A and B alternated (A B A B ...): per turn a fresh `cumulo serve`, the idle
# baseline (`serve_load.mjs --users 0 --probes K`), then the loaded probe
# (`--users U --gen G --long-prompt P --probes K`: short requests' TTFT while
# U streams decode and a P-token prompt arrives). A benchmark, not a test:
# nothing is asserted; every result is serve_load's JSON line, labelled with
# the build, the round and the load average when it started.
#
#   CUMULO_A=/tmp/old-cumulo CUMULO_B=build/cumulo ROUNDS=2 sh bench/serve_probe.sh
#
# TRACE=DIR: each server runs with CUMULO_SERVE_TRACE=1 and its stderr goes to
# DIR/<build>-r<round>.log (where each probe's time to first token went:
# admission, interjection, passes, first token, bytes sent).
set -u
cd "$(dirname "$0")/.." || exit 1
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
THREADS=${THREADS:-2}
SLOTS=${SLOTS:-16}
CTX=${CTX:-4096}
USERS=${USERS:-8}
GEN=${GEN:-160}
LONG=${LONG:-2000}
PROBES=${PROBES:-5}
ROUNDS=${ROUNDS:-2}
CUMULO_A=${CUMULO_A-}
CUMULO_B=${CUMULO_B:-build/cumulo}
PORT=${PORT:-18600}
TRACE=${TRACE-}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT INT TERM
echo "serve_probe: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; model $MODEL," \
    "threads $THREADS, slots $SLOTS, $USERS streams of $GEN, a $LONG-token prompt, $PROBES probes" >&2
r=1
while [ $r -le "$ROUNDS" ]; do
    for b in A B; do
        eval bin=\$CUMULO_$b
        [ -n "$bin" ] || continue
        log=/dev/null
        [ -n "$TRACE" ] && mkdir -p "$TRACE" && log="$TRACE/$b-r$r.log"
        CUMULO_SERVE_TRACE=${TRACE:+1} "$bin" serve "$MODEL" --port $PORT --threads "$THREADS" --slots "$SLOTS" \
            --queue 64 --ctx "$CTX" >/dev/null 2>"$log" &
        pid=$!
        i=0
        until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 || [ $i -ge 300 ]; do sleep 1; i=$((i + 1)); done
        load=$(cut -d' ' -f1 /proc/loadavg)
        node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users 1 --gen 4 >/dev/null 2>&1 # warm-up
        node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users 0 --probes "$PROBES" \
            --label "$b-r$r-idle-load$load" | tail -1
        load=$(cut -d' ' -f1 /proc/loadavg)
        node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users "$USERS" --gen "$GEN" \
            --long-prompt "$LONG" --probes "$PROBES" --label "$b-r$r-loaded-load$load" | tail -1
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        pid=""
        PORT=$((PORT + 1))
    done
    r=$((r + 1))
done
