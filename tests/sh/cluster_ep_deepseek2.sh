#!/bin/sh
# tests/sh/cluster_ep_deepseek2.sh (issue 13, deepseek2 with expert
# parallelism): synthetic DeepSeek-V3-style models (MLA, 1 leading dense
# layer + 2 MoE layers, sigmoid routing with exp_probs_b, 4 expert groups of
# which 2 are used, 1 shared expert; Q8_0) and a V2-Lite-style one, on this
# process + two `cumulo node`s on 127.0.0.1 with `--parallel ep`:
#   1. greedy ids equal one machine;
#   2. the expert exchange (coordinator's tp.data_bytes + each node's line)
#      sums to rows x L_moe x k x 2 peers x n_embd x 4, with L_moe the MoE
#      layers only (the leading dense layer exchanges nothing);
#   3. each node streamed only its experts (as cluster_ep.sh);
#   4. `cumulo info` says the KV cache holds the latent: per token
#      n_layer x (kv_lora_rank + rope dims) x 4 bytes (3 x 288 x 4 = 3456);
#   5. a 3-stage pipeline and the planner's choice give the same ids (and a
#      pipeline of a file with the older unsplit attn_kv_b);
#   6. --parallel tp: query heads split over the group, the experts an
#      expert group: the same ids, and the all-reduces counted.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need perl
. tests/sh/lib/ep_common.sh
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
PROMPT="Once upon a time"
N=24

V3=$TMP/ds-v3.gguf
LITE=$TMP/ds-lite.gguf
"$BIN" synth --arch deepseek2 --variant v3 --dim 256 --layers 3 --heads 4 --ffn 768 --expert-ffn 256 --experts 16 \
    --experts-used 4 --type q8_0 --seed 4003 --vocab "$VOCAB" -o "$V3" 2>/dev/null && ok || bad "synth v3 failed"
"$BIN" synth --arch deepseek2 --variant lite --dim 256 --layers 3 --heads 4 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 4008 --vocab "$VOCAB" -o "$LITE" 2>/dev/null && ok || bad "synth lite failed"
"$BIN" info "$V3" >"$TMP/info.txt" 2>&1
grep -q 'KV cache per token: 3456 bytes' "$TMP/info.txt" && ok || bad "info does not give the latent's 3456 bytes per token: $(grep -i 'kv' "$TMP/info.txt")"
ep_case v3 "$V3" 2
ep_case lite "$LITE" 2

# 5. a 3-stage pipeline (each stage its layers' latent cache; stage 0 holds the
# dense layer) and the planner's choice: ids equal one machine; tp refused
for n in a b; do cc_start_node "pp$n" --no-mdns; eval "PORT_$n=$NODE_PORT"; done
NODES=127.0.0.1:$PORT_a,127.0.0.1:$PORT_b
"$BIN" run "$V3" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
for mode in pp auto; do
    if "$BIN" run "$V3" --cluster --nodes "$NODES" --parallel $mode -p "$PROMPT" -n $N --temp 0 --threads 1 --json \
        >"$TMP/$mode.json" 2>"$TMP/$mode.err"; then
        [ $mode = auto ] || grep -q "pp plan, 3 stages" "$TMP/$mode.err" && ok || bad "$mode: not a 3-stage plan: $(grep why "$TMP/$mode.err")"
        [ "$(cc_jsonget "$TMP/$mode.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "$mode: ids differ from one machine"
    else
        bad "$mode run failed: $(tail -3 "$TMP/$mode.err")"
    fi
done
# the unsplit attn_kv_b layout (split at load; each stage's sparse file) through the pipeline too
KVB=$TMP/ds-v3kvb.gguf
"$BIN" synth --arch deepseek2 --variant v3kvb --dim 256 --layers 3 --heads 4 --ffn 768 --expert-ffn 256 --experts 16 \
    --experts-used 4 --type q8_0 --seed 4203 --vocab "$VOCAB" -o "$KVB" 2>/dev/null && ok || bad "synth v3kvb failed"
"$BIN" run "$KVB" -p "$PROMPT" -n $N --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
one_kvb=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
if "$BIN" run "$KVB" --cluster --nodes "$NODES" --parallel pp -p "$PROMPT" -n $N --temp 0 --threads 1 --json \
    >"$TMP/kvb.json" 2>"$TMP/kvb.err"; then
    [ -n "$one_kvb" ] && [ "$(cc_jsonget "$TMP/kvb.json" 'join(",", @{$j->{tokens}})')" = "$one_kvb" ] && ok ||
        bad "v3kvb pp: ids differ from one machine"
else
    bad "v3kvb pp run failed: $(tail -3 "$TMP/kvb.err")"
fi
# 6. tensor parallelism (--parallel tp): each member its query heads (and the
# dense layer's FFN rows; the latent computed and cached whole on each), the
# MoE layers as an expert group: ids equal one machine; per step the group
# runs one all-reduce per layer's attention and per dense FFN plus one expert
# exchange per MoE layer (3 + 1 + 2 = 6), where ep alone runs the 2 exchanges
"$BIN" run "$V3" --cluster --nodes "$NODES" --parallel ep -p "$PROMPT" -n $N --temp 0 --threads 1 --json \
    >"$TMP/ep3.json" 2>/dev/null
if "$BIN" run "$V3" --cluster --nodes "$NODES" --parallel tp -p "$PROMPT" -n $N --temp 0 --threads 1 --json \
    >"$TMP/tp.json" 2>"$TMP/tp.err"; then
    [ "$(cc_jsonget "$TMP/tp.json" 'join(",", @{$j->{tokens}})')" = "$one" ] && ok || bad "tp: ids differ from one machine"
    heads=$(sed -n 's/^.* 0     0-2     \([0-9]*-[0-9]*\) .*/\1/p' "$TMP/tp.err" | tr '\n' ' ')
    [ "$(echo "$heads" | wc -w)" -eq 3 ] && [ "$heads" != "0-3 0-3 0-3 " ] && ok || bad "tp: heads not split: '$heads'"
    grep -q "expert parallel: 3 members" "$TMP/tp.err" && ok || bad "tp: the MoE layers are not an expert group"
    ops_tp=$(cc_jsonget "$TMP/tp.json" '$j->{tp}{ops}')
    ops_ep=$(cc_jsonget "$TMP/ep3.json" '$j->{tp}{ops}')
    [ -n "$ops_ep" ] && [ "$ops_ep" -gt 0 ] && [ "$ops_tp" -eq $((ops_ep * 3)) ] && ok ||
        bad "tp: $ops_tp collective ops, expected 3 x the ep run's $ops_ep"
    echo "tp: heads per member $heads; $ops_tp collective ops (ep: $ops_ep), $(cc_jsonget "$TMP/tp.json" '$j->{tp}{data_bytes}') data bytes"
else
    bad "tp run failed: $(tail -3 "$TMP/tp.err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
