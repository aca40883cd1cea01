#!/bin/sh
# chaos_moe.sh (issue 13 item 5, issue 7's checker): a mixture-of-experts
# model under faults. `cumulo serve --parallel ep` on a synthetic qwen3moe
# (8 experts top 2, Q8_0) over this machine + two `cumulo node`s on
# 127.0.0.1 (an expert group of 3: each member holds a third of every MoE
# layer's experts). Per scenario a fresh cluster serves concurrent curl
# clients (streaming and not, temperature 0) in three waves: before, during
# and after one fault on expert member A, injected once the first stream has
# produced tokens:
#   none   no fault (the control)
#   kill   kill -9 of A: the coordinator re-plans the group on the survivors
#          (A's experts re-placed) and resumes the requests in flight
#   stop   SIGSTOP of A past the loss bound (A is cut off: alive but silent),
#          then SIGCONT: A is dropped and the group re-planned without it
#   killtp kill -9 of A in `--parallel tp` over a synthetic DeepSeek-V3-style
#          deepseek2 (MLA heads split over the group, its experts an expert
#          group): the survivors re-form a group of 2 with new head slices
# tests/sh/lib/chaos_check.py checks every request's history with
# --require-ok all: every request of every wave, also those in flight when A
# died, ends in success with the undisturbed single-machine text (no lost,
# repeated or changed token), and /health answered throughout.
# Loopback only (no namespaces, no root needed).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl python3 perl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
N_TOK=48; LOST_MS=1000; TOKEN_MS=5000; WAVE1=4; WAVE2=2; WAVE3=2
SCENARIOS=${CUMULO_CHAOS_SCENARIOS:-none kill stop killtp}
mkdir -p "$TMP/ref" "$TMP/ref_ds"
M=$TMP/moe.gguf
DS=$TMP/ds.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$M" 2>/dev/null && ok || bad "synth failed"
"$BIN" synth --arch deepseek2 --variant v3 --dim 256 --layers 3 --heads 4 --ffn 768 --expert-ffn 256 --experts 16 \
    --experts-used 4 --type q8_0 --seed 4003 --vocab "$VOCAB" -o "$DS" 2>/dev/null && ok || bad "synth deepseek2 failed"

PROMPTS="Once upon a time|The little dog|Lily and Ben|One day"
prompt() { echo "$PROMPTS" | cut -d'|' -f"$1"; }
for i in 1 2 3 4; do
    for r in "$M ref" "$DS ref_ds"; do
        set -- $r
        "$BIN" run "$1" -p "$(prompt $i)" -n $N_TOK --temp 0 --threads 1 --json 2>/dev/null |
            perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' >"$TMP/$2/want$i"
        [ -s "$TMP/$2/want$i" ] || bad "no reference text for prompt $i ($2)"
    done
done

# req ID PROMPT STREAM: one request, recorded as chaos_check.py reads it.
req() {
    id=$1 pi=$2 st=$3
    if [ "$st" = 1 ]; then s=true; else s=false; fi
    body=$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"stream":%s}' "$(prompt "$pi")" $N_TOK $s)
    echo "$id" >>"$D/launched"
    t0=$(date +%s.%N)
    curl -sN --max-time 120 -o "$D/$id.body" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" \
        "http://127.0.0.1:$PORT/v1/completions" >"$D/$id.code" 2>/dev/null
    rc=$?
    echo "$id $pi $st $t0 $(date +%s.%N) $(cat "$D/$id.code" 2>/dev/null || echo 000) $rc" >>"$D/history"
}
# killtp: TP sums in another order than one machine, so a greedy near-tie may
# pick differently under some split (docs/DESIGN.md): prompt 3's 48th token
# does with a group of 2 (measured, no fault needed); 1, 2 and 4 agree under
# the group of 3 and both groups of 2, so that scenario uses only those.
wave() { # wave TAG N: N requests in the background, prompts round robin, every third not streamed
    for r in $(seq 1 "$2"); do
        st=1; [ $((r % 3)) = 0 ] && st=0
        pi=$(( (r - 1) % 4 + 1 ))
        [ "$name" = killtp ] && [ $pi = 3 ] && pi=4
        req "$1-$r" $pi $st &
        WPIDS="$WPIDS $!"
    done
}
wait_wave() { for p in $WPIDS; do wait "$p"; done; WPIDS=""; }
health_loop() {
    while [ ! -f "$D/stop-health" ]; do
        echo "$(date +%s.%N) $(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$PORT/health")" >>"$D/health"
        sleep 0.25
    done
}

