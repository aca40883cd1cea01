#!/bin/sh
# tests/sh/cluster_tp.sh: tensor-parallel clusters of `cumulo node` processes
# on 127.0.0.1 (`run --parallel tp`): one group of the coordinator (rank 0,
# it samples) and 1, 2 or 3 nodes, each computing a slice (KV heads, FFN rows)
# of every layer and all-reducing twice per layer. Greedy ids must equal a
# single machine's (which must equal llama.cpp's references) on stories260K
# f32 and q8_0; the all-reduce element bytes every member sent (counted on its
# connections, the coordinator's in --json, each node's in its log) must be
# exactly 2 x layers x dim x 4 x (k-1) per evaluated token (decode and
# prefill both take the direct exchange at this size); uneven slices from
# --tp-weights give the same ids; concurrent streams equal the lone run;
# `serve --parallel tp` answers a completion equal to one machine's.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl
M=$SHARED/models

# start_node NAME [node options...]: a node on a free port (cluster_common.sh);
# sets PORT_<NAME> and SPID_<NAME>.
start_node() {
    name=$1
    shift
    CC_LOG_APPEND=1 cc_start_node "$name" --no-mdns "$@"
    eval "PORT_$name=$NODE_PORT; SPID_$name=$NODE_PID"
}

for n in a b c; do start_node $n --models "$M"; done
ADDR_a=127.0.0.1:$PORT_a
ADDR_b=127.0.0.1:$PORT_b
ADDR_c=127.0.0.1:$PORT_c
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && [ -n "$PORT_c" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }

"$BIN" info "$M/stories260K-f32.gguf" --json >"$TMP/info.json" 2>/dev/null
L=$(cc_jsonget "$TMP/info.json" '$j->{n_layer}')
D=$(cc_jsonget "$TMP/info.json" '$j->{n_embd}')

# node_bytes NAME LAST_EPOCH: "rows data_bytes epoch" of the node's latest
# tensor-parallel assignment ("took stage ... (epoch E), tensor-parallel
# member"), from the line it prints when the assignment ends ("tensor-parallel
# rank R of K (epoch E), stage ..."): after the run has exited and the node
# has noticed, later on a loaded machine, so wait for that line (up to 10 s).
# Empty (the caller's check fails) when the node took no new assignment since
# LAST_EPOCH or its line never came. (It used to wait 3 s for one more line
# than the caller had counted and then take the last line, whichever run's.)
node_bytes() {
    e=$(sed -n 's/.*took stage .* (epoch \([0-9]*\)), tensor-parallel member.*/\1/p' "$TMP/$1.log" | tail -1)
    [ -n "$e" ] && [ "$e" != "$2" ] || return 0
    i=0
    while ! grep -q "^tensor-parallel rank [0-9]* of [0-9]* (epoch $e), stage" "$TMP/$1.log"; do
        i=$((i + 1))
        [ $i -ge 200 ] && return 0
        sleep 0.05
    done
    grep "^tensor-parallel rank [0-9]* of [0-9]* (epoch $e), stage" "$TMP/$1.log" | tail -1 |
        sed 's/.*: \([0-9]*\) rows, [0-9]* all-reduces, \([0-9]*\) element bytes.*/\1 \2 '"$e"'/'
}
seen_a=0 seen_b=0 seen_c=0

# 1. Greedy ids with 2, 3 and 4 members vs one machine and llama.cpp; bytes.
for q in f32 q8_0; do
    for c in 0 1 2 3; do
        cc_ref_case "$q" "$c"
        for nodes in "$ADDR_a" "$ADDR_a,$ADDR_b" "$ADDR_a,$ADDR_b,$ADDR_c"; do
            k=$(($(echo "$nodes" | tr ',' '\n' | wc -l) + 1))
            if ! "$BIN" run "$M/stories260K-$q.gguf" --nodes "$nodes" --parallel tp -p "$prompt" -n "$n" --temp 0 \
                --threads 1 --json >"$TMP/tp.json" 2>"$TMP/tp.err"; then
                bad "$q case $c, $k members: run failed: $(tail -3 "$TMP/tp.err")"
                continue
            fi
            grep -q "tensor parallel: $k members" "$TMP/tp.err" && ok || bad "$q case $c: not a group of $k: $(grep -E 'why|tensor' "$TMP/tp.err")"
            got=$(cc_jsonget "$TMP/tp.json" 'join(",", @{$j->{tokens}})')
            [ "$got" = "$local_ids" ] && ok || bad "$q case $c, $k members: ids differ from one machine"
            per=$((2 * L * D * 4 * (k - 1)))
            rows=$(cc_jsonget "$TMP/tp.json" '$j->{tp}{rows}')
            data=$(cc_jsonget "$TMP/tp.json" '$j->{tp}{data_bytes}')
            [ "$rows" -ge "$n" ] && [ "$data" -eq $((rows * per)) ] && ok ||
                bad "$q case $c, $k members: coordinator sent $data element bytes for $rows tokens, expected $rows x $per"
            for nd in a b c; do
                case $nodes in *"$(eval echo "\$ADDR_$nd")"*) ;; *) continue ;; esac
                eval "before=\$seen_$nd"
                set -- $(node_bytes $nd "$before")
                [ -n "$3" ] && eval "seen_$nd=$3"
                [ "$1" = "$rows" ] && [ "$2" = $((rows * per)) ] && ok ||
                    bad "$q case $c, $k members: node $nd sent ${2:-?} element bytes for ${1:-?} rows, expected $rows x $per"
            done
            [ "$q$c" = q8_01 ] && echo "all-reduce bytes per token per member, $k members: $((data / rows)) = 2 x $L layers x $D x 4 x $((k - 1)); on the wire (frames, MACs) $(($(cc_jsonget "$TMP/tp.json" '$j->{tp}{wire_bytes}') / rows))"
        done
    done
