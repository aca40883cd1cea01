#!/bin/sh
# cluster_serve_many.sh: `cumulo serve --nodes` on a 3-stage pipeline (this
# process + two `cumulo node`s on 127.0.0.1) answering eight different
# requests at once (different prompts and lengths, greedy and seeded
# sampling on the last stage, a stop string, a JSON grammar sampled here
# from returned logits, logprobs): the decode rows travel as a few
# micro-batches of several sequences each, kept in flight on every stage
# (src/engine/batch_pipe.c). Every answer must equal, byte for byte, what a
# single-process `cumulo serve` gives for that request alone. Run three
# times: the default groups on one host (one micro-batch of every sequence:
# the plan text says so), each process playing a host of its own
# (CUMULO_HOST_ID: one group per stage, three in flight) and
# CUMULO_PIPE_GROUPS=2 (the override). Then three streaming clients leave
# mid-generation and three requests that take their slots still get their
# own text. Every process is killed on exit.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl
M=$SHARED/models/stories260K-q8_0.gguf

serve_port() { # LOG: the port of a serve that logged 'ready'
    k=0
    while ! grep -qs 'ready' "$1" && [ $k -lt 400 ]; do sleep 0.05; k=$((k + 1)); done
    sed -n 's/.*http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$1" | head -1
}

# The requests: file q$k.json (the body) and q$k.path (the route).
q() { echo "$2" >"$TMP/q$1.path"; echo "$3" >"$TMP/q$1.json"; }
q 1 /v1/completions '{"prompt":"Once upon a time","max_tokens":40,"temperature":0}'
q 2 /v1/completions '{"prompt":"The little dog","max_tokens":33,"temperature":0}'
q 3 /v1/completions '{"prompt":"Lily wanted to","max_tokens":27,"temperature":0.8,"seed":7}'
q 4 /v1/completions '{"prompt":"Tom and his mom","max_tokens":37,"temperature":1.0,"top_k":20,"seed":3}'
q 5 /v1/completions '{"prompt":"One day a bird","max_tokens":45,"temperature":0,"stop":["."]}'
q 6 /v1/completions '{"prompt":"Once upon a time there was","max_tokens":21,"temperature":0.7,"seed":11,"logprobs":2}'
q 7 /v1/chat/completions '{"messages":[{"role":"user","content":"a cat"}],"max_tokens":30,"temperature":0,"response_format":{"type":"json_object"}}'
q 8 /v1/completions '{"prompt":"The sun","max_tokens":50,"temperature":0.9,"seed":5,"ignore_eos":true}'
N=8

answer() { # FILE: the fields that must match (text or content, finish reason, token logprobs)
    perl -MJSON::PP -e 'local $/; my $j = eval { decode_json(<STDIN>) } or exit 0; my $c = $j->{choices}[0];
        my $t = defined $c->{text} ? $c->{text} : $c->{message}{content};
        my $lp = $c->{logprobs} ? join(",", map { sprintf("%.4f", $_) } @{$c->{logprobs}{token_logprobs} || []}) : "";
        print "$c->{finish_reason}|$t|$lp"' <"$1" 2>/dev/null
}

# The reference: one process, each request alone.
"$BIN" serve "$M" --host 127.0.0.1 --port 0 --threads 1 --slots 2 --ctx 128 >"$TMP/one.out" 2>"$TMP/one.log" &
CC_PIDS="$CC_PIDS $!"
P1=$(serve_port "$TMP/one.log")
[ -n "$P1" ] && ok || { bad "single-process serve did not start: $(tail -3 "$TMP/one.log")"; echo "$pass passed, $fail failed"; exit 1; }
k=1
while [ $k -le $N ]; do
    curl -s --max-time 60 "http://127.0.0.1:$P1$(cat "$TMP/q$k.path")" -H 'Content-Type: application/json' \
        -d @"$TMP/q$k.json" >"$TMP/want$k.json"
    w=$(answer "$TMP/want$k.json")
    [ -n "$w" ] && ok || bad "reference request $k: $(head -c 300 "$TMP/want$k.json")"
    k=$((k + 1))
done

