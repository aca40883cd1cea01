#!/bin/sh
# tune_cli.sh: the kernels' knobs at model load (kernels/tune.h,
# model/tune_cache.c) as a user meets them, in a temporary CUMULO_TUNE_DIR:
# the first load of a model with enough f16 weights measures and writes this
# CPU's file, the next reads it (bench --json says which, with the values);
# CUMULO_TUNE=force measures again, CUMULO_TUNE=0 uses the defaults and
# writes nothing; a corrupt or foreign file costs one warning line and is
# measured and written anew; a model too small for any knob writes nothing.
# Greedy text is the same under the defaults and under every other value
# (the file edited by hand). The knobs are the avx512 table's: on another
# CPU the runs say "none" and only that is checked.
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export CUMULO_TUNE_DIR="$T/tune"
unset CUMULO_TUNE
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
src() { sed -n 's/.*"tune":{"source":"\([a-z ]*\)".*/\1/p' "$T/json"; }
bench() { "$BIN" bench "$1" --threads 1 --prompt 8 --gen 2 --reps 1 --bw-mib 16 --json >"$T/json" 2>"$T/err"; }

# 1 layer of dim 2048, ffn 5632 in f16: 89 MiB of matmul weights (over CM_TUNE_MIN_BYTES)
"$BIN" synth --arch llama --dim 2048 --layers 1 --heads 16 --kv-heads 4 --ffn 5632 --type f16 \
    --vocab builtin --seed 5 -o "$T/big.gguf" >/dev/null 2>&1 || bad "synth big"
"$BIN" synth --arch llama --dim 256 --layers 1 --heads 4 --kv-heads 2 --ffn 512 --type f16 \
    --vocab builtin --seed 5 -o "$T/small.gguf" >/dev/null 2>&1 || bad "synth small"

bench "$T/small.gguf" && [ "$(src)" = none ] && [ ! -e "$T/tune" ] && ok || bad "small model: $(src), $(ls "$T/tune" 2>&1)"

bench "$T/big.gguf"
first=$(src)
if [ "$first" = none ]; then
    echo "skip: n/a: no avx512 table on this CPU: the knobs' cache (only 'none' checked)"
    echo "$pass passed, $fail failed, 1 skipped"
    [ $fail -eq 0 ]; exit
fi
[ "$first" = measured ] && ok || bad "first load: '$first', $(cat "$T/err")"
grep -q '"avx512.f16.gemv.pfd":[0-9]' "$T/json" && grep -q '"avx512.f16.gemm.pass_kib":[0-9]' "$T/json" &&
    grep -q '"measured_ms":{' "$T/json" && ok || bad "json: $(cat "$T/json")"
grep -q '^bench: kernel knobs: measured' "$T/err" && ok || bad "stderr line: $(cat "$T/err")"
ms=$(sed -n 's/.*"tune":{"source":"measured","ms":\([0-9.]*\).*/\1/p' "$T/json")
echo "measured in $ms ms"
f=$(ls "$T/tune"/*.tune 2>/dev/null | head -1)
[ -n "$f" ] && head -1 "$f" | grep -qx 'cumulo-tune 1' && grep -q '^sig .*; cpus [0-9]' "$f" && ok ||
    bad "cache file: $(ls -la "$T/tune" 2>&1)"

bench "$T/big.gguf" && [ "$(src)" = cache ] && ok || bad "second load: $(src)"
CUMULO_TUNE=force bench "$T/big.gguf" && [ "$(src)" = measured ] && ok || bad "force: $(src)"
rm -rf "$T/tune"
CUMULO_TUNE=0 bench "$T/big.gguf" && [ "$(src)" = off ] && [ ! -e "$T/tune" ] &&
    grep -q '"avx512.f16.gemv.pfd"' "$T/json" && ok || bad "off: $(src), $(cat "$T/json")"
grep -q '"knobs":{"avx512.f16.gemv.pfd":2048,"avx512.f16.gemm.pass_kib":1024}' "$T/json" && ok ||
    bad "off reports the defaults: $(cat "$T/json")"

# corrupt and foreign files: one warning line each, measured again, a good file written
bench "$T/big.gguf" && f=$(ls "$T/tune"/*.tune | head -1) && good=$(cat "$f")
for kind in garbage foreign value; do
    case $kind in
    garbage) head -c 3000 /dev/urandom >"$f" ;;
    foreign) printf '%s\n' "$good" | sed 's/^sig .*/sig AuthenticAMD 25 17 1; avx2; l2 1048576; cpus 2/' >"$f" ;;
    value) printf '%s\n' "$good" | sed 's/^avx512.f16.gemv.pfd .*/avx512.f16.gemv.pfd 12345/' >"$f" ;;
    esac
    bench "$T/big.gguf"; rc=$?
    n=$(grep -c "ignoring the kernel tuning file" "$T/err")
    [ $rc -eq 0 ] && [ "$n" -eq 1 ] && [ "$(src)" = measured ] && head -1 "$f" | grep -qx 'cumulo-tune 1' && ok ||
        bad "$kind file: rc $rc, $n warnings, $(src), $(cat "$T/err")"
done

# the same greedy text under the defaults and under each other value of the knobs
run() { "$BIN" run "$T/big.gguf" -p "the cat sat on" -n 12 --temp 0 --threads 1 2>/dev/null; }
CUMULO_TUNE=0 run >"$T/ref.txt"
[ -s "$T/ref.txt" ] && ok || bad "no text"
sig=$(sed -n 's/^sig //p' "$f")
for v in 1024:256 3072:512 2048:1024; do
    printf 'cumulo-tune 1\nsig %s\navx512.f16.gemv.pfd %s\navx512.f16.gemm.pass_kib %s\n' "$sig" "${v%:*}" "${v#*:}" >"$f"
    run >"$T/out.txt"
    cmp -s "$T/ref.txt" "$T/out.txt" && ok || bad "text differs with $v"
done
bench "$T/big.gguf" && [ "$(src)" = cache ] && grep -q '"avx512.f16.gemm.pass_kib":1024' "$T/json" && ok ||
    bad "hand-written file: $(src), $(cat "$T/json")"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
