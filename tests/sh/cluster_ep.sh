#!/bin/sh
# tests/sh/cluster_ep.sh (issue 13, expert parallelism): synthetic qwen3moe
# models (8 experts top 2, Q8_0, 3 layers; 64 experts top 8, Q8_0, 2 layers)
# on this process + two `cumulo node`s on 127.0.0.1 with `--parallel ep`: one
# expert group of 3 members, each holding every layer's attention and router
# and a range of the experts (by measured speed; --tp-weights skews it).
#   1. greedy ids equal one machine (the expert outputs are exchanged and
#      summed in the single machine's top-k order, so the bits are equal);
#   2. the expert exchange, counted in the data path by every member (the
#      coordinator's `tp.data_bytes` in --json, each node's line when its
#      assignment ends), sums to rows x L x k x (members - 1) x n_embd x 4;
#   3. each node streamed only its experts: weight bytes streamed =
#      all weights - (n_expert - held) x bytes of one expert (from `cumulo
#      info`: (weight_bytes - weight_bytes_active) / (n_expert - k));
#   4. expert groups as pipeline stages (--groups 2,1 and 1,2): ids equal.
#   5. serve --parallel ep: 4 concurrent completions of 2 prompts (batched
#      decode of several sequences) equal one machine's texts.
# Checks 1-3 also run on a synthetic gpt-oss model (MXFP4 experts with
# biases, attention sinks, sliding-window layers; 8 experts top 2).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
. tests/sh/lib/ep_common.sh
need curl perl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
M8=$TMP/moe8.gguf
M64=$TMP/moe64.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$M8" 2>/dev/null && ok || bad "synth 8x2 failed"
"$BIN" synth --arch qwen3moe --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 64 \
    --experts-used 8 --type q8_0 --seed 1074 --vocab "$VOCAB" -o "$M64" 2>/dev/null && ok || bad "synth 64x8 failed"
MGO=$TMP/gptoss.gguf
"$BIN" synth --arch gpt-oss --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --swa 4 --type mxfp4 --seed 4003 --vocab "$VOCAB" -o "$MGO" 2>/dev/null && ok || bad "synth gpt-oss failed"
PROMPT="Once upon a time"
N=24

# ep_case (ep_common.sh): fresh nodes (fresh caches), one EP run, checks 1-3.
ep_case e8 "$M8" ""
ep_case w8 "$M8" "" --tp-weights 1,1,8
# the skewed split gives the node of weight 8 more experts than the node of
# weight 1: which of a and b takes which weight is the planner's choice (it
# orders nodes by their measured speed), so either may hold the larger share
ea=$(grep 'weight bytes streamed' "$TMP/w8a.log" | tail -1 | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)).*/\1 \2/p')
eb=$(grep 'weight bytes streamed' "$TMP/w8b.log" | tail -1 | sed -n 's/.*experts \[\([0-9]*\), \([0-9]*\)).*/\1 \2/p')
set -- $ea $eb
big=0 small=0
if [ $# -eq 4 ]; then
    big=$(($2 - $1)) small=$(($4 - $3))
    [ "$small" -gt "$big" ] && big=$(($4 - $3)) small=$(($2 - $1))
fi
[ "$big" -gt "$small" ] && [ "$big" -ge $((2 * small)) ] && ok ||
    bad "--tp-weights 1,1,8: neither of nodes a and b holds twice the other's experts ($ea / $eb)"
ep_case e64 "$M64" ""
ep_case go8 "$MGO" ""

# 4. expert groups as pipeline stages: this machine + a as stage 0's group,
# b alone (2,1); this machine alone, then a + b as a group (1,2).
ep_nodes g
"$BIN" run "$M8" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
for g in 2,1 1,2; do
    if "$BIN" run "$M8" --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep --groups $g -p "$PROMPT" -n $N \
        --temp 0 --threads 1 --json >"$TMP/g.json" 2>"$TMP/g.err"; then
        grep -q 'hybrid: 2 stages of' "$TMP/g.err" && ok || bad "--groups $g: not a 2-stage plan: $(grep -E 'why|hybrid' "$TMP/g.err")"
        [ "$(cc_jsonget "$TMP/g.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "--groups $g: ids differ from one machine"
    else
        bad "--groups $g: run failed: $(tail -3 "$TMP/g.err")"
    fi
done
# each run's group was an expert group: one node beside this machine in the first, both nodes in the
# second (which node joins this machine follows the planner's measured speeds: count both logs)
pat='expert-parallel rank.*expert exchanges'
i=0
while [ $i -lt 400 ]; do # up to 20 s: a node logs after its coordinator has gone
    c=$(($(grep -c "$pat" "$TMP/ga.log") + $(grep -c "$pat" "$TMP/gb.log")))
    [ "$c" -ge 3 ] && break
    sleep 0.05
    i=$((i + 1))
done
[ "$c" -eq 3 ] && ok || bad "--groups: the nodes computed in $c expert groups, expected 3 (one node, then both)"

# 5. serve --parallel ep: 4 concurrent completions of 2 prompts (several
# sequences in one forward pass: cm_engine_step) equal one machine's texts.
# (cc_start_serve: until its "ready:" line, or it exits)
if cc_start_serve serve "$M8" --host 127.0.0.1 --nodes "127.0.0.1:$PORT_a,127.0.0.1:$PORT_b" --parallel ep --threads 1 \
    --slots 4 && grep -q 'expert parallel: 3 members' "$TMP/serve.log" && [ -n "$SERVE_PORT" ]; then
    ok
    PORT=$SERVE_PORT
    for q in 1 2; do
        pr="Once upon a time"; [ $q = 2 ] && pr="The little dog"
        "$BIN" run "$M8" -p "$pr" -n 32 --temp 0 --threads 1 --json 2>/dev/null |
            perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{text}' >"$TMP/want$q"
    done
    CP=""
    for k in 1 2 3 4; do
        pr="Once upon a time"; [ $((k % 2)) = 0 ] && pr="The little dog"
        curl -s --max-time 120 "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"$pr\",\"max_tokens\":32,\"temperature\":0}" >"$TMP/r$k.json" &
        CP="$CP $!"
    done
    for p in $CP; do wait "$p"; done
    for k in 1 2 3 4; do
        q=1; [ $((k % 2)) = 0 ] && q=2
        perl -MJSON::PP -e 'binmode STDOUT, ":utf8"; local $/; print decode_json(<STDIN>)->{choices}[0]{text}' <"$TMP/r$k.json" >"$TMP/got$k" 2>/dev/null
        [ -s "$TMP/want$q" ] && cmp -s "$TMP/got$k" "$TMP/want$q" && ok || bad "serve request $k differs from one machine: $(head -c 200 "$TMP/r$k.json")"
    done
else
    bad "serve --parallel ep did not start as a group of 3: $(tail -3 "$TMP/serve.log")"
fi
cc_stop "$SERVE_PID"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