for groups in 0 h 2; do
    NODES=""
    hid=""
    [ "$groups" = h ] && hid=host-$groups
    for i in 1 2; do
        CUMULO_HOST_ID=${hid:+$hid$i} "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/p$groups$i" --no-mdns --threads 1 --cache "$TMP/c$groups$i" \
            >"$TMP/n$groups$i.log" 2>&1 &
        CC_PIDS="$CC_PIDS $!"
        k=0
        while [ ! -s "$TMP/p$groups$i" ] && [ $k -lt 100 ]; do sleep 0.05; k=$((k + 1)); done
        NODES="$NODES${NODES:+,}127.0.0.1:$(cat "$TMP/p$groups$i")"
    done
    log="$TMP/pipe$groups.log"
    CUMULO_HOST_ID=${hid:+${hid}0} CUMULO_PIPE_GROUPS=${groups#h} "$BIN" serve "$M" --host 127.0.0.1 --port 0 --nodes "$NODES" --threads 1 --slots $N \
        --ctx 128 >"$TMP/pipe$groups.out" 2>"$log" &
    sp=$!
    CC_PIDS="$CC_PIDS $sp"
    P=$(serve_port "$log")
    [ -n "$P" ] && grep -q 'pp plan, 3 stages' "$log" && ok ||
        { bad "groups=$groups: the pipeline serve did not start with 3 stages: $(tail -3 "$log")"; continue; }
    want="serving: 1 micro-batch in flight"
    [ "$groups" = h ] && want="serving: 3 micro-batches in flight (a host per stage)"
    [ "$groups" = 2 ] || { grep -q "$want" "$log" && ok || bad "groups=$groups: no '$want' in $(cat "$log")"; }
    CP=""
    k=1
    while [ $k -le $N ]; do
        curl -s --max-time 120 "http://127.0.0.1:$P$(cat "$TMP/q$k.path")" -H 'Content-Type: application/json' \
            -d @"$TMP/q$k.json" >"$TMP/got$groups.$k.json" &
        CP="$CP $!"
        k=$((k + 1))
    done
    for p in $CP; do wait "$p"; done
    k=1
    while [ $k -le $N ]; do
        w=$(answer "$TMP/want$k.json")
        g=$(answer "$TMP/got$groups.$k.json")
        [ -n "$w" ] && [ "$g" = "$w" ] && ok ||
            bad "groups=$groups request $k: '$g' vs alone '$w' ($(head -c 200 "$TMP/got$groups.$k.json"))"
        k=$((k + 1))
    done
    if [ "$groups" = 0 ]; then
        # Clients that leave while their rows are in flight: their slots end (the answers on the way
        # collected and dropped), and requests that take those slots next still get their own text.
        CP=""
        for c in 1 2 3; do
            curl -s -N --max-time 120 "http://127.0.0.1:$P/v1/completions" -H 'Content-Type: application/json' \
                -d '{"prompt":"The end of","max_tokens":120,"temperature":0,"ignore_eos":true,"stream":true}' \
                >"$TMP/gone$c.out" &
            CP="$CP $!"
        done
        k=0
        while [ "$(cat "$TMP"/gone*.out 2>/dev/null | grep -c '^data:')" -lt 6 ] && [ $k -lt 400 ]; do
            sleep 0.05
            k=$((k + 1))
        done
        for p in $CP; do kill "$p" 2>/dev/null; done
        CP=""
        for k in 2 5 6; do
            curl -s --max-time 120 "http://127.0.0.1:$P$(cat "$TMP/q$k.path")" -H 'Content-Type: application/json' \
                -d @"$TMP/q$k.json" >"$TMP/after$k.json" &
            CP="$CP $!"
        done
        for p in $CP; do wait "$p"; done
        for k in 2 5 6; do
            w=$(answer "$TMP/want$k.json")
            g=$(answer "$TMP/after$k.json")
            [ -n "$w" ] && [ "$g" = "$w" ] && ok ||
                bad "after canceled streams, request $k: '$g' vs alone '$w' ($(head -c 200 "$TMP/after$k.json"))"
        done
    fi
    kill "$sp" 2>/dev/null
    wait "$sp" 2>/dev/null
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
