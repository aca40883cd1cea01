#!/bin/sh
# fuzz/run.sh SECONDS: runs every built libFuzzer target build-fuzz/fuzz_NAME
# for SECONDS on a temporary copy of its seed corpus fuzz/corpus/NAME/ (the
# committed corpus is never modified; new inputs found are thrown away).
# Crashes are saved under build-fuzz/crashes/. Prints exec/s and coverage per
# target and ends with "N passed, N failed"; a target passes when it ran the
# full time without a crash, a timeout or running out of memory.
cd "$(dirname "$0")/.." || exit 1
secs=${1:-20}
case "$secs" in ''|*[!0-9]*) echo "usage: sh fuzz/run.sh SECONDS" >&2; exit 2 ;; esac
mkdir -p build-fuzz/crashes
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cumulo-fuzz.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
passed=0; failed=0; bad=""
for bin in build-fuzz/fuzz_*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    target=$(basename "$bin")
    name=${target#fuzz_}
    corpus="$tmp/$name"
    mkdir -p "$corpus"
    if [ -d "fuzz/corpus/$name" ]; then cp -R "fuzz/corpus/$name/." "$corpus/"; fi
    log="$tmp/$name.log"
    "$bin" "$corpus" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="build-fuzz/crashes/$target-" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
    ncorp=$(ls "$corpus" | wc -l | tr -d ' ')
    if [ $rc -eq 0 ] && grep -q '^Done [0-9]* runs' "$log"; then
        passed=$((passed + 1))
        printf 'ok    %-20s %ss, %s execs, %s exec/s, %s, corpus %s\n' "$target" "$secs" \
            "${execs:-?}" "${rate:-?}" "${cov:-cov: ?}" "$ncorp"
    else
        failed=$((failed + 1)); bad="$bad $target"
        printf 'FAIL  %-20s exit %s (%s); artifacts in build-fuzz/crashes/\n' "$target" "$rc" "${cov:-cov: ?}"
        grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written|fuzz_[a-z_]*:' "$log" | head -20 | sed 's/^/      /'
    fi
done
[ -n "$bad" ] && echo "failed:$bad"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
