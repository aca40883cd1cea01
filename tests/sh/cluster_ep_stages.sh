#!/bin/sh
# tests/sh/cluster_ep_stages.sh (issue 13): the expert load of a later
# pipeline stage. `cumulo serve --parallel ep --groups 1,2` over this process
# (stage 0, alone) + two `cumulo node`s on 127.0.0.1 (stage 1, an expert
# group) with a synthetic qwen3moe (16 experts top 2, Q8_0, 4 layers) whose
# router favours expert 0 only in layer 3 (`synth --hot-expert 0 --hot-from
# 3`), no --expert-load (auto), equal declared speeds. This machine computes
# only stage 0's layers: the counts of stage 1's come from its rank 0's
# EXPERT_LOAD reports (docs/PROTOCOL.md).
#   1. the plan: 2 stages, stage 1 an expert group of both nodes holding
#      layer 3 (the hot layer), nothing replicated; 4 concurrent completions
#      equal one machine's texts;
#   2. the coordinator's counts cover stage 1's layers: /api/cluster's
#      reports > 0 and refused 0; expert 0 the most routed expert of layer 3
#      and not of layer 0; /metrics has layer 3's counts;
#   3. the measured load re-plans through the one plan change: 1 re-plan,
#      expert 0 replicated in stage 1 (cumulo_expert_holders{stage="1",
#      expert="0"} 2), on one of the nodes; 4 more completions equal one
#      machine's texts and the nodes computed rows of the replica;
#   4. the control, `--expert-load off`: no re-plan, and once idle every
#      layer's counts sum to the same total (each token's k assignments in
#      each layer, counted once: this machine's layers and the reported ones).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
. tests/sh/lib/ep_common.sh
need curl perl
M=$TMP/hot3.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 16 \
    --experts-used 2 --hot-expert 0 --hot-from 3 --type q8_0 --seed 21 \
    --vocab "$SHARED/vocab/ggml-vocab-llama-spm.gguf" -o "$M" 2>/dev/null && ok || bad "synth failed"
N_TOK=32
cc_want "$M" $N_TOK 1 2
export CUMULO_REJOIN_MS=300
export CUMULO_DECLARE_SPEED=50,20 # equal speeds: the group's opening ranges are even

# layer_sum FILE L: the assignments counted in layer L
layer_sum() { cc_jsonget "$1" "my \$s = 0; \$s += \$_ for @{\$j->{experts}{hits_by_layer}[$2]}; \$s"; }
# hottest FILE L: the most routed expert of layer L
hottest() {
    cc_jsonget "$1" "my @h = @{\$j->{experts}{hits_by_layer}[$2]}; my \$m = 0; for my \$i (0 .. \$#h) { \$m = \$i if \$h[\$i] > \$h[\$m] } \$m"
}

# ---- 1. the plan ----
ep_nodes s || exit 1
if ! cc_start_serve serve "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep \
    --groups 1,2 --threads 1 --slots 4; then
    bad "serve --parallel ep --groups 1,2 did not start: $(tail -3 "$TMP/serve.log")"
    exit 1
fi
ep_api start
s1=$(cc_jsonget "$TMP/start.api.json" 'join(" ", map { "$_->{stage}:$_->{layers}[0]-$_->{layers}[1]" } @{$j->{nodes}})')
grep -q 'hybrid: 2 stages of 1 member (layers \[0, [1-3])), 2 members (layers \[[1-3], 4))' "$TMP/serve.log" && ok ||
    bad "not stage 0 alone then a group of 2 holding layer 3: $(grep -E 'hybrid|why' "$TMP/serve.log") ($s1)"
[ "$(cc_jsonget "$TMP/start.api.json" 'scalar @{$j->{experts}{replicated}}')" = 0 ] && ok ||
    bad "replicas at the start: $(cc_jsonget "$TMP/start.api.json" 'JSON::PP->new->canonical->encode($j->{experts})')"
ep_wave before

# ---- 2 and 3: the counts of layer 3 reach the coordinator, and re-plan stage 1 ----
ep_wait_replan after
ex() { cc_jsonget "$TMP/after.api.json" "$1"; }
[ "$(ex '$j->{experts}{reports} // 0')" -gt 0 ] 2>/dev/null && [ "$(ex '$j->{experts}{refused_reports}')" = 0 ] && ok ||
    bad "EXPERT_LOAD reports $(ex '$j->{experts}{reports}'), refused $(ex '$j->{experts}{refused_reports}')"
[ "$(layer_sum "$TMP/after.api.json" 3)" -gt 0 ] && [ "$(hottest "$TMP/after.api.json" 3)" = 0 ] && ok ||
    bad "layer 3's counts: $(ex 'join(",", @{$j->{experts}{hits_by_layer}[3]})')"
