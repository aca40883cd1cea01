#!/bin/sh
# cluster_launch.sh: `cumulo launch` against a real OpenSSH server: a private
# sshd on 127.0.0.1 with its own host key and an authorized_keys holding a
# throwaway key. Launch copies the binary (none there yet) and the cluster key
# (mode 0600), starts the node, and the node then serves a pipeline stage
# whose output equals a single machine's; a second launch finds the binary
# and does not copy it; --stop ends the node. Failures explain themselves
# within seconds: a remote whose libmicrohttpd is broken (LD_LIBRARY_PATH set
# by authorized_keys to a folder with an empty libmicrohttpd.so.12) makes the
# pre-flight print the loader's error line; a node that exits on start (its
# port is taken) makes launch print the node log's last line, not wait 30 s.
# Everything is killed on exit.
cd "$(dirname "$0")/../.." || exit 1
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
SHARED=${CUMULO_SHARED:-$(cd .. && pwd)/shared}
M=$(realpath "$SHARED/models")
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
. tests/sh/lib/need.sh
SSHD=/usr/sbin/sshd
[ -x "$SSHD" ] || need_skip "needs $SSHD (openssh-server), which is not installed here (scripts/setup.sh installs it)"
need ssh ssh-keygen perl
TMP=$(mktemp -d /tmp/cmtest-launch.XXXXXX)
chmod 700 "$TMP"
SSHD_PID=""
cleanup() {
    [ -n "$LAUNCHED" ] && "$BIN" launch "$(id -un)@127.0.0.1:$SPORT" --identity "$TMP/id" --ssh-opt "UserKnownHostsFile=$TMP/known" \
        --ssh-opt StrictHostKeyChecking=accept-new --remote-dir "$TMP/remote" --stop >/dev/null 2>&1
    [ -f "$TMP/remote/node.pid" ] && kill "$(cat "$TMP/remote/node.pid")" 2>/dev/null
    [ -n "$SSHD_PID" ] && kill "$SSHD_PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
jsonget() {
    perl -MJSON::PP -e 'local $/; open my $f, "<", $ARGV[0] or exit 2; my $j = decode_json(<$f>); print eval $ARGV[1]' "$1" "$2"
}

# free ports from the kernel
ports=$(perl -MIO::Socket::INET -e 'for (1..2) { my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", Listen => 1) or die; push @s, $s; print $s->sockport, " " }')
SPORT=${ports%% *}
NPORT=$(echo "$ports" | cut -d' ' -f2)
ssh-keygen -q -t ed25519 -N '' -f "$TMP/hostkey" && ssh-keygen -q -t ed25519 -N '' -f "$TMP/id" || bad "ssh-keygen"
cp "$TMP/id.pub" "$TMP/authorized_keys"
chmod 600 "$TMP/authorized_keys"
cat >"$TMP/sshd_config" <<CFG
Port $SPORT
ListenAddress 127.0.0.1
HostKey $TMP/hostkey
AuthorizedKeysFile $TMP/authorized_keys
PidFile $TMP/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
Subsystem sftp /usr/lib/openssh/sftp-server
CFG
[ -d /run/sshd ] || mkdir -p /run/sshd
"$SSHD" -D -f "$TMP/sshd_config" -E "$TMP/sshd.log" &
SSHD_PID=$!
i=0
while ! perl -MIO::Socket::INET -e 'exit !IO::Socket::INET->new("127.0.0.1:'$SPORT'")' 2>/dev/null && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
export CUMULO_KEY_FILE="$TMP/cluster.key"
"$BIN" key >/dev/null 2>&1
T="$(id -un)@127.0.0.1:$SPORT"
L="--identity $TMP/id --ssh-opt UserKnownHostsFile=$TMP/known --ssh-opt StrictHostKeyChecking=accept-new --remote-dir $TMP/remote"

LAUNCHED=1
# shellcheck disable=SC2086
if "$BIN" launch "$T" $L --port "$NPORT" --models "$M" --no-mdns >"$TMP/l1.out" 2>"$TMP/l1.err"; then ok
else bad "launch failed: $(cat "$TMP/l1.err" "$TMP/sshd.log" | tail -5)"; fi
grep -q "copying" "$TMP/l1.err" && ok || bad "the binary was not copied: $(cat "$TMP/l1.err")"
cmp -s "$BIN" "$TMP/remote/cumulo" && ok || bad "the remote binary differs"
[ "$(stat -c %a "$TMP/remote/cluster.key" 2>/dev/null)" = 600 ] && ok || bad "key file mode $(stat -c %a "$TMP/remote/cluster.key")"
cmp -s "$CUMULO_KEY_FILE" "$TMP/remote/cluster.key" && ok || bad "the key was not copied"
grep -q "node '" "$TMP/l1.out" && ok || bad "launch did not show the node: $(cat "$TMP/l1.out")"

# the launched node serves a stage
"$BIN" run "$M/stories260K-q8_0.gguf" -p "Once upon a time" -n 24 --temp 0 --threads 1 --json >"$TMP/a.json" 2>/dev/null
if "$BIN" run "$M/stories260K-q8_0.gguf" --nodes "127.0.0.1:$NPORT" -p "Once upon a time" -n 24 --temp 0 --threads 1 \
    --json >"$TMP/b.json" 2>"$TMP/b.err"; then
    [ "$(jsonget "$TMP/a.json" 'join(",", @{$j->{tokens}})')" = "$(jsonget "$TMP/b.json" 'join(",", @{$j->{tokens}})')" ] &&
        ok || bad "the launched node's pipeline differs"
else
    bad "run through the launched node failed: $(tail -2 "$TMP/b.err")"
fi

# again: the binary is there (same version), the node is replaced
# shellcheck disable=SC2086
"$BIN" launch "$T" $L --port "$NPORT" --no-mdns >"$TMP/l2.out" 2>"$TMP/l2.err" && ok || bad "second launch: $(cat "$TMP/l2.err")"
grep -q "already there" "$TMP/l2.err" && ok || bad "the binary was copied again: $(cat "$TMP/l2.err")"

# stop
# shellcheck disable=SC2086
"$BIN" launch "$T" $L --stop >/dev/null 2>&1 && ok || bad "--stop failed"
# --stop sends SIGTERM and returns: the node lets go of its port soon after,
# later on a loaded machine; look until it no longer answers, up to 10 s
i=0
while :; do
    "$BIN" nodes --no-mdns --nodes "127.0.0.1:$NPORT" --json >"$TMP/n.json" 2>/dev/null
    [ "$(jsonget "$TMP/n.json" '$j->[0]{reachable} ? 1 : 0')" = 0 ] && break
    i=$((i + 1))
    [ $i -ge 50 ] && break
    sleep 0.2
done
[ "$(jsonget "$TMP/n.json" '$j->[0]{reachable} ? 1 : 0')" = 0 ] && ok || bad "the node still answers 10 s after --stop"
LAUNCHED=""
# ssh passes no *SAN_OPTIONS (log_path) to the launched node, so in a sanitizer
# build its reports land in its own log: look there.
if [ ! -f "$TMP/remote/node.log" ]; then bad "the launched node left no log"
elif grep -qE 'WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:' "$TMP/remote/node.log"; then
    bad "sanitizer report in the launched node's log: $(grep -E 'Sanitizer|runtime error' "$TMP/remote/node.log" | head -3)"
else ok; fi

# a remote where the binary cannot load its libraries: the loader's line, at once
mkdir -p "$TMP/badlib" "$TMP/remote2"
: >"$TMP/badlib/libmicrohttpd.so.12"
printf 'environment="LD_LIBRARY_PATH=%s" %s\n' "$TMP/badlib" "$(cat "$TMP/id.pub")" >"$TMP/authorized_keys"
echo "PermitUserEnvironment yes" >>"$TMP/sshd_config"
kill "$SSHD_PID" 2>/dev/null
wait "$SSHD_PID" 2>/dev/null
"$SSHD" -D -f "$TMP/sshd_config" -E "$TMP/sshd.log" &
SSHD_PID=$!
i=0
while ! perl -MIO::Socket::INET -e 'exit !IO::Socket::INET->new("127.0.0.1:'$SPORT'")' 2>/dev/null && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
L2="--identity $TMP/id --ssh-opt UserKnownHostsFile=$TMP/known --ssh-opt StrictHostKeyChecking=accept-new --remote-dir $TMP/remote2"
t3=$(date +%s.%N)
# shellcheck disable=SC2086
if "$BIN" launch "$T" $L2 --port "$NPORT" --no-mdns >"$TMP/l3.out" 2>"$TMP/l3.err"; then
    bad "launch onto a host with a broken libmicrohttpd succeeded"
else ok; fi
t3=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t3 }")
grep -q "does not run there.*libmicrohttpd.so.12" "$TMP/l3.err" && ok || bad "no loader error line: $(cat "$TMP/l3.err")"
grep -q "install the libraries" "$TMP/l3.err" && ok || bad "no advice on the libraries: $(cat "$TMP/l3.err")"
[ -f "$TMP/remote2/node.pid" ] && bad "a node was started although the binary cannot run" || ok
printf '%s\n' "$(cat "$TMP/id.pub")" >"$TMP/authorized_keys"

# a node that exits on start (its port is taken): the node's own error line
# (the holder says when it listens: perl alone takes 0.4-0.7 s to get there
# on a loaded 2-core machine, and launch must find the port taken)
perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:'$NPORT'", Listen => 1, ReuseAddr => 1) or die;
    open my $f, ">", "'"$TMP/held"'" or die; close $f; sleep 120' &
HOLD=$!
i=0
while [ ! -f "$TMP/held" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -f "$TMP/held" ] && ok || bad "the port holder did not listen within 10 s"
t4=$(date +%s.%N)
# shellcheck disable=SC2086
if "$BIN" launch "$T" $L2 --port "$NPORT" --no-mdns >"$TMP/l4.out" 2>"$TMP/l4.err"; then
    bad "launch succeeded although the node's port is taken"
else ok; fi
t4=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t4 }")
grep -q "the node exited on start: .*$NPORT" "$TMP/l4.err" && ok || bad "no node error line: $(cat "$TMP/l4.err")"
kill "$HOLD" 2>/dev/null
[ -n "$CUMULO_SHOW" ] && cat "$TMP/l3.err" "$TMP/l4.err" >&2 && echo "broken library: ${t3} s; port taken: ${t4} s" >&2

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
