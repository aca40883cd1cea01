#!/bin/sh
# tests/sh/http_tools.sh: tool calls and structured output on
# stories260K-q8_0 (--ctx 2048: the tool prompts are long in its tiny
# vocabulary) through the official openai SDK (tests/js/openai_tools.mjs)
# under each template family that has a tool format: chatml (Hermes-style
# <tool_call>, Qwen 2.5/3), llama3 and mistral-v3. The model knows nothing of
# tools or JSON, so every valid call and schema-valid reply is the grammar's
# doing. Then the cluster: a tensor-parallel group (rank 0 samples here)
# enforces the grammar too, and a pipeline and hybrid plans give one
# machine's replies (the last stage sends a constrained row's logits back).
. "$(dirname "$0")/lib/http_common.sh"
need curl node

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

# Tool turns as the official templates write them: cumulo's prompt
# (POST /apply-template) for conversations with tools, a call and its result
# equals the model's own Jinja template rendered by @huggingface/jinja:
# Llama 3.2 (meta-llama; the 3.1 family), Mistral v0.3 and Nemo (tekken).
for c in "llama3.1 meta-llama-Llama-3.2-3B-Instruct.jinja" "mistral-v3 llamacpp-mistral-v3.jinja" \
    "mistral-v3-tekken mistralai-Mistral-Nemo-Instruct-2407.jinja"; do
    set -- $c
    start_server "tt-$1" --ctx 2048 --chat-template "$1" || { bad "server $1"; continue; }
    (cd tests/js && node tools_template.mjs "$URL" "../data/chat/$2" "</s>") >"$TMP/tt.out" 2>"$TMP/tt.err"
    cat "$TMP/tt.err" >&2
    line=$(tail -1 "$TMP/tt.out")
    p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed$/\1/p')
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
    [ "${p:-0}" -ge 3 ] || bad "tools_template.mjs [$1] ran ${p:-0} checks (expected 3)"
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
N1=127.0.0.1:$(cat "$TMP/np1")
N2=$NODE
# Pipelines and hybrid plans: a constrained sequence asks the last stage for
# its logits and samples them here under the grammar (pipe_output.c), so
# every reply equals one machine's, sampled (temperature, seed) as well as
# greedy: json_schema, json_object, a forced tool call (tool_choice
# required and named), streamed and not.
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"f"}}]'
ask_all() { # ask_all CFG: the constrained requests against $URL, replies in $TMP/CFG.K (content + calls, no ids)
    k=0
    for body in "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":60,\"temperature\":1,\"seed\":3,$SCHEMA}" \
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":40,\"temperature\":0,\"response_format\":{\"type\":\"json_object\"}}" \
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"max_tokens\":300,\"temperature\":0.9,\"seed\":11,$TOOLS,\"tool_choice\":\"required\"}" \
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"max_tokens\":300,\"temperature\":0.7,\"seed\":5,$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}"; do
        k=$((k + 1))
        check "$1 request $k: 200" [ "$(status "$URL/v1/chat/completions" -d "$body")" = 200 ]
        js '[j.choices[0].message.content,(j.choices[0].message.tool_calls||[]).map(c=>c.function),j.choices[0].finish_reason]' "$TMP/body" >"$TMP/$1.$k"
    done
    curl -sN --max-time 60 "$URL/v1/chat/completions" -d "{\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":60,\"temperature\":1,\"seed\":3,$SCHEMA}" >"$TMP/$1.sse"
    sse_text "$TMP/$1.sse" >"$TMP/$1.stream" || bad "$1: the stream did not end with [DONE]"
}
if start_server one --ctx 1024 --chat-template chatml; then
    ask_all one
    check "one machine: schema reply valid ($(head -c 80 "$TMP/one.1"))" [ "$(js 'Number.isInteger(JSON.parse(j[0]).n)?"y":"n"' "$TMP/one.1")" = y ]
    check "one machine: a forced call of get_weather ($(head -c 120 "$TMP/one.4"))" [ "$(js 'j[1].length==1&&j[1][0].name=="get_weather"&&typeof JSON.parse(j[1][0].arguments).city=="string"?"y":"n"' "$TMP/one.4")" = y ]
    check "one machine: stream text = the non-streamed content" [ "$(cat "$TMP/one.stream")" = "$(js 'j[0]' "$TMP/one.1")" ]
    stop_server "$PID"
else
    bad "one-machine serve did not start"
fi
for cfg in "pp --nodes $N1,$N2" "hy12 --nodes $N1,$N2 --groups 1,2" "hy21 --nodes $N1,$N2 --groups 2,1"; do
    # shellcheck disable=SC2086
    set -- $cfg
    name=$1; shift
    if start_server "$name" --ctx 1024 --chat-template chatml "$@"; then
        ask_all "$name"
        if [ "$name" != pp ]; then
            # A tensor-parallel group (hy21: this machine in one; hy12: the
            # nodes' stage, split by speeds measured at start): its all-reduced sums
            # differ from one machine's in the last bits, and so may a
            # sampled reply after a long prompt, grammar or not (measured:
            # the same tools prompt unconstrained differs too). Valid replies.
            check "$name: schema reply valid ($(head -c 80 "$TMP/$name.1"))" [ "$(js 'Number.isInteger(JSON.parse(j[0]).n)?"y":"n"' "$TMP/$name.1")" = y ]
            check "$name: forced call valid ($(head -c 120 "$TMP/$name.4"))" [ "$(js 'j[1].length==1&&j[1][0].name=="get_weather"&&typeof JSON.parse(j[1][0].arguments).city=="string"?"y":"n"' "$TMP/$name.4")" = y ]
        else
            for k in 1 2 3 4; do
                check "$name request $k = one machine ($(head -c 100 "$TMP/$name.$k") vs $(head -c 100 "$TMP/one.$k"))" cmp -s "$TMP/$name.$k" "$TMP/one.$k"
            done
            check "$name: stream = one machine's" cmp -s "$TMP/$name.stream" "$TMP/one.stream"
        fi
        [ "$name" = pp ] && sdk "chatml, pipeline" # the official SDK's whole run on a pipeline
        check "$name: auto tools still answer" [ "$(status "$URL/v1/chat/completions" -d '{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f"}}]}')" = 200 ]
        stop_server "$PID"
    else
        bad "$name serve did not start"
    fi
done
finish
