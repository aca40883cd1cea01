#!/bin/sh
# tests/run.sh: runs every unit-test binary (build/tests/test_*) and every
# script test (tests/sh/*.sh), each of which ends with "N passed, N failed".
# Prints one summary line in the same form and exits non-zero on any failure.
# CUMULO_TESTBIN / CUMULO_BIN choose other builds (sanitizers); CUMULO_ONLY=regex filters,
# CUMULO_SKIP=regex leaves tests out.
cd "$(dirname "$0")/.." || exit 1
TESTBIN=${CUMULO_TESTBIN:-build/tests}
export CUMULO_BIN=${CUMULO_BIN:-build/cumulo}
export CUMULO_SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
total_p=0; total_f=0; bad=""
run_one() {
    name=$1; shift
    if [ -n "$CUMULO_ONLY" ] && ! echo "$name" | grep -Eq "$CUMULO_ONLY"; then return; fi
    if [ -n "$CUMULO_SKIP" ] && echo "$name" | grep -Eq "$CUMULO_SKIP"; then return; fi
    start=$(date +%s)
    out=$("$@" 2>/tmp/cumulo-test-$$.err); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p'); f=$(echo "$line" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
    [ -z "$p" ] && p=0
    [ -z "$f" ] && f=0
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
    total_p=$((total_p + p)); total_f=$((total_f + f))
    secs=$(( $(date +%s) - start ))
    if [ "$f" -ne 0 ]; then
        bad="$bad $name"
        printf 'FAIL  %-28s %s (%ss)\n' "$name" "${line:-exit $rc}" "$secs"
        sed 's/^/      /' /tmp/cumulo-test-$$.err | tail -40
    else
        printf 'ok    %-28s %s (%ss)\n' "$name" "$line" "$secs"
    fi
    rm -f /tmp/cumulo-test-$$.err
}
for t in "$TESTBIN"/test_*; do
    case "$t" in *.d) continue ;; esac
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in tests/sh/*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s" .sh)" sh "$s"
done
[ -n "$bad" ] && echo "failed:$bad"
echo "$total_p passed, $total_f failed"
[ "$total_f" -eq 0 ]
