#!/bin/sh
# cluster_deadline.sh (issue 7): no network wait outlasts the loss bound
# (CM_PIPE_LOST_MS = 2 s) by much, and a connection flood cannot starve a
# node. stories260K on 127.0.0.1 (ports chosen by the nodes: --port 0); every
# text is compared with the single-machine greedy text.
#   stop1: 3-stage pipeline (this process + 2 nodes, --layers 2,2,1) with
#          socket buffers shrunk to 4 kB (CUMULO_TEST_SOCKBUF), 8 long
#          prompts; SIGSTOP of stage 1 during their prefill: the coordinator's
#          sends to it block on full buffers. The loss must be declared and the pipeline
#          recovered within 10 s (bound 2 s; before this test's fix the send
#          waited the 60 s data deadline with every heartbeat stuck behind it);
#          every request completes with the undisturbed text.
#   stop2: the same with the last stage frozen: stage 1's send to it blocks.
#   tp:    `serve --parallel tp` (this process + 2 nodes), SIGSTOP of a member
#          mid-decode: the all-reduce waiting on it gives up within the bound
#          (it waited 60 s), the group is re-formed, texts equal.
#   flood: 300 idle or junk TCP connections from 127.0.0.2 held against a node
#          while a 3-stage `serve` (connecting from 127.0.0.1) starts on it and
#          answers 4 requests: texts equal, the node logs its refusals naming
#          127.0.0.2, and its thread count stays bounded (it was one thread per
#          connection).
# Durations are printed; the only time checks are generous (10 s).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
need curl python3 perl
export CUMULO_LOG=info
LONG="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree. She ran to the ball and kicked it very high. The ball flew over the fence and into the garden of an old man. Lily was scared, but she went to the door and knocked. The old man opened the door and smiled at her. He gave her the ball and a cookie. Lily said thank you and ran back to her friends. They played all day until the sun went down."
N_TOK=60
CC_REQ_TIME=60
cc_want "$M" $N_TOK 1 2 3 4 long

# since_ms T0 FILE REGEX TENTHS: ms from T0 (date +%s%N) until FILE matches (empty if never)
since_ms() {
    cc_wait_grep "$2" "$3" "$4" || return 0
    echo $(( ($(date +%s%N) - $1) / 1000000 ))
}

# ---- stop1 / stop2: a frozen pipeline stage behind full socket buffers
pp_phase() { # TAG WHICH(1|2)
    ph=$1
    export CUMULO_TEST_SOCKBUF=4096
    cc_start_node "${ph}a" --bind 127.0.0.1 --no-mdns; PA=$NODE_PORT; A=$NODE_PID
    cc_start_node "${ph}b" --bind 127.0.0.1 --no-mdns; PB=$NODE_PORT; B=$NODE_PID
    export CUMULO_TEST_CLUSTER_DELAY_MS=60
    cc_start_serve "s$ph" "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --threads 1 --slots 8
    src=$?
    unset CUMULO_TEST_SOCKBUF CUMULO_TEST_CLUSTER_DELAY_MS
    if [ $src -ne 0 ]; then bad "$ph: serve did not start: $(tail -3 "$TMP/s$ph.log")"; return; fi
    # The planner orders the nodes by the measured links: find who runs stage 1 and 2.
    S1=$(awk '$3 == "1" && $2 ~ /^127\.0\.0\.1:/ {print $2; exit}' "$TMP/s$ph.log")
    if [ "$S1" = "127.0.0.1:$PA" ]; then P1=$A L1="$TMP/${ph}a.log" P2=$B; else P1=$B L1="$TMP/${ph}b.log" P2=$A; fi
    if [ "$2" = 1 ]; then V=$P1; VLOG="$TMP/s$ph.log"; else V=$P2; VLOG=$L1; fi
    # 8 long prompts (~270 kB of prefill, 64 tokens a micro-batch with a
    # 60 ms pause), then the freeze while they are prefilled: the sender
    # toward the frozen stage fills the 4 kB buffers and blocks.
    CP=""
    for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_request "$ph" $r long $s; done
    cc_wait_grep "$TMP/$ph.r1.out" 'data:' 100
    t0=$(date +%s%N)
    kill -STOP "$V"
    (since_ms "$t0" "$TMP/s$ph.log" 'lost: silent|failure:.*took none of our data' 300 >"$TMP/$ph.lost") &
    W1=$!
    (since_ms "$t0" "$TMP/s$ph.log" 'recovered' 300 >"$TMP/$ph.rec") &
    W2=$!
    wait $W1 $W2
    lost=$(cat "$TMP/$ph.lost") rec=$(cat "$TMP/$ph.rec")
    echo "$ph: SIGSTOP of stage $2 declared lost after ${lost:-never} ms, recovered after ${rec:-never} ms" >&2
    [ -n "$lost" ] && [ "$lost" -lt 10000 ] && ok || bad "$ph: loss not declared within 10 s ($(grep -i 'lost\|fail' "$TMP/s$ph.log" | head -2))"
    [ -n "$rec" ] && [ "$rec" -lt 10000 ] && ok || bad "$ph: no recovery within 10 s ($(grep -i 'plan\|fail' "$TMP/s$ph.log" | tail -2))"
    # The freeze did catch a send with full buffers: the sender says so.
    # (Asserted for stage 1, whose sender is the coordinator itself; a node's
    # send to a frozen last stage blocks in most runs, but not all: printed.)
    # Since nodes send heartbeats from their ASSIGN on, the silence check
    # (2 s after the freeze) often ends the blocked send before its own
    # stall bound (2 s after it blocked) fires: either way the loss is
    # declared within the bound, which the checks above assert. The stall
    # path itself is test_net's test_send_stall; here it is only reported.
    if grep -q 'took none of our data\|did not take our data' "$VLOG"; then :
    else echo "$ph: the send stall bound did not fire this time (silence came first)" >&2; fi
    echo "$ph: $(grep -m1 'took none of our data\|did not take our data' "$VLOG" | sed 's/.*peer/peer/')" >&2
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_check "$ph" $r long $s; done
    cc_stop "$SERVE_PID"; cc_stop "$A"; cc_stop "$B"
}
pp_phase stop1 1
pp_phase stop2 2

