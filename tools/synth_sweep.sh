#!/bin/sh
# synth_sweep.sh: compare cumulo with llama.cpp on synthetic models of shapes,
# seeds, vocabularies and prompt lengths that the golden set does not hold
# (tests/data/synth, tools/gen_synth_refs.sh). Run by hand, never in CI (it
# needs node-llama-cpp: see ../shared/oracle/README.md).
#
#   sh tools/synth_sweep.sh [ORACLE_DIR] [NAME_REGEX] [CASES_FILE]
#
# Each case line of CASES_FILE (default: the list at the end of this script)
# is "NAME VOCAB PROMPTS SYNTH_ARGS...": VOCAB a file of ../shared/vocab
# (spm = ggml-vocab-llama-spm.gguf, llama-bpe, qwen2, gpt-2), PROMPTS "short"
# (the golden set's three prompts, spm only), "ids" (three prompts of random
# ids valid in every vocabulary) or "longN" (two prompts of N random ids,
# N <= 480: past gemma3 / gpt-oss sliding windows). For each case: `cumulo
# synth` writes the model, tools/synth_oracle.mjs stores llama.cpp's numbers
# (1 thread, F32 KV cache) in $SWEEP_DIR/NAME.json (default
# /tmp/synth_sweep), and test_synth_golden compares cumulo with them
# (CUMULO_SYNTH_DIR): the golden test's rules exactly. Prints one line per
# model and the failures; exit status 1 if any model disagrees. Each JSON
# records the CPU variant llama.cpp loaded ("ggml_cpu"): on a CPU without
# AVX512-BF16 its BF16 dots sum in another order than ours (vdpbf16ps's) and
# test_synth_golden judges BF16 models by its foreign-order bound.
# A reference that already exists is reused (delete it to recompute);
# SWEEP_CMP=0 only writes references.
set -eu
cd "$(dirname "$0")/.."
NLC=${1:-${TMPDIR:-/tmp}/nlc}
ONLY=${2:-.}
CASES=${3:-}
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
DIR=${SWEEP_DIR:-/tmp/synth_sweep}
[ -f "$NLC/node_modules/node-llama-cpp/package.json" ] || { echo "synth_sweep: no node-llama-cpp in $NLC" >&2; exit 1; }
make -s cumulo build/tests/test_synth_golden
cp tools/synth_oracle.mjs "$NLC/synth_oracle.mjs"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd) # absolute: the oracle runs in $NLC (gen_synth_refs.sh passes tests/data/synth)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# ids N SEED: N pseudo-random token ids in [100, 30000) (normal tokens in every vocabulary here), comma-separated
ids() {
    awk -v n="$1" -v s="$2" 'BEGIN { x = s; for (i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648;
        printf "%s%d", (i ? "," : ""), 100 + int(x / 65536) % 29900 } }'
}

# meta NAME VOCABFILE ARGS...: the JSON header test_synth_golden reads (the synth parameters)
meta() {
    name=$1; vf=$2; shift 2
    arch=""; dim=0; layers=0; heads=0; kv=0; ffn=0; ctx=4096; type=""; seed=1; tied=false; scaling=none; extra=""
    cmd=$*
    while [ $# -gt 0 ]; do
        case $1 in
            --arch) arch=$2; shift ;;
            --dim) dim=$2; shift ;;
            --layers) layers=$2; shift ;;
            --heads) heads=$2; shift ;;
            --kv-heads) kv=$2; shift ;;
            --ffn) ffn=$2; shift ;;
            --ctx) ctx=$2; shift ;;
            --type) type=$2; shift ;;
            --seed) seed=$2; shift ;;
            --tied) tied=true ;;
            --rope-scaling) scaling=$2; shift ;;
            --experts) extra="$extra,\"experts\":$2"; shift ;;
            --experts-used) extra="$extra,\"experts_used\":$2"; shift ;;
            --expert-ffn) extra="$extra,\"expert_ffn\":$2"; shift ;;
            --shared-ffn) extra="$extra,\"shared_ffn\":$2"; shift ;;
            --swa) extra="$extra,\"swa\":$2"; shift ;;
            --variant) extra="$extra,\"variant\":\"$2\""; shift ;;
            --rope-factor) extra="$extra,\"rope_factor\":$2"; shift ;;
            --rope-orig-ctx) extra="$extra,\"rope_orig_ctx\":$2"; shift ;;
            --rope-attn-factor) extra="$extra,\"rope_attn_factor\":$2"; shift ;;
            --yarn-beta-fast) extra="$extra,\"yarn_beta_fast\":$2"; shift ;;
            --yarn-beta-slow) extra="$extra,\"yarn_beta_slow\":$2"; shift ;;
            --yarn-log-mul) extra="$extra,\"yarn_log_mul\":$2"; shift ;;
            --rope-base) extra="$extra,\"rope_base\":$2"; shift ;;
            *) echo "synth_sweep: $name: unknown argument $1" >&2; return 1 ;;
        esac
        shift
    done
    printf '{"name":"%s","command":"cumulo synth %s --vocab %s","synth":{"arch":"%s","dim":%d,"layers":%d,"heads":%d,"kv_heads":%d,"ffn":%d,"ctx":%d,"type":"%s","seed":%d,"tied":%s,"rope_scaling":"%s"%s,"vocab":"vocab/%s"}}' \
        "$name" "$cmd" "$vf" "$arch" "$dim" "$layers" "$heads" "$kv" "$ffn" "$ctx" "$type" "$seed" "$tied" "$scaling" "$extra" "$vf"
}

