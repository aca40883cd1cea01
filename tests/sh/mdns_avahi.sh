#!/bin/sh
# mdns_avahi.sh: interoperability of cumulo's mDNS/DNS-SD with an independent
# implementation, Debian's avahi-daemon + avahi-utils. Two namespaces on a
# bridge (in a third namespace; the host network is untouched): avahi-daemon
# runs in one with its own config, a private tmpfs /run and a private
# dbus-daemon (DBUS_SYSTEM_BUS_ADDRESS points at it; the host bus is never
# used); cumulo runs in the other. Checks: avahi-browse resolves our node with
# its TXT, our browser finds an avahi-publish service, avahi sees our goodbye,
# and name conflicts are resolved in both directions. Skips (0 passed, 0
# failed) without root, ip netns, avahi-daemon, avahi-utils or dbus-daemon.
cd "$(dirname "$0")/../.." || exit 1
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }
T=cmtest-av$$
BR=$T-br; NC=$T-c; NA=$T-a
TMP=$(mktemp -d /tmp/cmtest-avahi.XXXXXX)
chmod 755 "$TMP"
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.3
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    for n in $NC $NA $BR; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

. tests/sh/lib/need.sh
need avahi-daemon avahi-browse avahi-publish dbus-daemon
need_netns "$BR"
ip -n "$BR" link add cmbr0 type bridge && ip -n "$BR" link set cmbr0 up
i=1
for n in $NC $NA; do
    ip netns add "$n"
    ip -n "$n" link set lo up
    ip link add name eth0 netns "$n" type veth peer name cmp$i netns "$BR"
    ip -n "$BR" link set cmp$i master cmbr0
    ip -n "$BR" link set cmp$i up
    ip -n "$n" addr add 10.79.0.$i/24 dev eth0
    ip -n "$n" link set eth0 up
    i=$((i + 1))
done

cat >"$TMP/dbus.conf" <<EOC
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$TMP/dbus.sock</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
EOC
cat >"$TMP/avahi.conf" <<EOC
[server]
host-name=cmavahi
use-ipv4=yes
use-ipv6=no
allow-interfaces=eth0
enable-dbus=yes
[wide-area]
enable-wide-area=no
[publish]
publish-hinfo=no
publish-workstation=no
EOC
export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$TMP/dbus.sock"
dbus-daemon --config-file="$TMP/dbus.conf" --nofork --nopidfile >"$TMP/dbus.log" 2>&1 &
PIDS="$PIDS $!"
# avahi-daemon connects to the bus once, at start: wait until dbus-daemon
# listens (a clean-clone CI run once started avahi before the socket existed)
k=0
while [ ! -S "$TMP/dbus.sock" ] && [ $k -lt 100 ]; do sleep 0.1; k=$((k + 1)); done
if [ ! -S "$TMP/dbus.sock" ]; then
    bad "dbus-daemon did not start: $(tail -5 "$TMP/dbus.log")"
    echo "$pass passed, $fail failed"; exit 1
fi
# ip netns exec gives a private mount namespace: a tmpfs /run keeps avahi's pid file off the host
ip netns exec "$NA" sh -c 'mount -t tmpfs tmpfs /run && exec avahi-daemon --no-drop-root --no-chroot --no-rlimits --no-proc-title -f "$1"' \
    sh "$TMP/avahi.conf" >"$TMP/avahi.log" 2>&1 &
PIDS="$PIDS $!"

wait_for() {
    k=0
    while [ $k -lt $(($3 * 10)) ]; do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1; k=$((k + 1))
    done
    return 1
}
if ! wait_for "$TMP/avahi.log" "Server startup complete" 10; then
    bad "avahi-daemon did not start: $(tail -5 "$TMP/avahi.log")"
    echo "$pass passed, $fail failed"; exit 1
fi

# 1. avahi-browse -rpt lists and resolves our node, TXT included (v= is the
# wire protocol's version, src/proto/proto.h)
PROTO=$(sed -n 's/^#define CM_PROTO_VERSION \([0-9]*\).*/\1/p' src/proto/proto.h)
[ -n "$PROTO" ] || bad "CM_PROTO_VERSION not found in src/proto/proto.h"
ip netns exec "$NC" "$BIN" announce --name alpha --port 7001 --id a1a1a1a1a1a1a1a1 >"$TMP/a1" 2>&1 &
A1=$!; PIDS="$PIDS $A1"
wait_for "$TMP/a1" "^announced alpha$" 5 || bad "alpha announced: $(cat "$TMP/a1")"
ip netns exec "$NA" timeout 10 avahi-browse -rpt _cumulo._tcp >"$TMP/browse" 2>&1
if grep -q '^=;eth0;IPv4;alpha;_cumulo._tcp;local;cm-a1a1a1a1a1a1.local;10.79.0.1;7001;.*"id=a1a1a1a1a1a1a1a1"' "$TMP/browse" &&
   grep -q "^=;.*\"v=$PROTO\"" "$TMP/browse"; then
    ok "avahi-browse -rpt resolves our node with TXT"
else
    bad "avahi-browse: $(cat "$TMP/browse")"
fi

# 2. our browser finds a service published with avahi-publish -s
ip netns exec "$NA" avahi-publish -s "avahi svc" _cumulo._tcp 7777 "id=feedbeef" "v=$PROTO" >"$TMP/pub" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/pub" "Established" 5 || bad "avahi-publish: $(cat "$TMP/pub")"
ip netns exec "$NC" "$BIN" discover --json --timeout 3 >"$TMP/list.json" 2>&1
if grep -q '"name":[[:space:]]*"avahi svc"' "$TMP/list.json" && grep -q '"addr":[[:space:]]*"10.79.0.2"' "$TMP/list.json" &&
   grep -q '"port":[[:space:]]*7777' "$TMP/list.json" && grep -q '"id":[[:space:]]*"feedbeef"' "$TMP/list.json"; then
    ok "cumulo discover finds the avahi-publish service"
else
    bad "discover: $(cat "$TMP/list.json")"
fi

# 3. avahi sees our goodbye
ip netns exec "$NA" timeout 8 avahi-browse -p _cumulo._tcp >"$TMP/watch" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/watch" "^+;eth0;IPv4;alpha;" 5
kill -INT $A1
wait_for "$TMP/watch" "^-;eth0;IPv4;alpha;" 5 && ok "avahi removes our node on goodbye" || bad "goodbye: $(cat "$TMP/watch")"

# 4. conflicts both ways: we rename away from avahi's name; avahi renames away from ours
ip netns exec "$NC" "$BIN" announce --name "avahi svc" --port 7002 --id c3c3c3c3c3c3c3c3 >"$TMP/a2" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/a2" "^announced avahi svc (2)$" 8 && ok "we rename on conflict with avahi" || bad "rename: $(cat "$TMP/a2")"
ip netns exec "$NA" timeout 5 avahi-publish -s "avahi svc (2)" _cumulo._tcp 7778 >"$TMP/pub2" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/pub2" "Name collision" 5 && ok "avahi renames on conflict with our defended name" || bad "avahi collision: $(cat "$TMP/pub2")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
