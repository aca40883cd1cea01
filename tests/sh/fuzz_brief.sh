#!/bin/sh
# fuzz_brief.sh: `make test` fuzzes every libFuzzer target briefly (15 s each)
# on its seed corpus; longer runs are `make fuzz-long`. Passes fuzz/run.sh's
# "N passed, N failed" line through. Without clang it cannot fuzz: it says so
# and counts as one failure, since the GGUF reader must be fuzzed in CI.
cd "$(dirname "$0")/../.." || exit 1
if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz_brief: clang not found (apt-get install clang); cannot fuzz"
    echo "0 passed, 1 failed"
    exit 1
fi
# the sanitizer library builds on every CPU (-j: clang's ASan+UBSan build of
# the AVX-512 kernel files took 4-6 min each one at a time on a Zen 1, 2026-12-06)
jobs=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
out=$(make --no-print-directory -j"$jobs" fuzz FUZZ_SECONDS=${FUZZ_SECONDS:-15} 2>&1); rc=$?
printf '%s\n' "$out" | grep -vE '^(clang|ar|make)' | grep -v '^ ' | grep -vE '^[0-9]+ passed, [0-9]+ failed' | tail -40 >&2
line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
if [ -z "$line" ]; then
    printf '%s\n' "$out" | tail -20 >&2
    echo "0 passed, 1 failed"
    exit 1
fi
echo "$line"
[ $rc -eq 0 ]
