#!/bin/sh
# cluster_hostile.sh (issue 7): hostile peers against a running cluster.
#  1. Loopback: `cumulo serve` with two `cumulo node`s (3 stages) streams
#     greedy completions while build/tests/test_hostile (tool mode) attacks
#     both nodes: the wrong key, --insecure, junk, oversized/truncated/early
#     frames, a replayed session, a replayed frame, a bad MAC, a garbage
#     payload, ASSIGN from a non-coordinator, FORWARD without an assignment,
#     TRAIN from a non-coordinator (SETUP, a BWD, a FWD of another epoch);
#     and a burst of junk TCP connections. Every attack is refused and logged
#     by the node with the peer's address; the streams are unaffected (texts
#     equal the single-machine run, no loss declared, no re-plan).
#  2. Namespaces (cmchaos-h*): on a bridge, a good node, a rogue node with
#     another cluster key and a spoofed announcement of a port where nothing
#     listens, all announced by mDNS. `serve --nodes auto` uses only the good
#     node and logs why each other one was not used; the rogue logs the
#     refused handshake. Then thousands of mDNS packets per second (junk,
#     fake _cumulo._tcp services, queries) from the rogue's namespace: the
#     good node and the server survive, discovery still finds the good node
#     among the fakes (one source holds few browse entries), and probing the
#     fakes does not hang `cumulo nodes` (handshakes run in parallel).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
HOSTILE=${CUMULO_TESTBIN:-build/tests}/test_hostile
N_TOK=120
need curl python3 perl
[ -x "$HOSTILE" ] || need_skip "needs $HOSTILE (make tests)"
PROMPTS="Once upon a time|The little dog|Lily and Ben|One day"
prompt() { echo "$PROMPTS" | cut -d'|' -f"$1"; }
for i in 1 2 3 4; do
    "$BIN" run "$M" -p "$(prompt $i)" -n $N_TOK --temp 0 --threads 1 --json 2>/dev/null |
        perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{text}' >"$TMP/want$i"
