#!/bin/sh
# tests/sh/cluster_ep_replicas.sh (issue 13): hot-expert replication in an
# expert group over this process + two `cumulo node`s on 127.0.0.1. A
# synthetic qwen3moe (8 experts top 2, Q8_0) whose router is skewed towards
# expert 0 (`synth --hot-expert 0`); one machine's `run --json` gives the ids
# and the routing counts (expert_hits), which `--expert-load` hands to the
# planner (sched/replicas.c):
#   1. with the counts: the plan replicates the hot expert (the coordinator's
#      "replicas:" line), every ASSIGN carries every member's replicas, the
#      node holding one streams exactly its range's and its replicas' expert
#      slabs, splits the replicated expert's rows with its other holders
#      (cm_expert_share) and says how many it computed (> 0: the replica was
#      used); ids equal one machine; the exchange still sends each row once
#      (element bytes = rows x L x k x 2 peers x n_embd x 4);
#   2. the control, without the counts: no replica, and no node computes a
#      replicated expert's rows (so check 1 fails when replication is off);
#   3. the node holding the replica is killed mid-stream (40 ms per token, a
#      test hook): the coordinator re-plans through its one plan change, with
#      the counts again, and the text equals one machine's.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
. tests/sh/lib/ep_common.sh
M=$TMP/hot.gguf
ep_hot_model "$M"
PROMPT="Once upon a time"
N=32
"$BIN" run "$M" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
hits=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{expert_hits}})')
cc_jsonget "$TMP/one.json" '$j->{text}' >"$TMP/want" 2>/dev/null
[ -n "$one" ] && [ -n "$hits" ] && ok || bad "single machine run failed (ids '$one', expert_hits '$hits')"
# the skew is real: expert 0 takes more than 1.5 times an even share
set -- $(echo "$hits" | tr ',' ' ')
sum=0
for h in "$@"; do sum=$((sum + h)); done
[ "$1" -gt 0 ] && [ $((2 * $1 * $#)) -gt $((3 * sum)) ] && ok || bad "expert 0 is not hot: routing counts $hits"
echo "routing counts on one machine (3 layers x $N+ tokens x top 2): $hits"
ep_info "$M"
# equally strong machines: the replicas' placement follows work / bandwidth, and
# bandwidths measured on a busy shared host could put the only replica on this
# process (rank 0), which check 3 cannot kill
export CUMULO_DECLARE_SPEED=50,20

# ep_case TAG [run options]: fresh nodes TAGa and TAGb, one EP run (checks 1, 2).
# Sets REPLICA_ROWS (rows of replicated experts the nodes computed).
ep_case() {
    ct=$1
    shift
    ep_nodes "$ct" || return
    if ! "$BIN" run "$M" --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep -p "$PROMPT" -n $N --temp 0 \
        --threads 1 --json "$@" >"$TMP/$ct.json" 2>"$TMP/$ct.err"; then
        bad "$ct: expert-parallel run failed: $(tail -3 "$TMP/$ct.err")"
        return
    fi
    got=$(cc_jsonget "$TMP/$ct.json" 'join(",", @{$j->{tokens}})')
    [ "$got" = "$one" ] && ok || bad "$ct: ids differ from one machine: $got vs $one"
    rows=$(cc_jsonget "$TMP/$ct.json" '$j->{tp}{rows}')
    total=$(cc_jsonget "$TMP/$ct.json" '$j->{tp}{data_bytes}')
    REPLICA_ROWS=0
    for n in a b; do
        lg=$TMP/$ct$n.log
        # a node logs its exchange (and replica) lines when its coordinator has gone
        cc_wait_grep "$lg" 'expert-parallel rank.*expert exchanges' 200 || bad "$ct: node $n logged no exchange"
        ep_exchange "$(grep 'expert-parallel rank.*expert exchanges' "$lg" | tail -1)"
        total=$((total + ${NBYTES:-0}))
        ep_streamed "$lg"
        reps=$REPS
        nrep=$(echo $reps | wc -w)
        held=$((${E1:-0} - ${E0:-0} + nrep))
        [ -n "$GOT_B" ] && [ "$GOT_B" -eq $((WB - (X - held) * PER_EXPERT)) ] && ok ||
            bad "$ct: node $n streamed ${GOT_B:-?} bytes for experts [$E0, $E1) + replicas '$reps', expected $((WB - (X - held) * PER_EXPERT))"
        r=$(grep 'rows of replicated experts computed here' "$lg" | tail -1 | sed -n 's/.*: \([0-9]*\) rows of replicated.*/\1/p')
        if [ "$nrep" -gt 0 ]; then
            cc_wait_grep "$lg" 'rows of replicated experts computed here' 50
            r=$(grep 'rows of replicated experts computed here' "$lg" | tail -1 | sed -n 's/.*: \([0-9]*\) rows of replicated.*/\1/p')
            # a holder's share of a replicated expert's rows follows its measured speed and may round to
            # none on one node: the group's sum is checked below (REPLICA_ROWS)
            [ -n "$r" ] && ok || bad "$ct: node $n holds replicas '$reps' but logged no replica rows"
        fi
        REPLICA_ROWS=$((REPLICA_ROWS + ${r:-0}))
        echo "$ct: node $n: experts [$E0, $E1)${reps:+ + replicas $reps}: streamed $GOT_B of $WB weight bytes, ${r:-0} rows of replicated experts computed"
    done
    per=$((L * K * 2 * D * 4))
    [ "$rows" -ge $N ] && [ "$total" -eq $((rows * per)) ] && ok ||
        bad "$ct: the group sent $total exchange bytes for $rows rows, expected $rows x $per"
    echo "$ct: $(grep 'expert parallel:' "$TMP/$ct.err" | sed 's/.*experts by rank/experts by rank/')"
    kill "$PID_a" "$PID_b" 2>/dev/null
}

# 1. with the routing counts: a replica, used
ep_case rep --expert-load "$hits"
grep -q 'expert parallel: 3 members.*replicas: rank' "$TMP/rep.err" && ok ||
    bad "rep: the plan has no replica: $(grep -E 'expert parallel|why' "$TMP/rep.err")"
[ "$REPLICA_ROWS" -gt 0 ] && ok || bad "rep: no node computed rows of a replicated expert"
# 2. the control: no counts, no replica
ep_case plain
grep -q 'replicas:' "$TMP/plain.err" && bad "plain: replicas without --expert-load" || ok
[ "$REPLICA_ROWS" -eq 0 ] && ok || bad "plain: $REPLICA_ROWS rows of replicated experts without replicas"

# 3. the node holding a replica killed mid-stream: recovery, one machine's text
cc_start_node ka --no-mdns; PORT_a=$NODE_PORT PID_a=$NODE_PID
cc_start_node kb --no-mdns; PORT_b=$NODE_PORT PID_b=$NODE_PID
CUMULO_TEST_CLUSTER_DELAY_MS=40 "$BIN" run "$M" -p "$PROMPT" -n $N --temp 0 --threads 1 \
    --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep --expert-load "$hits" --json >"$TMP/kill.json" \
    2>"$TMP/kill.log" &
run=$!
CC_PIDS="$CC_PIDS $run"
cc_wait_grep "$TMP/kill.log" 'expert parallel:' 300 || bad "kill: no expert group: $(tail -3 "$TMP/kill.log")"
# the members have loaded (and logged their replicas) once the run says
# 'cluster ready'; 'expert parallel:' is the plan, and a member lost while it
# loads fails the run instead of a recovery
cc_wait_grep "$TMP/kill.log" 'cluster ready' 300 || bad "kill: the cluster did not start: $(tail -3 "$TMP/kill.log")"
victim=""
grep -q 'weight bytes streamed, replicas' "$TMP/ka.log" && victim=$PID_a vname=a
[ -z "$victim" ] && grep -q 'weight bytes streamed, replicas' "$TMP/kb.log" && victim=$PID_b vname=b
[ -n "$victim" ] && ok || bad "kill: neither node holds a replica"
sleep 0.4 # ~10 tokens in
kill -0 $run 2>/dev/null && ok || bad "kill: the run had ended before the kill"
[ -n "$victim" ] && kill -9 "$victim"
wait $run
cc_jsonget "$TMP/kill.json" '$j->{text}' >"$TMP/kill.got" 2>/dev/null
cmp -s "$TMP/kill.got" "$TMP/want" && ok || bad "kill: text differs from one machine: $(tail -3 "$TMP/kill.log")"
grep -q 'recovered' "$TMP/kill.log" && ok || bad "kill: no recovery: $(grep -iE 'plan|recover|fail' "$TMP/kill.log" | tail -3)"
echo "kill: node $vname (holding a replica) killed mid-stream; $(grep -E 're-plan|recovered' "$TMP/kill.log" | tail -2 | tr '\n' ' ')"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
