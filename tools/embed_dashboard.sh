#!/bin/sh
# tools/embed_dashboard.sh: regenerate src/http/dashboard.c from
# src/http/dashboard.html (the dashboard is embedded in the binary as a byte
# array: no CDN, no files at run time). Run after editing the HTML;
# tests/sh/http_dashboard_embed.sh fails when the two disagree.
set -e
cd "$(dirname "$0")/.."
in=src/http/dashboard.html
out=${1:-src/http/dashboard.c}  # another path: to compare (tests)
{
    echo "/*"
    echo " * dashboard.c: GENERATED from dashboard.html by tools/embed_dashboard.sh; do not"
    echo " * edit. The dashboard page served at /, as bytes (a string literal this long"
    echo " * is beyond what ISO C promises compilers accept)."
    echo " */"
    echo '#include "http_impl.h"'
    echo ""
    echo "const unsigned char cm_http_dashboard_html[] = {"
    od -An -v -tu1 "$in" | awk '{ line = "   "; for (i = 1; i <= NF; i++) line = line " " $i ","; print line }'
    echo "    0};"
} > "$out.tmp.$$"
mv "$out.tmp.$$" "$out"