run_scenario() {
    name=$1
    D=$TMP/$name
    mkdir -p "$D"
    : >"$D/launched"
    CUMULO_LOG=info cc_start_node "$name-a" --no-mdns; PA=$NODE_PID; PORT_a=$NODE_PORT
    CUMULO_LOG=info cc_start_node "$name-b" --no-mdns; PB=$NODE_PID; PORT_b=$NODE_PORT
    model=$M mode=ep ref=$TMP/ref
    [ "$name" = killtp ] && model=$DS mode=tp ref=$TMP/ref_ds
    CUMULO_LOST_MS=$LOST_MS CUMULO_TOKEN_TIMEOUT_MS=$TOKEN_MS CUMULO_TEST_STEP_DELAY_MS=15 cc_start_serve "$name-s" "$model" \
        --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel $mode --threads 1 --slots 8
    PS=$SERVE_PID PORT=$SERVE_PORT
    if [ -z "$PORT" ] || ! grep -q 'expert parallel: 3 members' "$TMP/$name-s.log"; then
        bad "$name: no expert group of 3: $(tail -3 "$TMP/$name-s.log")"
        cc_stop "$PS"; cc_stop "$PA"; cc_stop "$PB"
        return
    fi
    health_loop &
    HP=$!
    WPIDS=""
    wave w1 $WAVE1
    k=0 # mid-stream: the first streamed request has produced some tokens
    while [ "$(cat "$D/w1-1.body" 2>/dev/null | grep -c '^data:')" -lt 10 ] && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
    [ $k -lt 200 ] || bad "$name: the first stream produced no tokens"
    echo "$name: fault after $(cat "$D/w1-1.body" | grep -c '^data:') streamed chunks of the first request" >&2
    ts=$(date +%s%N)
    case $name in
        none) wave w2 $WAVE2 ;;
        kill | killtp) kill -9 "$PA"; wave w2 $WAVE2 ;;
        stop) kill -STOP "$PA"; wave w2 $WAVE2; sleep "$(awk "BEGIN { print $LOST_MS / 1000 + 2 }")"; kill -CONT "$PA" ;;
    esac
    wait_wave
    wave w3 $WAVE3
    wait_wave
    el=$(( ($(date +%s%N) - ts) / 1000000 ))
    touch "$D/stop-health"
    wait $HP
    kill -0 "$PS" 2>/dev/null || echo "999 000" >>"$D/health" # the server died
    out=$(python3 tests/sh/lib/chaos_check.py "$D" "$ref" --require-ok all 2>&1)
    crc=$?
    summary=$(echo "$out" | tail -1)
    recov=$(grep -c 'recovered:' "$TMP/$name-s.log")
    echo "chaos_moe $name: $summary; ${el} ms; recoveries $recov: $(grep -m1 -o 'recovered: [^;]*' "$TMP/$name-s.log")" >&2
    [ $crc -eq 0 ] && ok || { bad "chaos_moe $name"; echo "$out" | grep VIOLATION | head -8 >&2; }
    # the fault was seen and survived: a re-plan to a group of 2 that then served
    if [ "$name" != none ]; then
        grep -q 'recovered: expert group of 2' "$TMP/$name-s.log" && ok ||
            bad "$name: no expert group of 2 after the fault: $(grep -iE 'plan|recover|lost|fail' "$TMP/$name-s.log" | tail -3)"
    fi
    kill -CONT "$PA" 2>/dev/null
    kill -9 "$PS" "$PA" "$PB" 2>/dev/null
    wait "$PS" "$PA" "$PB" 2>/dev/null
}

for s in $SCENARIOS; do run_scenario "$s"; done
# the check can fail: the control's history against a reference with one
# character changed must show violations
if [ -f "$TMP/none/history" ]; then
    mkdir -p "$TMP/ref_bad" && cp "$TMP"/ref/want* "$TMP/ref_bad/"
    perl -0pi -e 's/^(.)/$1 eq "x" ? "y" : "x"/e' "$TMP/ref_bad/want1"
    out=$(python3 tests/sh/lib/chaos_check.py "$TMP/none" "$TMP/ref_bad" --require-ok all 2>&1 | tail -1)
    echo "$out" | grep -Eq 'violations [1-9]' && ok || bad "chaos_check passed a wrong reference: $out"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
