#!/bin/sh
# tests/sh/http_chunked.sh: chunked prefill in serve's scheduler (queue.c),
# on a synthetic q4_0 llama (512 wide, context 4096, so the decode steps of
# several streams run the batched gemm over repacked rows).
#  1. A stream keeps producing tokens while a 2,000-token prompt is admitted:
#     between the moment the long request is sent and its first token, the
#     running stream receives tokens (its decode steps alternate with the
#     long prompt's chunks; with the whole prompt evaluated in one go it
#     would receive none). The check is an ordering of events, not a time.
#     Both requests then complete, and the long one's text and logprobs
#     equal the same request's sent alone to an idle server (chunking changes
#     no bit).
#  3. (run second) A shared prompt prefix is shared between slots, counted in
#     /metrics, and changes no bit: text and every token's logprob equal the
#     prompt evaluated alone (a V row copied one position short fails this).
#  4. (run third) Four prompts sent together while a stream decodes: their
#     chunks ride in the same mixed passes, 32 prompt tokens a pass in all
#     (the bound on the running stream's wait), and each text and logprob
#     equals the prompt alone.
#  2. Cancellation frees the slot at once: with one slot, a client that
#     disconnects while its 2,000-token prompt is being evaluated is followed
#     by a request that is served (the slot was not lost), and /metrics shows
#     no request active afterwards.
# CUMULO_PREFILL_CHUNK=32 (the default) and CUMULO_TEST_STEP_DELAY_MS keep
# each iteration short but observable; in 2. the 2,000 tokens take at least
# 8 iterations of 100 ms (256 tokens each while nothing decodes), so the
# client's leaving after 0.3 s always falls inside the prefill.
. "$(dirname "$0")/lib/http_common.sh"
need curl python3
serving_setup
cp "$TMP/cl.py" "$TMP/client.py"
cat >>"$TMP/client.py" <<'EOF'
import json, threading, time
stream = sc.stream
LONG = ids(2000, 7)
SYS = ids(300, 11)
PB = SYS + ids(5, 13)
SEV = [ids(n, 30 + n) for n in (20, 45, 70, 100)]
if mode == "alone":
    L, P = {}, {}
    stream(LONG, 3, L)
    stream(PB, 8, P)
    sev = []
    for p in SEV:
        S = {}
        stream(p, 6, S)
        sev.append(S["text"] + repr(S.get("lp")))
    print(json.dumps({"text": L["text"] + repr(L.get("lp")), "done": L["done"], "ptext": P["text"] + repr(P.get("lp")),
                      "sev": sev}))
