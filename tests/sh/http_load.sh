#!/bin/sh
# tests/sh/http_load.sh: many users at once on stories260K-q8_0.
#  - 16 concurrent streaming clients (greedy and seeded sampling, different
#    lengths) batched together: each output equals the same request run alone;
#  - a continuing conversation reuses the slot's KV cache (metrics);
#  - queue full: extra requests get 503 + Retry-After at once, later ones 200;
#  - a client that disconnects (streaming or not) frees its slot and stops its
#    generation (seen through /metrics);
#  - slowloris: stalled headers, headers trickling a byte at a time and a
#    trickling body are all cut off (idle timeout, header deadline, body
#    deadline) while other clients are served.
# CUMULO_TEST_STEP_DELAY_MS (a test hook of the scheduler) slows generation so
# that requests stay in flight long enough to observe.
. "$(dirname "$0")/lib/http_common.sh"
need curl node

# ---- 16 concurrent streams == 16 single runs ----
start_server many --slots 16 --queue 16 || { bad "server"; finish; exit 1; }
body() { # i stream?
    i=$1
    case $((i % 4)) in
        0) p="Once upon a time" ;; 1) p="The little dog" ;; 2) p="Lily and Ben" ;; *) p="One day, a bird" ;;
    esac
    if [ $((i % 2)) -eq 0 ]; then samp='"temperature":0'; else samp="\"temperature\":0.9,\"seed\":$i"; fi
    if [ $((i % 3)) -eq 0 ]; then
        printf '{"messages":[{"role":"user","content":"%s"}],"max_tokens":%d,%s,"stream":true}' "$p" $((20 + 5 * i)) "$samp"
    else
        printf '{"prompt":"%s","max_tokens":%d,%s,"stream":true}' "$p" $((20 + 5 * i)) "$samp"
    fi
}
route() { if [ $(($1 % 3)) -eq 0 ]; then echo /v1/chat/completions; else echo /v1/completions; fi; }
i=0
while [ $i -lt 16 ]; do
    curl -s -N "$URL$(route $i)" -d "$(body $i)" >"$TMP/single$i"
    i=$((i + 1))
done
i=0
pids=""
while [ $i -lt 16 ]; do
    curl -s -N --max-time 120 "$URL$(route $i)" -d "$(body $i)" >"$TMP/conc$i" &
    pids="$pids $!"
    i=$((i + 1))
done
for p in $pids; do wait "$p"; done
i=0
same=0
while [ $i -lt 16 ]; do
    a=$(sse_text "$TMP/single$i") || bad "single $i did not complete"
    b=$(sse_text "$TMP/conc$i") || bad "concurrent $i did not complete"
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=$((same + 1)); else bad "stream $i: alone '$a' vs together '$b'"; fi
    i=$((i + 1))
done
check "16 concurrent streams identical to single runs ($same/16)" [ $same -eq 16 ]
check "all slots free afterwards" [ "$(metric cumulo_slots_active)" = 0 ]

# ---- prefix reuse: a continuing conversation ----
c0=$(metric cumulo_prompt_tokens_cached_total)
T1='{"role":"user","content":"Tell me a story about a frog who wanted to fly over the big blue pond."}'
curl -s "$URL/v1/chat/completions" -d "{\"messages\":[$T1],\"max_tokens\":16,\"temperature\":0}" >"$TMP/turn1"
a1=$(js 'JSON.stringify(j.choices[0].message.content)' "$TMP/turn1")
n1=$(js 'j.usage.prompt_tokens' "$TMP/turn1")
curl -s "$URL/v1/chat/completions" -d "{\"messages\":[$T1,{\"role\":\"assistant\",\"content\":$a1},{\"role\":\"user\",\"content\":\"And then?\"}],\"max_tokens\":16,\"temperature\":0}" >"$TMP/turn2"
c1=$(metric cumulo_prompt_tokens_cached_total)
check "second turn reuses the first turn's KV cache ($c0 -> $c1, first prompt $n1 tokens)" [ $((c1 - c0)) -ge "$n1" ]
stop_server "$PID"

