#!/bin/sh
# http_finetune.sh: fine-tuning while serving (serve --finetune-dir DIR;
# src/http/api_finetune.c, src/cli/serve_finetune.c), OpenAI's jobs API on
# stories260K-q8_0: POST /v1/fine_tuning/jobs with a JSONL file of DIR
# starts a LoRA run in the background (a second one while it runs: 409),
# the server keeps answering completions meanwhile, GET
# /v1/fine_tuning/jobs/ID goes from running to succeeded with the adapter
# written (it loads with `run --lora` and changes the text), /api/train holds
# the loss curve the dashboard draws (the loss falls), and the dashboard page
# has the panel. Bad requests are 400s naming the field (a path instead of
# a file name, a file not in DIR, bad hyperparameters), an unknown job 404,
# and a server without --finetune-dir answers 404.
. "$(dirname "$0")/lib/http_common.sh"
need curl node
DIR=$TMP/ft
mkdir -p "$DIR"
i=0
while [ $i -lt 80 ]; do
    echo "{\"text\": \"Zorbix the blue fox found $i shiny stones by the river, and Zorbix smiled at the stones.\"}"
    i=$((i + 1))
done >"$DIR/d.jsonl"
echo "secret" >"$TMP/outside.jsonl"
post() { status "$URL$1" -H 'Content-Type: application/json' -d "$2"; }

if start_server ft --finetune-dir "$DIR"; then
    code=$(post /v1/fine_tuning/jobs '{"training_file": "d.jsonl", "hyperparameters": {"batch_size": 2}, "steps": 40, "n_ctx": 64}')
    [ "$code" = 200 ] && [ "$(js 'j.object + " " + j.id + " " + j.status + " " + j.training_file' "$TMP/body")" = "fine_tuning.job ftjob-1 running d.jsonl" ] \
        && ok || bad "POST job: $code $(cat "$TMP/body")"
    code=$(post /v1/fine_tuning/jobs '{"training_file": "d.jsonl"}')
    st=$(curl -s "$URL/v1/fine_tuning/jobs/ftjob-1" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).status))')
    if [ "$st" = running ]; then [ "$code" = 409 ] && grep -q "still running: one job at a time" "$TMP/body" && ok || bad "second job: $code $(cat "$TMP/body")"
    else echo "note: the job ended before the second POST ($st)"; fi
    code=$(post /v1/completions '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
    [ "$code" = 200 ] && ok || bad "completion while training: $code"
    n=0
    while :; do
        code=$(status "$URL/v1/fine_tuning/jobs/ftjob-1")
        st=$(js 'j.status' "$TMP/body")
        [ "$st" != running ] && break
        n=$((n + 1))
        [ $n -gt 600 ] && break
        sleep 0.5
    done
    cp "$TMP/body" "$TMP/job.json"
    [ "$st" = succeeded ] && ok || bad "job: $st $(cat "$TMP/job.json")"
    ad=$(js 'j.fine_tuned_model' "$TMP/job.json")
    [ "$ad" = "$DIR/ftjob-1.gguf" ] && [ -s "$ad" ] && [ -s "$ad.svg" ] && ok || bad "adapter '$ad' not written"
    [ "$(js 'j.cumulo.step + "/" + j.cumulo.steps + " " + (j.trained_tokens > 0) + " " + (j.finished_at >= j.created_at)' "$TMP/job.json")" = "40/40 true true" ] \
        && ok || bad "job fields: $(cat "$TMP/job.json")"
    code=$(status "$URL/api/train")
    [ "$code" = 200 ] && [ "$(js 'j.points.length >= 40 && j.points[j.points.length - 1][1] < j.points[0][1] && j.job.id == "ftjob-1"' "$TMP/body")" = true ] \
        && ok || bad "/api/train: $code $(head -c 600 "$TMP/body")"
    echo "loss: $(js 'j.points[0][1] + " -> " + j.points[j.points.length - 1][1]' "$TMP/body")"
    code=$(status "$URL/v1/fine_tuning/jobs")
    [ "$code" = 200 ] && [ "$(js 'j.object + " " + j.data.length + " " + j.data[0].status' "$TMP/body")" = "list 1 succeeded" ] && ok || bad "list: $code $(cat "$TMP/body")"
    # the adapter learned the name: it loads and changes the text
    a=$("$BIN" run "$MODEL" -p "Zorbix the" -n 12 --temp 0 --threads 1 --lora "$ad" 2>"$TMP/run.err")
    b=$("$BIN" run "$MODEL" -p "Zorbix the" -n 12 --temp 0 --threads 1 2>/dev/null)
    [ -n "$a" ] && [ "$a" != "$b" ] && ok || bad "adapter: '$a' vs without '$b' ($(tail -1 "$TMP/run.err"))"
    echo "with the adapter: $a"
    # the dashboard has the panel
    curl -s "$URL/" | grep -q 'id="train"' && curl -s "$URL/" | grep -q '/api/train' && ok || bad "dashboard: no fine-tuning panel"
    # bad requests
    bad_req() { # BODY PATTERN
        code=$(post /v1/fine_tuning/jobs "$1")
        if [ "$code" = 400 ] && grep -Eq "$2" "$TMP/body"; then ok; else bad "POST $1: $code $(cat "$TMP/body")"; fi
    }
    bad_req '{"training_file": "../outside.jsonl"}' "must be a plain file name"
    bad_req "{\"training_file\": \"$TMP/outside.jsonl\"}" "must be a plain file name"
    bad_req '{"training_file": "none.jsonl"}' "is not in the server's fine-tuning directory"
    bad_req '{"training_file": ".hidden"}' "plain file name"
    bad_req '{}' "'training_file' must be the name"
    bad_req '{"training_file": "d.jsonl", "hyperparameters": {"n_epochs": "x"}}' "'n_epochs' must be"
    bad_req '{"training_file": "d.jsonl", "hyperparameters": {"learning_rate_multiplier": -1}}' "'learning_rate_multiplier' must be"
    bad_req '{"training_file": "d.jsonl", "model": "other"}' "'model' must be"
    bad_req '[1]' "must be a JSON object"
    code=$(status "$URL/v1/fine_tuning/jobs/ftjob-9")
    [ "$code" = 404 ] && ok || bad "unknown job: $code"
    stop_server "$PID"
else bad "serve --finetune-dir did not start"; fi

if start_server plain; then
    code=$(post /v1/fine_tuning/jobs '{"training_file": "d.jsonl"}')
    [ "$code" = 404 ] && grep -q "fine-tuning is not enabled on this server (start it with --finetune-dir DIR)" "$TMP/body" && ok \
        || bad "without --finetune-dir: $code $(cat "$TMP/body")"
    code=$(status "$URL/api/train")
    [ "$code" = 200 ] && [ "$(cat "$TMP/body")" = '{"job":null,"points":[]}' ] && ok || bad "/api/train without jobs: $code $(cat "$TMP/body")"
    stop_server "$PID"
else bad "plain server did not start"; fi
finish
