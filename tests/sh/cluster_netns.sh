#!/bin/sh
# cluster_netns.sh: a pipeline across network namespaces. Four namespaces on
# a bridge (itself in a fifth namespace, so the host's network is untouched):
# three run `cumulo node`, one the coordinator, which finds the nodes by mDNS
# alone (--nodes auto, no static peers). One node's link is rate-limited with
# tc tbf (8 mbit both ways). Every machine declares the same speed
# (CUMULO_DECLARE_SPEED), so only the links tell them apart. `cumulo nodes`
# must show the node to node links (each node measures the others), the slow
# ones slower. On a 24-layer `cumulo synth` model the plan must put the
# slow-linked node last and give it strictly fewer layers than the fast node
# whose hops are both fast; the test first checks from the printed plan (hop
# costs, output head, per-layer time) that the cost model demands it (the
# slow node's hops cost at least one layer more), so the check cannot pass or
# fail by luck. Greedy output must equal a single machine's, on stories260K
# and on the synth model. Needs root, ip netns and tc; names start with
# $CM_NETNS_PREFIX (default cmtest) and everything is removed on exit.
cd "$(dirname "$0")/../.." || exit 1
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
M=$(realpath "$SHARED/models")
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
T=${CM_NETNS_PREFIX:-cmtest}-cl$$
BR=$T-br; N0=$T-0; N1=$T-1; N2=$T-2; N3=$T-3
TMP=$(mktemp -d /tmp/cmtest-cluster.XXXXXX)
chmod 755 "$TMP"
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    for n in $N0 $N1 $N2 $N3 $BR; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

. tests/sh/lib/need.sh
need tc perl
need_netns "$BR"
jsonget() {
    perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or exit 2; my $j = decode_json(<$f>); print eval $ARGV[1]' "$1" "$2"
}
ip -n "$BR" link add cmbr0 type bridge && ip -n "$BR" link set cmbr0 up || bad "bridge"
i=0
for n in $N0 $N1 $N2 $N3; do
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip link add name eth0 netns "$n" type veth peer name cmp$i netns "$BR"
    ip -n "$BR" link set cmp$i master cmbr0
    ip -n "$BR" link set cmp$i up
    ip -n "$n" addr add 10.78.0.$((i + 1))/24 dev eth0
    ip -n "$n" link set eth0 up
    i=$((i + 1))
done
# node 3's link is slow both ways: its own egress and the bridge port toward it
tc -n "$N3" qdisc add dev eth0 root tbf rate 8mbit burst 32kbit latency 400ms || bad "tc on $N3"
tc -n "$BR" qdisc add dev cmp3 root tbf rate 8mbit burst 32kbit latency 400ms || bad "tc on the bridge port"

export CUMULO_KEY_FILE="$TMP/cluster.key"
# equally strong machines: 20 GFLOP/s, 4 GB/s each (one layer of the synth
# model, 0.85 MB of F32 weights, then costs 0.21 ms; a 512-byte hidden state
# over 8 mbit about 0.5 ms)
export CUMULO_DECLARE_SPEED=20,4
"$BIN" key >/dev/null 2>&1
"$BIN" synth --arch llama --dim 128 --layers 24 --heads 4 --kv-heads 4 --ffn 384 --type f32 \
    --vocab "$M/stories260K-q8_0.gguf" --seed 7 -o "$TMP/deep24.gguf" >/dev/null 2>&1 || bad "cannot write the synth model"
mkdir -p "$TMP/models" && ln -s "$M/stories260K-q8_0.gguf" "$TMP/models/" && ln -s "$TMP/deep24.gguf" "$TMP/models/"
for k in 1 2 3; do
    eval ns=\$N$k
    # each namespace plays a machine of its own (issue 19: nodes of one host share its cores in the plan)
    CUMULO_HOST_ID=$ns ip netns exec "$ns" "$BIN" node --name fast$k --port 7070 --models "$TMP/models" --cache "$TMP/cache$k" --threads 1 \
        >"$TMP/node$k.log" 2>&1 &
    PIDS="$PIDS $!"
    # one at a time: each measures its speed at start, which two cores shared
    # by three nodes would distort
    j=0
    while ! grep -q listening "$TMP/node$k.log" && [ $j -lt 100 ]; do sleep 0.1; j=$((j + 1)); done