done
sse_text() { perl -MJSON::PP -ne 'next unless s/^data: //; chomp; next if $_ eq "[DONE]"; my $j = decode_json($_);
    print STDERR "error event: $_\n" if $j->{error}; print $j->{choices}[0]{text} // ""' "$1"; }

# ---- 1. attacks on the nodes of a serving cluster (loopback)
CUMULO_LOG=info cc_start_node a --bind 127.0.0.1 --no-mdns --models "$MODELS"; PA=$NODE_PORT
CUMULO_LOG=info cc_start_node b --bind 127.0.0.1 --no-mdns --models "$MODELS"; PB=$NODE_PORT
[ -n "$PA" ] && [ -n "$PB" ] && ok || { bad "nodes did not start"; echo "$pass passed, $fail failed"; exit 1; }
CUMULO_TEST_STEP_DELAY_MS=15 cc_start_serve s "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" \
    --layers 2,2,1 --threads 1 --slots 4 || bad "serve did not start: $(tail -3 "$TMP/s.log")"
CP=""
for r in 1 2 3 4; do
    curl -sN --max-time 120 "http://127.0.0.1:$SERVE_PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"stream":true}' "$(prompt $r)" $N_TOK)" \
        >"$TMP/r$r.sse" &
    CP="$CP $!"
done
cc_wait_grep "$TMP/r1.sse" '^data:' 100
for port in $PA $PB; do
    CM_HOSTILE_ADDR=127.0.0.1:$port "$HOSTILE" >"$TMP/hostile-$port.out" 2>&1
    grep -q '^6 passed, 0 failed' "$TMP/hostile-$port.out" && ok || bad "attacks on :$port: $(tail -5 "$TMP/hostile-$port.out")"
done
# a burst of junk connections: random bytes, some cut off mid-frame
python3 - "$PA" <<'EOF'
import os, socket, struct, sys
port = int(sys.argv[1])
for i in range(300):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    if i % 3 == 0:
        s.sendall(os.urandom(i % 200 + 1))
    elif i % 3 == 1:  # a plausible AUTH_INIT header, then half its payload
        s.sendall(b"CMLO" + struct.pack("<BBHQI", 1, 1, 0, 0, 68) + os.urandom(30))
    s.close()
EOF
for p in $CP; do wait "$p"; done
for r in 1 2 3 4; do
    sse_text "$TMP/r$r.sse" >"$TMP/got$r" 2>"$TMP/err$r"
    cmp -s "$TMP/got$r" "$TMP/want$r" && [ ! -s "$TMP/err$r" ] && ok ||
        bad "stream $r under attack: $(wc -c <"$TMP/got$r") of $(wc -c <"$TMP/want$r") bytes; $(head -c 300 "$TMP/err$r")"
done
grep -qE 'lost|failure|re-plan' "$TMP/s.log" && bad "the attacks disturbed the cluster: $(grep -E 'lost|failure' "$TMP/s.log" | head -2)" || ok
kill -0 "$SERVE_PID" && ok || bad "serve died"
for tag in a b; do
    port=$(cat "$TMP/$tag.port")
    for want in "does not know this cluster's key" "the connecting node runs --insecure" "not a cumulo frame" \
        "exceeds the maximum of 128" "sent a replayed PING frame" "sent a PING frame with a bad MAC" \
        "sent a malformed FORWARD payload" "FORWARD frame of 268435457 bytes exceeds" "which is not a coordinator: ignored" \
        "unexpected EXPERT_LOAD from"; do
        grep "$want" "$TMP/$tag.log" | grep -q '127\.0\.0\.1:[0-9]' && ok || bad "node $tag (:$port) did not log '$want'"
    done
done
cc_stop "$SERVE_PID"

# ---- 2. rogue announcements and an mDNS flood (namespaces)
T=cmchaos-h$$
BR=$T-br; NC=$T-c; NG=$T-g; NR=$T-r
cc_cleanup_hook() { for n in $NC $NG $NR $BR; do ip netns del "$n" 2>/dev/null; done; }
need_netns "$BR" # (or the namespace part is skipped)
ip -n "$BR" link add chbr0 type bridge && ip -n "$BR" link set chbr0 up
i=1
for n in $NC $NG $NR; do
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip link add name eth0 netns "$n" type veth peer name chp$i netns "$BR"
    ip -n "$BR" link set chp$i master chbr0
    ip -n "$BR" link set chp$i up
    ip -n "$n" addr add 10.80.0.$i/24 dev eth0
    ip -n "$n" link set eth0 up
    i=$((i + 1))
done
cc_key "$TMP/rogue.key"
CUMULO_LOG=info CC_NS=$NG cc_start_node good --port 7070 --models "$MODELS"; PG=$NODE_PID
CC_NS=$NR cc_start_node rogue --port 7070 --key-file "$TMP/rogue.key" --models "$MODELS"; PR=$NODE_PID
ip netns exec "$NR" "$BIN" announce --name spoof --port 7999 >"$TMP/spoof.log" 2>&1 &
CC_PIDS="$CC_PIDS $!"
cc_wait_grep "$TMP/spoof.log" '^announced' 80 || bad "spoof announcement: $(cat "$TMP/spoof.log")"
CC_NS=$NC cc_start_serve auto "$M" --host 127.0.0.1 --nodes auto --threads 1
if [ -n "$SERVE_PORT" ]; then
    ok
    grep -q 'good 10\.80\.0\.2:7070' "$TMP/auto.log" && ok || bad "the good node is not in the plan: $(cat "$TMP/auto.log")"
    grep -E '10\.80\.0\.3:7070 .*not used.*does not know this cluster.s key' "$TMP/auto.log" >/dev/null && ok ||
        bad "no clear refusal of the rogue node: $(grep -i '10.80.0.3' "$TMP/auto.log")"
    grep -E '10\.80\.0\.3:7999 .*not used' "$TMP/auto.log" >/dev/null && ok ||
        bad "no clear refusal of the spoofed announcement: $(grep -i '10.80.0.3' "$TMP/auto.log")"
    ip netns exec "$NC" curl -s --max-time 60 "http://127.0.0.1:$SERVE_PORT/v1/completions" -H 'Content-Type: application/json' \
        -d "$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0}' "$(prompt 1)" $N_TOK)" >"$TMP/auto.json"
    [ "$(cc_jsonget "$TMP/auto.json" '$j->{choices}[0]{text}')" = "$(cat "$TMP/want1")" ] && ok ||
        bad "completion through the good node: $(head -c 300 "$TMP/auto.json")"
else
    bad "serve --nodes auto did not start with a rogue on the network: $(tail -4 "$TMP/auto.log")"
fi
grep -q "does not know this cluster's key" "$TMP/rogue.log" && ok || bad "the rogue did not log the refused handshake: $(cat "$TMP/rogue.log")"

# The flood: thousands of packets/s to 224.0.0.251:5353 from the rogue's
# namespace, from when it writes $TMP/flooding until $TMP/stop-flood exists.
ip netns exec "$NR" python3 - "$TMP" <<'EOF' &
import os, random, socket, struct, sys, time
tmp = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5353))  # responses from another source port are ignored (RFC 6762 6.)
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("10.80.0.3"))
s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
def name(*labels):
    return b"".join(bytes([len(l)]) + l for l in labels) + b"\0"