run_case() { # NAME VOCAB PROMPTS ARGS...
    name=$1; voc=$2; pr=$3; shift 3
    echo "$name" | grep -Eq "$ONLY" || return 0
    case $voc in spm) vf=ggml-vocab-llama-spm.gguf ;; *) vf=ggml-vocab-$voc.gguf ;; esac
    out=$DIR/$name.json
    [ -s "$out" ] && return 0
    case $pr in
        short) prompts="1;1,450,4996,17354,1701,432,12500,975;1,15043,29892,920" ;;
        ids) prompts="$(ids 1 7);$(ids 8 11);$(ids 4 13)" ;;
        long*) n=${pr#long}; prompts="$(ids "$n" 17);$(ids "$n" 19)" ;;
        *) echo "synth_sweep: $name: unknown prompts $pr" >&2; return 1 ;;
    esac
    m=$(meta "$name" "$vf" "$@") || return 1
    # shellcheck disable=SC2068
    if ! ./cumulo synth $@ --vocab "$SHARED/vocab/$vf" -o "$TMP/$name.gguf" --threads 1 >"$TMP/synth.log" 2>&1; then
        echo "SYNTH-REJECTED $name: $(tail -1 "$TMP/synth.log")"
        return 0
    fi
    if ! (cd "$NLC" && node synth_oracle.mjs "$TMP/$name.gguf" "$out.tmp" "$prompts" 32 16 "$m") >"$TMP/oracle.log" 2>&1; then
        echo "LLAMACPP-REJECTED $name: $(grep -v '^prompt' "$TMP/oracle.log" | tail -2 | tr '\n' ' ')"
        rm -f "$out.tmp" "$TMP/$name.gguf"
        return 0
    fi
    mv "$out.tmp" "$out"
    rm -f "$TMP/$name.gguf"
    echo "ref $name"
}

if [ -n "$CASES" ]; then
    list=$(grep -v '^#' "$CASES")
else
    list=$(sed -n '/^#CASES$/,$p' "$0" | grep -v '^#')
fi
echo "$list" | while read -r line; do
    [ -n "$line" ] || continue
    # shellcheck disable=SC2086
    run_case $line </dev/null
