#!/bin/sh
# tests/sh/cluster_pipeline.sh: pipeline-parallel clusters of `cumulo node`
# processes on 127.0.0.1. 2-, 3- and 4-stage clusters (the coordinator is
# stage 0) must give the same greedy ids as a single machine, and llama.cpp's
# reference ids, on the stories260K reference prompts; bytes per token per hop
# are counted on the wire (net's counters) and bounded by dim x 4 + a fixed
# header; concurrent streams fill the pipeline and each equals the lone run;
# a node with another cluster key is refused, one with the key works;
# `cumulo nodes` reports the nodes; KV cache types reach the nodes. Every
# process is killed on exit.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
M=$SHARED/models

# start_node NAME [node options...]: a node on a free port (cluster_common.sh);
# sets PORT_<NAME>.
start_node() {
    name=$1
    shift
    cc_start_node "$name" --no-mdns "$@"
    eval "PORT_$name=$NODE_PORT"
}

for n in a b c; do start_node $n --models "$M"; done
ADDR_a=127.0.0.1:$PORT_a
ADDR_b=127.0.0.1:$PORT_b
ADDR_c=127.0.0.1:$PORT_c
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && [ -n "$PORT_c" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }

# 1. Greedy ids: 2, 3 and 4 stages (the planner's split) vs one machine and llama.cpp.
for q in q8_0 f32; do
    for c in 0 1 2 3; do
        cc_ref_case "$q" "$c"
        for nodes in "$ADDR_a" "$ADDR_a,$ADDR_b" "$ADDR_a,$ADDR_b,$ADDR_c"; do
            stages=$(($(echo "$nodes" | tr ',' '\n' | wc -l) + 1))
            if ! "$BIN" run "$M/stories260K-$q.gguf" --cluster --nodes "$nodes" -p "$prompt" -n "$n" --temp 0 \
                --threads 1 --json >"$TMP/cl.json" 2>"$TMP/cl.err"; then
                bad "$q case $c, $stages stages: run failed: $(tail -3 "$TMP/cl.err")"
                continue
            fi
            grep -q "pp plan, $stages stages" "$TMP/cl.err" && ok || bad "$q case $c: the plan is not $stages stages: $(grep why "$TMP/cl.err")"
            got=$(cc_jsonget "$TMP/cl.json" 'join(",", @{$j->{tokens}})')
            [ "$got" = "$local_ids" ] && ok || bad "$q case $c, $stages stages: ids differ from one machine"
            # Bytes on the first hop: per row dim*4 + 9 (pos, seq, want), per frame
            # at most 64 (20 header + 16 MAC + 25 FORWARD fields, rounded up).
            b=$(cc_jsonget "$TMP/cl.json" '$j->{hop}{bytes}')
            f=$(cc_jsonget "$TMP/cl.json" '$j->{hop}{frames}')
            r=$(cc_jsonget "$TMP/cl.json" '$j->{hop}{rows}')
            if [ "$r" -ge "$n" ] && [ "$b" -le $((r * (64 * 4 + 9) + f * 64)) ] && [ "$b" -gt $((r * 64 * 4)) ]; then ok
            else bad "$q case $c: $b bytes in $f frames for $r tokens on the first hop"; fi
            [ "$q$c" = q8_01 ] && [ "$stages" = 4 ] && echo "bytes per token per hop (decode, dim 64): $(((b - (r - f + 1) * 265 - 61) / (f - 1))) = 64*4 + $(((b - (r - f + 1) * 265 - 61) / (f - 1) - 256))"
        done
    done
done

# 2. Explicit split and four concurrent streams through 3 stages: every
# stream equals the lone run.
"$BIN" run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 48 --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_b,$ADDR_c" --layers 1,3,1 -p "Once upon a time" -n 48 --temp 0 \
    --threads 1 --streams 4 --json >"$TMP/st.json" 2>"$TMP/st.err"; then
    [ "$(cc_jsonget "$TMP/st.json" '$j->{identical} ? 1 : 0')" = 1 ] && ok || bad "4 streams gave different outputs"
    [ "$(cc_jsonget "$TMP/st.json" 'join(",", @{$j->{ids}})')" = "$one" ] && ok || bad "4 streams differ from the lone run"
    grep -q 'layers split by --layers 1,3,1' "$TMP/st.err" && ok || bad "--layers not used"
else
    bad "4 streams failed: $(tail -3 "$TMP/st.err")"
fi

# 2b. --quiet (issue 19): the same text, nothing on stderr (no tables, no
# timing); without it the start-up time is shown.
"$BIN" run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 24 --temp 0 --threads 1 >"$TMP/q1.out" 2>/dev/null
if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_b,$ADDR_c" -p "Once upon a time" -n 24 --temp 0 --threads 1 \
    -q >"$TMP/q.out" 2>"$TMP/q.err"; then
    cmp -s "$TMP/q1.out" "$TMP/q.out" && ok || bad "--quiet: text differs: $(cat "$TMP/q.out")"
    [ ! -s "$TMP/q.err" ] && ok || bad "--quiet printed on stderr: $(head -3 "$TMP/q.err")"
