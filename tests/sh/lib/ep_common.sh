# tests/sh/lib/ep_common.sh: shared by the expert-parallel script tests
# (cluster_ep*.sh; not a test itself). Source it after cluster_common.sh. It
# starts the two nodes an expert group of three needs beside this process,
# reads a model's expert sizes from `cumulo info`, and parses the lines a
# node logs about its experts (docs/DESIGN.md, "Expert parallelism"). Which
# node holds which experts is the planner's choice (it orders nodes by their
# measured speed): callers look at both nodes' lines, never assume one.

# ep_nodes TAG: fresh nodes TAGa and TAGb (fresh caches, no mDNS); sets
# PORT_a PORT_b PID_a PID_b. A failed check and non-zero when either did not
# start.
ep_nodes() {
    for n in a b; do cc_start_node "$1$n" --no-mdns; eval "PORT_$n=$NODE_PORT PID_$n=$NODE_PID"; done
    if [ -n "$PORT_a" ] && [ -n "$PORT_b" ]; then ok; else bad "$1: nodes did not start"; return 1; fi
}

# ep_hot_model FILE: a synthetic qwen3moe (8 experts top 2, Q8_0, 3
# layers) whose router favours expert 0 (`synth --hot-expert 0`); a check.
ep_hot_model() {
    "$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
        --experts-used 2 --hot-expert 0 --type q8_0 --seed 21 --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" \
        -o "$1" 2>/dev/null && ok || bad "synth failed"
}

# ep_info MODEL: sets L (layers) D (n_embd) X (experts) K (experts per token)
# WB (all weight bytes) WA (the bytes one token reads) and PER_EXPERT, the
# bytes of one expert over every MoE layer (WB - WA holds X - K of them).
ep_info() {
    "$BIN" info "$1" --json >"$TMP/info.json" 2>/dev/null
    L=$(cc_jsonget "$TMP/info.json" '$j->{n_layer}')
    D=$(cc_jsonget "$TMP/info.json" '$j->{n_embd}')
    X=$(cc_jsonget "$TMP/info.json" '$j->{n_expert}')
    K=$(cc_jsonget "$TMP/info.json" '$j->{n_expert_used}')
    WB=$(cc_jsonget "$TMP/info.json" '$j->{weight_bytes}')
    WA=$(cc_jsonget "$TMP/info.json" '$j->{weight_bytes_active}')
    PER_EXPERT=$(((WB - WA) / (X - K)))
}

# ep_streamed LOG: the node's last "weight bytes streamed" line: sets E0 E1
# (its expert range), GOT_B (the weight bytes it streamed) and REPS (the
# replicas it holds beyond the range, space separated; "" for none).
ep_streamed() {
    sline=$(grep 'weight bytes streamed' "$1" | tail -1)
    E0=$(echo "$sline" | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)), \([0-9]*\) weight bytes.*/\1/p')
    E1=$(echo "$sline" | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)), \([0-9]*\) weight bytes.*/\2/p')
    GOT_B=$(echo "$sline" | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)), \([0-9]*\) weight bytes.*/\3/p')
    REPS=$(echo "$sline" | sed -n 's/.*, replicas \([0-9 ]*\)$/\1/p')
}

# ep_exchange LINE: from a node's "expert-parallel rank ... expert exchanges"
# line, sets NROWS (rows it computed) and NBYTES (element bytes it sent).
ep_exchange() {
    NROWS=$(echo "$1" | sed -n 's/.*: \([0-9]*\) rows, [0-9]* expert exchanges, \([0-9]*\) element bytes.*/\1/p')
    NBYTES=$(echo "$1" | sed -n 's/.*: \([0-9]*\) rows, [0-9]* expert exchanges, \([0-9]*\) element bytes.*/\2/p')
}

# node_line TAG COUNT PATTERN: the last line of TAG's log matching PATTERN,
# once there are more than COUNT of them (a node prints its exchange line
# when the coordinator leaves; wait for it, up to 20 s).
node_line() {
    i=0
    while [ $i -lt 400 ]; do
        [ "$(grep -c "$3" "$TMP/$1.log")" -gt "$2" ] && break
        sleep 0.05
        i=$((i + 1))
    done
    grep "$3" "$TMP/$1.log" | tail -1
}
