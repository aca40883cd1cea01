#!/bin/sh
# cluster_failover.sh (issue 7): `cumulo serve --nodes` on a 3-stage pipeline
# (this process + two `cumulo node`s on 127.0.0.1, --layers 2,2,1) streams 8
# concurrent greedy completions; mid-stream the middle stage is
#   phase 1: killed (kill -9),
#   phase 2: frozen (SIGSTOP), on a fresh cluster.
# Every streamed text (the concatenation of its SSE chunks) must equal the
# single-machine text exactly: nothing lost, nothing repeated. Phase 2 also
# checks the loss was declared within the bound (CM_PIPE_LOST_MS = 2 s, plus
# scheduling slack). Every process is killed on exit.
# CUMULO_TEST_NO_RECOVER=1 in the environment disables recovery (to see this
# test fail: the streams end with an explicit error event instead).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
M=$MODELS/stories260K-q8_0.gguf
N_TOK=150
need curl perl
cc_want "$M" $N_TOK 1 2 3 4

start_node() { # $1: tag; sets NODE_PID, NODE_ADDR
    cc_start_node "$1" --bind 127.0.0.1 --no-mdns
    NODE_ADDR="127.0.0.1:$NODE_PORT"
}

# phase TAG SIGNAL: a fresh cluster, 8 streams, SIGNAL to the middle stage.
phase() {
    tag=$1 sig=$2
    start_node "${tag}a"; MID=$NODE_PID; A1=$NODE_ADDR
    start_node "${tag}b"; A2=$NODE_ADDR; LAST=$NODE_PID
    CUMULO_TEST_STEP_DELAY_MS=15 "$BIN" serve "$M" --host 127.0.0.1 --port 0 --nodes "$A1,$A2" --layers 2,2,1 \
        --threads 1 --slots 8 >"$TMP/s$tag.out" 2>"$TMP/s$tag.log" &
    SRV=$!
    CC_PIDS="$CC_PIDS $SRV"
    k=0
    while ! grep -q 'ready' "$TMP/s$tag.log" && [ $k -lt 300 ]; do sleep 0.05; k=$((k + 1)); done
    if ! grep -q 'ready' "$TMP/s$tag.log"; then bad "$tag: serve did not start: $(tail -3 "$TMP/s$tag.log")"; return; fi
    grep -q 'why: layers split by --layers 2,2,1' "$TMP/s$tag.log" && ok || bad "$tag: serve did not plan 3 stages"
    PORT=$(sed -n 's/.*http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/s$tag.log" "$TMP/s$tag.out" | head -1)
    CP=""
    for r in 1 2 3 4 5 6 7 8; do
        body=$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"stream":true}' "$(cc_prompt $r)" $N_TOK)
        curl -sN --max-time 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "$body" >"$TMP/$tag.r$r.sse" &
        CP="$CP $!"
    done
    # Mid-stream: every request has streamed something.
    k=0
    while [ $k -lt 200 ]; do
        n=0
        for r in 1 2 3 4 5 6 7 8; do [ "$(grep -c '^data:' "$TMP/$tag.r$r.sse" 2>/dev/null)" -ge 5 ] && n=$((n + 1)); done
        [ $n -eq 8 ] && break
        sleep 0.05; k=$((k + 1))
    done
    t0=$(date +%s%N)
    kill -"$sig" "$MID"
    if [ "$sig" = STOP ]; then
        # Detection bound: CM_PIPE_LOST_MS (2 s) of silence, checked every
        # 100 ms; 1 s of slack for a loaded machine.
        k=0
        while ! grep -q 'lost: silent' "$TMP/s$tag.log" && [ $k -lt 200 ]; do sleep 0.02; k=$((k + 1)); done
        el=$(( ($(date +%s%N) - t0) / 1000000 ))
        grep -q 'lost: silent' "$TMP/s$tag.log" && [ $el -le 3000 ] && ok ||
            bad "$tag: SIGSTOP declared lost after ${el} ms ($(grep lost "$TMP/s$tag.log" | head -1))"
        echo "$tag: SIGSTOP declared lost after ${el} ms" >&2
    fi
    for p in $CP; do wait "$p"; done
    for r in 1 2 3 4 5 6 7 8; do
        i=$(( (r - 1) % 4 + 1 ))
        perl -MJSON::PP -ne 'next unless s/^data: //; chomp; next if $_ eq "[DONE]"; my $j = decode_json($_);
            print STDERR "error event: $_\n" if $j->{error}; print $j->{choices}[0]{text} // ""' \
            <"$TMP/$tag.r$r.sse" >"$TMP/$tag.got$r" 2>"$TMP/$tag.err$r"
        if cmp -s "$TMP/$tag.got$r" "$TMP/want$i" && [ ! -s "$TMP/$tag.err$r" ]; then ok; else
            bad "$tag request $r: streamed $(wc -c <"$TMP/$tag.got$r") bytes vs $(wc -c <"$TMP/want$i") wanted;" \
                "$(head -c 200 "$TMP/$tag.err$r") $(tail -c 300 "$TMP/$tag.r$r.sse")"
        fi
    done
    grep -q 'recovered' "$TMP/s$tag.log" && ok || bad "$tag: no recovery in the log: $(grep -i 'lost\|fail' "$TMP/s$tag.log" | head -3)"
    el=$(( ($(date +%s%N) - t0) / 1000000 ))
    echo "$tag: 8 streams done ${el} ms after SIG$sig" >&2
    if [ "$sig" = KILL ]; then
        # The last survivor goes too: the model no longer fits anywhere but
        # here (which keeps only its layers). In-flight streams end with an
        # explicit error event, new requests get 503 with the reason.
        CP=""
        for r in 1 2; do
            body=$(printf '{"prompt":"%s","max_tokens":%d,"temperature":0,"stream":true}' "$(cc_prompt $r)" $N_TOK)
            curl -sN --max-time 60 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
                -d "$body" >"$TMP/gone.r$r.sse" &
            CP="$CP $!"
        done
        k=0
        while [ "$(grep -c '^data:' "$TMP/gone.r2.sse" 2>/dev/null)" -lt 5 ] && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
        kill -9 "$LAST"
        for p in $CP; do wait "$p"; done
        for r in 1 2; do
            grep -q '"error".*no node is left' "$TMP/gone.r$r.sse" && ok ||
                bad "gone: stream $r has no explicit error: $(tail -c 300 "$TMP/gone.r$r.sse")"
        done
        code=$(curl -s -o "$TMP/gone.json" -w '%{http_code}' --max-time 30 "http://127.0.0.1:$PORT/v1/completions" \
            -H 'Content-Type: application/json' -d '{"prompt":"Hi","max_tokens":4,"temperature":0}')
        [ "$code" = 503 ] && grep -q 'no node is left' "$TMP/gone.json" && ok ||
            bad "gone: a new request got $code: $(head -c 300 "$TMP/gone.json")"
    fi
    kill -9 $SRV 2>/dev/null
}
phase kill KILL
phase stop STOP
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
