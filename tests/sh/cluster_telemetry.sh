#!/bin/sh
# cluster_telemetry.sh (issue 19, item 4): live telemetry from every node.
# `cumulo serve` + two nodes that play machines of their own (host ids
# cc-na, cc-nb); na reads a fake RAPL tree (CUMULO_POWERCAP_ROOT, whose
# counter a loop sets every 20 ms to 25 W times the time since it began), nb
# has none (an estimate). After a few requests:
#   /api/cluster: every remote node's memory in use, CPU load, power and its
#     label (na measured, nb estimated), tokens/s and time per token of its
#     stage come from its heartbeats; the cluster's watts are the sum over the
#     3 hosts, labelled "rapl x1, estimate x2", and tokens/W = tokens/s / that;
#   /metrics: per-node series with labels node and host, the cluster's watts
#     and tokens/W with their label.
# Before issue 19 remote nodes had power "unknown", memory "at connect" and
# the cluster's tokens/W divided by this machine's watts alone.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
need curl perl

RAPL=$TMP/rapl
mkdir -p "$RAPL/intel-rapl:0"
echo 1000000000000 >"$RAPL/intel-rapl:0/max_energy_range_uj"
echo 0 >"$RAPL/intel-rapl:0/energy_uj"
# The counter follows the clock, not the loop's pace: a shell loop adding 5 J
# per `sleep 0.2` (forking echo, mv and sleep) slowed to ~0.3 s a turn at load
# 20 and read 17.8 W; at 0.4 s a turn a 500 ms window holds one step (10 W).
# No forks here, and however late a turn runs it writes 25 W x elapsed.
perl -MTime::HiRes=time,sleep -e '
    my ($d, $t0) = ($ARGV[0], time);
    while (1) {
        open my $f, ">", "$d/energy_uj.t" or die; printf $f "%d\n", 25e6 * (time - $t0); close $f;
        rename "$d/energy_uj.t", "$d/energy_uj" or die; sleep 0.02;
    }' "$RAPL/intel-rapl:0" &
CC_PIDS="$CC_PIDS $!"
CUMULO_POWERCAP_ROOT=$RAPL cc_start_node na --bind 127.0.0.1 --no-mdns; PA=$NODE_PORT
cc_start_node nb --bind 127.0.0.1 --no-mdns; PB=$NODE_PORT
[ -n "$PA" ] && [ -n "$PB" ] || bad "nodes did not start"
cc_start_serve srv "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --threads 1 --slots 2 ||
    bad "serve did not start: $(tail -3 "$TMP/srv.log")"
U=http://127.0.0.1:$SERVE_PORT
for i in 1 2 3; do
    curl -s --max-time 60 "$U/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":60,"temperature":0}' >/dev/null
done
sleep 1.2 # a heartbeat or two after the last token
curl -s "$U/api/cluster" >"$TMP/c.json"
curl -s "$U/metrics" >"$TMP/m.txt"
j() { cc_jsonget "$TMP/c.json" "$1"; }
node_of() { echo '(grep { $_->{id} eq "127.0.0.1:'"$1"'" } @{$j->{nodes}})[0]'; }
for p in $PA $PB; do
    n=$(node_of $p)
    [ "$(j "$n->{memory_source}")" = "live (heartbeat)" ] && [ "$(j "$n->{memory_used} > 0 ? 1 : 0")" = 1 ] && ok ||
        bad "node $p memory: $(j "$n->{memory_source}") $(j "$n->{memory_used}")"
    [ "$(j "defined($n->{cpu_load}) && $n->{cpu_load} >= 0 && $n->{cpu_load} <= 1 ? 1 : 0")" = 1 ] && ok || bad "node $p cpu_load"
    [ "$(j "$n->{stage_tokens_per_second} > 0 && $n->{ms_per_token} > 0 ? 1 : 0")" = 1 ] && ok ||
        bad "node $p stage tok/s $(j "$n->{stage_tokens_per_second}") ms/tok $(j "$n->{ms_per_token}")"
    [ "$(j "$n->{host_id}")" = "cc-n$( [ $p = "$PA" ] && echo a || echo b)" ] && ok || bad "node $p host_id $(j "$n->{host_id}")"
done
na=$(node_of $PA); nb=$(node_of $PB)
[ "$(j "$na->{power_source}")" = measured ] && [ "$(j "$nb->{power_source}")" = estimated ] && ok ||
    bad "power sources: na $(j "$na->{power_source}"), nb $(j "$nb->{power_source}")"
# na's fake counter: 25 W, read as the average over one heartbeat (CM_PIPE_HB_MS, 500 ms); the
# counter lags the clock by at most a late turn of its loop, so a window reads 25 W give or take
# that lag over 500 ms; the bounds keep it apart from the estimate (65 W here) and from nothing
[ "$(j "$na->{power_watts} > 12 && $na->{power_watts} <= 31 ? 1 : 0")" = 1 ] && ok || bad "na watts $(j "$na->{power_watts}")"
[ "$(j '$j->{power_hosts}')" = 3 ] && [ "$(j '$j->{power_missing}')" = 0 ] && ok || bad "hosts $(j '$j->{power_hosts}') missing $(j '$j->{power_missing}')"
sum=$(j 'my $s = 0; $s += $_->{power_watts} for @{$j->{nodes}}; $s')
[ "$(j 'abs($j->{power_watts} - '"$sum"') < 0.01 ? 1 : 0')" = 1 ] && ok || bad "cluster watts $(j '$j->{power_watts}') vs sum $sum"
[ "$(j '$j->{power_source}')" = "rapl x1, estimate x2" ] && ok || bad "cluster power label '$(j '$j->{power_source}')'"
[ "$(j '$j->{power_watts} > 0 && abs($j->{tokens_per_watt} - $j->{tokens_per_second} / $j->{power_watts}) < 1e-4 ? 1 : 0')" = 1 ] && ok ||
    bad "tokens/W $(j '$j->{tokens_per_watt}') vs $(j '$j->{tokens_per_second}') / $(j '$j->{power_watts}')"
# the planner orders nodes by measured speed: na and nb may hold stage 1 or 2, one each
sa=$(sed -nE 's/^cumulo_cluster_node_power_watts\{node="na",host="cc-na",stage="([12])",source="rapl"\} [0-9.]+$/\1/p' "$TMP/m.txt")
sb=$(sed -nE 's/^cumulo_cluster_node_power_watts\{node="nb",host="cc-nb",stage="([12])",source="estimate"\} [0-9.]+$/\1/p' "$TMP/m.txt")
[ -n "$sa" ] && [ -n "$sb" ] && [ "$sa" != "$sb" ] && ok ||
    bad "metrics per node power: $(grep cluster_node_power "$TMP/m.txt")"
for s in memory_used_bytes cpu_load tokens_per_second ms_per_token; do
    [ "$(grep -cE "^cumulo_cluster_node_${s}\{node=\"n[ab]\",host=\"cc-n[ab]\",stage=\"[12]\"\} [0-9.]+$" "$TMP/m.txt")" = 2 ] && ok ||
        bad "metrics $s: $(grep "cluster_node_$s" "$TMP/m.txt")"
done
grep -Eq '^cumulo_cluster_tokens_per_watt\{hosts="3",source="rapl x1, estimate x2"\} [0-9.]+$' "$TMP/m.txt" && ok ||
    bad "metrics cluster tokens/W: $(grep cluster_tokens_per_watt "$TMP/m.txt")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
