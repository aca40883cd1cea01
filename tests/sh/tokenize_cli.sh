#!/bin/sh
# tokenize_cli.sh: `cumulo tokenize` / `cumulo detokenize` on the shared
# vocab-only GGUFs: ids as llama.cpp gives them, --json, --special, --no-bos,
# and one-line errors with a non-zero exit. Ends with "N passed, N failed".
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
V=${CUMULO_SHARED:-../shared}/vocab
pass=0; fail=0
check() { # name, expected, actual
    if [ "$2" = "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1: want [$2] got [$3]" >&2; fi
}
check spm "1 15043 3186" "$($BIN tokenize "$V/ggml-vocab-llama-spm.gguf" "Hello world")"
check spm-no-bos "15043 3186" "$($BIN tokenize "$V/ggml-vocab-llama-spm.gguf" "Hello world" --no-bos)"
check bpe-special "128000 9906 220 128009" "$($BIN tokenize "$V/ggml-vocab-llama-bpe.gguf" "Hello <|eot_id|>" --special)"
check bpe-plain "128000 9906 83739 68 354 851 91 29" "$($BIN tokenize "$V/ggml-vocab-llama-bpe.gguf" "Hello <|eot_id|>")"
check json '{"ids":[5303,612,198],"pieces":["hi"," there","\u000a"]}' "$(printf 'hi there\n' | $BIN tokenize "$V/ggml-vocab-gpt-2.gguf" - --json)"
check json-bytes '{"ids":[1,29871,243,162,165,163],"pieces":["<s>"," ","\ufffd","\ufffd","\ufffd","\ufffd"]}' \
    "$($BIN tokenize "$V/ggml-vocab-llama-spm.gguf" "$(printf '\360\237\242\240')" --json)"
check detok "Hello world" "$($BIN detokenize "$V/ggml-vocab-llama-spm.gguf" 15043 3186)"
check detok-special "<s> Hello world" "$($BIN detokenize "$V/ggml-vocab-llama-spm.gguf" 1 15043 3186 --special)"
check detok-bpe "Hello, world!" "$($BIN detokenize "$V/ggml-vocab-gpt-2.gguf" 15496 11 995 0)"
out=$($BIN detokenize "$V/ggml-vocab-llama-spm.gguf" 99999 2>&1); rc=$?
check detok-range "1 cumulo: detokenize: token id 99999 is out of range (vocabulary of 32000)" "$rc $out"
out=$($BIN tokenize /nonexistent.gguf x 2>&1); rc=$?
check missing "1 cumulo: cannot open '/nonexistent.gguf': no such file" "$rc $out"
out=$($BIN tokenize 2>&1); rc=$?
check usage "1" "$rc"
check help "0" "$($BIN tokenize --help >/dev/null; echo $?)"
check help2 "0" "$($BIN detokenize --help >/dev/null; echo $?)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