done
[ "${SWEEP_CMP:-1}" = 0 ] && exit 0
CUMULO_SYNTH_DIR=$DIR CUMULO_SYNTH_ONLY="$ONLY" build/tests/test_synth_golden
exit $?
#CASES
# name vocab prompts synth-args (seeds from 7001; every line a shape the golden set lacks)
llama-h6kv2-hs48-f32 spm ids --arch llama --dim 288 --layers 2 --heads 6 --kv-heads 2 --ffn 416 --ctx 512 --type f32 --seed 7001
llama-h6kv2-hs48-q8_0 spm ids --arch llama --dim 288 --layers 2 --heads 6 --kv-heads 2 --ffn 416 --ctx 512 --type q8_0 --seed 7002
llama-h6kv2-hs48-q4_0 spm ids --arch llama --dim 288 --layers 3 --heads 6 --kv-heads 2 --ffn 416 --ctx 512 --type q4_0 --seed 7003
llama-hs80-kv1-f16 spm short --arch llama --dim 320 --layers 2 --heads 4 --kv-heads 1 --ffn 864 --ctx 512 --type f16 --seed 7004
llama-hs112-bf16 spm short --arch llama --dim 448 --layers 2 --heads 4 --kv-heads 4 --ffn 1024 --ctx 512 --type bf16 --seed 7005
llama-hs256-q8_0 spm ids --arch llama --dim 512 --layers 2 --heads 2 --kv-heads 1 --ffn 736 --ctx 512 --type q8_0 --seed 7006
llama-h10kv2-q4_0 spm ids --arch llama --dim 640 --layers 2 --heads 10 --kv-heads 2 --ffn 1728 --ctx 512 --type q4_0 --seed 7007
llama-h12-q4_k_m spm ids --arch llama --dim 768 --layers 3 --heads 12 --kv-heads 4 --ffn 2048 --ctx 512 --type q4_k_m --seed 7008
llama-hs48-q3_k spm ids --arch llama --dim 768 --layers 2 --heads 16 --kv-heads 4 --ffn 1280 --ctx 512 --type q3_k --seed 7009
llama-hs256-h3-q6_k spm ids --arch llama --dim 768 --layers 2 --heads 3 --kv-heads 1 --ffn 1536 --ctx 512 --type q6_k --seed 7010
llama3-hs80-f32 spm short --arch llama --dim 320 --layers 2 --heads 4 --kv-heads 2 --ffn 864 --ctx 512 --type f32 --seed 7011 --rope-scaling llama3
llama-bpe-long-f32 llama-bpe long300 --arch llama --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 768 --ctx 512 --type f32 --seed 7012
llamatied-bpe-q8_0 llama-bpe ids --arch llama --dim 256 --layers 2 --heads 4 --kv-heads 4 --ffn 640 --ctx 512 --type q8_0 --seed 7013 --tied
llama-yarn8-long-f32 spm long200 --arch llama --dim 384 --layers 2 --heads 6 --kv-heads 3 --ffn 768 --ctx 512 --type f32 --seed 7014 --rope-scaling yarn --rope-factor 8 --rope-orig-ctx 64 --yarn-beta-fast 16 --yarn-beta-slow 2
llama-linear35-f32 spm ids --arch llama --dim 320 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --ctx 512 --type f32 --seed 7015 --rope-scaling linear --rope-factor 3.5
llama-base50k-q8_0 gpt-2 ids --arch llama --dim 256 --layers 2 --heads 4 --kv-heads 1 --ffn 512 --ctx 512 --type q8_0 --seed 7016 --rope-base 50000
llama-iq4_nl-hs96 spm ids --arch llama --dim 576 --layers 2 --heads 6 --kv-heads 3 --ffn 1248 --ctx 512 --type iq4_nl --seed 7017
qwen2-hs96-q8_0 qwen2 ids --arch qwen2 --dim 576 --layers 2 --heads 6 --kv-heads 2 --ffn 1248 --ctx 512 --type q8_0 --seed 7018
qwen2-h14kv2-q4_0 qwen2 ids --arch qwen2 --dim 896 --layers 2 --heads 14 --kv-heads 2 --ffn 2432 --ctx 512 --type q4_0 --seed 7019
qwen2-long-f16 qwen2 long300 --arch qwen2 --dim 320 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --ctx 512 --type f16 --seed 7020
qwen3-hs80-kv1-f32 spm ids --arch qwen3 --dim 320 --layers 2 --heads 4 --kv-heads 1 --ffn 704 --ctx 512 --type f32 --seed 7021
qwen3-h6-q4_k_m qwen2 ids --arch qwen3 --dim 768 --layers 3 --heads 6 --kv-heads 2 --ffn 1280 --ctx 512 --type q4_k_m --seed 7022
qwen3-yarn-long-q8_0 qwen2 long250 --arch qwen3 --dim 256 --layers 2 --heads 2 --kv-heads 1 --ffn 512 --ctx 512 --type q8_0 --seed 7023 --rope-scaling yarn --rope-factor 4 --rope-orig-ctx 128
qwen2moe-e6u3-q8_0 qwen2 ids --arch qwen2moe --dim 288 --layers 2 --heads 6 --kv-heads 2 --ffn 416 --ctx 512 --type q8_0 --seed 7024 --experts 6 --experts-used 3 --expert-ffn 96 --shared-ffn 160
qwen3moe-e5u1-f32 spm ids --arch qwen3moe --dim 256 --layers 2 --heads 2 --kv-heads 1 --ffn 512 --ctx 512 --type f32 --seed 7025 --experts 5 --experts-used 1 --expert-ffn 128
qwen3moe-e12u3-q4_0 qwen2 ids --arch qwen3moe --dim 320 --layers 2 --heads 5 --kv-heads 1 --ffn 512 --ctx 512 --type q4_0 --seed 7026 --experts 12 --experts-used 3 --expert-ffn 96
mixtral-e4u3-f16 spm ids --arch llama --dim 320 --layers 2 --heads 5 --kv-heads 5 --ffn 224 --ctx 512 --type f16 --seed 7027 --experts 4 --experts-used 3
gemma3-swa3-l7-long-f32 spm long100 --arch gemma3 --dim 320 --layers 7 --heads 4 --kv-heads 1 --ffn 640 --ctx 512 --type f32 --seed 7028 --tied --swa 3
gemma3-swa16-long-q8_0 spm long200 --arch gemma3 --dim 256 --layers 6 --heads 4 --kv-heads 2 --ffn 512 --ctx 512 --type q8_0 --seed 7029 --tied --swa 16
gemma3-hs256-bf16 spm ids --arch gemma3 --dim 512 --layers 6 --heads 2 --kv-heads 1 --ffn 768 --ctx 512 --type bf16 --seed 7030 --tied --swa 5
gemma3-linear8-q8_0 spm long100 --arch gemma3 --dim 256 --layers 6 --heads 4 --kv-heads 1 --ffn 512 --ctx 512 --type q8_0 --seed 7031 --tied --swa 8 --rope-scaling linear --rope-factor 8
gemma3-untied-q4_k_m spm ids --arch gemma3 --dim 512 --layers 6 --heads 8 --kv-heads 2 --ffn 1024 --ctx 512 --type q4_k_m --seed 7032 --swa 4
phi3-hs80-f32 spm ids --arch phi3 --dim 320 --layers 2 --heads 4 --kv-heads 4 --ffn 864 --ctx 512 --type f32 --seed 7033
phi3-h6kv2-long-q8_0 spm long300 --arch phi3 --dim 576 --layers 2 --heads 6 --kv-heads 2 --ffn 1024 --ctx 512 --type q8_0 --seed 7034
gptoss-e6u3-long-f32 gpt-2 long100 --arch gpt-oss --dim 384 --layers 4 --heads 6 --kv-heads 2 --ffn 256 --ctx 512 --type f32 --seed 7035 --experts 6 --experts-used 3 --expert-ffn 192 --swa 5
gptoss-e4u1-mxfp4 spm ids --arch gpt-oss --dim 256 --layers 2 --heads 4 --kv-heads 4 --ffn 256 --ctx 512 --type mxfp4 --seed 7036 --experts 4 --experts-used 1 --expert-ffn 128 --swa 3
deepseek2v3-e12u6-f32 spm ids --arch deepseek2 --dim 512 --layers 4 --heads 4 --kv-heads 4 --ffn 768 --ctx 512 --type f32 --seed 7037 --experts 12 --experts-used 6 --expert-ffn 128 --variant v3
deepseek2lite-e6u3-q8_0 spm long100 --arch deepseek2 --dim 256 --layers 3 --heads 2 --kv-heads 2 --ffn 512 --ctx 512 --type q8_0 --seed 7038 --experts 6 --experts-used 3 --expert-ffn 256 --variant lite
deepseek2v3yarn-q4_k spm ids --arch deepseek2 --dim 512 --layers 3 --heads 8 --kv-heads 8 --ffn 512 --ctx 512 --type q4_k --seed 7039 --experts 8 --experts-used 2 --expert-ffn 256 --variant v3yarn
llama-q2_k-h12 qwen2 ids --arch llama --dim 768 --layers 2 --heads 12 --kv-heads 12 --ffn 1536 --ctx 512 --type q2_k --seed 7040
qwen3-mxfp4-hs48 spm ids --arch qwen3 --dim 384 --layers 2 --heads 8 --kv-heads 2 --ffn 640 --ctx 512 --type mxfp4 --seed 7041
# follow-ups of gemma3-hs256-bf16 (BF16 at dim 512: rounding amplification, docs/HISTORY.md session 22; session 23:
# llama.cpp sums BF16 in another order on CPUs without AVX512-BF16, its own builds 1e-2 apart; foreign-order bound)
gemma3-hs256-f32 spm ids --arch gemma3 --dim 512 --layers 6 --heads 2 --kv-heads 1 --ffn 768 --ctx 512 --type f32 --seed 7030 --tied --swa 5
gemma3-hs256-q8_0 spm ids --arch gemma3 --dim 512 --layers 6 --heads 2 --kv-heads 1 --ffn 768 --ctx 512 --type q8_0 --seed 7030 --tied --swa 5
gemma3-hs256-s7042-bf16 spm ids --arch gemma3 --dim 512 --layers 6 --heads 2 --kv-heads 1 --ffn 768 --ctx 512 --type bf16 --seed 7042 --tied --swa 5
llama-d512h2-bf16 spm ids --arch llama --dim 512 --layers 6 --heads 2 --kv-heads 1 --ffn 768 --ctx 512 --type bf16 --seed 7030 --tied
gemma3-d512h8-bf16 spm ids --arch gemma3 --dim 512 --layers 6 --heads 8 --kv-heads 2 --ffn 768 --ctx 512 --type bf16 --seed 7030 --tied --swa 5
gemma3-d256h1-bf16 spm ids --arch gemma3 --dim 256 --layers 6 --heads 1 --kv-heads 1 --ffn 768 --ctx 512 --type bf16 --seed 7030 --tied --swa 5
