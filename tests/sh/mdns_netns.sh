#!/bin/sh
# mdns_netns.sh: cumulo's mDNS responder and browser across three network
# namespaces joined by a bridge (itself in a fourth namespace, so the host's
# own network is never touched). Two announcers, one browser: both nodes are
# found with no static peers, a goodbye removes one, and a name conflict is
# resolved by renaming to "name (2)". Needs root and `ip netns`; all names
# start with cmtest- and everything is removed on exit, even on failure.
cd "$(dirname "$0")/../.." || exit 1
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }
T=cmtest-md$$
BR=$T-br; N1=$T-1; N2=$T-2; N3=$T-3
TMP=$(mktemp -d /tmp/cmtest-mdns.XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.2
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    for n in $N1 $N2 $N3 $BR; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

. tests/sh/lib/need.sh
need_netns "$BR"
. tests/sh/lib/netns_common.sh
nn_bridge "$BR" cmbr0 cmp 10.77.0 "$N1" "$N2" "$N3"

# wait_for FILE PATTERN SECONDS
wait_for() {
    k=0
    while [ $k -lt $(($3 * 10)) ]; do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1; k=$((k + 1))
    done
    return 1
}

ip netns exec "$N3" "$BIN" discover --watch --timeout 30 >"$TMP/events" 2>"$TMP/disc.err" &
PIDS="$PIDS $!"
ip netns exec "$N1" "$BIN" announce --name alpha --port 7001 --id a1a1a1a1a1a1a1a1 >"$TMP/a1" 2>&1 &
A1=$!; PIDS="$PIDS $A1"
ip netns exec "$N2" "$BIN" announce --name beta --port 7002 --id b2b2b2b2b2b2b2b2 >"$TMP/a2" 2>&1 &
A2=$!; PIDS="$PIDS $A2"

wait_for "$TMP/a1" "^announced alpha$" 5 && ok "alpha probed and announced" || bad "alpha announced: $(cat "$TMP/a1")"
wait_for "$TMP/a2" "^announced beta$" 5 && ok "beta probed and announced" || bad "beta announced: $(cat "$TMP/a2")"
wait_for "$TMP/events" "^add 'alpha' 10.77.0.1:7001$" 10 && ok "browser found alpha" || bad "browser found alpha"
wait_for "$TMP/events" "^add 'beta' 10.77.0.2:7002$" 10 && ok "browser found beta" || bad "browser found beta"

# a second, independent browser resolves both with their TXT capabilities
ip netns exec "$N3" "$BIN" discover --json --timeout 3 >"$TMP/list.json" 2>"$TMP/list.err"
if grep -q '"id":[[:space:]]*"a1a1a1a1a1a1a1a1"' "$TMP/list.json" && grep -q '"id":[[:space:]]*"b2b2b2b2b2b2b2b2"' "$TMP/list.json" &&
   grep -q '"cores":' "$TMP/list.json" && grep -q '"ver":' "$TMP/list.json"; then
    ok "discover --json lists both with TXT id/ver/cores"
else
    bad "discover --json: $(cat "$TMP/list.json" "$TMP/list.err")"
fi

# goodbye: Ctrl-C on alpha removes it from the running browser (long TTLs, so not expiry)
kill -INT $A1
wait_for "$TMP/events" "^remove 'alpha'" 5 && ok "goodbye removed alpha" || bad "goodbye removed alpha"
grep -q "^remove 'beta'" "$TMP/events" && bad "beta wrongly removed" || ok "beta still present"

# conflict: a second 'beta' (different id and host) must rename itself
ip netns exec "$N1" "$BIN" announce --name beta --port 7003 --id c3c3c3c3c3c3c3c3 >"$TMP/a3" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/a3" "^announced beta (2)$" 8 && ok "conflicting name renamed to 'beta (2)'" || bad "rename: $(cat "$TMP/a3")"
wait_for "$TMP/events" "^add 'beta (2)' 10.77.0.1:7003$" 10 && ok "browser found 'beta (2)'" || bad "browser found 'beta (2)'"
grep -q "^announced beta (2)" "$TMP/a2" && bad "the established beta renamed itself" || ok "established beta kept its name"

# an address change is noticed by the responder's interface rescan (every 5 s) and re-announced
ip -n "$N2" addr del 10.77.0.2/24 dev eth0
ip -n "$N2" addr add 10.77.0.12/24 dev eth0
wait_for "$TMP/events" "^update 'beta' 10.77.0.12:7002$" 12 && ok "new address re-announced" || bad "address change: $(cat "$TMP/events")"

# one machine, several processes sharing port 5353 on lo (make demo's case):
# both found, and a same-name conflict between them is resolved
ip netns exec "$N3" "$BIN" announce --iface lo --name solo --port 7101 --id d4d4d4d4d4d4d4d4 >"$TMP/l1" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/l1" "^announced solo$" 5 || bad "solo announced: $(cat "$TMP/l1")"
ip netns exec "$N3" "$BIN" announce --iface lo --name solo --port 7102 --id e5e5e5e5e5e5e5e5 >"$TMP/l2" 2>&1 &
PIDS="$PIDS $!"
wait_for "$TMP/l2" "^announced solo (2)$" 8 && ok "same-host conflict on lo renamed" || bad "same-host rename: $(cat "$TMP/l2")"
ip netns exec "$N3" "$BIN" discover --iface lo --timeout 2 >"$TMP/lo.txt" 2>&1
if grep -q "^solo  *127.0.0.1:7101 " "$TMP/lo.txt" && grep -q "^solo (2)  *127.0.0.1:7102 " "$TMP/lo.txt"; then
    ok "discover --iface lo finds both local processes"
else
    bad "discover on lo: $(cat "$TMP/lo.txt")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