done

# 2. Uneven slices (--tp-weights): same ids.
"$BIN" run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 48 --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
for w in "3,1" "1,3" "1,2,1" "4,1,1,2"; do
    k=$(($(echo "$w" | tr ',' '\n' | wc -l)))
    nodes=$(echo "$ADDR_a,$ADDR_b,$ADDR_c" | cut -d, -f1-$((k - 1)))
    if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$nodes" --parallel tp --tp-weights "$w" -p "Once upon a time" -n 48 \
        --temp 0 --threads 1 --json >"$TMP/w.json" 2>"$TMP/w.err"; then
        [ "$(cc_jsonget "$TMP/w.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "--tp-weights $w: ids differ"
        echo "--tp-weights $w: $(grep 'tensor parallel:' "$TMP/w.err" | sed 's/.*rank 0 with //')"
    else
        bad "--tp-weights $w: run failed: $(tail -2 "$TMP/w.err")"
    fi
done
# --tp-weights are the speeds, not a factor on the measured ones: whatever this
# machine measures (declared here 1000x apart), 1,1 gives the same slices,
# so the sums' last bits (and a benchmark's split) do not move from run to run.
for sp in 500,200 0.5,0.2; do
    CUMULO_DECLARE_SPEED=$sp "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_a" --parallel tp --tp-weights 1,1 \
        -p "Hi" -n 2 --temp 0 --threads 1 >/dev/null 2>"$TMP/d$sp.err" || bad "--tp-weights 1,1 at speed $sp: run failed"
done
d1=$(grep 'tensor parallel:' "$TMP/d500,200.err")
[ -n "$d1" ] && [ "$d1" = "$(grep 'tensor parallel:' "$TMP/d0.5,0.2.err")" ] && ok ||
    bad "--tp-weights 1,1 gave other slices when this machine measured faster: '$d1' / '$(grep 'tensor parallel:' "$TMP/d0.5,0.2.err")'"
s1=$(grep 'tensor parallel:' "$TMP/w.err")
"$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_a,$ADDR_b,$ADDR_c" --parallel tp -p "Hi" -n 2 --temp 0 --threads 1 \
    >/dev/null 2>"$TMP/w0.err"
[ -n "$s1" ] && [ "$s1" != "$(grep 'tensor parallel:' "$TMP/w0.err")" ] && ok || bad "--tp-weights did not change the slices"

# 3. Three concurrent streams over 3 members equal the lone run.
if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_a,$ADDR_b" --parallel tp -p "Once upon a time" -n 48 --temp 0 \
    --threads 1 --streams 3 --json >"$TMP/st.json" 2>"$TMP/st.err"; then
    [ "$(cc_jsonget "$TMP/st.json" '$j->{identical} ? 1 : 0')" = 1 ] && ok || bad "3 streams gave different outputs"
    [ "$(cc_jsonget "$TMP/st.json" 'join(",", @{$j->{ids}})')" = "$one" ] && ok || bad "3 streams differ from the lone run"
else
    bad "3 streams failed: $(tail -3 "$TMP/st.err")"
fi

# 4. serve --parallel tp: 4 concurrent completions (batched by cm_engine_step)
# over a group of 3 equal one machine's text.
if cc_start_serve serve "$M/stories260K-q8_0.gguf" --host 127.0.0.1 --nodes "$ADDR_b,$ADDR_c" --parallel tp --threads 1 \
    --slots 4 && grep -q 'tensor parallel: 3 members' "$TMP/serve.log"; then
    ok
    want=$("$BIN" run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 40 --temp 0 --threads 1 --json 2>/dev/null |
        perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{text}')
    cc_same_texts 40 "$want"
else
    bad "serve --parallel tp did not start as a group of 3: $(tail -3 "$TMP/serve.log")"
fi
cc_stop "$SERVE_PID"

# 5. Streamed weights: nodes WITHOUT --models get only their tensors (the
# first stage's members also token_embd: they embed their tokens) into their
# cache, twice with 2 and 3 members (a missing tensor is a hole that reads as
# zeros, which gave "there there there..."), then again after a restart that
# finds everything in the cache. Must equal one machine's ids every time.
for n in s t; do start_node $n; done
ADDR_s=127.0.0.1:$PORT_s
ADDR_t=127.0.0.1:$PORT_t
stream_case() { # LABEL NODES
    for q in f32 q8_0; do
        want=$("$BIN" run "$M/stories260K-$q.gguf" -p "Once upon a time" -n 40 --temp 0 --threads 1 --json 2>/dev/null |
            perl -MJSON::PP -e 'local $/; print join(",", @{decode_json(<STDIN>)->{tokens}})')
        got=$("$BIN" run "$M/stories260K-$q.gguf" --nodes "$2" --parallel tp -p "Once upon a time" -n 40 --temp 0 \
            --threads 1 --json 2>"$TMP/sw.err" | perl -MJSON::PP -e 'local $/; print join(",", @{decode_json(<STDIN>)->{tokens}})')
        [ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "streamed $q, $1: '$got' vs '$want' ($(tail -2 "$TMP/sw.err"))"
    done
}
if [ -n "$PORT_s" ] && [ -n "$PORT_t" ]; then
    for r in 1 2; do
        stream_case "2 members, run $r" "$ADDR_s"
        stream_case "3 members, run $r" "$ADDR_s,$ADDR_t"
        stream_case "3 members with a --models node, run $r" "$ADDR_s,$ADDR_a"
    done
    [ -n "$(ls "$TMP"/cache-s/slices/*.gguf 2>/dev/null)" ] && ok || bad "node s cached nothing"
    # restart s and t on their caches: nothing is streamed, ids unchanged
    kill $SPID_s $SPID_t 2>/dev/null
    wait $SPID_s $SPID_t 2>/dev/null
    rm -f "$TMP/s.port" "$TMP/t.port"
    for n in s t; do start_node $n; done
    stream_case "3 members after a restart on the cache" "127.0.0.1:$PORT_s,127.0.0.1:$PORT_t"
else
    bad "streamed nodes did not start"
fi

# 6. "The little dog", 400 tokens, f32: reported as diverging from one machine
# around byte 588 on every split. That was the streamed token_embd hole of 5.
# Measured here (2026-12-02): one machine's smallest top-1 margin p1-p2 over
# the 400 steps is 1.9e-3 (step 172) while TP's chosen-token probabilities
# differ from one machine's by <= 1e-6 (summation order), so no near tie can
# flip and the ids must be exactly equal, streamed or from --models, uneven.
want=$("$BIN" run "$M/stories260K-f32.gguf" -p "The little dog" -n 400 --temp 0 --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'local $/; print join(",", @{decode_json(<STDIN>)->{tokens}})')
for nodes in "127.0.0.1:$PORT_s,127.0.0.1:$PORT_t" "$ADDR_a,$ADDR_b"; do
    got=$("$BIN" run "$M/stories260K-f32.gguf" --nodes "$nodes" --parallel tp --tp-weights 3,1,2 -p "The little dog" -n 400 \
        --temp 0 --threads 1 --json 2>"$TMP/dog.err" | perl -MJSON::PP -e 'local $/; print join(",", @{decode_json(<STDIN>)->{tokens}})')
    [ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "'The little dog' x 400 over $nodes differs from one machine ($(tail -2 "$TMP/dog.err"))"
done

# 7. A prompt longer than 64 tokens goes to the group in one pass
# (default_n_batch: CM_BATCH_MAX under --parallel tp), so it costs the group as
# many all-reduces as a one-word prompt, and gives one machine's ids (64-token
# passes there; the kernels are batch-invariant).
long=""
for w in 1 2 3 4 5 6 7 8 9 10 11 12; do long="$long Once upon a time there was a little dog."; done
want=$("$BIN" run "$M/stories260K-f32.gguf" -p "$long" -n 4 --temp 0 --ignore-eos --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'local $/; my $j = decode_json(<STDIN>); print join(",", @{$j->{tokens}}), " ", $j->{timings}{prompt_n}')
for p in "$long" "Once"; do
    "$BIN" run "$M/stories260K-f32.gguf" --nodes "$ADDR_a" --parallel tp -p "$p" -n 4 --temp 0 --ignore-eos --threads 1 \
        --json >"$TMP/long.json" 2>"$TMP/long.err" || bad "long prompt run failed: $(tail -2 "$TMP/long.err")"
    ops=$(cc_jsonget "$TMP/long.json" '$j->{tp}{ops}')
    [ "$p" = Once ] && ops_short=$ops || { ops_long=$ops got="$(cc_jsonget "$TMP/long.json" 'join(",", @{$j->{tokens}}) . " " . $j->{timings}{prompt_n}')"; }
done
[ "${want#* }" -gt 64 ] && [ "$got" = "$want" ] && ok || bad "a prompt of ${want#* } tokens over tp: ids '$got', one machine '$want'"
[ -n "$ops_long" ] && [ "$ops_long" = "$ops_short" ] && ok || bad "a long prompt took $ops_long all-reduces, a one-word one $ops_short: not one pass"

# NEEDSWORK: a member dying mid-run (the failover work). Hybrid plans: cluster_hybrid.sh.

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