done
sleep 1

# cumulo nodes, from the coordinator's namespace: mDNS only
ip netns exec "$N0" "$BIN" nodes --timeout 3 --json >"$TMP/nodes.json" 2>"$TMP/nodes.err"
[ "$(jsonget "$TMP/nodes.json" 'scalar(grep { $_->{reachable} && $_->{mdns} } @$j)')" = 3 ] && ok ||
    bad "cumulo nodes found $(jsonget "$TMP/nodes.json" 'scalar(@$j)') nodes: $(cat "$TMP/nodes.json" "$TMP/nodes.err")"
slow_bw=$(jsonget "$TMP/nodes.json" 'join ",", map { int($_->{mbytes_per_s} * 1000) } grep { $_->{addr} =~ /^10\.78\.0\.4:/ } @$j')
fast_bw=$(jsonget "$TMP/nodes.json" 'join ",", map { int($_->{mbytes_per_s} * 1000) } grep { $_->{addr} =~ /^10\.78\.0\.2:/ } @$j')
[ -n "$slow_bw" ] && [ -n "$fast_bw" ] && [ "$slow_bw" -lt "$fast_bw" ] && ok || bad "slow link not measured slower ($slow_bw vs $fast_bw kB/s)"
# node to node: every node measured the two others; links into and out of
# 10.78.0.4 are slower than the fast nodes' link to each other
ip netns exec "$N0" "$BIN" nodes --timeout 3 >"$TMP/nodes.txt" 2>&1
echo "cumulo nodes (mDNS, measured from the coordinator's namespace):" >&2
cat "$TMP/nodes.txt" >&2
nl=$(jsonget "$TMP/nodes.json" 'scalar(map { grep { $_->{measured} } @{$_->{links} || []} } @$j)')
[ "$nl" = 6 ] && ok || bad "node to node links measured: $nl of 6"
lk() { jsonget "$TMP/nodes.json" "$(printf 'join "", map { int($_->{mbytes_per_s} * 1000) } grep { $_->{to} =~ /^10\\.78\\.0\\.%s:/ } map { @{$_->{links} || []} } grep { $_->{addr} =~ /^10\\.78\\.0\\.%s:/ } @$j' "$2" "$1")"; }
f23=$(lk 2 3); f24=$(lk 2 4); f42=$(lk 4 2); f32=$(lk 3 2)
[ -n "$f24" ] && [ -n "$f23" ] && [ "$f24" -lt "$f23" ] && [ -n "$f42" ] && [ -n "$f32" ] && [ "$f42" -lt "$f32" ] && ok ||
    bad "node to node: .2->.4 $f24 vs .2->.3 $f23, .4->.2 $f42 vs .3->.2 $f32 kB/s"

