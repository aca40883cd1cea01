#!/bin/sh
# cluster_join.sh (issue 7 item 3): nodes that join or come back are used at
# the next idle re-plan, on stories260K, every text compared with one
# machine's at temperature 0 (CUMULO_REJOIN_MS=500 makes the idle interval
# short):
#   tp:   `serve --parallel tp`, this machine + 2 nodes on 127.0.0.1. A
#         member is killed (kill -9) mid-stream: the group shrinks to 2 and
#         the streams complete. The node restarts on its port: the idle
#         scheduler redials it and re-forms the group of 3 (log, and
#         /api/cluster shows three members with slices n/3); texts equal.
#   hybrid: `serve --groups 2,2`, this machine + 3 nodes: a stage-1 member is
#         killed mid-stream, restarts on its port, and the idle scheduler
#         takes it back (4 members in /api/cluster); texts
#         equal.
#   refuse: a pipeline node restarts unable to take a part (no cache
#         directory): the idle re-plan onto it fails, it is left out and the
#         cluster serves on (texts equal) instead of giving up.
#   mdns: network namespaces (names cms3join-*, 10.83.0.0/24): `serve
#         --nodes auto` starts with one node found by mDNS (--layers 2,3, so
#         the node holds 3 layers), then a second node starts, and a node
#         with another cluster key: the coordinator keeps browsing, dials
#         both, leaves the rogue out with a log line, and re-plans onto the
#         good one while idle (declared speeds make a layer cost more than a
#         hop, so 3 stages are predicted faster); /api/cluster shows it; texts
#         equal. Skipped (a skip with its reason) without root / ip netns.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
need curl perl
export CUMULO_REJOIN_MS=500
PHASES=${CUMULO_JOIN_PHASES:-tp hybrid refuse mdns} # a subset by hand: CUMULO_JOIN_PHASES="mdns"
want() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
N_TOK=60
cc_want "$M" $N_TOK 1 3 4
# round HOST PORT TAG: 3 streaming + 1 non-streaming request, checked
round() {
    CP="" CC_HOST=$1 CC_PORT=$2
    for r in 1 2 3 4; do s=true; [ $r = 4 ] && s=false; cc_request "$3" $r $(echo "1 3 4 1" | cut -d' ' -f$r) $s; done
    for p in $CP; do wait "$p"; done
    unset CC_HOST CC_PORT
    for r in 1 2 3 4; do s=true; [ $r = 4 ] && s=false; cc_check "$3" $r $(echo "1 3 4 1" | cut -d' ' -f$r) $s; done
}

# ---- tp. The prompts are those of cluster_recover.sh's tp phase ("The
# little dog" has a near-tie that a TP sum order can flip). Declared speeds
# (1 GFLOP/s, 1 MB/s: the same everywhere, so the slices stay even) make
# compute cost more than the all-reduces in the planner's eyes: on real
# speeds stories260K is all round trips and the planner rightly prefers the
# smaller group (the log then says "not taken").
if want tp; then
export CUMULO_DECLARE_SPEED=1,0.001
cc_start_node ta --bind 127.0.0.1 --no-mdns --models "$MODELS"; A=$NODE_PID; PA=$NODE_PORT
cc_start_node tb --bind 127.0.0.1 --no-mdns --models "$MODELS"; PB=$NODE_PORT
[ -n "$PA" ] && [ -n "$PB" ] || bad "tp: the nodes did not start: $(tail -2 "$TMP/ta.log" "$TMP/tb.log")"
CUMULO_TEST_STEP_DELAY_MS=15 cc_start_serve stp "$M" --host 127.0.0.1 --nodes 127.0.0.1:$PA,127.0.0.1:$PB \
    --parallel tp --threads 1 --slots 4 || bad "tp: serve did not start: $(tail -3 "$TMP/stp.log")"
grep -q 'tensor parallel: 3 members' "$TMP/stp.log" && ok || bad "tp: not a group of 3: $(grep -i 'tensor' "$TMP/stp.log")"
CP=""
for r in 1 2 3; do cc_request tp1 $r $(echo "1 3 4" | cut -d' ' -f$r) true; done
k=0
while [ "$(cat "$TMP"/tp1.r*.out 2>/dev/null | grep -c '^data:')" -lt 15 ] && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
kill -9 $A
for p in $CP; do wait "$p"; done
for r in 1 2 3; do cc_check tp1 $r $(echo "1 3 4" | cut -d' ' -f$r) true; done
cc_wait_grep "$TMP/stp.log" 'recovered: tensor-parallel group of 2' 50 && ok ||
    bad "tp: no group of 2 after the kill: $(grep -i 'plan\|fail\|lost' "$TMP/stp.log" | tail -3)"