elif mode == "several":
    A, S = {}, [{} for _ in SEV]
    ta = threading.Thread(target=stream, args=(ids(8, 3), 200, A))
    ta.start()
    while len(A.get("times", [])) < 3:
        time.sleep(0.01)
    th = [threading.Thread(target=stream, args=(p, 6, S[i])) for i, p in enumerate(SEV)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ta.join()
    print(json.dumps({"sev": [x["text"] + repr(x.get("lp")) for x in S], "ok": A["done"] and all(x["done"] for x in S)}))
elif mode == "prefix":
    A, B = {}, {}
    ta = threading.Thread(target=stream, args=(SYS + ids(5, 12), 120, A))
    ta.start()
    while len(A.get("times", [])) < 3:
        time.sleep(0.01)
    stream(PB, 8, B)
    ta.join()
    print(json.dumps({"ptext": B["text"] + repr(B.get("lp")), "ok": A["done"] and B["done"]}))
elif mode == "interleave":
    A, B = {}, {}
    ta = threading.Thread(target=stream, args=(ids(8, 3), 300, A))
    ta.start()
    while len(A.get("times", [])) < 3:
        time.sleep(0.01)
    stream(LONG, 3, B)
    ta.join()
    t0, t1 = B["sent"], B["times"][0] if B.get("times") else float("inf")
    during = sum(1 for t in A["times"] if t0 < t < t1)
    print(json.dumps({"during": during, "a_tokens": len(A["times"]), "a_done": A["done"], "b_done": B["done"],
                      "b_status": B["status"], "text": B["text"] + repr(B.get("lp"))}))
elif mode == "cancel":
    C, D = {}, {}
    # C is admitted and its prompt evaluation begins; the client leaves after 0.3 s
    stream(LONG, 3, C, hold=lambda log: time.monotonic() - log["sent"] > 0.3)
    stream(ids(8, 5), 4, D)
    print(json.dumps({"c_tokens": len(C.get("times", [])), "d_done": D["done"], "d_tokens": len(D["times"])}))
EOF

# 1. interleaving, and the long request's text equals it alone
start_server alone --slots 2 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" alone >"$TMP/alone.json" 2>"$TMP/alone.err" || bad "alone client: $(cat "$TMP/alone.err")"
stop_server "$PID"
CUMULO_TEST_STEP_DELAY_MS=5 start_server mixed --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" interleave >"$TMP/mix.json" 2>"$TMP/mix.err" || bad "interleave client: $(cat "$TMP/mix.err")"
during=$(js 'j.during' "$TMP/mix.json")
# 2,000 tokens are ~63 chunks of 32, each followed by a decode step of the
# running stream; demand a good part of them (none without chunking)
[ "${during:-0}" -ge 20 ] && ok || bad "running stream got ${during:-?} tokens while the long prompt was admitted ($(cat "$TMP/mix.json"))"
[ "$(js 'j.a_done && j.a_tokens === 300 && j.b_done && j.b_status === 200' "$TMP/mix.json")" = true ] && ok ||
    bad "requests did not complete: $(cat "$TMP/mix.json")"
a=$(js 'j.text' "$TMP/alone.json")
b=$(js 'j.text' "$TMP/mix.json")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "long prompt's text chunked '$b' vs alone '$a'"
stop_server "$PID"

# 4. several prompts arriving together while a stream decodes: their chunks
# share the mixed passes (cm_engine_step_prefill_many), and each text and
# logprob equals the prompt alone
CUMULO_TEST_STEP_DELAY_MS=5 start_server several --slots 6 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" several >"$TMP/sev.json" 2>"$TMP/sev.err" || bad "several client: $(cat "$TMP/sev.err")"
a=$(js 'JSON.stringify(j.sev)' "$TMP/alone.json")
b=$(js 'JSON.stringify(j.sev)' "$TMP/sev.json")
[ "$(js 'j.ok' "$TMP/sev.json")" = true ] && [ -n "$a" ] && [ "$a" = "$b" ] && ok ||
    bad "several prompts in mixed passes '$b' vs alone '$a'"
stop_server "$PID"

# 3. shared prefixes: B's prompt starts with the 300 tokens A's slot holds
# (A is still generating, so B gets another slot): they are shared, not
# evaluated (/metrics), and B's text equals B alone on an idle server.
start_server prefix --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" prefix >"$TMP/p.json" 2>"$TMP/p.err" || bad "prefix client: $(cat "$TMP/p.err")"
curl -s --max-time 10 "$URL/metrics" >"$TMP/pm.txt"
hits=$(sed -n 's/^cumulo_prefix_cache_hits_total //p' "$TMP/pm.txt")
toks=$(sed -n 's/^cumulo_prefix_cache_tokens_total //p' "$TMP/pm.txt")
[ "${hits:-0}" -ge 1 ] && [ "${toks:-0}" -ge 300 ] && ok || bad "prefix cache: hits '$hits' tokens '$toks'"
a=$(js 'j.ptext' "$TMP/alone.json")
b=$(js 'j.ptext' "$TMP/p.json")
[ "$(js 'j.ok' "$TMP/p.json")" = true ] && [ -n "$a" ] && [ "$a" = "$b" ] && ok ||
    bad "text after a copied prefix '$b' vs evaluated alone '$a'"
stop_server "$PID"

# 2. cancel during prefill frees the only slot
CUMULO_TEST_STEP_DELAY_MS=100 start_server one --slots 1 --queue 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" cancel >"$TMP/c.json" 2>"$TMP/c.err" || bad "cancel client: $(cat "$TMP/c.err")"
[ "$(js 'j.c_tokens === 0 && j.d_done && j.d_tokens === 4' "$TMP/c.json")" = true ] && ok ||
    bad "after a cancel during prefill: $(cat "$TMP/c.json")"
curl -s --max-time 10 "$URL/metrics" >"$TMP/m.txt"
grep -Eq '^cumulo_slots_active 0$' "$TMP/m.txt" && ok ||
    bad "requests still active after the cancel: $(grep -E 'active|queued' "$TMP/m.txt" | head -5)"
finish
