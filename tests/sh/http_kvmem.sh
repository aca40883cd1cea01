#!/bin/sh
# tests/sh/http_kvmem.sh: serve's KV memory is committed on demand and
# admitted by a budget (paged KV memory, issue 22; queue.c, src/model/kv_mem.c),
# on a synthetic q4_0 llama (context 4096, F32 cache as rows: 32 MiB per slot if held,
# 512 KiB for 60 positions: 4 layers x 4 KV heads x K and V, 4 pages each).
#  1. 16 slots at the whole context start with no KV memory in use, and the
#     start-up line states the budget.
#  2. With --kv-mem 1 (two 60-position requests fit, a third does not),
#     8 concurrent requests all complete, each with exactly the text and
#     logprobs it gets alone on a server without a tight budget; the
#     reserved bytes never pass the budget (/metrics polled meanwhile), idle
#     slots' caches were given back to admit the later ones (evictions), and
#     the server's resident memory grew by at most the KV bytes in use + the
#     slots' pools (pages kept for reuse, cumulo_kv_bytes_pooled) + 8 MiB,
#     and the reserved bytes cover in use + pooled.
#  3. A request whose prompt + max_tokens can never fit the budget gets a 400
#     that names --kv-mem instead of waiting forever.
. "$(dirname "$0")/lib/http_common.sh"
need curl python3
[ -r /proc/self/status ] || need_skip "n/a: no /proc/self/status here"
serving_setup
cp "$TMP/cl.py" "$TMP/client.py"
cat >>"$TMP/client.py" <<'EOF'
import json, threading, time
req, metrics = sc.req, sc.metrics
N = 8
if mode == "alone":
    out = []
    for i in range(N):
        L = {}
        req(ids(20, 50 + i), 40, L)
        out.append(L["text"])
    print(json.dumps({"texts": out}))
elif mode == "warm":
    L = {}
    req(ids(20, 99), 40, L)
    print(json.dumps({"status": L["status"], "m": metrics()}))
elif mode == "crowd":
    logs = [{} for _ in range(N)]
    th = [threading.Thread(target=req, args=(ids(20, 50 + i), 40, logs[i])) for i in range(N)]
    for t in th:
        t.start()
    worst, waited, polls = 0.0, 0, 0
    while any(t.is_alive() for t in th):
        m = metrics()
        polls += 1
        worst = max(worst, m.get("cumulo_kv_bytes_reserved", 0) - m.get("cumulo_kv_bytes_capacity", 0))
        waited += int(m.get("cumulo_kv_waiting", 0))
        time.sleep(0.02)
    for t in th:
        t.join()
    print(json.dumps({"texts": [l["text"] for l in logs], "status": [l["status"] for l in logs], "over": worst,
                      "waited": waited, "polls": polls, "m": metrics()}))
elif mode == "huge":
    L = {}
    req(ids(20, 7), 4000, L)
    print(json.dumps(L))
EOF
rss() { sed -n 's/^VmRSS:[^0-9]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }

# the reference: each request alone, a budget that fits every slot
start_server alone --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" alone >"$TMP/alone.json" 2>"$TMP/alone.err" || bad "alone client: $(cat "$TMP/alone.err")"
stop_server "$PID"

# 1. nothing in use at start; the start-up line
CUMULO_TEST_STEP_DELAY_MS=10 start_server tight --slots 16 --ctx 4096 --threads 2 --kv-mem 1 || { bad "server"; finish; exit 1; }
grep -q 'kv cache: budget 1.0 MiB for 16 slots' "$TMP/tight.log" && ok || bad "start-up line: $(grep 'kv cache' "$TMP/tight.log")"
[ "$(metric cumulo_kv_bytes_in_use)" = 0 ] && [ "$(metric cumulo_kv_bytes_capacity)" = 1048576 ] && ok ||
    bad "at start: in use '$(metric cumulo_kv_bytes_in_use)', capacity '$(metric cumulo_kv_bytes_capacity)'"

# 2. a warm-up request (the forward pass's scratch), then the crowd
python3 "$TMP/client.py" "$PORT" warm >"$TMP/warm.json" 2>"$TMP/warm.err" || bad "warm client: $(cat "$TMP/warm.err")"
rss1=$(rss "$PID")
python3 "$TMP/client.py" "$PORT" crowd >"$TMP/crowd.json" 2>"$TMP/crowd.err" || bad "crowd client: $(cat "$TMP/crowd.err")"
rss2=$(rss "$PID")
[ "$(js 'j.status.every(s => s === 200)' "$TMP/crowd.json")" = true ] && ok || bad "statuses: $(js 'j.status' "$TMP/crowd.json")"
a=$(js 'JSON.stringify(j.texts)' "$TMP/alone.json")
b=$(js 'JSON.stringify(j.texts)' "$TMP/crowd.json")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "texts under the budget differ from alone"
[ "$(js 'j.over <= 0' "$TMP/crowd.json")" = true ] && ok || bad "reserved passed the budget by $(js 'j.over' "$TMP/crowd.json") bytes"
[ "$(js 'j.m.cumulo_kv_evictions_total >= 1' "$TMP/crowd.json")" = true ] && ok ||
    bad "no idle cache was given back: $(js 'j.m' "$TMP/crowd.json")"
used1=$(js 'j.m.cumulo_kv_bytes_in_use' "$TMP/warm.json")
used2=$(js 'j.m.cumulo_kv_bytes_in_use' "$TMP/crowd.json")
cap=$(js 'j.m.cumulo_kv_bytes_capacity' "$TMP/crowd.json")
echo "  rss ${rss1} -> ${rss2} KiB; kv in use ${used1} -> ${used2} bytes of ${cap}; polls $(js 'j.polls' "$TMP/crowd.json"), waiting seen $(js 'j.waited' "$TMP/crowd.json")"
[ -n "$used2" ] && [ "$used2" -le "$cap" ] && ok || bad "in use $used2 > capacity $cap"
pool1=$(js 'j.m.cumulo_kv_bytes_pooled' "$TMP/warm.json")
pool2=$(js 'j.m.cumulo_kv_bytes_pooled' "$TMP/crowd.json")
echo "  kv pooled ${pool1} -> ${pool2} bytes, pool trims $(js 'j.m.cumulo_kv_pool_trims_total' "$TMP/crowd.json")"
[ -n "$pool2" ] && [ "$(js 'j.m.cumulo_kv_bytes_reserved >= j.m.cumulo_kv_bytes_in_use + j.m.cumulo_kv_bytes_pooled' "$TMP/crowd.json")" = true ] &&
    ok || bad "reserved does not cover in use + pooled: $(js 'j.m' "$TMP/crowd.json")"
[ -n "$rss2" ] && [ $(( (rss2 - rss1) * 1024 )) -le $(( used2 + pool2 - used1 - pool1 + 8 * 1048576 )) ] && ok ||
    bad "resident memory grew $(( (rss2 - rss1) * 1024 )) bytes for $(( used2 + pool2 - used1 - pool1 )) bytes of KV in use + pooled"

# 3. never fits: a 400 naming the budget, not a wait
python3 "$TMP/client.py" "$PORT" huge >"$TMP/huge.json" 2>"$TMP/huge.err" || bad "huge client: $(cat "$TMP/huge.err")"
[ "$(js 'j.status === 400 && j.text.includes("--kv-mem")' "$TMP/huge.json")" = true ] && ok || bad "too large: $(cat "$TMP/huge.json")"
stop_server "$PID"
finish
