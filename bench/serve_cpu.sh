#!/bin/sh
# serve_cpu.sh: CPU time per generated token of `cumulo serve` under a
# closed-loop load, two builds or option sets A and B alternated (A B A B
# ...), for a machine too busy for wall-clock throughput to mean anything:
# the server's user + system CPU seconds (/proc/PID/stat) over the load,
# divided by the tokens generated. It counts what the server spent, including
# its threads' barrier spinning, so it rises somewhat with the machine's
# load too: compare A and B of the same round, never across machines. A
# benchmark, not a test: nothing is asserted. One JSON line per run.
#
#   CUMULO_A=/tmp/main-cumulo CUMULO_B=build/cumulo ARGS_B="-fa" USERS="8 16" ROUNDS=3 sh bench/serve_cpu.sh
set -u
cd "$(dirname "$0")/.." || exit 1
MODEL=${MODEL:-/work/cache/bench-1b/llama1b-q4_0.gguf}
THREADS=${THREADS:-2}
SLOTS=${SLOTS:-16}
CTX=${CTX:-4096}
USERS=${USERS:-8 16}
REQS=${REQS:-2}
GEN=${GEN:-64}
PROMPT=${PROMPT:-16}
ROUNDS=${ROUNDS:-2}
CUMULO_A=${CUMULO_A-}
CUMULO_B=${CUMULO_B:-build/cumulo}
ARGS_A=${ARGS_A-}
ARGS_B=${ARGS_B-}
PORT=${PORT:-18700}
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT INT TERM
tck=$(getconf CLK_TCK)
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
echo "serve_cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; model $MODEL," \
    "threads $THREADS, slots $SLOTS, prompt $PROMPT, gen $GEN, $REQS requests per user" >&2
r=1
while [ $r -le "$ROUNDS" ]; do
    for u in $USERS; do
        for b in A B; do
            eval bin=\$CUMULO_$b args=\$ARGS_$b
            [ -n "$bin" ] || continue
            # shellcheck disable=SC2086
            "$bin" serve "$MODEL" --port $PORT --threads "$THREADS" --slots "$SLOTS" --queue 64 --ctx "$CTX" $args \
                >/dev/null 2>&1 &
            pid=$!
            i=0
            until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 || [ $i -ge 300 ]; do
                sleep 1
                i=$((i + 1))
            done
            node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users "$u" --gen 8 --prompt "$PROMPT" \
                >/dev/null 2>&1 # warm-up: page faults, first touch of the slots' caches
            load=$(cut -d' ' -f1 /proc/loadavg)
            c0=$(cpu_ticks $pid)
            line=$(node bench/serve_load.mjs --url "http://127.0.0.1:$PORT" --users "$u" --requests "$REQS" \
                --gen "$GEN" --prompt "$PROMPT" --seed "$u" --label "$b" | tail -1)
            c1=$(cpu_ticks $pid)
            echo "$line" | node -e '
                let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => {
                    const o = JSON.parse(s), cpu = (Number(process.argv[1]) - Number(process.argv[2])) / Number(process.argv[3]);
                    console.log(JSON.stringify({bench: "serve_cpu", label: process.argv[4], round: Number(process.argv[5]),
                        users: o.users, tokens: o.tokens, ok: o.ok, failed: o.failed, agg_tps: o.agg_tps, cpu_s: cpu,
                        cpu_ms_per_token: Math.round(cpu / Math.max(1, o.tokens) * 100000) / 100, load: Number(process.argv[6])}));
                });' "$c1" "$c0" "$tck" "$b${args:+ $args}" "$r" "$load"
            kill "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            pid=""
            PORT=$((PORT + 1))
        done
    done
    r=$((r + 1))
done
