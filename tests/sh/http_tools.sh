#!/bin/sh
# tests/sh/http_tools.sh: tool calls and structured output on
# stories260K-q8_0 (--ctx 2048: the tool prompts are long in its tiny
# vocabulary) through the official openai SDK (tests/js/openai_tools.mjs)
# under each template family that has a tool format: chatml (Hermes-style
# <tool_call>, Qwen 2.5/3), llama3 and mistral-v3. The model knows nothing of
# tools or JSON, so every valid call and schema-valid reply is the grammar's
# doing. Then the cluster: a tensor-parallel group (rank 0 samples here)
# enforces the grammar too; a pipeline answers 501 saying why.
. "$(dirname "$0")/lib/http_common.sh"

if [ ! -d tests/js/node_modules/openai ]; then
    (cd tests/js && npm ci --no-audit --no-fund >"$TMP/npm.log" 2>&1) || { tail -20 "$TMP/npm.log" >&2; bad "npm ci in tests/js failed"; finish; exit 1; }
fi

sdk() { # sdk LABEL: run openai_tools.mjs against $URL, add its counts
    (cd tests/js && node openai_tools.mjs "$URL" stories260K-q8_0 "$1") >"$TMP/sdk.out" 2>"$TMP/sdk.err"
    rc=$?
    cat "$TMP/sdk.err" >&2
    line=$(tail -1 "$TMP/sdk.out")
    p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
    [ "${p:-0}" -ge 16 ] || bad "openai_tools.mjs [$1] ran ${p:-0} checks (expected 16)"
    [ $rc -ne 0 ] && [ "${f:-0}" -eq 0 ] && bad "openai_tools.mjs [$1] exited $rc"
}

for t in chatml llama3 mistral-v3; do
    start_server "$t" --ctx 2048 --chat-template "$t" || { bad "server $t"; continue; }
    sdk "$t"
    stop_server "$PID"
done

# a family without a tool format: a clear 400
start_server gemma --ctx 2048 --chat-template gemma || bad "server gemma"
check "gemma template: 400 naming the families" [ "$(status "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}')" = 400 ]
check "gemma message" grep -q 'Llama 3.x, chatml' "$TMP/body"
check "json_schema still works there" [ "$(status "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":200,"response_format":{"type":"json_schema","json_schema":{"schema":{"enum":["yes","no"]}}}}')" = 200 ]
check "enum reply" [ "$(js '["yes","no"].includes(JSON.parse(j.choices[0].message.content))?"y":"n"' "$TMP/body")" = y ]
stop_server "$PID"

# ---- cluster ----
export CUMULO_KEY_FILE="$TMP/cluster.key"
"$BIN" key --new --force >/dev/null 2>&1
node_up() { # node_up N: a node on a free port; sets NODE
    "$BIN" node --bind 127.0.0.1 --port 0 --port-file "$TMP/np$1" --no-mdns --threads 1 --cache "$TMP/nc$1" >"$TMP/node$1.log" 2>&1 &
    SERVER_PIDS="$SERVER_PIDS $!"
    k=0
    while [ ! -s "$TMP/np$1" ] && [ $k -lt 100 ]; do sleep 0.05; k=$((k + 1)); done
    NODE=127.0.0.1:$(cat "$TMP/np$1")
}
SCHEMA='"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}}}'
node_up 1
if start_server tp --ctx 1024 --nodes "$NODE" --parallel tp; then
    check "tp: json_schema 200" [ "$(status "$URL/v1/chat/completions" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":100,\"temperature\":1,\"seed\":3,$SCHEMA}")" = 200 ]
    check "tp: reply valid ($(js 'j.choices[0].message.content' "$TMP/body"))" [ "$(js 'Number.isInteger(JSON.parse(j.choices[0].message.content).n)&&Object.keys(JSON.parse(j.choices[0].message.content)).length==1?"y":"n"' "$TMP/body")" = y ]
    stop_server "$PID"
else
    bad "tp serve did not start"
fi
node_up 2
if start_server pp --ctx 1024 --nodes "$NODE"; then
    check "pipeline: 501" [ "$(status "$URL/v1/chat/completions" -d "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],$SCHEMA}")" = 501 ]
    check "pipeline: says why" grep -q 'not supported on a pipeline cluster' "$TMP/body"
    check "pipeline: auto tools still answer" [ "$(status "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f"}}]}')" = 200 ]
else
    bad "pipeline serve did not start"
fi
finish
