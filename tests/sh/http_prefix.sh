#!/bin/sh
# tests/sh/http_prefix.sh: a prompt prefix shared by many requests is held
# once (copy-on-write KV blocks, src/model/kv_blocks.c; queue.c admission),
# on tests/sh/lib's synthetic q4_0 llama with --flash-attn (K and V as rows,
# both shared; 1,000 positions of F32 rows are 7.8 MiB).
#  1. 16 concurrent requests whose prompts start with the same 1,000 tokens
#     (one slot already holds them) all complete with exactly the text and
#     every token's logprob of the same request on a one-slot server, where
#     the slot evaluated the prefix itself.
#  2. /metrics: 15 or more prefix hits; the shared bytes are about one
#     prefix and counted once: the KV bytes in use grew by less than two
#     prefixes for 16 slots (copies: 15 more prefixes), and the slots map
#     ten times the shared bytes beyond them (cumulo_kv_bytes_shared_saved).
#  3. The server's proportional set size (/proc/PID/smaps_rollup Pss: a page
#     mapped by 16 slots counts once) grew by at most the KV bytes in use
#     grew + 8 MiB: the accounting is the memory. (A crowd of 16 short
#     requests runs first, so the baseline has every slot's buffers touched.)
. "$(dirname "$0")/lib/http_common.sh"
need python3
[ -r /proc/self/smaps_rollup ] || need_skip "n/a: no /proc/self/smaps_rollup here"
serving_setup
cp "$TMP/cl.py" "$TMP/client.py"
cat >>"$TMP/client.py" <<'EOF'
import json, threading
SYS = ids(1000, 21)
N = 16
if mode == "alone":
    out = []
    for i in range(N):
        L = {}
        sc.req(SYS + ids(8, 100 + i), 12, L)
        out.append(L["text"])
    print(json.dumps({"texts": out}))
elif mode == "warm":  # 16 at once first (every slot, thread and buffer of a crowd touched), then the prefix
    logs = [{} for _ in range(N)]
    th = [threading.Thread(target=sc.req, args=(ids(12, 500 + i), 4, logs[i])) for i in range(N)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    m0 = sc.metrics()
    L = {}
    sc.req(SYS + ids(8, 99), 4, L)
    print(json.dumps({"status": L["status"], "m0": m0, "m": sc.metrics()}))
elif mode == "crowd":
    logs = [{} for _ in range(N)]
    th = [threading.Thread(target=sc.req, args=(SYS + ids(8, 100 + i), 12, logs[i])) for i in range(N)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    print(json.dumps({"texts": [l["text"] for l in logs], "status": [l["status"] for l in logs], "m": sc.metrics()}))
EOF
pss() { sed -n 's/^Pss:[^0-9]*\([0-9]*\) kB/\1/p' "/proc/$1/smaps_rollup"; }

start_server alone --slots 1 --ctx 2048 --threads 2 -fa || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" alone >"$TMP/alone.json" 2>"$TMP/alone.err" || bad "alone client: $(cat "$TMP/alone.err")"
stop_server "$PID"

start_server shared --slots 16 --ctx 2048 --threads 2 -fa || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" warm >"$TMP/warm.json" 2>"$TMP/warm.err" || bad "warm client: $(cat "$TMP/warm.err")"
pss1=$(pss "$PID")
python3 "$TMP/client.py" "$PORT" crowd >"$TMP/crowd.json" 2>"$TMP/crowd.err" || bad "crowd client: $(cat "$TMP/crowd.err")"
pss2=$(pss "$PID")
stop_server "$PID"

# 1. every text and logprob as alone
[ "$(js 'j.status.every(s => s === 200)' "$TMP/crowd.json")" = true ] && ok || bad "statuses: $(js 'j.status' "$TMP/crowd.json")"
a=$(js 'JSON.stringify(j.texts)' "$TMP/alone.json")
b=$(js 'JSON.stringify(j.texts)' "$TMP/crowd.json")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "texts with a shared prefix differ from alone"
# 2. the accounting
one=$(js 'j.m.cumulo_kv_bytes_in_use' "$TMP/warm.json")
base=$(js 'j.m0.cumulo_kv_bytes_in_use' "$TMP/warm.json") # 16 short caches
prefix=$((one - base))                                    # one slot holding the prefix
used=$(js 'j.m.cumulo_kv_bytes_in_use' "$TMP/crowd.json")
shared=$(js 'j.m.cumulo_kv_bytes_shared' "$TMP/crowd.json")
saved=$(js 'j.m.cumulo_kv_bytes_shared_saved' "$TMP/crowd.json")
hits=$(js 'j.m.cumulo_prefix_cache_hits_total' "$TMP/crowd.json")
echo "  one slot with the prefix: ${prefix} bytes; 16 slots: in use ${used}, shared ${shared}, saved ${saved}, hits ${hits}; Pss ${pss1} -> ${pss2} KiB"
[ "${hits:-0}" -ge 15 ] && ok || bad "prefix hits: ${hits:-?}"
[ -n "$used" ] && [ "$used" -lt $((prefix * 2)) ] && ok || bad "16 slots hold ${used} bytes of KV for one prefix of ${prefix}"
[ -n "$shared" ] && [ "$shared" -gt $((prefix / 2)) ] && [ "$shared" -le "$prefix" ] && ok ||
    bad "shared ${shared} for one prefix of ${prefix}"
[ -n "$saved" ] && [ "$saved" -ge $((shared * 10)) ] && ok || bad "saved ${saved} for ${shared} shared"
# 3. the memory
[ -n "$pss2" ] && [ $(((pss2 - pss1) * 1024)) -le $((used - one + 8 * 1048576)) ] && ok ||
    bad "Pss grew $(((pss2 - pss1) * 1024)) bytes for $((used - one)) more bytes of KV in use"
finish
