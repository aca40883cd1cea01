#!/bin/sh
# cluster_recover.sh (issue 7): recovery beyond cluster_failover.sh, on
# stories260K split over this process + two `cumulo node`s on 127.0.0.1
# (--layers 2,2,1; each node on a free port of its own choosing, --port 0,
# so that two checkouts can run this test at once; a node that comes back
# does so on the port it had), all greedy, every text compared with
# the single-machine text (SSE streams token by token: the concatenation of
# their chunks, and no chunk after an error):
#   nofit:    the nodes offer little memory (CUMULO_MEM_OFFER), so after a
#             kill -9 the survivor cannot hold the rest: in-flight streams end
#             with an explicit error event, a new request gets 503 with the
#             planner's reason; the node restarts on its port and the idle
#             scheduler takes it back (cm_pipe_maintain): requests succeed.
#   stopcont: SIGSTOP of the middle stage while 6 streaming + 2 non-streaming
#             requests run: declared lost within the bound, all complete;
#             then SIGCONT: the stale node drops its old-epoch stage, is
#             redialled and used again (in /api/cluster), texts still equal.
#   prefill:  kill -9 of the middle stage while 8 long prompts are prefilled.
#   cli:      kill -9 of the middle stage during `cumulo run --cluster`.
#   tp:       kill -9 of a tensor-parallel member, then of the other one.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
need curl perl
export CUMULO_REJOIN_MS=500

LONG="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball under a tree. She ran to the ball and kicked it very high. The ball flew over the fence and into the garden of an old man. Lily was scared, but she went to the door and knocked. The old man opened the door and smiled at her. He gave her the ball and a cookie. Lily said thank you and ran back to her friends. They played all day until the sun went down. When she got home, her mom asked her about her day. Lily told her about the ball, the old man and the cookie. Her mom was happy and gave her a big hug. The next day, Lily went back to the garden with a flower for the old man. He was very happy and they became good friends."
N_TOK=100
LONG_TOK=40 cc_want "$M" $N_TOK 1 2 3 4 long

