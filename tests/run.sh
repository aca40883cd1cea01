#!/bin/sh
# tests/run.sh: runs every unit-test binary (build/tests/test_*) and every
# script test (tests/sh/*.sh). Each test ends with a line "N passed, N failed"
# (", N skipped" may follow), and reports what it could not run as lines
# "skip: REASON" (stdout or stderr; one line per skipped part). Prints one
# line per test and a last line "N passed, N failed, N skipped" after naming
# every skip; exits non-zero on any failure.
#
# A test fails when it reports a failure, exits non-zero, prints no summary
# line, reports nothing at all (0 passed and no skip), or runs past its time
# limit (a hang is a failure with the test's name; limits below, times
# CUMULO_TIMEOUT_SCALE, e.g. 4 under the sanitizers).
#
# CI=true: a skip fails the run, unless its reason starts with "n/a:" (not
# applicable to this platform, e.g. netns on macOS): every tool the setup
# installs (curl, netns/ip, avahi, sshd, chromium, clang, qemu, node) must be
# there, and CUMULO_ONLY / CUMULO_SKIP / a missing test binary fail too.
#
# CUMULO_TESTBIN / CUMULO_BIN choose other builds (sanitizers); CUMULO_ONLY=regex
# runs only the matching tests, CUMULO_SKIP=regex leaves tests out (both are
# announced at the start and counted at the end).
cd "$(dirname "$0")/.." || exit 1
TESTBIN=${CUMULO_TESTBIN:-build/tests}
export CUMULO_BIN=${CUMULO_BIN:-build/cumulo}
export CUMULO_SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
SCALE=${CUMULO_TIMEOUT_SCALE:-1}
CI_MODE=""
case "${CI:-}" in true | 1 | yes) CI_MODE=1 ;; esac
OUT=$(mktemp -d) || exit 1
trap 'rm -rf "$OUT"' EXIT
# the kernels' knob choices of models loaded by tests go to a temporary
# folder, never to the user's cache (tests/sh/tune_cli.sh sets its own)
export CUMULO_TUNE_DIR=${CUMULO_TUNE_DIR:-$OUT/tune}
total_p=0; total_f=0; total_s=0; bad=""; left_out=0; n_run=0
: >"$OUT/skips"

# Time limit of one test in seconds (before SCALE): generous, several times
# what the test takes on a loaded 2-core machine.
limit_for() {
    case $1 in
        chaos | fuzz_brief) echo 3000 ;; # fuzz_brief builds the sanitizer library first (~10-20 min on 2 cores)
        neon | cluster_hostile | cluster_recover | cluster_recover_seeded | cluster_hybrid | \
            cluster_deadline | cluster_join | cluster_tp | test_synth_golden) echo 1200 ;;
        *) echo 600 ;;
    esac
}
if command -v timeout >/dev/null 2>&1; then TIMEOUT=timeout
elif command -v gtimeout >/dev/null 2>&1; then TIMEOUT=gtimeout
else TIMEOUT=""; fi

# with_limit SECONDS CMD...: run CMD; exit 124 if it ran past SECONDS (its
# process group is sent TERM, then KILL 10 s later).
with_limit() {
    lim=$1; shift
    if [ -n "$TIMEOUT" ]; then "$TIMEOUT" -k 10 "$lim" "$@"; return; fi
    "$@" &
    cpid=$!
    (sleep "$lim"; kill -TERM "$cpid" 2>/dev/null && { touch "$OUT/timedout"; sleep 10; kill -KILL "$cpid" 2>/dev/null; }) &
    wpid=$!
    wait "$cpid"
    crc=$?
    kill "$wpid" 2>/dev/null
    if [ -f "$OUT/timedout" ]; then rm -f "$OUT/timedout"; return 124; fi
    return $crc
}

selected() {
    if [ -n "$CUMULO_ONLY" ] && ! echo "$1" | grep -Eq "$CUMULO_ONLY"; then return 1; fi
    if [ -n "$CUMULO_SKIP" ] && echo "$1" | grep -Eq "$CUMULO_SKIP"; then return 1; fi
    return 0
}

