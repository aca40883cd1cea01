#!/bin/sh
# tests/sh/cluster_ep_autoload.sh (issue 13): the expert load comes from the
# running cluster. `cumulo serve --parallel ep` over this process + two
# `cumulo node`s on 127.0.0.1 with a synthetic qwen3moe (8 experts top 2,
# Q8_0, 3 layers) whose router favours expert 0 (`synth --hot-expert 0`),
# and no --expert-load: the default, auto (serve counts the routing and
# looks at it, while idle, after every 64 new assignments per expert).
#   1. at the start nothing is replicated (/api/cluster: load "uniform") and
#      4 concurrent completions equal one machine's texts;
#   2. after that warm-up the coordinator re-plans through its one plan
#      change (CUMULO_REJOIN_MS: it looks every 300 ms while idle):
#      /api/cluster says load "measured", 1 re-plan, expert 0 among the
#      replicated experts (the planner may add others), held by
#      a node (which node is the planner's choice: looked up, not assumed),
#      the counts per layer sum to the totals and expert 0 is the most
#      routed; /metrics has the counts per layer and expert, the holders and
#      the re-plan;
#   3. 4 more completions equal one machine's texts, and the nodes computed
#      rows of the replicated expert (the replica is used);
#   4. the exchange over both plans: this machine's element bytes
#      (/api/cluster) plus each node's (its line per plan) equal rows x L x
#      k x 2 peers x n_embd x 4, the formula of docs/DESIGN.md, and every
#      node computed every row;
#   5. the control, `--expert-load off`: the same traffic, no re-plan.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
. tests/sh/lib/ep_common.sh
need curl perl
M=$TMP/hot.gguf
ep_hot_model "$M"
ep_info "$M"
N_TOK=32
cc_want "$M" $N_TOK 1 2
export CUMULO_REJOIN_MS=300
# equal declared speeds (every process): the opening ranges are then even, so
# the member holding the hot expert is the busiest and the planner's first
# replica is expert 0 (with measured speeds on a loaded machine another
# member may be busier and get its own hottest expert replicated first)
export CUMULO_DECLARE_SPEED=50,20

# ---- serve with the default (auto) ----
ep_nodes s || exit 1
if ! cc_start_serve serve "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep \
    --threads 1 --slots 4; then
    bad "serve --parallel ep did not start: $(tail -3 "$TMP/serve.log")"
    exit 1
fi
grep -q 'expert parallel: 3 members' "$TMP/serve.log" && ok || bad "not an expert group of 3: $(grep -E 'expert|why' "$TMP/serve.log")"
ep_api start
[ "$(cc_jsonget "$TMP/start.api.json" '$j->{experts}{load}')" = uniform ] &&
    [ "$(cc_jsonget "$TMP/start.api.json" 'scalar @{$j->{experts}{replicated}}')" = 0 ] && ok ||
    bad "at the start: $(cc_jsonget "$TMP/start.api.json" 'JSON::PP->new->canonical->encode($j->{experts})')"
# 1. before: one machine's texts
ep_wave before
# 2. the warm-up's counts re-plan the replicas (idle: the scheduler's upkeep)
ep_wait_replan after
ex() { cc_jsonget "$TMP/after.api.json" "$1"; }
[ "$(ex '$j->{experts}{replans}')" = 1 ] && [ "$(ex '$j->{experts}{load}')" = measured ] && ok ||
    bad "no re-plan from the measured load: $(ex 'JSON::PP->new->canonical->encode($j->{experts})') $(grep -E 'expert load|re-plan' "$TMP/serve.log" | tail -3)"
ex '(grep { $_ == 0 } @{$j->{experts}{replicated}}) ? 1 : 0' | grep -q 1 && ok ||
    bad "replicated experts '$(ex 'join(",", @{$j->{experts}{replicated}})')', not the hot expert 0"
holder=$(ex 'join(" ", map { $_->{id} } grep { grep { $_ == 0 } @{$_->{replicas} // []} } @{$j->{nodes}})')
[ -n "$holder" ] && ok || bad "no node lists expert 0 among its replicas: $(ex 'JSON::PP->new->encode($j->{nodes})' | head -c 600)"
# the counts: per layer summing to the totals, expert 0 the most routed
[ "$(ex 'my $s = 0; $s += $_ for map { @$_ } @{$j->{experts}{hits_by_layer}}; my $t = 0; $t += $_ for @{$j->{experts}{hits}}; $s == $t && $t > 0 ? 1 : 0')" = 1 ] &&
    ok || bad "hits by layer do not sum to the hits"