# ---- tp: a frozen member of a tensor-parallel group. "The little dog" is
# left out: TP sums in another order and flips a near-tie there (see
# cluster_recover.sh).
cc_start_node tpa --bind 127.0.0.1 --no-mdns --models "$MODELS"; PA=$NODE_PORT; A=$NODE_PID
cc_start_node tpb --bind 127.0.0.1 --no-mdns --models "$MODELS"; PB=$NODE_PORT; B=$NODE_PID
export CUMULO_TEST_STEP_DELAY_MS=15
cc_start_serve stp "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --parallel tp --threads 1 --slots 8
src=$?
unset CUMULO_TEST_STEP_DELAY_MS
if [ $src -eq 0 ]; then
    grep -q 'tensor parallel: 3 members' "$TMP/stp.log" && ok || bad "tp: not a group of 3: $(grep -i tensor "$TMP/stp.log")"
    tpp() { echo "1 3 4" | cut -d' ' -f$(( ($1 - 1) % 3 + 1 )); }
    CP=""
    for r in 1 2 3 4 5 6; do s=true; [ $r -gt 4 ] && s=false; cc_request tp $r "$(tpp $r)" $s; done
    k=0
    while [ $k -lt 200 ]; do
        n=0
        for r in 1 2 3 4; do [ "$(grep -c '^data:' "$TMP/tp.r$r.out" 2>/dev/null)" -ge 5 ] && n=$((n + 1)); done
        [ $n -eq 4 ] && break
        sleep 0.05; k=$((k + 1))
    done
    t0=$(date +%s%N)
    kill -STOP "$A"
    rec=$(since_ms "$t0" "$TMP/stp.log" 'recovered: tensor-parallel group of 2' 300)
    lost=$(since_ms "$t0" "$TMP/stp.log" 'lost' 10)
    echo "tp: SIGSTOP of a member: recovered after ${rec:-never} ms (loss logged after ${lost:-never} ms): $(grep -m1 'failure:' "$TMP/stp.log")" >&2
    [ -n "$rec" ] && [ "$rec" -lt 10000 ] && ok || bad "tp: no recovery within 10 s: $(grep -i 'plan\|fail' "$TMP/stp.log" | tail -3)"
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4 5 6; do s=true; [ $r -gt 4 ] && s=false; cc_check tp $r "$(tpp $r)" $s; done
    # The healthy member kept answering while its all-reduce waited: it is in the new group.
    grep -q 'lost.*tpb\|tpb.*lost' "$TMP/stp.log" && bad "tp: the healthy member was declared lost: $(grep lost "$TMP/stp.log")" || ok