# The member restarts on its port: taken back while idle.
cc_start_node ta2 --bind 127.0.0.1 --port "$PA" --no-mdns --models "$MODELS"
[ "$NODE_PORT" = "$PA" ] || bad "tp: the member did not restart on port $PA: $(tail -2 "$TMP/ta2.log")"
cc_wait_grep "$TMP/stp.log" 'now a tensor-parallel group of 3' 100 && ok ||
    bad "tp: the group did not take the member back: $(grep -i 'back\|plan\|fail' "$TMP/stp.log" | tail -3)"
grep 're-plan (' "$TMP/stp.log" | sed 's/^/tp: /' >&2
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/tp.cluster"
n3=$(cc_jsonget "$TMP/tp.cluster" 'scalar grep { $_->{slice} =~ m{^\d/3:} } @{$j->{nodes}}')
[ "$n3" = 3 ] && grep -q "\"id\":\"127.0.0.1:$PA\"" "$TMP/tp.cluster" && ok ||
    bad "tp: /api/cluster does not show the group of 3: $(head -c 600 "$TMP/tp.cluster")"
round 127.0.0.1 "$SERVE_PORT" tp2
cc_stop "$SERVE_PID"
unset CUMULO_DECLARE_SPEED
fi

# ---- hybrid: `serve --groups 2,2` (this machine + 1 node, then 2 nodes as
# stage 1) on 127.0.0.1. A member of stage 1 is killed mid-stream: the plan
# shrinks (the planner's hybrid plan of the survivors); the node restarts on
# its port and the idle scheduler's planner takes it back: 4 members again.
if want hybrid; then
export CUMULO_DECLARE_SPEED=1,0.001
HP=""
for t in ha hb hc; do
    cc_start_node $t --bind 127.0.0.1 --no-mdns --models "$MODELS"
    eval "PID_$t=\$NODE_PID; PORT_$t=\$NODE_PORT"
    HP="$HP${HP:+,}127.0.0.1:$NODE_PORT"
done
CUMULO_TEST_STEP_DELAY_MS=15 cc_start_serve shy "$M" --host 127.0.0.1 --nodes "$HP" --groups 2,2 --threads 1 --slots 4 ||
    bad "hybrid: serve did not start: $(tail -3 "$TMP/shy.log")"
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/hy0.cluster"
VP=$(cc_jsonget "$TMP/hy0.cluster" '(map { $_->{id} =~ /:(\d+)$/ ? $1 : () } grep { $_->{stage} == 1 } @{$j->{nodes}})[0]')
VT=""
for t in ha hb hc; do eval "[ \"\$PORT_$t\" = \"$VP\" ]" && VT=$t; done
[ -n "$VT" ] && ok || bad "hybrid: no stage-1 member in /api/cluster: $(head -c 400 "$TMP/hy0.cluster")"
if [ -n "$VT" ]; then
    CP=""
    for r in 1 2 3; do cc_request hy1 $r $(echo "1 3 4" | cut -d' ' -f$r) true; done
    k=0
    while [ "$(cat "$TMP"/hy1.r*.out 2>/dev/null | grep -c '^data:')" -lt 15 ] && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
    eval "kill -9 \$PID_$VT"
    for p in $CP; do wait "$p"; done
    for r in 1 2 3; do cc_check hy1 $r $(echo "1 3 4" | cut -d' ' -f$r) true; done
    cc_wait_grep "$TMP/shy.log" 'recovered' 50 && ok || bad "hybrid: no recovery: $(grep -i 'plan\|fail\|lost' "$TMP/shy.log" | tail -3)"
    cc_start_node ${VT}2 --bind 127.0.0.1 --port "$VP" --no-mdns --models "$MODELS"
    cc_wait_grep "$TMP/shy.log" 'now [0-9]+ stages \(4 members\)' 100 && ok ||
        bad "hybrid: the plan did not take the member back: $(grep -i 'back\|plan\|fail' "$TMP/shy.log" | tail -3)"
    grep 're-plan (' "$TMP/shy.log" | sed 's/^/hybrid: /' >&2
    curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/hy.cluster"
    [ "$(cc_jsonget "$TMP/hy.cluster" 'scalar @{$j->{nodes}}')" = 4 ] && grep -q "\"id\":\"127.0.0.1:$VP\"" "$TMP/hy.cluster" && ok ||
        bad "hybrid: /api/cluster does not show the 4 members: $(head -c 600 "$TMP/hy.cluster")"
    round 127.0.0.1 "$SERVE_PORT" hy2
fi
cc_stop "$SERVE_PID"
unset CUMULO_DECLARE_SPEED
fi

