#!/bin/sh
# tests/sh/http_interject.sh: interjections in serve's scheduler (queue.c
# interject, engine.h cm_engine_set_interject), on tests/sh/lib's synthetic
# q4_0 llama (4 layers). While a stream decodes and a 600-token prompt is
# being evaluated, short requests arrive: each is admitted between two
# layers of the pass in flight and its prompt evaluated in a pass of its
# own there, its first token streamed at once.
#  1. It happens: /metrics cumulo_prompt_interjections_total counts them
#     (CUMULO_TEST_LAYER_DELAY_MS stretches every pass to >= 3 x 40 ms, so a
#     request sent at any moment almost surely lands inside one; 1 of 3
#     required). With CUMULO_INTERJECT=0 the count stays 0.
#  2. It changes no bit: every short request's text and logprobs, the long
#     prompt's and the running stream's equal the same requests sent one at
#     a time to an idle server without interjections (the paused pass goes on
#     unchanged; a first token sampled twice or lost, or a disturbed pass,
#     fails this).
#  3. Every request completes (none is lost to the scheduler's new path).
#  4. Between steps (queue.c short_first): with CUMULO_TEST_STEP_DELAY_MS a
#     request most likely arrives between two steps; its prompt is evaluated
#     in a pass of its own before the next step (cumulo_prompt_short_first_total
#     >= 1; 0 with CUMULO_INTERJECT=0), with the same bits as alone.
. "$(dirname "$0")/lib/http_common.sh"
need python3 curl
serving_setup
cp "$TMP/cl.py" "$TMP/client.py"
cat >>"$TMP/client.py" <<'EOF'
import json, threading, time
stream = sc.stream
LONG = ids(600, 7)
RUN = ids(8, 3)
SHORT = [ids(12, 40 + k) for k in range(3)]
def out(x):
    return x["text"] + repr(x.get("lp"))
if mode == "alone":
    A, L, S = {}, {}, [{} for _ in SHORT]
    stream(RUN, 60, A)
    stream(LONG, 3, L)
    for i, p in enumerate(SHORT):
        stream(p, 5, S[i])
    print(json.dumps({"a": out(A), "l": out(L), "s": [out(x) for x in S],
                      "ok": A["done"] and L["done"] and all(x["done"] for x in S)}))
else:
    A, L, S = {}, {}, [{} for _ in SHORT]
    ta = threading.Thread(target=stream, args=(RUN, 60, A))
    ta.start()
    while len(A.get("times", [])) < 2:
        time.sleep(0.01)
    tl = threading.Thread(target=stream, args=(LONG, 3, L))
    tl.start()
    for i, p in enumerate(SHORT):
        time.sleep(0.13)
        stream(p, 5, S[i])
    ta.join()
    tl.join()
    print(json.dumps({"a": out(A), "l": out(L), "s": [out(x) for x in S],
                      "ok": A["done"] and L["done"] and all(x["done"] for x in S)}))
EOF

CUMULO_INTERJECT=0 start_server alone --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" alone >"$TMP/alone.json" 2>"$TMP/alone.err" || bad "alone client: $(cat "$TMP/alone.err")"
n=$(metric cumulo_prompt_interjections_total)
[ "$n" = 0 ] && ok || bad "CUMULO_INTERJECT=0: $n interjections"
n=$(metric cumulo_prompt_short_first_total)
[ "$n" = 0 ] && ok || bad "CUMULO_INTERJECT=0: $n short prompts first"
stop_server "$PID"

CUMULO_TEST_LAYER_DELAY_MS=40 start_server busy --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" busy >"$TMP/busy.json" 2>"$TMP/busy.err" || bad "busy client: $(cat "$TMP/busy.err")"
n=$(metric cumulo_prompt_interjections_total)
[ "${n:-0}" -ge 1 ] && ok || bad "no short prompt was interjected (cumulo_prompt_interjections_total '$n')"
[ "$(js 'j.ok' "$TMP/busy.json")" = true ] && [ "$(js 'j.ok' "$TMP/alone.json")" = true ] && ok ||
    bad "requests did not complete: $(cat "$TMP/busy.json") / $(cat "$TMP/alone.json")"
for f in a l s; do
    a=$(js "JSON.stringify(j.$f)" "$TMP/alone.json")
    b=$(js "JSON.stringify(j.$f)" "$TMP/busy.json")
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "$f: with interjections '$b' vs alone '$a'"
done
stop_server "$PID"

CUMULO_TEST_STEP_DELAY_MS=150 start_server gap --slots 4 --ctx 4096 --threads 2 || { bad "server"; finish; exit 1; }
python3 "$TMP/client.py" "$PORT" gap >"$TMP/gap.json" 2>"$TMP/gap.err" || bad "gap client: $(cat "$TMP/gap.err")"
n=$(metric cumulo_prompt_short_first_total)
[ "${n:-0}" -ge 1 ] && ok || bad "no short prompt went first between steps (cumulo_prompt_short_first_total '$n')"
[ "$(js 'j.ok' "$TMP/gap.json")" = true ] && ok || bad "requests did not complete: $(cat "$TMP/gap.json")"
for f in a l s; do
    a=$(js "JSON.stringify(j.$f)" "$TMP/alone.json")
    b=$(js "JSON.stringify(j.$f)" "$TMP/gap.json")
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "$f: short prompts first between steps '$b' vs alone '$a'"
done
stop_server "$PID"
finish