def rr(n, t, data, ttl=120):
    return n + struct.pack(">HHIH", t, 0x8001, ttl, len(data)) + data
svc = name(b"_cumulo", b"_tcp", b"local")
end, i = time.time() + 30, 0
open(tmp + "/flooding", "w").write("flooding\n")
while time.time() < end and not os.path.exists(tmp + "/stop-flood"):
    k = i % 4
    if k == 0:  # junk
        p = os.urandom(random.randint(0, 1400))
    elif k == 1:  # a fake service: PTR, SRV, TXT, A
        inst = name(b"fake%d" % i, b"_cumulo", b"_tcp", b"local")
        host = name(b"h%d" % i, b"local")
        recs = [rr(svc, 12, inst), rr(inst, 33, struct.pack(">HHH", 0, 0, 7000 + i % 1000) + host),
                rr(inst, 16, b"\x03v=1\x05id=%02x" % (i % 256)),
                rr(host, 1, socket.inet_aton("10.80.0.%d" % (10 + i % 200)))]
        p = struct.pack(">HHHHHH", 0, 0x8400, 0, len(recs), 0, 0) + b"".join(recs)
    elif k == 2:  # a query for the service (each would make responders answer)
        p = struct.pack(">HHHHHH", 0, 0, 1, 0, 0, 0) + svc + struct.pack(">HH", 12, 1)
    else:  # a response whose counts lie, and a compression loop
        p = struct.pack(">HHHHHH", 0, 0x8400, 0, 65535, 65535, 65535) + b"\xc0\x0c" * 40
    try:
        s.sendto(p, ("224.0.0.251", 5353))
    except OSError:
        pass
    i += 1
    if i % 50 == 0:
        time.sleep(0.01)
print("sent", i)
EOF
FLOOD=$!
cc_wait_grep "$TMP/flooding" flooding 100 || bad "the flood did not start"
sleep 0.5
# Fake services must not wedge probing: handshakes run in parallel, so
# addresses where nothing answers cost one connect deadline in all.
t0=$(date +%s)
ip netns exec "$NC" timeout 90 "$BIN" nodes --timeout 2 --json >"$TMP/during.json" 2>"$TMP/during.err"
nrc=$?
el=$(($(date +%s) - t0))
touch "$TMP/stop-flood"
wait $FLOOD
n_seen=$(cc_jsonget "$TMP/during.json" 'scalar(@$j)')
echo "mDNS flood: cumulo nodes listed $n_seen services (fakes included) in ${el} s" >&2
[ "${n_seen:-0}" -gt 3 ] && ok || bad "the flood's fake services never reached the browser (the flood tests nothing)"
# (not a timing assertion: one probe after another took minutes; 90 s is a hang)
[ $nrc -ne 124 ] && ok || bad "cumulo nodes hung under the flood (killed after 90 s)"
ip netns exec "$NC" "$BIN" nodes --timeout 2 --json >"$TMP/after.json" 2>"$TMP/after.err"
for f in during after; do
    [ "$(cc_jsonget "$TMP/$f.json" 'scalar(grep { $_->{reachable} && $_->{addr} eq "10.80.0.2:7070" } @$j)')" = 1 ] && ok ||
        bad "$f the flood, discovery did not find the good node: $(head -c 400 "$TMP/$f.json") $(tail -2 "$TMP/$f.err")"
done
kill -0 "$PG" && ok || bad "the good node died in the flood: $(tail -5 "$TMP/good.log")"
[ -z "$SERVE_PORT" ] || { [ "$(ip netns exec "$NC" curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$SERVE_PORT/health")" = 200 ] && ok ||
    bad "serve stopped answering after the flood"; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