# ---- refuse: a pipeline (--layers 2,2,1) loses its last stage and recovers
# on the other node; the lost node restarts on its port but cannot take a
# part (its cache directory cannot be made, so no weights can be streamed to
# it): the idle re-plan onto it fails, the coordinator leaves it out
# (instead of recovering with it again and giving up) and serves on.
if want refuse; then
export CUMULO_DECLARE_SPEED=1,0.001
cc_start_node ra --bind 127.0.0.1 --no-mdns; RA=$NODE_PORT
cc_start_node rb --bind 127.0.0.1 --no-mdns; RB=$NODE_PORT; PID_rb=$NODE_PID
cc_start_serve sref "$M" --host 127.0.0.1 --nodes 127.0.0.1:$RA,127.0.0.1:$RB --layers 2,2,1 --threads 1 --slots 4 ||
    bad "refuse: serve did not start: $(tail -3 "$TMP/sref.log")"
kill -9 $PID_rb
round 127.0.0.1 "$SERVE_PORT" rf0 # recovers at its start (an idle pipe waits for a request or a node)
cc_wait_grep "$TMP/sref.log" 'recovered: 2 stages' 100 && ok ||
    bad "refuse: no recovery after the kill: $(grep -i 'plan\|fail\|lost' "$TMP/sref.log" | tail -3)"
cc_start_node rb2 --bind 127.0.0.1 --port "$RB" --no-mdns --cache /dev/null/cache
cc_wait_grep "$TMP/sref.log" "node 127.0.0.1:$RB .* left out: it could not take its part" 100 && ok ||
    bad "refuse: the node that cannot take its part was not left out: $(grep -i 'back\|plan\|fail' "$TMP/sref.log" | tail -4)"
k=0 # a second recovery: without it
while [ "$(grep -c 'recovered: 2 stages' "$TMP/sref.log")" -lt 2 ] && [ $k -lt 100 ]; do sleep 0.1; k=$((k + 1)); done
[ "$(grep -c 'recovered: 2 stages' "$TMP/sref.log")" -ge 2 ] && ok || bad "refuse: no recovery without it"
grep -E 'left out|re-plan \(|recovered|cannot continue' "$TMP/sref.log" | sed 's/^/refuse: /' >&2
round 127.0.0.1 "$SERVE_PORT" rf
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/rf.cluster"
[ "$(cc_jsonget "$TMP/rf.cluster" '$j->{n_stages}')" = 2 ] && ok || bad "refuse: /api/cluster: $(head -c 400 "$TMP/rf.cluster")"
cc_stop "$SERVE_PID"
unset CUMULO_DECLARE_SPEED
fi

# ---- mdns: four namespaces on a bridge (in a fifth, so the host's network
# is untouched): 0 serves, 1 runs a node from the start, 2 a node that
# starts later, 3 a node with another cluster key.
T=cms3join-$$
cc_cleanup_hook() { for n in $T-0 $T-1 $T-2 $T-3 $T-br; do ip netns del "$n" 2>/dev/null; done; }
if want mdns; then
    need python3 # the flood below; the last phase: a skip here ends the script with the counts so far
    need_netns "$T-br"
    ip -n "$T-br" link add cmbr0 type bridge && ip -n "$T-br" link set cmbr0 up || bad "mdns: bridge"
    for i in 0 1 2 3; do
        ip netns add "$T-$i"
        ip -n "$T-$i" link set lo up
        ip link add name eth0 netns "$T-$i" type veth peer name cmp$i netns "$T-br"
        ip -n "$T-br" link set cmp$i master cmbr0
        ip -n "$T-br" link set cmp$i up
        ip -n "$T-$i" addr add 10.83.0.$((i + 1))/24 dev eth0
        ip -n "$T-$i" link set eth0 up
    done
    # Declared speeds: a layer costs ~50 ms in the planner's eyes, so spreading
    # the node's 3 layers over two nodes is predicted faster (as in
    # cluster_recover.sh's stopcont phase).
    export CUMULO_DECLARE_SPEED=1,0.001
    CC_NS=$T-1; cc_start_node ja --port 7070
    [ "$NODE_PORT" = 7070 ] || bad "mdns: node ja did not start: $(tail -2 "$TMP/ja.log")"
    CC_NS=$T-0; cc_start_serve sjoin "$M" --host 127.0.0.1 --nodes auto --layers 2,3 --threads 1 --slots 4 ||
        bad "mdns: serve did not start: $(tail -3 "$TMP/sjoin.log")"
    SP=$SERVE_PORT
    grep -q 'node 10.83.0.2:7070' "$TMP/sjoin.log" && ok || bad "mdns: the first node was not found: $(tail -3 "$TMP/sjoin.log")"
    CC_NS=$T-0; round 127.0.0.1 "$SP" mj1
    cc_key "$TMP/rogue.key"
    KEEP_KEY=$CUMULO_KEY_FILE
    CUMULO_KEY_FILE="$TMP/rogue.key"; CC_NS=$T-3; cc_start_node jrogue --port 7070
    NODE_PID_ROGUE=$NODE_PID
    CUMULO_KEY_FILE=$KEEP_KEY
    CC_NS=$T-2; cc_start_node jb --port 7070
    [ "$NODE_PORT" = 7070 ] || bad "mdns: node jb did not start: $(tail -2 "$TMP/jb.log")"
    cc_wait_grep "$TMP/sjoin.log" "node 10.83.0.3:7070 .* joined \\(found by mDNS\\)" 150 && ok ||
        bad "mdns: the new node did not join: $(grep -i 'mdns\|join\|plan' "$TMP/sjoin.log" | tail -3)"
    cc_wait_grep "$TMP/sjoin.log" 'now 3 stages' 100 && ok ||
        bad "mdns: no re-plan onto the new node: $(grep -i 'plan\|join\|taken' "$TMP/sjoin.log" | tail -3)"
    cc_wait_grep "$TMP/sjoin.log" 'node 10.83.0.4:7070 \(found by mDNS\) not used' 100 && ok ||
        bad "mdns: the rogue node was not refused in the log: $(grep -i 'mdns\|10.83.0.4' "$TMP/sjoin.log" | tail -3)"
    grep -E 'joined|not used|re-plan \(|now [0-9]+ stages' "$TMP/sjoin.log" | sed 's/^/mdns: /' >&2
    ip netns exec "$T-0" curl -s --max-time 10 "http://127.0.0.1:$SP/api/cluster" >"$TMP/mj.cluster"
    [ "$(cc_jsonget "$TMP/mj.cluster" '$j->{n_stages}')" = 3 ] && grep -q '"id":"10.83.0.3:7070"' "$TMP/mj.cluster" &&
        ! grep -q '10.83.0.4' "$TMP/mj.cluster" && ok ||
        bad "mdns: /api/cluster does not show the new plan: $(head -c 600 "$TMP/mj.cluster")"
    CC_NS=$T-0; round 127.0.0.1 "$SP" mj2
    CC_NS=
    # A flood of fake announcements (60 services from each of 6 source
    # addresses, at addresses where nobody answers; the browser keeps 8 per
    # source, so 48 wait at once): the table of waiting addresses stays
    # bounded (the log says how many were ignored), nothing else joins, and
    # the cluster serves on.
    cc_stop "$NODE_PID_ROGUE"
    for a in 50 51 52 53 54 55; do ip -n "$T-3" addr add 10.83.0.$a/24 dev eth0; done
    ip netns exec "$T-3" python3 - <<'EOF_FLOOD'
