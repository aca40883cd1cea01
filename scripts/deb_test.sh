#!/bin/sh
# deb_test.sh (`make deb-test`): build the Debian package from the committed
# tree (git archive into a temporary folder, dpkg-buildpackage -us -uc -b),
# install it with dpkg -i, run what a user runs first (cumulo --version, the
# demo from /usr/share/cumulo/demo.sh, `cumulo service print node` naming
# /usr/bin/cumulo), then remove it (dpkg -r). Needs root and debhelper
# (apt-get install debhelper); says so and exits 1 without them. Ends with
# "N passed, N failed".
cd "$(dirname "$0")/.." || exit 1
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
[ "$(id -u)" = 0 ] || { echo "deb_test: needs root (dpkg -i)"; echo "0 passed, 1 failed"; exit 1; }
command -v dpkg-buildpackage >/dev/null && command -v dh >/dev/null ||
    { echo "deb_test: needs dpkg-dev and debhelper (apt-get install debhelper)"; echo "0 passed, 1 failed"; exit 1; }
dpkg -s cumulo >/dev/null 2>&1 && { echo "deb_test: a cumulo package is installed already; remove it first (dpkg -r cumulo)"; echo "0 passed, 1 failed"; exit 1; }
TMP=$(mktemp -d)
trap 'dpkg -r cumulo >/dev/null 2>&1; rm -rf "$TMP"' EXIT INT TERM
mkdir "$TMP/cumulo-0.1.0"
git archive HEAD | tar -x -C "$TMP/cumulo-0.1.0"
(cd "$TMP/cumulo-0.1.0" && dpkg-buildpackage -us -uc -b) >"$TMP/build.log" 2>&1; rc=$?
deb=$(ls "$TMP"/cumulo_*.deb 2>/dev/null | head -1)
check "dpkg-buildpackage builds a .deb (exit $rc; $(tail -1 "$TMP/build.log"))" [ "$rc" = 0 ] && [ -n "$deb" ]
[ -n "$deb" ] || { tail -30 "$TMP/build.log" >&2; echo "$pass passed, $fail failed"; exit 1; }
echo "deb_test: $(basename "$deb"), $(stat -c %s "$deb") bytes" >&2
dpkg-deb -c "$deb" >"$TMP/contents"
check "the package holds /usr/bin/cumulo" grep -q ' ./usr/bin/cumulo$' "$TMP/contents"
check "and the demo" grep -q ' ./usr/share/cumulo/demo.sh$' "$TMP/contents"
out=$(dpkg -i "$deb" 2>&1); rc=$?
check "dpkg -i installs it ($out)" [ "$rc" = 0 ]
out=$(/usr/bin/cumulo --version 2>&1)
check "cumulo --version ($out)" sh -c "echo '$out' | grep -q '^cumulo 0.1.0'"
# the demo as a user with no checkout: a random-weight model, three nodes, a story
out=$(cd / && HOME=$TMP/home sh /usr/share/cumulo/demo.sh 2>"$TMP/demo.err"); rc=$?
check "the installed demo runs ($(tail -1 "$TMP/demo.err"))" [ "$rc" = 0 ] && [ -n "$out" ]
check "it says its model is random" grep -q 'RANDOM-WEIGHT' "$TMP/demo.err"
check "service units name the installed binary" sh -c "/usr/bin/cumulo service print node | grep -q '^ExecStart=/usr/bin/cumulo node'"
out=$(dpkg -r cumulo 2>&1); rc=$?
check "dpkg -r removes it ($out)" [ "$rc" = 0 ] && [ ! -e /usr/bin/cumulo ]
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
