#!/bin/sh
# tests/sh/cluster_ep_recover.sh (issue 13 item 5): losing a member of an
# expert group mid-stream. `cumulo run --parallel ep` on a synthetic
# qwen3moe (8 experts top 2) over this process + two `cumulo node`s on
# 127.0.0.1, 40 ms pause per token (test hook) so the kill lands mid-stream:
#   1. kill -9 of node a: the coordinator re-plans through the one plan
#      change (apply_plan): an expert group of 2, the lost experts re-placed
#      on the survivor, which fetches only the slabs it lacks; the text equals
#      one machine's, and the survivor's second assignment holds more experts;
#   2. kill -9 of node b in the next run (a group of this machine and b): this
#      machine alone holds every expert; the text equals one machine's.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
MOE=$TMP/moe.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$MOE" 2>/dev/null && ok || bad "synth failed"
PROMPT="Once upon a time"
N=40
# equally strong machines: which member takes the lost experts follows the
# speeds, and speeds measured on a busy shared host can give them all to this
# process (rank 0), leaving check 1's survivor with what it had
export CUMULO_DECLARE_SPEED=50,20
"$BIN" run "$MOE" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' <"$TMP/one.json" >"$TMP/want"
[ -s "$TMP/want" ] && ok || bad "single machine run failed"

# run_kill TAG NODES VICTIM_PID: one EP run, VICTIM killed once tokens flow.
run_kill() {
    CUMULO_TEST_CLUSTER_DELAY_MS=40 "$BIN" run "$MOE" -p "$PROMPT" -n $N --temp 0 --threads 1 --nodes "$2" \
        --parallel ep --json >"$TMP/$1.json" 2>"$TMP/$1.log" &
    run=$!
    CC_PIDS="$CC_PIDS $run"
    cc_wait_grep "$TMP/$1.log" 'expert parallel:' 300 || bad "$1: no expert group: $(tail -3 "$TMP/$1.log")"
    # the kill once the members have loaded ('expert parallel:' is the plan;
    # a member lost while it loads is left out at open: cluster_open.sh), then mid-run
    cc_wait_grep "$TMP/$1.log" 'cluster ready' 300 || bad "$1: the cluster did not start: $(tail -3 "$TMP/$1.log")"
    sleep 0.4 # ~10 tokens in
    kill -0 $run 2>/dev/null && ok || bad "$1: the run had ended before the kill"
    kill -9 "$3"
    wait $run
    perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' <"$TMP/$1.json" >"$TMP/$1.got" 2>/dev/null
    cmp -s "$TMP/$1.got" "$TMP/want" && ok || bad "$1: text differs from one machine: $(tail -3 "$TMP/$1.log")"
}

cc_start_node a --no-mdns; PORT_a=$NODE_PORT PID_a=$NODE_PID
cc_start_node b --no-mdns; PORT_b=$NODE_PORT
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && ok || { bad "nodes did not start"; exit 1; }
run_kill kill1 "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" "$PID_a"
grep -q 'expert parallel: 3 members' "$TMP/kill1.log" && ok || bad "kill1: not a group of 3 at first"
grep -q 'recovered: expert group of 2' "$TMP/kill1.log" && ok || bad "kill1: no expert group of 2 after the loss: $(grep -iE 'plan|recover|fail' "$TMP/kill1.log" | tail -3)"
# node b's assignments: its experts before and after the loss
ranges=$(grep 'weight bytes streamed' "$TMP/b.log" | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)), \([0-9]*\) weight bytes.*/\1 \2 \3/p')
set -- $ranges
if [ $# -ge 6 ]; then
    [ $(($5 - $4)) -gt $(($2 - $1)) ] && ok || bad "kill1: node b held [$1, $2), then [$4, $5): no more experts after the loss"
    echo "kill1: node b held experts [$1, $2) ($3 bytes streamed), then [$4, $5) ($6 more bytes: only the slabs it lacked)"
else
    bad "kill1: node b was not assigned twice: $ranges"
fi

cc_start_node c --no-mdns; PORT_c=$NODE_PORT PID_c=$NODE_PID
run_kill kill2 "127.0.0.1:$PORT_c" "$PID_c"
grep -q 'expert parallel: 2 members' "$TMP/kill2.log" && ok || bad "kill2: not a group of 2 at first"
grep -q 'this machine alone now' "$TMP/kill2.log" && grep -q 'recovered' "$TMP/kill2.log" && ok || bad "kill2: no recovery to this machine alone: $(grep -iE 'plan|recover|fail' "$TMP/kill2.log" | tail -3)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