run_one() {
    name=$1; shift
    if ! selected "$name"; then left_out=$((left_out + 1)); return; fi
    n_run=$((n_run + 1))
    lim=$(( $(limit_for "$name") * SCALE ))
    start=$(date +%s)
    with_limit "$lim" "$@" >"$OUT/out" 2>"$OUT/err"
    rc=$?
    secs=$(( $(date +%s) - start ))
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/out" | tail -1)
    p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
    f=$(echo "$line" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p')
    s=$(echo "$line" | sed -n 's/.* failed, \([0-9]*\) skipped.*/\1/p')
    [ -z "$p" ] && p=0
    [ -z "$f" ] && f=0
    [ -z "$s" ] && s=0
    cat "$OUT/out" "$OUT/err" | sed -n 's/^skip: //p' >"$OUT/why"
    nwhy=$(wc -l <"$OUT/why" | tr -d ' ')
    [ "$nwhy" -gt "$s" ] && s=$nwhy
    [ "$s" -gt 0 ] && [ "$nwhy" -eq 0 ] && echo "(no reason given)" >"$OUT/why"
    why=""
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="TIMEOUT: still running after ${lim}s (limit; a hang)"; f=$((f + 1))
    elif [ -z "$line" ]; then
        why="no summary line (exit $rc)"; f=$((f + 1))
    elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        why="exit $rc"; f=1
    elif [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then
        why="reported 0 passed and no skip: it checked nothing"; f=1
    fi
    while IFS= read -r r; do
        echo "$name: $r" >>"$OUT/skips"
        case "$r" in
            n/a:*) ;;
            *) if [ -n "$CI_MODE" ]; then f=$((f + 1)); why="${why:+$why; }CI=true: skipped: $r"; fi ;;
        esac
    done <"$OUT/why"
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
    sk=""; [ "$s" -gt 0 ] && sk=", $s skipped"
    case "$line" in *" $s skipped"*) sk="" ;; esac # (said already)
    if [ "$f" -ne 0 ]; then
        bad="$bad $name"
        printf 'FAIL  %-28s %s (%ss)\n' "$name" "${line:-}${why:+ [$why]}" "$secs"
        tail -40 "$OUT/err" | sed 's/^/      /'
    elif [ "$s" -gt 0 ]; then
        printf 'SKIP  %-28s %s%s (%ss): %s\n' "$name" "$line" "$sk" "$secs" "$(head -1 "$OUT/why")"
    else
        printf 'ok    %-28s %s (%ss)\n' "$name" "$line" "$secs"
    fi
}

# What was asked: filters and an empty build are said out loud.
if [ -n "$CUMULO_ONLY$CUMULO_SKIP" ]; then
    echo "tests/run.sh: a PARTIAL run:${CUMULO_ONLY:+ CUMULO_ONLY='$CUMULO_ONLY'}${CUMULO_SKIP:+ CUMULO_SKIP='$CUMULO_SKIP'}"
fi
n_bins=0
for t in "$TESTBIN"/test_*; do
    case "$t" in *.d) continue ;; esac
    [ -x "$t" ] || continue
    n_bins=$((n_bins + 1))
    run_one "$(basename "$t")" "$t"
done
for s in tests/sh/*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s" .sh)" sh "$s"
done
if [ "$n_bins" -eq 0 ]; then
    echo "!!!!!! no unit-test binaries in '$TESTBIN' (build them: make tests)"
    echo "run.sh: no unit-test binaries in '$TESTBIN'" >>"$OUT/skips"
    total_s=$((total_s + 1))
    [ -n "$CI_MODE" ] && { total_f=$((total_f + 1)); bad="$bad (no-test-binaries)"; }
fi
if [ "$left_out" -gt 0 ]; then
    echo "left out by CUMULO_ONLY/CUMULO_SKIP: $left_out tests (ran $n_run)"
    [ -n "$CI_MODE" ] && { total_f=$((total_f + 1)); bad="$bad (CUMULO_ONLY/CUMULO_SKIP-under-CI)"; }
fi
[ "$n_run" -eq 0 ] && { echo "!!!!!! no test ran"; total_f=$((total_f + 1)); bad="$bad (nothing-ran)"; }
if [ -s "$OUT/skips" ]; then
    echo "skipped (${CI_MODE:+fails under CI=true unless n/a; }each with its reason):"
    sed 's/^/  skip /' "$OUT/skips"
fi
[ -n "$bad" ] && echo "failed:$bad"
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
