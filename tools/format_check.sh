#!/bin/sh
# tools/format_check.sh: how far the C sources (the files tools/format_files.sh
# lists) are from .clang-format. Prints each file clang-format would change
# with the number of its lines that would change, then "N lines of M would
# change (F files)"; exits 1 when any would, 2 when clang-format is missing.
# Changes nothing (`make format` applies it). Not part of `make test`: see
# docs/DESIGN.md (Build).
cd "$(dirname "$0")/.." || exit 2
command -v clang-format >/dev/null 2>&1 || { echo "format_check: clang-format is missing (apt-get install clang-format)"; exit 2; }
total=0; changed=0; nfiles=0
for f in $(sh tools/format_files.sh); do
    n=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^<')
    total=$((total + $(wc -l < "$f")))
    [ "$n" -eq 0 ] && continue
    echo "$n $f"
    changed=$((changed + n)); nfiles=$((nfiles + 1))
done
echo "$changed lines of $total would change ($nfiles files)"
[ "$changed" -eq 0 ]