# ---- queue full -> 503 quickly; disconnects free slots ----
CUMULO_TEST_STEP_DELAY_MS=20 start_server q --slots 1 --queue 1 || bad "server q"
LONG='{"prompt":"Once upon a time","max_tokens":150,"temperature":0,"stream":true}'
curl -s -N "$URL/v1/completions" -d "$LONG" >"$TMP/q1" &
q1=$!
curl -s -N "$URL/v1/completions" -d "$LONG" >"$TMP/q2" &
q2=$!
i=0
while [ "$(metric cumulo_queue_depth)" != 1 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
check "one running, one queued" [ "$(metric cumulo_slots_active)/$(metric cumulo_queue_depth)" = 1/1 ]
st=$(curl -s -o "$TMP/b503" -D "$TMP/h503" -w '%{http_code}' --max-time 5 "$URL/v1/completions" -d '{"prompt":"x","max_tokens":5}')
check "queue full: 503 ($st)" [ "$st" = 503 ]
check "503 has Retry-After" grep -qi '^Retry-After: ' "$TMP/h503"
check "503 is an error object" [ "$(js 'j.error.code' "$TMP/b503")" = queue_full ]
st=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"stream":true}')
check "queue full: streaming request 503 too ($st)" [ "$st" = 503 ]
wait $q1 $q2
t1=$(sse_text "$TMP/q1") || bad "running stream did not complete"
t2=$(sse_text "$TMP/q2") || bad "queued stream did not complete"
check "the running and the queued request both complete, same text" [ "${t1:-x}" = "${t2:-y}" ]
check "after the queue drains: 200" [ "$(status "$URL/v1/completions" -d '{"prompt":"x","max_tokens":3}')" = 200 ]

# A streaming client that goes away: its slot frees and generation stops.
g0=$(metric cumulo_generated_tokens_total)
curl -s -N --max-time 0.6 "$URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":400,"temperature":0,"stream":true}' >/dev/null
i=0
while [ "$(metric cumulo_slots_active)" != 0 ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
check "disconnected stream freed its slot" [ "$(metric cumulo_slots_active)" = 0 ]
sleep 0.3
g1=$(metric cumulo_generated_tokens_total)
check "and stopped generating ($((g1 - g0)) of 400 tokens)" [ $((g1 - g0)) -lt 200 ]
# The same for a non-streaming client.
curl -s --max-time 0.6 "$URL/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":400,"temperature":0}' >/dev/null
i=0
while [ "$(metric cumulo_slots_active)" != 0 ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
check "disconnected non-streaming client freed its slot" [ "$(metric cumulo_slots_active)" = 0 ]
# A queued client that goes away never takes a slot.
curl -s -N "$URL/v1/completions" -d "$LONG" >/dev/null &
q3=$!
sleep 0.2
curl -s -N --max-time 0.3 "$URL/v1/completions" -d "$LONG" >/dev/null
wait $q3
check "nothing left running or queued" [ "$(metric cumulo_slots_active)/$(metric cumulo_queue_depth)" = 0/0 ]
stop_server "$PID"

# ---- slowloris ----
start_server slow --timeout 2 || bad "server slow"
node -e '
const net=require("net"),port=+process.argv[1],t0=Date.now();let closed=0;const N=6;
function done(){if(++closed===N*3){process.stdout.write("closed "+((Date.now()-t0)/1000).toFixed(1));process.exit(0)}}
for(let i=0;i<N;i++){
  // headers that never finish
  const a=net.connect(port,"127.0.0.1",()=>a.write("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  a.on("close",done);a.on("error",()=>{});
  // a body that trickles one byte at a time, slower than the idle timeout would catch
  const b=net.connect(port,"127.0.0.1",()=>{b.write("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n\r\n");
    const iv=setInterval(()=>{if(!b.destroyed)b.write("x");else clearInterval(iv)},1000);b.on("close",()=>clearInterval(iv))});
  b.on("close",done);b.on("error",()=>{});
  // headers that trickle one byte every 300 ms, never idle long enough for an idle timeout
  const h="GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "+"y".repeat(500)+"\r\n\r\n";let k=0;
  const c=net.connect(port,"127.0.0.1",()=>{const iv=setInterval(()=>{if(c.destroyed||k>=h.length)return clearInterval(iv);c.write(h[k++])},300);
    c.on("close",()=>clearInterval(iv))});
  c.on("close",done);c.on("error",()=>{});
}
setTimeout(()=>{process.stdout.write("still open after 20 s: "+(3*N-closed));process.exit(1)},20000);
' "$PORT" >"$TMP/slow" &
slowpid=$!
sleep 0.5
check "served while slow clients hang on" [ "$(status "$URL/v1/completions" -d '{"prompt":"Once","max_tokens":8}')" = 200 ]
check "streamed while slow clients hang on" [ -n "$(curl -s -N "$URL/v1/completions" -d '{"prompt":"Once","max_tokens":8,"stream":true}' >"$TMP/s1"; sse_text "$TMP/s1")" ]
wait $slowpid
check "slow senders are cut off: $(cat "$TMP/slow")" grep -q '^closed' "$TMP/slow"
check "still serving afterwards" [ "$(status "$URL/health")" = 200 ]
stop_server "$PID"
finish