else
    bad "--quiet run failed: $(tail -3 "$TMP/q.err")"
fi
"$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_b,$ADDR_c" -p "Once upon a time" -n 4 --temp 0 --threads 1 \
    >/dev/null 2>"$TMP/nq.err"
grep -q '^cluster ready in [0-9.]* s$' "$TMP/nq.err" && ok || bad "no start-up time: $(cat "$TMP/nq.err")"

# 3. Sampling with a seed happens on the last stage and equals one machine's.
"$BIN" run "$M/stories260K-q8_0.gguf" -p "Lily" -n 40 --temp 0.9 --seed 7 --repeat-penalty 1.3 --threads 1 --json >"$TMP/s1.json" 2>/dev/null
"$BIN" run "$M/stories260K-q8_0.gguf" --nodes "$ADDR_a,$ADDR_c" -p "Lily" -n 40 --temp 0.9 --seed 7 --repeat-penalty 1.3 \
    --threads 1 --json >"$TMP/s2.json" 2>"$TMP/s2.err"
[ "$(cc_jsonget "$TMP/s1.json" 'join(",", @{$j->{tokens}})')" = "$(cc_jsonget "$TMP/s2.json" 'join(",", @{$j->{tokens}})' 2>/dev/null)" ] &&
    ok || bad "seeded sampling with penalties differs on the cluster: $(tail -2 "$TMP/s2.err")"

# 4. Keys: a node with another key is refused, and says so; `cumulo nodes` sees ours.
CUMULO_KEY_FILE="$TMP/other.key" "$BIN" key >/dev/null 2>&1
CUMULO_KEY_FILE="$TMP/other.key" start_node x --models "$M"
if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "127.0.0.1:$PORT_x" -p "Hi" -n 4 --temp 0 --threads 1 >"$TMP/x.out" 2>"$TMP/x.err"; then
    bad "a node with another key was used"
else
    grep -q "key" "$TMP/x.err" && ok || bad "refusal does not mention the key: $(cat "$TMP/x.err")"
fi
"$BIN" nodes --no-mdns --nodes "$ADDR_a,127.0.0.1:$PORT_x" --json >"$TMP/nodes.json" 2>/dev/null
[ "$(cc_jsonget "$TMP/nodes.json" '($j->[0]{reachable} ? 1 : 0) . ($j->[1]{reachable} ? 1 : 0) . $j->[0]{name}')" = "10a" ] &&
    ok || bad "cumulo nodes: $(cat "$TMP/nodes.json")"
[ "$(cc_jsonget "$TMP/nodes.json" '$j->[0]{cores} > 0 && $j->[0]{rtt_ms} > 0 && $j->[0]{gflops} > 0 ? 1 : 0')" = 1 ] &&
    ok || bad "cumulo nodes lacks capabilities: $(cat "$TMP/nodes.json")"