import socket, struct, time
def name(*labels):
    return b"".join(bytes([len(l)]) + l for l in labels) + b"\0"
def rr(n, t, data, ttl=120):
    return n + struct.pack(">HHIH", t, 0x8001, ttl, len(data)) + data
svc = name(b"_cumulo", b"_tcp", b"local")
socks = []
for a in range(50, 56):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    src = "10.83.0.%d" % a
    s.bind((src, 5353))  # responses from another source port are ignored (RFC 6762 6.)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(src))
    socks.append(s)
for i in range(60):
    for k, s in enumerate(socks):
        n = i * 8 + k
        inst = name(b"fake%d" % n, b"_cumulo", b"_tcp", b"local")
        host = name(b"h%d" % n, b"local")
        recs = [rr(svc, 12, inst), rr(inst, 33, struct.pack(">HHH", 0, 0, 7000 + n) + host),
                rr(inst, 16, b"\x03v=1\x05id=%02x" % (n % 256)), rr(host, 1, socket.inet_aton("10.83.0.%d" % (100 + n % 150)))]
        s.sendto(struct.pack(">HHHHHH", 0, 0x8400, 0, len(recs), 0, 0) + b"".join(recs), ("224.0.0.251", 5353))
    time.sleep(0.01)
EOF_FLOOD
    cc_wait_grep "$TMP/sjoin.log" 'announcement\(s\) of new nodes ignored' 100 && ok ||
        bad "mdns: the flood did not reach the bound: $(grep -c 'not used' "$TMP/sjoin.log") refusals logged"
    echo "mdns flood: $(grep -c '(found by mDNS) not used' "$TMP/sjoin.log") addresses refused; $(grep 'ignored' "$TMP/sjoin.log" | head -1)" >&2
    CC_NS=$T-0; round 127.0.0.1 "$SP" mj3
    CC_NS=
    ip netns exec "$T-0" curl -s --max-time 10 "http://127.0.0.1:$SP/api/cluster" >"$TMP/mj3.cluster"
    [ "$(grep -c 'joined (found by mDNS)' "$TMP/sjoin.log")" = 1 ] && [ "$(cc_jsonget "$TMP/mj3.cluster" '$j->{n_stages}')" = 3 ] &&
        ok || bad "mdns: the plan changed under the flood: $(grep -E 'joined|re-plan' "$TMP/sjoin.log" | tail -3)"
    unset CUMULO_DECLARE_SPEED
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
