#!/bin/sh
# bench/tp_mem.sh: a benchmark, not a test (issue 14). Peak RSS of the two
# members of a tensor-parallel group on loopback (this machine as rank 0 and
# one `cumulo node`, `run --parallel tp --tp-weights 1,1`, 8 tokens), for
# each binary given, interleaved A B A B; the model file's size beside them.
#   sh bench/tp_mem.sh MODEL.gguf [BIN ...]    (default BIN: build/cumulo)
#   REPS=2
cd "$(dirname "$0")/.." || exit 1
M=${1:?usage: bench/tp_mem.sh MODEL.gguf [BIN ...]}
shift
[ $# -gt 0 ] || set -- build/cumulo
REPS=${REPS:-2}
echo "model $M: $(($(wc -c <"$M") / 1048576)) MiB; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
r=0
while [ $r -lt "$REPS" ]; do
    for BIN in "$@"; do
        T=$(mktemp -d)
        "$BIN" node --port 0 --port-file "$T/p" --no-mdns --threads 1 >"$T/node.log" 2>&1 &
        NP=$!
        i=0
        while [ ! -s "$T/p" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        /usr/bin/time -f '%M' -o "$T/rss" "$BIN" run "$M" --nodes "127.0.0.1:$(cat "$T/p")" --parallel tp \
            --tp-weights 1,1 -p "Once upon a time" -n 8 --temp 0 --threads 1 >/dev/null 2>"$T/err"
        nk=$(awk '/VmHWM/ {print $2}' "/proc/$NP/status" 2>/dev/null)
        kill "$NP" 2>/dev/null
        wait "$NP" 2>/dev/null
        echo "$BIN: peak RSS coordinator $(($(tail -1 "$T/rss") / 1024)) MiB, node $((${nk:-0} / 1024)) MiB"
        rm -rf "$T"
    done
    r=$((r + 1))
done
