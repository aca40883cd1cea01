#!/bin/sh
# tests/sh/cluster_prefill.sh: a long prompt through a pipeline of `cumulo
# node` processes on 127.0.0.1 is sent in chunks (micro-batches of the
# engine's batch, 64 rows) that the stages process in arrival order, so
# stage k works on chunk i while stage k+1 works on chunk i-1. Checked: the
# greedy ids after a 421-token prompt through 2 and 3 stages equal one
# machine's (F32 and Q8_0 weights; F32 and F16 KV caches), and the first hop
# carried the prompt as at least ceil(421 / 64) FORWARD frames, not as one.
# The wall times of one machine and of the pipelines are printed, never
# asserted (2 shared cores). Every process is killed on exit.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
M=$SHARED/models

for n in a b; do
    cc_start_node "$n" --no-mdns --models "$M"
    eval "PORT_$n=$NODE_PORT"
done
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }
A=127.0.0.1:$PORT_a
B=127.0.0.1:$PORT_b

P=""
i=0
while [ $i -lt 30 ]; do P="${P}Once upon a time there was a little girl named Lily. "; i=$((i + 1)); done
now_ms() { perl -MTime::HiRes=time -e 'printf "%d", time * 1000'; }

for q in f32 q8_0; do
    for kv in f32 f16; do
        t0=$(now_ms)
        "$BIN" run "$M/stories260K-$q.gguf" -p "$P" -n 40 --temp 0 --threads 1 --kv-type "$kv" --json \
            >"$TMP/one.json" 2>"$TMP/one.err" || bad "$q/$kv: one machine failed: $(tail -2 "$TMP/one.err")"
        t1=$(now_ms)
        one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
        np=$(cc_jsonget "$TMP/one.json" 'scalar @{$j->{prompt_tokens}}')
        [ "$np" -ge 400 ] && [ -n "$one" ] && ok || bad "$q/$kv: the prompt has $np tokens (want >= 400), ids '$one'"
        line="$q weights, $kv kv, $np-token prompt: one machine $((t1 - t0)) ms"
        for nodes in "$A" "$A,$B"; do
            stages=$(($(echo "$nodes" | tr ',' '\n' | wc -l) + 1))
            t0=$(now_ms)
            if ! "$BIN" run "$M/stories260K-$q.gguf" --cluster --nodes "$nodes" -p "$P" -n 40 --temp 0 --threads 1 \
                --kv-type "$kv" --json >"$TMP/cl.json" 2>"$TMP/cl.err"; then
                bad "$q/$kv, $stages stages: run failed: $(tail -3 "$TMP/cl.err")"
                continue
            fi
            t1=$(now_ms)
            grep -q "pp plan, $stages stages" "$TMP/cl.err" && ok || bad "$q/$kv: the plan is not $stages stages"
            got=$(cc_jsonget "$TMP/cl.json" 'join(",", @{$j->{tokens}})')
            [ "$got" = "$one" ] && ok || bad "$q/$kv, $stages stages: ids differ from one machine"
            f=$(cc_jsonget "$TMP/cl.json" '$j->{hop}{frames}')
            r=$(cc_jsonget "$TMP/cl.json" '$j->{hop}{rows}')
            # the prompt's chunks + about one frame per generated token: a prompt
            # sent whole would leave f - ng at 1 or 2
            ng=$(cc_jsonget "$TMP/cl.json" 'scalar @{$j->{tokens}}')
            [ "$r" -ge "$np" ] && [ $((f - ng)) -ge $(((np + 63) / 64 - 1)) ] && ok ||
                bad "$q/$kv, $stages stages: $r rows in $f frames on the first hop for a $np-token prompt"
            line="$line, $stages stages $((t1 - t0)) ms ($f frames)"
        done
        echo "$line"
    done
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