for model in stories260K-q8_0 deep24; do
    ip netns exec "$N0" "$BIN" run "$TMP/models/$model.gguf" -p "Once upon a time" -n 32 --temp 0 --ignore-eos --threads 1 \
        --json >"$TMP/local.json" 2>/dev/null
    want=$(jsonget "$TMP/local.json" 'join(",", @{$j->{tokens}})')
    if ip netns exec "$N0" "$BIN" run "$TMP/models/$model.gguf" --cluster --nodes auto -p "Once upon a time" -n 32 --temp 0 \
        --ignore-eos --threads 1 --json >"$TMP/cl.json" 2>"$TMP/cl.err"; then
        [ "$(jsonget "$TMP/cl.json" 'join(",", @{$j->{tokens}})')" = "$want" ] && ok || bad "$model: cluster ids differ"
    else
        bad "$model: cluster run failed: $(tail -3 "$TMP/cl.err")"
        continue
    fi
    echo "$model plan (cumulo run --cluster):" >&2
    sed -n '/^node  *stage/,/^why:/p;/^links (row/,/^$/p' "$TMP/cl.err" | sed -n '1,20p' >&2
    # layers per machine from the plan table: the slow-linked node (10.78.0.4)
    # gets fewer than the busiest fast machine
    layers=$(perl -ne 'if (/(10\.78\.0\.\d|\(here\))\S*\s+\d+\s+(\d+)-(\d+)\s/) { print "$1=", $3 - $2 + 1, " " }' "$TMP/cl.err")
    slow=$(echo "$layers" | tr ' ' '\n' | grep '^10.78.0.4=' | cut -d= -f2)
    maxfast=$(echo "$layers" | tr ' ' '\n' | grep -vE '^10.78.0.4=' | grep = | cut -d= -f2 | sort -n | tail -1)
    echo "$model layers: $layers" >&2
    if [ -z "$slow" ] || { [ -n "$maxfast" ] && [ "$slow" -lt "$maxfast" ]; }; then ok
    else bad "$model: the slow-linked node has $slow layers, the busiest fast one $maxfast"; fi
    # it comes last in the pipeline (only token ids leave it)
    last=$(perl -ne 'print "$1\n" if /^\S+ (\d+\.\d+\.\d+\.\d+):\d+\s+\d+\s+\d+-\d+.*head/' "$TMP/cl.err")
    [ -z "$slow" ] || [ "$last" = 10.78.0.4 ] && ok || bad "$model: the slow-linked node is not the last stage ($last)"
    [ "$model" = deep24 ] || continue
    # the plan was made on a fully measured matrix (nodes measured each other)
    matrix=$(sed -n '/^links (row/,/^$/p' "$TMP/cl.err")
    [ "$(printf '%s\n' "$matrix" | grep -c '10\.78\.0\.')" -ge 4 ] && ! printf '%s\n' "$matrix" | grep -qE 'not measured|unreachable' && ok ||
        bad "$model: the plan's link matrix is incomplete: $matrix"
    # The real check, from the cost model as printed: the planner balances
    # each stage's time (its layers + the hops it receives and sends + the
    # output head on the last) and fills stages in order up to that bound.
    # If the slow node's hops and head cost at least one layer more than the
    # hops of a fast node on fast links only (and all layers cost the same:
    # equal declared speeds), it must get strictly fewer layers.
    verdict=$(perl -e '
        my (%st, %n, %ms, @hop, $head);
        while (<>) {
            if (/^(?:\S+ )?(10\.78\.0\.\d+|\(here\))\S*\s+(\d+)\s+(\d+)-(\d+)\s+\S+\s+\S+\s+\S+\s+\S+\s+([\d.]+)/) {
                $st{$1} = $2; $n{$1} = $4 - $3 + 1; $ms{$1} = $5;
            }
            if (/^hops \(ms per token\):(.*); output head ([\d.]+)/) {
                $head = $2; my $h = $1;
                while ($h =~ /(\d+)->\d+ ([\d.]+)/g) { $hop[$1] = $2; }
            }
        }
        my $G = scalar @hop; my $s = "10.78.0.4";
        exit 3 unless $G && defined $st{$s} && defined $head;
        my $cost = sub { my $k = $st{$_[0]}; $hop[$k] + $hop[$k ? $k - 1 : $G - 1] + ($k == $G - 1 ? $head : 0) };
        my ($f) = sort { $cost->($a) <=> $cost->($b) || $a cmp $b } grep { defined $st{$_} } ("10.78.0.2", "10.78.0.3");
        my $L = $ms{$f} / $n{$f}; my $D = $cost->($s) - $cost->($f);
        printf "slow %s: stage %d, %d layers, hops+head %.3f ms; fast %s: stage %d, %d layers, hops %.3f ms; one layer %.3f ms; difference %.2f layers; %s %s\n",
            $s, $st{$s}, $n{$s}, $cost->($s), $f, $st{$f}, $n{$f}, $cost->($f), $L, $D / $L, $D >= $L ? "demanded" : "not-demanded",
            $n{$s} < $n{$f} ? "fewer" : "not-fewer";
    ' "$TMP/cl.err")
    echo "$model: $verdict" >&2
    case "$verdict" in
    *" demanded fewer") ok ;;
    *" not-demanded "*) bad "$model: the setup does not make the slow link cost a layer ($verdict)" ;;
    *) bad "$model: the slow-linked node does not get fewer layers than the fast one ($verdict)" ;;
    esac
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