[ "$(hottest "$TMP/after.api.json" 0)" != 0 ] && ok ||
    bad "expert 0 is the most routed of layer 0 too (not a later stage's hot expert): $(ex 'join(",", @{$j->{experts}{hits_by_layer}[0]})')"
[ "$(ex '$j->{experts}{replans}')" = 1 ] && [ "$(ex '$j->{experts}{load}')" = measured ] && ok ||
    bad "no re-plan from the measured load: $(ex 'JSON::PP->new->canonical->encode($j->{experts})') $(grep -E 'expert load|re-plan' "$TMP/serve.log" | tail -3)"
holder=$(ex 'join(" ", map { "$_->{id}\@$_->{stage}" } grep { grep { $_ == 0 } @{$_->{replicas} // []} } @{$j->{nodes}})')
case "$holder" in
*@1*) ok ;;
*) bad "expert 0 is not replicated in stage 1: '$holder' $(ex 'JSON::PP->new->encode($j->{nodes})' | head -c 600)" ;;
esac
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/metrics" >"$TMP/metrics.txt"
grep -q '^cumulo_expert_routed_total{layer="3",expert="0"} [1-9]' "$TMP/metrics.txt" &&
    grep -q '^cumulo_expert_replans_total{load="measured"} 1$' "$TMP/metrics.txt" &&
    [ "$(sed -n 's/^cumulo_expert_holders{stage="1",expert="0"} //p' "$TMP/metrics.txt")" = 2 ] && ok ||
    bad "/metrics: $(grep '^cumulo_expert' "$TMP/metrics.txt" | grep -E 'layer="3",expert="0"|stage="1",expert="0"|replans' | head -6)"
echo "stage 1's layers reported: layer 3 $(ex 'join(",", @{$j->{experts}{hits_by_layer}[3]})'), layer 0 $(ex 'join(",", @{$j->{experts}{hits_by_layer}[0]})'); $(ex '$j->{experts}{reports}') reports; expert 0 replicated on $holder; $(grep 'expert load measured' "$TMP/serve.log" | tail -1 | sed 's/.*cluster: //')"
ep_wave later
cc_stop "$SERVE_PID"
replica_rows=0
for n in a b; do
    node_line "s$n" 1 'expert-parallel rank.*expert exchanges' >/dev/null # one line per plan
    for r in $(grep 'rows of replicated experts computed here' "$TMP/s$n.log" | sed -n 's/.*: \([0-9]*\) rows of replicated.*/\1/p'); do
        replica_rows=$((replica_rows + r))
    done
done
[ "$replica_rows" -gt 0 ] && ok || bad "no node computed rows of the replicated expert"
kill "$PID_a" "$PID_b" 2>/dev/null

# ---- 4. the control: no re-plan; every layer counted once ----
ep_nodes o || exit 1
if cc_start_serve off "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep --groups 1,2 \
    --threads 1 --slots 4 --expert-load off; then
    ep_wave off
    # idle for at least 2 s (several of the scheduler's idle looks, every
    # 300 ms: the control's re-plan would come then); stage 1's last counts
    # come with its rank 0's next EXPERT_LOAD report, a heartbeat later, or
    # later on a loaded machine: look until every layer's sum is layer 0's,
    # up to 30 s
    sleep 2
    k=0
    while :; do
        ep_api off
        t0=$(layer_sum "$TMP/off.api.json" 0)
        sums="$t0"
        same=1
        for l in 1 2 3; do
            t=$(layer_sum "$TMP/off.api.json" $l)
            sums="$sums $t"
            [ "$t" = "$t0" ] || same=0
        done
        [ "$same" = 1 ] && [ "${t0:-0}" -gt 0 ] 2>/dev/null && break
        k=$((k + 1))
        [ $k -ge 150 ] && break
        sleep 0.2
    done
    [ "$(cc_jsonget "$TMP/off.api.json" '$j->{experts}{replans}')" = 0 ] &&
        [ "$(cc_jsonget "$TMP/off.api.json" 'scalar @{$j->{experts}{replicated}}')" = 0 ] && ok ||
        bad "--expert-load off re-planned: $(cc_jsonget "$TMP/off.api.json" 'JSON::PP->new->canonical->encode($j->{experts})')"
    [ "$same" = 1 ] && [ "$t0" -gt 0 ] && ok || bad "the layers' counts differ: $sums (each layer routes every token)"
    echo "control: per-layer sums $sums"
else
    bad "serve --expert-load off did not start: $(tail -3 "$TMP/off.log")"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
