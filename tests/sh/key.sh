#!/bin/sh
# key.sh: `cumulo key` end to end: creates a 0600 key file (and a 0700 parent)
# atomically, keeps it on a second run, refuses to replace it without --force,
# prints it only with --print, imports a key from stdin, rejects bad ones.
cd "$(dirname "$0")/../.." || exit 1
BIN=${CUMULO_BIN:-build/cumulo}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cumulo-key.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
export CUMULO_KEY_FILE="$tmp/conf/cumulo/cluster.key"
p=0; f=0
ok() { if [ "$1" = 0 ]; then p=$((p + 1)); else f=$((f + 1)); echo "FAIL: $2" >&2; fi; }

out=$("$BIN" key); ok $? "first run"
echo "$out" | grep -q "^created key $CUMULO_KEY_FILE (fingerprint [0-9a-f]\{16\})$"; ok $? "created line: $out"
[ "$(stat -c %a "$CUMULO_KEY_FILE" 2>/dev/null || stat -f %Lp "$CUMULO_KEY_FILE")" = 600 ]; ok $? "mode 0600"
[ "$(stat -c %a "$tmp/conf/cumulo" 2>/dev/null || stat -f %Lp "$tmp/conf/cumulo")" = 700 ]; ok $? "parent 0700"
grep -qx '[0-9a-f]\{64\}' "$CUMULO_KEY_FILE"; ok $? "64 hex digits"
fp1=$(echo "$out" | sed 's/.*fingerprint \(.*\))/\1/')
out2=$("$BIN" key); ok $? "second run"
echo "$out2" | grep -q "^using key .*(fingerprint $fp1)$"; ok $? "key kept: $out2"
"$BIN" key --new 2>"$tmp/err"; [ $? -ne 0 ]; ok $? "--new refuses to replace"
grep -q "already exists; add --force" "$tmp/err"; ok $? "--new message: $(cat "$tmp/err")"
hex=$("$BIN" key --print 2>/dev/null); ok $? "--print"
[ "$hex" = "$(cat "$CUMULO_KEY_FILE")" ]; ok $? "--print prints the key"
echo "$out2" | grep -q "$hex"; [ $? -ne 0 ]; ok $? "the key is not printed without --print"
# Another machine imports it: same fingerprint.
out3=$(echo "$hex" | "$BIN" key --import - --file "$tmp/other.key"); ok $? "--import -"
echo "$out3" | grep -q "fingerprint $fp1"; ok $? "imported key has the same fingerprint: $out3"
"$BIN" key --import 1234 --file "$tmp/bad.key" 2>"$tmp/err"; [ $? -ne 0 ]; ok $? "bad import refused"
grep -q "64 hex digits" "$tmp/err"; ok $? "bad import message"
[ ! -e "$tmp/bad.key" ]; ok $? "no file for a bad key"
out4=$("$BIN" key --new --force); ok $? "--new --force"
echo "$out4" | grep -q "fingerprint $fp1"; [ $? -ne 0 ]; ok $? "--new --force makes a different key"
"$BIN" key --help | grep -q "usage: cumulo key"; ok $? "--help"
ls "$tmp/conf/cumulo" | grep -q tmp; [ $? -ne 0 ]; ok $? "no temporary file left"
echo "$p passed, $f failed"
[ "$f" -eq 0 ]