[ "$(ex 'my @h = @{$j->{experts}{hits}}; my $m = 0; $m = $_ > $m ? $_ : $m for @h; $h[0] == $m ? 1 : 0')" = 1 ] && ok ||
    bad "expert 0 is not the most routed: $(ex 'join(",", @{$j->{experts}{hits}})')"
grep -q 'expert load measured.*re-planning the experts' "$TMP/serve.log" && grep -q 'expert parallel: 3 members.*replicas: rank' "$TMP/serve.log" &&
    ok || bad "the serve log has no measured re-plan with replicas: $(grep -E 'expert' "$TMP/serve.log" | tail -3)"
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/metrics" >"$TMP/metrics.txt"
grep -q '^cumulo_expert_routed_total{layer="2",expert="0"} [1-9]' "$TMP/metrics.txt" &&
    grep -q '^cumulo_expert_replans_total{load="measured"} 1$' "$TMP/metrics.txt" &&
    [ "$(sed -n 's/^cumulo_expert_holders{stage="0",expert="0"} //p' "$TMP/metrics.txt")" -ge 2 ] 2>/dev/null && ok ||
    bad "/metrics: $(grep '^cumulo_expert' "$TMP/metrics.txt" | grep -E 'expert="0"|replans' | head -6)"
echo "after the warm-up: replicated $(ex 'join(",", @{$j->{experts}{replicated}})'), expert 0 on $holder; hits $(ex 'join(",", @{$j->{experts}{hits}})'); $(grep 'expert load measured' "$TMP/serve.log" | tail -1 | sed 's/.*cluster: //')"
# 3. after: one machine's texts again
ep_wave later
# 4. the exchange over both plans
ep_api end
cb=$(cc_jsonget "$TMP/end.api.json" '$j->{experts}{exchange_bytes}')
rows=$(cc_jsonget "$TMP/end.api.json" '$j->{experts}{exchange_rows}')
cc_stop "$SERVE_PID"
total=${cb:-0}
replica_rows=0
for n in a b; do
    node_line "s$n" 1 'expert-parallel rank.*expert exchanges' >/dev/null # one line per plan: wait for both
    nr=0
    grep 'expert-parallel rank.*expert exchanges' "$TMP/s$n.log" >"$TMP/s$n.ex"
    while read -r line; do
        ep_exchange "$line"
        total=$((total + ${NBYTES:-0}))
        nr=$((nr + ${NROWS:-0}))
    done <"$TMP/s$n.ex"
    [ "$nr" = "$rows" ] && ok || bad "node $n computed $nr rows over the plans, the coordinator sent $rows"
    for r in $(grep 'rows of replicated experts computed here' "$TMP/s$n.log" | sed -n 's/.*: \([0-9]*\) rows of replicated.*/\1/p'); do
        replica_rows=$((replica_rows + r))
    done
done
[ "$replica_rows" -gt 0 ] && ok || bad "no node computed rows of the replicated expert"
per=$((L * K * 2 * D * 4))
[ -n "$rows" ] && [ "$rows" -gt $((8 * N_TOK)) ] && [ "$total" -eq $((rows * per)) ] && ok ||
    bad "the group sent $total exchange bytes for ${rows:-?} rows, expected rows x $per"
echo "exchange over both plans: $total element bytes for $rows rows = $((total / ${rows:-1})) per token ($L layers x k $K x 2 peers x $D x 4); $replica_rows rows of the replicated expert on the nodes"
kill "$PID_a" "$PID_b" 2>/dev/null

# 5. the control: --expert-load off, the same traffic, no re-plan
ep_nodes o || exit 1
if cc_start_serve off "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep --threads 1 \
    --slots 4 --expert-load off; then
    ep_wave off
    sleep 2 # several idle looks (every 300 ms)
    ep_api off
    [ "$(cc_jsonget "$TMP/off.api.json" '$j->{experts}{replans}')" = 0 ] &&
        [ "$(cc_jsonget "$TMP/off.api.json" 'scalar @{$j->{experts}{replicated}}')" = 0 ] && ok ||
        bad "--expert-load off re-planned: $(cc_jsonget "$TMP/off.api.json" 'JSON::PP->new->canonical->encode($j->{experts})')"
else
    bad "serve --expert-load off did not start: $(tail -3 "$TMP/off.log")"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
