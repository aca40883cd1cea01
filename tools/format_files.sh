#!/bin/sh
# tools/format_files.sh: the C files `make format` (tools/format_apply.sh) and
# tools/format_check.sh cover, one a line: src, tests, fuzz, bench and tools,
# less generated files (a "GENERATED" in their first 5 lines, such as
# src/http/dashboard.c, which tests/sh/http_api.sh compares byte for byte with
# what tools/embed_dashboard.sh writes). build/ (build/gen) is never listed.
cd "$(dirname "$0")/.." || exit 2
find src tests fuzz bench tools -name '*.[ch]' | sort | while read -r f; do
    head -n 5 "$f" | grep -q 'GENERATED' || echo "$f"
done
