#!/bin/sh
# tests/sh/cluster_moe.sh: a mixture-of-experts model (synthetic qwen3moe, 8
# experts top 2, Q8_0) through a 3-stage pipeline of `cumulo node` processes
# on 127.0.0.1 (the nodes receive their layers' stacked expert tensors as
# streamed slices): greedy ids equal one machine, with --parallel pp and with
# the planner's choice (auto: a pipeline, or expert groups: never FFN rows).
# Tensor-parallel plans (experts cut by rows) are refused by the planner with
# a one-line error naming ep (the model's own refusal of a tensor-parallel
# slice is tests/unit/test_moe.c; expert parallelism is tests/sh/cluster_ep.sh).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
MOE=$TMP/moe.gguf
"$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$MOE" 2>/dev/null && ok || bad "synth failed"
for n in a b; do cc_start_node $n --no-mdns --cache "$TMP/cache_$n"; eval "PORT_$n=$NODE_PORT"; done
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && ok || { bad "nodes did not start"; exit 1; }
NODES=127.0.0.1:$PORT_a,127.0.0.1:$PORT_b
"$BIN" run "$MOE" -p "Once upon a time" -n 24 --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
[ -n "$one" ] && ok || bad "single machine run failed"
if "$BIN" run "$MOE" --cluster --nodes "$NODES" --parallel pp -p "Once upon a time" -n 24 --temp 0 --threads 1 --json \
    >"$TMP/pp.json" 2>"$TMP/pp.err"; then
    grep -q "pp plan, 3 stages" "$TMP/pp.err" && ok || bad "not a 3-stage plan: $(grep why "$TMP/pp.err")"
    [ "$(cc_jsonget "$TMP/pp.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "3-stage pipeline ids differ from one machine"
else
    bad "pipeline run failed: $(tail -3 "$TMP/pp.err")"
fi
if "$BIN" run "$MOE" --cluster --nodes "$NODES" --parallel auto -p "Once upon a time" -n 24 --temp 0 --threads 1 --json \
    >"$TMP/auto.json" 2>"$TMP/auto.err"; then
    ! grep -q "tp plan" "$TMP/auto.err" && ok || bad "auto picked a tensor-parallel plan: $(grep why "$TMP/auto.err")"
    [ "$(cc_jsonget "$TMP/auto.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "auto plan ids differ from one machine"
else
    bad "auto run failed: $(tail -3 "$TMP/auto.err")"
fi
if "$BIN" run "$MOE" --cluster --nodes "$NODES" --parallel tp -p "Once upon a time" -n 4 --temp 0 --threads 1 \
    >/dev/null 2>"$TMP/tp.err"; then
    bad "a tp plan of an MoE model was accepted"
else
    grep -q "tensor-parallel plans of a mixture-of-experts model (8 experts) are not supported; use --parallel ep" "$TMP/tp.err" \
        && ok || bad "tp refusal: $(tail -2 "$TMP/tp.err")"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
