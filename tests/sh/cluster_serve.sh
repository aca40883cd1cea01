#!/bin/sh
# cluster_serve.sh: `cumulo serve --nodes` on a 3-stage pipeline (this
# process + two `cumulo node`s on 127.0.0.1): five concurrent greedy
# completions (four slots batched through the pipeline, one queued) all equal
# the single-machine text. A full context (--ctx 64) as on one machine: a
# prompt over it is a 400 context_length_exceeded, and a completion without
# max_tokens runs to the limit with finish_reason "length" and `run`'s text
# (finish "ctx"). Every process is killed on exit.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl
M=$SHARED/models/stories260K-q8_0.gguf
NODES=""
for i in 1 2; do
    "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/p$i" --no-mdns --threads 1 --cache "$TMP/c$i" >"$TMP/n$i.log" 2>&1 &
    CC_PIDS="$CC_PIDS $!"
    k=0
    while [ ! -s "$TMP/p$i" ] && [ $k -lt 100 ]; do sleep 0.05; k=$((k + 1)); done
    NODES="$NODES${NODES:+,}127.0.0.1:$(cat "$TMP/p$i")"
done
"$BIN" serve "$M" --host 127.0.0.1 --port 0 --nodes "$NODES" --threads 1 --slots 4 --ctx 64 >"$TMP/serve.out" 2>"$TMP/serve.log" &
CC_PIDS="$CC_PIDS $!"
k=0
while ! grep -q 'ready' "$TMP/serve.log" && [ $k -lt 200 ]; do sleep 0.05; k=$((k + 1)); done
grep -q 'ready' "$TMP/serve.log" && ok || { bad "serve did not start: $(tail -3 "$TMP/serve.log")"; echo "$pass passed, $fail failed"; exit 1; }
grep -q 'pp plan, 3 stages' "$TMP/serve.log" && ok || bad "serve did not plan 3 stages"
PORT=$(sed -n 's/.*http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$TMP/serve.log" "$TMP/serve.out" | head -1)
[ -n "$PORT" ] && ok || { bad "no port in the serve log: $(cat "$TMP/serve.log")"; echo "$pass passed, $fail failed"; exit 1; }
want=$("$BIN" run "$M" -p "Once upon a time" -n 40 --temp 0 --threads 1 --json 2>/dev/null |
    perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{text}')
CP=""
for k in 1 2 3 4 5; do
    curl -s --max-time 60 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":40,"temperature":0}' >"$TMP/r$k.json" &
    CP="$CP $!"
done
for p in $CP; do wait "$p"; done
for k in 1 2 3 4 5; do
    got=$(perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{choices}[0]{text}' <"$TMP/r$k.json" 2>/dev/null)
    [ -n "$want" ] && [ "$got" = "$want" ] && ok || bad "request $k: '$got' vs '$want' ($(head -c 200 "$TMP/r$k.json"))"
done
long=$(perl -e 'print "the dog ran and " x 40')
code=$(curl -s --max-time 60 -o "$TMP/long.json" -w '%{http_code}' "http://127.0.0.1:$PORT/v1/completions" \
    -H 'Content-Type: application/json' -d "{\"prompt\":\"$long\"}")
[ "$code" = 400 ] && grep -q context_length_exceeded "$TMP/long.json" && grep -q 'maximum context length is 64' "$TMP/long.json" &&
    ok || bad "a prompt over the context: $code $(head -c 300 "$TMP/long.json")"
"$BIN" run "$M" -p "Once upon a time" --ctx 64 -n 100 --temp 0 --threads 1 --json >"$TMP/full_one.json" 2>/dev/null
want_full=$(perl -MJSON::PP -e 'local $/; my $j = decode_json(<STDIN>); print "$j->{finish_reason}:$j->{text}"' <"$TMP/full_one.json")
curl -s --max-time 60 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt":"Once upon a time","temperature":0}' >"$TMP/full.json"
got_full=$(perl -MJSON::PP -e 'local $/; my $j = decode_json(<STDIN>); my $c = $j->{choices}[0]; print "$c->{finish_reason}:$c->{text}"' <"$TMP/full.json" 2>/dev/null)
case $want_full in ctx:*) ;; *) bad "run did not reach the context: $want_full" ;; esac
[ "length:${want_full#ctx:}" = "$got_full" ] && ok || bad "full context on the cluster: '$got_full' vs run's '$want_full'"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