# 5. Weights: a node without the model gets only its stage's tensors streamed
# into its cache (a sparse copy: disk use below the file's size), verified by
# hash; after a restart nothing is sent; a corrupted tensor is fetched again.
w_run() { # w_run TAG: run through node w, check the ids
    if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "127.0.0.1:$PORT_w" --layers 2,3 -p "Once upon a time" -n 48 --temp 0 --threads 1 \
        --json >"$TMP/w.json" 2>"$TMP/w.err"; then
        [ "$(cc_jsonget "$TMP/w.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "$1: ids differ"
    else
        bad "$1: run failed: $(tail -2 "$TMP/w.err")"
    fi
}
streamed() { grep 'bytes streamed' "$TMP/w.log" | tail -1 | sed 's/.*weights: \([0-9]*\) bytes streamed.*/\1/'; }
CUMULO_LOG=info start_node w
w_run "streamed weights"
[ -n "$(streamed)" ] && [ "$(streamed)" -gt 0 ] && ok || bad "nothing was streamed: $(grep weights "$TMP/w.log" | tail -2)"
slice=$(ls "$TMP"/cache-w/slices/*.gguf 2>/dev/null | head -1)
if [ -n "$slice" ]; then
    [ "$(du -k "$slice" | cut -f1)" -lt $(($(wc -c <"$M/stories260K-q8_0.gguf") / 1024)) ] && ok || bad "the cached slice is not sparse"
else
    bad "no cached slice"
fi
# restart the node: same cache
pw=$(echo $CC_PIDS | tr ' ' '\n' | tail -1)
kill "$pw"; wait "$pw" 2>/dev/null
rm -f "$TMP/w.port"
CUMULO_LOG=info start_node w
w_run "cached weights"
[ "$(streamed)" = 0 ] && ok || bad "a restart streamed $(streamed) bytes again"
# flip the first stored byte after the header (inside a streamed tensor:
# holes read as zeros): the hash catches it
off=$(perl -e 'open M, "<", $ARGV[1]; binmode M; read M, $h, 16; my $d = unpack("Q<", substr($h, 8, 8));
    open F, "<", $ARGV[0]; binmode F; local $/; $_ = <F>; pos($_) = $d; /[^\0]/g; print pos($_) - 1' "$slice" "${slice%.gguf}.manifest")
printf '\377' | dd of="$slice" bs=1 seek="$off" conv=notrunc 2>/dev/null
w_run "repaired weights"
[ "$(streamed)" -gt 0 ] && ok || bad "a corrupted cached tensor was not fetched again"

# 6. KV cache types reach the nodes through their assignment: a 2-stage
# run with -ctk q8_0 -ctv q4_0 (and f16 with -fa) equals one machine with
# the same types, and differs from F32 (so the types were used).
"$BIN" synth --arch llama --dim 128 --layers 4 --heads 2 --kv-heads 2 --ffn 256 --type q8_0 --seed 5 \
    --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" -o "$TMP/kv.gguf" --threads 1 >/dev/null 2>&1
kv_ids() { # kv_ids OUT [run options]
    out=$1
    shift
    "$BIN" run "$TMP/kv.gguf" -p "one two three four" -n 40 --temp 0 --threads 1 --json "$@" >"$TMP/$out.json" 2>"$TMP/$out.err" &&
        cc_jsonget "$TMP/$out.json" 'join(",", @{$j->{tokens}})'
}
f32=$(kv_ids kvf32)
for opts in "-ctk q8_0 -ctv q4_0" "--kv-type f16 -fa"; do
    # shellcheck disable=SC2086
    one_kv=$(kv_ids kv1 $opts)
    # shellcheck disable=SC2086
    cl_kv=$(kv_ids kv2 $opts --nodes "$ADDR_a" --layers 2,2)
    [ -n "$one_kv" ] && [ "$one_kv" = "$cl_kv" ] && ok || bad "kv $opts: 2 stages differ from one machine: $(tail -2 "$TMP/kv2.err")"
    [ "$opts" = "--kv-type f16 -fa" ] || { [ "$one_kv" != "$f32" ] && ok || bad "kv $opts: same ids as F32 (types not used?)"; }
done

# 7. A full context is the same on a cluster as on one machine (docs/DESIGN.md,
# "A full context"): a prompt longer than --ctx is refused naming the limit;
# generation that reaches it stops with finish_reason "ctx" after the same ids.
long=$(perl -e 'print "the dog ran and " x 40')
for where in "" "--nodes $ADDR_a"; do
    # shellcheck disable=SC2086
    if "$BIN" run "$M/stories260K-q8_0.gguf" $where -p "$long" --ctx 32 --threads 1 >/dev/null 2>"$TMP/full.err"; then
        bad "a prompt over the context was accepted ($where)"
    else
        grep -q "does not fit the context of 32" "$TMP/full.err" && ok || bad "full prompt ($where): $(tail -1 "$TMP/full.err")"
    fi
    # shellcheck disable=SC2086
    "$BIN" run "$M/stories260K-q8_0.gguf" $where -p "Once upon a time" --ctx 40 -n 100 --temp 0 --threads 1 --json \
        >"$TMP/full.json" 2>"$TMP/full2.err"
    got=$(cc_jsonget "$TMP/full.json" '$j->{finish_reason} . ":" . scalar(@{$j->{tokens}})' 2>/dev/null)
    [ -z "$where" ] && full_one=$got
    case $got in ctx:*) ok ;; *) bad "generation to a full context ($where): $got $(tail -1 "$TMP/full2.err")" ;; esac
done
[ "$got" = "$full_one" ] && ok || bad "a full context differs on the cluster: $got vs $full_one"
# chat's shift (the oldest exchange after the system message dropped before a
# turn) on the cluster: the same replies and the same notice as one machine.
for where in "" "--nodes $ADDR_a"; do
    # shellcheck disable=SC2086
    printf 'hello\nwhat next?\n' | "$BIN" chat "$M/stories260K-q8_0.gguf" $where --chat-template chatml \
        --system "Be brief." --temp 0 -n 24 --ctx 128 --threads 1 >"$TMP/chat_last.out" 2>"$TMP/chat.err"
    [ -z "$where" ] && cp "$TMP/chat_last.out" "$TMP/chat_one.out"
    grep -q 'dropped the oldest 1 exchange' "$TMP/chat.err" && ok || bad "chat shift ($where): $(tail -2 "$TMP/chat.err")"
done
[ -s "$TMP/chat_one.out" ] && cmp -s "$TMP/chat_one.out" "$TMP/chat_last.out" && ok ||
    bad "chat with a full context differs on the cluster: $(cat "$TMP/chat_one.out") / $(cat "$TMP/chat_last.out")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
