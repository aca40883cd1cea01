#!/bin/sh
# service.sh: `cumulo service print|install|uninstall node|serve`: the systemd
# unit passes `systemd-analyze verify`, its ExecStart (unquoted as systemd
# does) starts a working node, install/uninstall write and remove the files
# (under CUMULO_SERVICE_ROOT: no systemctl here), and the launchd plist is a
# valid property list (Python's plistlib, as plutil -lint would check) with
# the same arguments. Ends with "N passed, N failed".
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/need.sh
need python3
BIN=$(pwd)/${CUMULO_BIN:-build/cumulo}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { d=$1; shift; if "$@"; then ok; else bad "$d"; fi; }
if [ "$(uname -s)" = Linux ]; then need systemd-analyze # (Debian's package systemd; scripts/setup.sh installs it)
else command -v systemd-analyze >/dev/null || need_skip "n/a: no systemd-analyze on $(uname -s)"; fi
TMP=$(mktemp -d)
NODEPID=""
trap '[ -n "$NODEPID" ] && kill $NODEPID 2>/dev/null; rm -rf "$TMP"' EXIT INT TERM

# 1. the unit: verified by systemd, arguments quoted as systemd reads them
$BIN service print node -- --name "shelf 1" --port 0 --port-file "$TMP/n.port" --cache "$TMP/cache" --no-mdns \
    --threads 1 --key-file "$TMP/key" >"$TMP/cumulo-node.service"
check "print node exits 0" [ -s "$TMP/cumulo-node.service" ]
out=$(systemd-analyze verify "$TMP/cumulo-node.service" 2>&1); rc=$?
check "systemd-analyze verify accepts the node unit ($out)" [ "$rc" = 0 ]
check "ExecStart runs this binary by its absolute path" grep -q "^ExecStart=$BIN node " "$TMP/cumulo-node.service"
check "a name with a space is quoted" grep -q '"shelf 1"' "$TMP/cumulo-node.service"
check "restarts on failure, starts at boot" sh -c "grep -q '^Restart=on-failure' '$TMP/cumulo-node.service' && grep -q '^WantedBy=multi-user.target' '$TMP/cumulo-node.service'"
# systemd's own reading of ExecStart (quotes, $$ and %% unescaped), then run it
python3 - "$TMP/cumulo-node.service" >"$TMP/argv" <<'EOF'
import shlex, sys
line = [l for l in open(sys.argv[1]) if l.startswith("ExecStart=")][0][len("ExecStart="):].strip()
args = [a.replace("$$", "$").replace("%%", "%") for a in shlex.split(line)]
print("\n".join(args))
EOF
CUMULO_KEY_FILE=$TMP/key $BIN key --new --force >/dev/null 2>&1
(IFS='
'; set -f; exec $(cat "$TMP/argv")) >"$TMP/node.log" 2>&1 &
NODEPID=$!
i=0
while [ ! -s "$TMP/n.port" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
check "the unit's command line starts a node ($(head -1 "$TMP/node.log"))" grep -q "cumulo node 'shelf 1' listening" "$TMP/node.log"
kill $NODEPID 2>/dev/null; wait $NODEPID 2>/dev/null; NODEPID=""

$BIN service print serve --user -- ../shared/models/stories260K-q8_0.gguf --port 8080 --alias 'a b$c%d' >"$TMP/cumulo-serve.service"
out=$(systemd-analyze verify "$TMP/cumulo-serve.service" 2>&1); rc=$?
check "systemd-analyze verify accepts the serve unit ($out)" [ "$rc" = 0 ]
check "a relative model path becomes absolute" grep -q "serve $(realpath ../shared/models/stories260K-q8_0.gguf) " "$TMP/cumulo-serve.service"
check "\$ and % are escaped for systemd" grep -q '"a b$$c%%d"' "$TMP/cumulo-serve.service"
check "a user service is wanted by default.target" grep -q '^WantedBy=default.target' "$TMP/cumulo-serve.service"
check "a user service names no User=" sh -c "! grep -q '^User=' '$TMP/cumulo-serve.service'"

# 2. install / uninstall write and remove the files (CUMULO_SERVICE_ROOT: nothing started)
export CUMULO_SERVICE_ROOT=$TMP/root
out=$($BIN service install node -- --name shelf1 2>&1); rc=$?
U=$TMP/root/etc/systemd/system/cumulo-node.service
check "install writes the system unit ($out)" [ "$rc" = 0 ] && [ -f "$U" ]
check "installed = printed" sh -c "$BIN service print node -- --name shelf1 | cmp -s - '$U'"
out=$(HOME=$TMP/home $BIN service install node --user -- --name shelf1 2>&1); rc=$?
check "install --user writes under ~/.config/systemd/user ($out)" [ -f "$TMP/root$TMP/home/.config/systemd/user/cumulo-node.service" ]
check "uninstall removes it" sh -c "$BIN service uninstall node 2>/dev/null && [ ! -e '$U' ]"
out=$($BIN service uninstall node 2>&1); rc=$?
check "uninstall of what is not there ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q 'not installed'"

# 3. launchd (macOS): a valid plist with the same arguments
CUMULO_SERVICE_KIND=launchd $BIN service install node -- --name 'x<y & z' --port 7070 2>/dev/null
P=$TMP/root/Library/LaunchDaemons/org.cumulo.node.plist
out=$(python3 - "$P" "$BIN" <<'EOF'
import plistlib, sys
d = plistlib.load(open(sys.argv[1], "rb"))
assert d["Label"] == "org.cumulo.node", d
assert d["ProgramArguments"] == [sys.argv[2], "node", "--name", "x<y & z", "--port", "7070"], d["ProgramArguments"]
assert d["RunAtLoad"] is True and d["KeepAlive"] == {"SuccessfulExit": False}
assert d["StandardErrorPath"] == "/Library/Logs/cumulo-node.log"
print("ok")
EOF
)
check "the launchd plist parses with the right arguments ($out)" [ "$out" = ok ]
command -v plutil >/dev/null && check "plutil -lint" plutil -lint "$P"
check "launchd uninstall" sh -c "CUMULO_SERVICE_KIND=launchd $BIN service uninstall node 2>/dev/null && [ ! -e '$P' ]"
unset CUMULO_SERVICE_ROOT

# 4. errors
out=$($BIN service install serve -- --port 8080 2>&1); rc=$?
check "serve without a model ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q MODEL"
out=$($BIN service start node 2>&1); rc=$?
check "an unknown action ($out)" [ "$rc" = 1 ]
out=$($BIN service install node --run-as no-such-user-here 2>&1); rc=$?
check "an unknown --run-as user ($out)" sh -c "[ $rc = 1 ] && echo '$out' | grep -q no-such-user-here"
check "--help" sh -c "$BIN service --help | grep -q systemd"
check "--help after -- belongs to the command" sh -c "$BIN service print node -- --help | grep -q 'ExecStart=.* node --help'"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