# start_node TAG [PORT] [node options...]: a node on 127.0.0.1 (a free port, or
# PORT: a node coming back on its port), log $TMP/TAG.log (appended); sets
# NODE_PID and NODE_PORT.
start_node() {
    t=$1 p=${2:-0}
    shift
    [ $# -gt 0 ] && shift
    CUMULO_LOG=info CC_LOG_APPEND=1 cc_start_node "$t" --bind 127.0.0.1 --port "$p" --no-mdns "$@"
    [ -n "$NODE_PORT" ] || bad "node $t did not start: $(tail -3 "$TMP/$t.log")"
}
start_serve() { # $1 tag, $2 slots, $3 nodes; extra env from the caller; sets SRV, SERVE_PORT
    cc_start_serve "s$1" "$M" --host 127.0.0.1 --nodes "$3" --layers 2,2,1 --threads 1 --slots "$2" ||
        bad "$1: serve did not start: $(tail -3 "$TMP/s$1.log")"
    SRV=$SERVE_PID
}
wait_streams() { # TAG N MIN: until requests 1..N have streamed MIN chunks
    k=0
    while [ $k -lt 200 ]; do
        n=0 r=1
        while [ $r -le "$2" ]; do
            [ "$(grep -c '^data:' "$TMP/$1.r$r.out" 2>/dev/null)" -ge "$3" ] && n=$((n + 1)); r=$((r + 1))
        done
        [ $n -eq "$2" ] && return 0
        sleep 0.05; k=$((k + 1))
    done
    return 1
}
wait_log() { # FILE REGEX TENTHS
    k=0
    while ! grep -q "$2" "$1" && [ $k -lt "$3" ]; do sleep 0.1; k=$((k + 1)); done
    grep -q "$2" "$1"
}

# ---- nofit: 256 MiB reserve + 1.5 MiB: a node holds 2 layers of KV (4 slots
# x 512 positions) but not the 3 layers + head the survivor would need.
export CUMULO_MEM_OFFER=270008320
start_node nofa; A=$NODE_PID; PA=$NODE_PORT
start_node nofb; PB=$NODE_PORT
unset CUMULO_MEM_OFFER
export CUMULO_TEST_STEP_DELAY_MS=15
start_serve nofit 4 "127.0.0.1:$PA,127.0.0.1:$PB"
unset CUMULO_TEST_STEP_DELAY_MS
CP=""
for r in 1 2 3 4; do cc_request nofit $r $r true $N_TOK; done
wait_streams nofit 4 5 || bad "nofit: the streams did not start"
kill -9 $A
for p in $CP; do wait "$p"; done
for r in 1 2 3 4; do
    grep -q '"error".*no longer fits' "$TMP/nofit.r$r.out" && ok ||
        bad "nofit: stream $r has no explicit error: $(tail -c 300 "$TMP/nofit.r$r.out")"
done
code=$(curl -s -o "$TMP/nofit.503" -w '%{http_code}' --max-time 30 "http://127.0.0.1:$SERVE_PORT/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt":"Hi","max_tokens":4,"temperature":0}')
[ "$code" = 503 ] && grep -q 'no longer fits' "$TMP/nofit.503" && ok ||
    bad "nofit: a new request got $code: $(head -c 300 "$TMP/nofit.503")"
echo "nofit: $(head -c 300 "$TMP/nofit.503")" >&2
# The node comes back on its port: the idle scheduler takes it back.
sleep 0.5
CUMULO_MEM_OFFER=270008320 start_node nofa "$PA"
wait_log "$TMP/snofit.log" 'is back' 100 && wait_log "$TMP/snofit.log" 'recovered' 100 && ok ||
    bad "nofit: the returning node was not taken back: $(grep -i 'back\|plan\|fail' "$TMP/snofit.log" | tail -3)"
CP=""
for r in 1 2 3 4; do s=true; [ $r -gt 2 ] && s=false; cc_request nofit2 $r $r $s $N_TOK; done
for p in $CP; do wait "$p"; done
for r in 1 2 3 4; do s=true; [ $r -gt 2 ] && s=false; cc_check nofit2 $r $r $s; done
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/nofit.cluster"
grep -q "\"id\":\"127.0.0.1:$PA\"" "$TMP/nofit.cluster" && ok || bad "nofit: /api/cluster lacks the node: $(head -c 400 "$TMP/nofit.cluster")"
kill -9 $SRV 2>/dev/null

# ---- stopcont. Declared speeds (1 GFLOP/s, 1 MB/s) make a layer cost ~50 ms
# in the planner's eyes, far above a loopback hop, so the plan that uses the
# returning node is predicted faster (on real speeds stories260K is all hops
# and the planner rightly keeps 2 stages: that case is the nofit phase's).
export CUMULO_DECLARE_SPEED=1,0.001
start_node stopa; A=$NODE_PID; PA=$NODE_PORT
start_node stopb; PB=$NODE_PORT
export CUMULO_TEST_STEP_DELAY_MS=15
start_serve stop 8 "127.0.0.1:$PA,127.0.0.1:$PB"
unset CUMULO_DECLARE_SPEED CUMULO_TEST_STEP_DELAY_MS
CP=""
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_request stop $r $(( (r - 1) % 4 + 1 )) $s $N_TOK; done
wait_streams stop 6 5 || bad "stop: the streams did not start"
t0=$(date +%s%N)
kill -STOP $A
k=0
while ! grep -q 'lost: silent' "$TMP/sstop.log" && [ $k -lt 200 ]; do sleep 0.02; k=$((k + 1)); done
el=$(( ($(date +%s%N) - t0) / 1000000 ))
# Bound: CM_PIPE_LOST_MS (2 s) of silence, checked every 100 ms; 1 s of slack.
grep -q 'lost: silent' "$TMP/sstop.log" && [ $el -le 3000 ] && ok || bad "stop: SIGSTOP declared lost after ${el} ms"
echo "stopcont: SIGSTOP declared lost after ${el} ms" >&2
for p in $CP; do wait "$p"; done
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_check stop $r $(( (r - 1) % 4 + 1 )) $s; done
kill -CONT $A
wait_log "$TMP/stopa.log" 'coordinator left: dropping stage' 50 && ok ||
    bad "stop: the stale node kept its stage: $(tail -3 "$TMP/stopa.log")"
wait_log "$TMP/sstop.log" 'now 3 stages' 100 && ok ||
    bad "stop: the node was not used again: $(grep -i 'back\|plan\|taken' "$TMP/sstop.log" | tail -3)"
curl -s --max-time 10 "http://127.0.0.1:$SERVE_PORT/api/cluster" >"$TMP/stop.cluster"
grep -q "\"id\":\"127.0.0.1:$PA\"" "$TMP/stop.cluster" && ok || bad "stop: /api/cluster lacks the node: $(head -c 400 "$TMP/stop.cluster")"
grep 're-plan' "$TMP/sstop.log" | sed 's/^/stopcont: /' >&2
CP=""
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_request stop2 $r $(( (r - 1) % 4 + 1 )) $s $N_TOK; done
for p in $CP; do wait "$p"; done
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_check stop2 $r $(( (r - 1) % 4 + 1 )) $s; done
echo "stopcont: old-epoch frames dropped by the last stage: $(grep -c 'dropped' "$TMP/stopb.log")" >&2
kill -9 $SRV 2>/dev/null

# ---- prefill: each 64-token prompt chunk pauses 40 ms (test hook), so the
# 8 prompts of ~200 tokens take ~2 s to prefill; the middle stage dies in it.
start_node prea; A=$NODE_PID; PA=$NODE_PORT
start_node preb; PB=$NODE_PORT
export CUMULO_TEST_CLUSTER_DELAY_MS=40
start_serve pre 8 "127.0.0.1:$PA,127.0.0.1:$PB"
unset CUMULO_TEST_CLUSTER_DELAY_MS
CP=""
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_request pre $r long $s 40; done
sleep 0.6
started=0
for r in 1 2 3 4 5 6; do [ "$(grep -c '^data:' "$TMP/pre.r$r.out" 2>/dev/null)" -ge 1 ] && started=$((started + 1)); done
kill -9 $A
for p in $CP; do wait "$p"; done
for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_check pre $r long $s; done
[ $started -lt 6 ] && ok || bad "prefill: every stream had output before the kill (not during prefill)"
grep -q 'recovered' "$TMP/spre.log" && ok || bad "prefill: no recovery in the log"
echo "prefill: $started of 6 streams had output at the kill" >&2
kill -9 $SRV 2>/dev/null

# ---- cli: `cumulo run --cluster`, 20 ms pause per token (test hook)
start_node clia; A=$NODE_PID; PA=$NODE_PORT
start_node clib; PB=$NODE_PORT
CUMULO_TEST_CLUSTER_DELAY_MS=20 "$BIN" run "$M" -p "$(cc_prompt 1)" -n $N_TOK --temp 0 --threads 1 \
    --nodes "127.0.0.1:$PA,127.0.0.1:$PB" --layers 2,2,1 --json >"$TMP/cli.json" 2>"$TMP/cli.log" &
RUN=$!
sleep 0.1
# the kill after 'cluster ready' (the stages loaded; 'why:' is the plan; a
# node lost while its stage loads is left out at open: cluster_open.sh), then mid-run: 20 ms a
# token makes 100 tokens last 2 s at least (at 5 ms the margin was 0.3 s);
# said, not assumed:
wait_log "$TMP/cli.log" 'cluster ready' 300 || bad "cli: the cluster did not start: $(tail -3 "$TMP/cli.log")"
sleep 0.2
kill -0 $RUN 2>/dev/null && ok || bad "cli: the run had ended before the kill"
kill -9 $A
wait $RUN
perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{text}' <"$TMP/cli.json" >"$TMP/cli.got" 2>/dev/null
cmp -s "$TMP/cli.got" "$TMP/want1" && ok || bad "cli: text differs: $(tail -3 "$TMP/cli.log")"
grep -q 'recovered' "$TMP/cli.log" && ok || bad "cli: no recovery: $(tail -3 "$TMP/cli.log")"

# ---- tp: `serve --parallel tp`, a group of this machine + 2 nodes (they
# map the model from --models: NEEDSWORK, TP members that stream their
# weights compute wrong sums, see the report of this branch). A member is
# killed mid-stream: the group is re-formed with the survivor (new slices);
# then the survivor is killed too: this machine computes every slice alone.
# Texts equal one machine's. TP sums in another order than one machine, so a
# near-tie can flip a greedy choice whatever the recovery: "The little dog"
# does with every split tried (1,1 1,10 10,1 1,3 3,1 1,1,1 1,2,3 3,2,1 1,5,5
# by --tp-weights), the three other prompts agree with all of them for 100
# tokens; only those three are used here.
start_node tpa 0 --models "$SHARED/models"; A=$NODE_PID; PA=$NODE_PORT
start_node tpb 0 --models "$SHARED/models"; B2=$NODE_PID; PB=$NODE_PORT
CUMULO_TEST_STEP_DELAY_MS=15 cc_start_serve stp "$M" --host 127.0.0.1 --nodes "127.0.0.1:$PA,127.0.0.1:$PB" \
    --parallel tp --threads 1 --slots 8 || bad "tp: serve did not start: $(tail -3 "$TMP/stp.log")"
SRV=$SERVE_PID
grep -q 'tensor parallel: 3 members' "$TMP/stp.log" && ok || bad "tp: not a group of 3: $(grep -i 'tensor' "$TMP/stp.log")"
tpp() { echo "1 3 4" | cut -d' ' -f$(( ($1 - 1) % 3 + 1 )); }
for round in 1 2; do
    CP=""
    for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_request tp$round $r $(tpp $r) $s $N_TOK; done
    wait_streams tp$round 6 5 || bad "tp: the streams did not start"
    if [ $round = 1 ]; then kill -9 $A; else kill -9 $B2; fi
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4 5 6 7 8; do s=true; [ $r -gt 6 ] && s=false; cc_check tp$round $r $(tpp $r) $s; done
done
grep -q 'recovered: tensor-parallel group of 2' "$TMP/stp.log" && ok || bad "tp: no re-formed group of 2: $(grep -i 'plan\|fail' "$TMP/stp.log" | tail -3)"
grep -q 'this machine alone now' "$TMP/stp.log" && ok || bad "tp: no fallback to this machine: $(grep -i 'plan\|fail' "$TMP/stp.log" | tail -3)"
kill -9 $SRV 2>/dev/null

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
