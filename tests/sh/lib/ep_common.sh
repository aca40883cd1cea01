# tests/sh/lib/ep_common.sh: shared by the expert-parallel script tests
# (cluster_ep*.sh; not a test itself). Source it after cluster_common.sh. It
# starts the two nodes an expert group of three needs beside this process,
# reads a model's expert sizes from `cumulo info`, parses the lines a node
# logs about its experts (docs/DESIGN.md, "Expert parallelism"), runs the
# one-run case of cluster_ep.sh and cluster_ep_deepseek2.sh (ep_case) and
# the serving tests' requests and /api/cluster reads. Which
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

# ---- serving (cluster_ep_autoload.sh, cluster_ep_stages.sh): a `cumulo
# serve` at $SERVE_PORT (cc_start_serve); texts named as cc_want's.

# ep_wave TAG: 4 concurrent completions (prompts 1 2 1 2), each one machine's text.
ep_wave() {
    CP=""
    for r in 1 2 3 4; do cc_request "$1" $r $(((r - 1) % 2 + 1)) false; done
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4; do cc_check "$1" $r $(((r - 1) % 2 + 1)) false; done
}

# ep_api TAG: /api/cluster into $TMP/TAG.api.json
ep_api() { curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/$1.api.json"; }

# ep_wait_replan TAG: /api/cluster into $TMP/TAG.api.json until it counts a
# re-plan of the experts (the scheduler's idle upkeep), up to 30 s.
ep_wait_replan() {
    k=0
    while [ $k -lt 150 ]; do
        ep_api "$1"
        [ "$(cc_jsonget "$TMP/$1.api.json" '$j->{experts}{replans} // 0')" -ge 1 ] 2>/dev/null && break
        sleep 0.2
        k=$((k + 1))
    done
}

# ---- one expert-parallel run beside one machine (cluster_ep.sh,
# cluster_ep_deepseek2.sh): $PROMPT, $N tokens.

# ep_case NAME MODEL L_MOE [run options...]: fresh nodes NAMEa and NAMEb,
# one `run --parallel ep` over this process and them:
#   1. an expert group of 3 whose greedy ids equal one machine's;
#   2. the expert exchange, counted in the data path by every member (the
#      coordinator's `tp.data_bytes` in --json, each node's line when its
#      assignment ends), sums to rows x L x k x (members - 1) x n_embd x 4;
#   3. each node streamed only its experts: weight bytes streamed = all
#      weights - (n_expert - held) x bytes of one expert.
# L_MOE: the model's MoE layers when its leading layers are dense (deepseek2);
# "": every layer.
ep_case() {
    name=$1 model=$2 lmoe=$3
    shift 3
    ep_nodes "$name" || return
    ep_info "$model"
    per_x=$PER_EXPERT
    if [ -n "$lmoe" ]; then
        L=$lmoe                           # the leading dense layers have no experts
        per_x=$((PER_EXPERT / L * L)) # WB - WA counts L MoE layers
    fi
    "$BIN" run "$model" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
    one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
    [ -n "$one" ] && ok || bad "$name: single machine run failed"
    if ! "$BIN" run "$model" --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep -p "$PROMPT" -n $N --temp 0 \
        --threads 1 --json "$@" >"$TMP/ep.json" 2>"$TMP/ep.err"; then
        bad "$name: expert-parallel run failed: $(tail -3 "$TMP/ep.err")"
        return
    fi
    grep -q "expert parallel: 3 members" "$TMP/ep.err" && ok || bad "$name: not an expert group of 3: $(grep -E 'why|expert' "$TMP/ep.err")"
    got=$(cc_jsonget "$TMP/ep.json" 'join(",", @{$j->{tokens}})')
    [ "$got" = "$one" ] && ok || bad "$name: ids differ from one machine: $got vs $one"
    rows=$(cc_jsonget "$TMP/ep.json" '$j->{tp}{rows}')
    total=$(cc_jsonget "$TMP/ep.json" '$j->{tp}{data_bytes}')
    for n in a b; do
        ep_exchange "$(node_line "$name$n" 0 'expert-parallel rank.*expert exchanges')"
        [ "$NROWS" = "$rows" ] && ok || bad "$name: node $n computed ${NROWS:-?} rows, the coordinator sent $rows"
        total=$((total + ${NBYTES:-0}))
        ep_streamed "$TMP/$name$n.log"
        want_b=$((WB - (X - ${E1:-0} + ${E0:-0}) * per_x))
        [ -n "$GOT_B" ] && [ "$GOT_B" -eq "$want_b" ] && ok ||
            bad "$name: node $n streamed ${GOT_B:-?} weight bytes for experts [$E0, $E1), expected $want_b"
        echo "$name: node $n holds experts [$E0, $E1) of $X: streamed $GOT_B of $WB weight bytes"
    done
    per=$((L * K * 2 * D * 4)) # per token: L MoE layers x k slots x (members - 1) peers x n_embd x 4
    [ -n "$rows" ] && [ "$rows" -ge $N ] && [ "$total" -eq $((rows * per)) ] && ok ||
        bad "$name: the group sent $total exchange bytes for $rows rows, expected $rows x $per"
    echo "$name: expert exchange per token (all members) $((total / ${rows:-1})) bytes = $L MoE layers x k $K x 2 peers x $D x 4; $(grep 'expert parallel:' "$TMP/ep.err" | sed 's/.*experts by rank/experts by rank/')"
    kill "$PID_a" "$PID_b" 2>/dev/null
}
