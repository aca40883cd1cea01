#!/bin/sh
# synth_cli.sh: `cumulo synth` as a user meets it: --help, one-line errors with
# a non-zero exit for every bad argument, and a file that is the same bytes
# whatever the thread count (the golden comparison with llama.cpp is
# tests/unit/test_synth_golden.c, which calls the same generator).
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
SHARED=${CUMULO_SHARED:-../shared}
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

"$BIN" synth --help >"$T/help" 2>&1 && grep -q "q4_k_m" "$T/help" && ok || bad "--help"

BASE="--arch llama --dim 256 --layers 1 --heads 4 --kv-heads 2 --ffn 512 --vocab $VOCAB --seed 5"
# Each bad invocation: exit 1, exactly one line on stderr starting with "cumulo: ".
expect_err() {
    want=$1; shift
    "$BIN" synth "$@" >"$T/out" 2>"$T/err"; rc=$?
    if [ $rc -ne 1 ] || [ "$(wc -l <"$T/err")" -ne 1 ] || ! grep -Eq "^cumulo: .*($want)" "$T/err"; then
        bad "synth $*: rc $rc, stderr: $(cat "$T/err")"
    else ok; fi
}
# shellcheck disable=SC2086
{
expect_err "unknown architecture 'gpt2'" $BASE --type q8_0 -o "$T/x.gguf" --arch gpt2
expect_err "unknown type 'iq2_xs'" $BASE --type iq2_xs -o "$T/x.gguf"
expect_err "multiples of 256" $BASE --type q4_k --dim 288 -o "$T/x.gguf"
expect_err "not a multiple of kv-heads" $BASE --type q8_0 --kv-heads 3 -o "$T/x.gguf"
expect_err "missing -o" $BASE --type q8_0
expect_err "missing --vocab" --arch llama --dim 256 --layers 1 --heads 4 --ffn 512 --type q8_0 -o "$T/x.gguf"
expect_err "cannot open|no such file" --arch llama --dim 256 --layers 1 --heads 4 --ffn 512 --type q8_0 --vocab "$T/none.gguf" -o "$T/x.gguf"
expect_err "unknown rope scaling 'longrope'" $BASE --type q8_0 --rope-scaling longrope -o "$T/x.gguf"
expect_err "unknown option '--bogus'" $BASE --type q8_0 --bogus -o "$T/x.gguf"
expect_err "'--dim'" $BASE --type q8_0 --dim abc -o "$T/x.gguf"
expect_err "needs --experts" $BASE --type q8_0 --arch qwen3moe -o "$T/x.gguf"
expect_err "has no experts" $BASE --type q8_0 --arch qwen3 --experts 8 --experts-used 2 -o "$T/x.gguf"
expect_err "experts used 9 must be in" $BASE --type q8_0 --arch qwen3moe --experts 8 --experts-used 9 -o "$T/x.gguf"
expect_err "expert widths must be multiples of 256" $BASE --type q4_k --arch qwen3moe --experts 8 --experts-used 2 --expert-ffn 128 -o "$T/x.gguf"
}
[ ! -e "$T/x.gguf" ] && ok || bad "a failed synth left a file behind"

# shellcheck disable=SC2086
if "$BIN" synth $BASE --type q4_k_m --rope-scaling llama3 -o "$T/a.gguf" --threads 1 2>/dev/null &&
   "$BIN" synth $BASE --type q4_k_m --rope-scaling llama3 -o "$T/b.gguf" --threads 2 2>/dev/null; then
    ok
    cmp -s "$T/a.gguf" "$T/b.gguf" && ok || bad "1 and 2 threads wrote different files"
    [ "$(head -c 4 "$T/a.gguf")" = "GGUF" ] && ok || bad "not a GGUF file"
else
    bad "synth failed"
fi
# --vocab builtin (the demo without ../shared): no file needed; the model
# loads, encodes a prompt without <unk>, and what it generates prints as
# words and characters of that vocabulary (no control bytes).
if "$BIN" synth --arch llama --dim 256 --layers 2 --heads 8 --kv-heads 4 --ffn 512 --type q8_0 --vocab builtin \
    --seed 1 -o "$T/builtin.gguf" 2>"$T/err"; then
    ok
    "$BIN" info "$T/builtin.gguf" >"$T/info" 2>&1 && grep -qi "vocab" "$T/info" && ok || bad "info on the builtin-vocab model: $(head -3 "$T/info")"
    ids=$("$BIN" tokenize "$T/builtin.gguf" "Once upon a time, the little dog" 2>/dev/null)
    [ -n "$ids" ] && ! echo " $ids " | grep -q " 0 " && ok || bad "builtin vocab encodes with <unk>: '$ids'"
    "$BIN" run "$T/builtin.gguf" -p "Once upon a time" -n 40 --seed 3 --threads 1 >"$T/run" 2>/dev/null &&
        [ "$(wc -c <"$T/run")" -gt 20 ] && ! LC_ALL=C grep -q '[[:cntrl:]]' "$T/run" && ok ||
        bad "run on the builtin-vocab model: $(od -c "$T/run" | head -3)"
else
    bad "synth --vocab builtin: $(cat "$T/err")"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