else
    bad "tp: serve did not start: $(tail -3 "$TMP/stp.log")"
fi
cc_stop "$SERVE_PID"; cc_stop "$A"; cc_stop "$B"

# ---- flood: hundreds of idle / junk connections from 127.0.0.2
cc_start_node fla --bind 127.0.0.1 --no-mdns; PA=$NODE_PORT; A=$NODE_PID
cc_start_node flb --bind 127.0.0.1 --no-mdns; PB=$NODE_PORT
cat >"$TMP/flood.py" <<'EOF'
import os, select, socket, sys, time
port, tmp = int(sys.argv[1]), sys.argv[2]
socks, opened, closed = [], 0, 0
end = time.time() + 120
while time.time() < end and not os.path.exists(tmp + "/stop-flood"):
    new = 0
    while len(socks) < 300 and new < 40:  # keep 300 open, at most 800 new a second
        s = socket.socket()
        s.setblocking(False)
        try:
            s.bind(("127.0.0.2", 0))
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            break
        socks.append(s)
        opened += 1
        new += 1
        if opened % 3 == 0:  # junk on a third of them, silence on the rest
            try: s.send(b"\x16\x03\x01junk-not-cumulo" if opened % 2 else os.urandom(40))
            except OSError: pass
    if opened >= 300 and not os.path.exists(tmp + "/flooding"):
        open(tmp + "/flooding", "w").write("flooding\n")
    r, _, _ = select.select(socks, [], [], 0.05)
    for s in r:
        try: gone = s.recv(4096) == b""
        except BlockingIOError: gone = False
        except OSError: gone = True
        if gone:
            socks.remove(s); s.close(); closed += 1
open(tmp + "/flood.stats", "w").write("%d %d\n" % (opened, closed))
EOF
python3 "$TMP/flood.py" "$PA" "$TMP" &
FLOOD=$!
CC_PIDS="$CC_PIDS $FLOOD"
cc_wait_grep "$TMP/flooding" flooding 100 && ok || bad "flood: the flood did not start"
thr() { awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null; }
maxthr=0
sample() { t=$(thr "$A"); [ -n "$t" ] && [ "$t" -gt "$maxthr" ] && maxthr=$t; }
sample
export CUMULO_TEST_STEP_DELAY_MS=15
cc_start_serve sfl "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --threads 1 --slots 4
src=$?
unset CUMULO_TEST_STEP_DELAY_MS
if [ $src -eq 0 ]; then
    ok
    CP=""
    for r in 1 2 3 4; do s=true; [ $r -gt 2 ] && s=false; cc_request fl $r $r $s; done
    for k in 1 2 3 4 5 6 7 8 9 10; do sample; sleep 0.2; done
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4; do s=true; [ $r -gt 2 ] && s=false; cc_check fl $r $r $s; done
    grep -q 'why: layers split by --layers 2,2,1' "$TMP/sfl.log" && ok || bad "flood: serve did not plan 3 stages on the flooded node"
else
    bad "flood: serve could not start against the flooded node: $(tail -3 "$TMP/sfl.log")"
fi
sample
touch "$TMP/stop-flood"
wait "$FLOOD"
nref=$(grep -c 'refused connection from 127\.0\.0\.2' "$TMP/fla.log")
echo "flood: $(cat "$TMP/flood.stats" 2>/dev/null | awk '{print $1 " connections opened, " $2 " closed by the node"}'); node threads at most $maxthr; $nref refusal lines logged, e.g. $(grep -m1 'refused connection from' "$TMP/fla.log" | sed 's/.*refused/refused/')" >&2
[ "$nref" -ge 1 ] && ok || bad "flood: the node logged no refusal naming 127.0.0.2: $(tail -3 "$TMP/fla.log")"
# 64 connection threads at most, plus main, heartbeat and compute threads.
[ "$maxthr" -gt 0 ] && [ "$maxthr" -le 80 ] && ok || bad "flood: the node ran $maxthr threads"
kill -0 "$A" && ok || bad "flood: the node died"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
