#!/bin/sh
# scripts/newcomer.sh (`make newcomer`): the README's two commands as a new
# user meets them. Debootstraps a Debian 12 (bookworm) minbase root (no make,
# no curl, no sudo, Debian's Node.js 18 once setup installs it), makes a clean
# `git clone` of this checkout's current branch in it with ../shared beside it
# (a read-only bind mount of this checkout's ../shared), and runs, as root
# inside the root, exactly the README's command lines:
#   1. sh scripts/setup.sh && make demo      (with ../shared)
#   2. sh scripts/setup.sh && make test      (with ../shared)
#   3. sh scripts/setup.sh && make demo      (a second clone, without ../shared)
# then reports each command's exit code, the demo's story, the test summary
# line with what failed and what was skipped, and the demo without ../shared.
# Commits only: uncommitted changes are not in the clone (it says so).
#
# Needs root, mount rights and the network to the Debian mirror this machine's
# apt uses; takes long (debootstrap, ~1 GB of packages, the whole suite).
# Not part of `make test`. Exits 0 only when all three commands exited 0.
#
#   CUMULO_NEWCOMER_DIR   work folder (default /var/tmp/cumulo-newcomer; the root is rebuilt each run)
#   CUMULO_NEWCOMER_KEEP=1  keep the root afterwards (default: deleted)
#   CUMULO_NEWCOMER_TEST_TIMEOUT  seconds for `make test` (default 3600)
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
die() { echo "newcomer: FAILED: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
WORK=${CUMULO_NEWCOMER_DIR:-/var/tmp/cumulo-newcomer}
R=$WORK/root
LOGS=$WORK/logs
SHARED_SRC=$(cd "$REPO/.." && pwd)/shared
BRANCH=$(git -C "$REPO" rev-parse --abbrev-ref HEAD) || die "not a git checkout"
COMMIT=$(git -C "$REPO" rev-parse --short HEAD)
[ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ] &&
    echo "newcomer: note: uncommitted changes in $REPO are not in the clone (it tests commit $COMMIT)" >&2

MOUNTS=""
mnt() { # mnt ARGS... TARGET: mount, remembering TARGET for the cleanup (last in, first out)
    eval "t=\${$#}"
    mkdir -p "$t"
    mount "$@" || die "mount $*"
    MOUNTS="$t $MOUNTS"
}
cleanup() {
    # Processes still running inside the root (a daemon a test left): by pid, only those whose root is $R.
    for d in /proc/[0-9]*; do
        [ "$(readlink "$d/root" 2>/dev/null)" = "$R" ] && kill -9 "${d#/proc/}" 2>/dev/null
    done
    sleep 1
    for m in $MOUNTS; do umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
    MOUNTS=""
    if [ -z "${CUMULO_NEWCOMER_KEEP:-}" ] && [ -d "$R" ] && ! grep -q " $R" /proc/mounts; then rm -rf "$R"; fi
}
trap cleanup EXIT
trap 'exit 3' INT TERM

# The mirror this machine's apt uses (deb822 .sources or sources.list).
MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs: *\([^ ]*debian\/*\)$/\1/p' | head -1)
[ -z "$MIRROR" ] && MIRROR=$(sed -n 's/^deb  *\(\[[^]]*\]  *\)\{0,1\}\([^ ]*\) *bookworm .*/\2/p' /etc/apt/sources.list 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
    echo "newcomer: installing debootstrap on this machine" >&2
    apt-get -o DPkg::Lock::Timeout=900 install -y debootstrap >"$WORK.debootstrap-install.log" 2>&1 ||
        { tail -20 "$WORK.debootstrap-install.log" >&2; die "apt-get install debootstrap"; }
fi

# A fresh root every run.
grep -q " $R" /proc/mounts && die "something is still mounted under $R (umount -R it first)"
rm -rf "$R" "$LOGS"
mkdir -p "$R" "$LOGS"
t0=$(date +%s)
echo "newcomer: debootstrap --variant=minbase bookworm from $MIRROR" >&2
debootstrap --variant=minbase bookworm "$R" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 ||
    { tail -20 "$LOGS/debootstrap.log" >&2; die "debootstrap (log: $LOGS/debootstrap.log)"; }
echo "newcomer: root ready in $(($(date +%s) - t0)) s; in it: make $(chroot "$R" sh -c 'command -v make || echo missing'), curl $(chroot "$R" sh -c 'command -v curl || echo missing'), node $(chroot "$R" sh -c 'command -v node || echo missing')" >&2

# What a newcomer's machine has: the kernel's file systems, a /run and /tmp,
# name resolution. Bind mounts are made slaves so nothing unmounted inside
# reaches this machine.
# The root is a mount point, as / is on a real machine (`ip netns exec` runs
# `mount --make-rslave /`, which fails on a plain directory).
mnt --bind "$R" "$R"
mnt -t proc proc "$R/proc"
mnt --rbind /sys "$R/sys"
mount --make-rslave "$R/sys"
mnt --rbind /dev "$R/dev"
mount --make-rslave "$R/dev"
mnt -t tmpfs tmpfs "$R/run"
mnt -t tmpfs -o size=8g tmpfs "$R/tmp"
cp /etc/resolv.conf "$R/etc/resolv.conf"
# Debian's sources inside, as on a fresh install (debootstrap writes only the main suite).
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
    "$MIRROR" "$MIRROR" >"$R/etc/apt/sources.list"

# No service starts from package scripts (avahi, dbus, sshd would run in this
# machine's network): as in any chroot or container image. The tests start
# the daemons they need themselves.
printf '#!/bin/sh\nexit 101\n' >"$R/usr/sbin/policy-rc.d"
chmod +x "$R/usr/sbin/policy-rc.d"

# This machine's network may intercept TLS with a CA of its own, which this
# machine trusts (npm fails with "self-signed certificate in certificate
# chain" without it): the root trusts what this machine trusts, as a
# newcomer's machine on the same network would have to. The certificates go
# where update-ca-certificates (run when setup installs ca-certificates)
# finds local ones; nothing else of this machine's configuration is copied.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    mkdir -p "$R/usr/local/share/ca-certificates/newcomer-host"
    awk -v dir="$R/usr/local/share/ca-certificates/newcomer-host" \
        '/BEGIN CERT/ { n++; f = sprintf("%s/host-%03d.crt", dir, n) } n { print > f } /END CERT/ { close(f) }' \
        /etc/ssl/certs/ca-certificates.crt
fi
EXTRA_CA=""
[ -n "${NODE_EXTRA_CA_CERTS:-}" ] && EXTRA_CA="NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt"

# The clones: with ../shared beside (read-only) and without.
mkdir -p "$R/root/with" "$R/root/alone"
git clone -q --branch "$BRANCH" --single-branch "file://$REPO" "$R/root/with/cumulo" || die "git clone"
git clone -q --branch "$BRANCH" --single-branch "file://$REPO" "$R/root/alone/cumulo" || die "git clone"
if [ -d "$SHARED_SRC" ]; then
    mnt --bind "$SHARED_SRC" "$R/root/with/shared"
    mount -o remount,bind,ro "$R/root/with/shared"
else
    echo "newcomer: warning: no $SHARED_SRC: the 'with ../shared' runs will not have it" >&2
fi

# in_root DIR LIMIT LOG COMMAND: run COMMAND (a README line) as root in DIR
# inside the root, with a newcomer's environment; prints its exit code.
in_root() {
    timeout -k 30 "$2" chroot "$R" /usr/bin/env -i HOME=/root TERM=xterm LANG=C.UTF-8 $EXTRA_CA \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        /bin/sh -c "cd '$1' && $4" >"$3" 2>&1
    echo $?
}
run_cmd() { # run_cmd TAG DIR LIMIT COMMAND
    echo "newcomer: [$1] $4   (in ${2#/root/})" >&2
    s=$(date +%s)
    rc=$(in_root "$2" "$3" "$LOGS/$1.log" "$4")
    echo "newcomer: [$1] exit $rc after $(($(date +%s) - s)) s (log $LOGS/$1.log)" >&2
    eval "RC_$1=$rc"
}
run_cmd demo /root/with/cumulo 2400 'sh scripts/setup.sh && make demo'
run_cmd test /root/with/cumulo "${CUMULO_NEWCOMER_TEST_TIMEOUT:-3600}" 'sh scripts/setup.sh && make test'
run_cmd alone /root/alone/cumulo 1200 'sh scripts/setup.sh && make demo'
NODEV=$(chroot "$R" sh -c 'node --version 2>/dev/null || echo none')

story() { # the demo's story: the lines from the prompt on, up to the plan's or the end's lines
    sed -n '/^Once upon a time/,/^prompt:/p' "$1" | grep -v '^prompt:' | head -20
}
echo
echo "================ newcomer report: branch $BRANCH at $COMMIT, Debian 12 minbase root, node $NODEV"
echo "1. sh scripts/setup.sh && make demo   (with ../shared)     exit $RC_demo"
grep -E '^setup: (installing|FAILED|step)|^demo: (FAILED|using|ok)' "$LOGS/demo.log" | head -8 | sed 's/^/     /'
echo "   story:"
story "$LOGS/demo.log" | sed 's/^/     | /'
echo "2. sh scripts/setup.sh && make test   (with ../shared)     exit $RC_test"
grep -E '^(FAIL|SKIP) ' "$LOGS/test.log" | head -30 | sed 's/^/     /'
sed -n '/^skipped/,/^[0-9]* passed/p' "$LOGS/test.log" | grep '^  skip' | head -30 | sed 's/^/     /'
grep -E '^failed:' "$LOGS/test.log" | sed 's/^/     /'
echo "   summary: $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOGS/test.log" | tail -1)"
echo "3. sh scripts/setup.sh && make demo   (no ../shared)       exit $RC_alone"
grep -E '^demo: (FAILED|.*RANDOM|.*random-weight model|ok)' "$LOGS/alone.log" | head -4 | sed 's/^/     /'
echo "   text:"
story "$LOGS/alone.log" | sed 's/^/     | /'
echo "total $(($(date +%s) - t0)) s; logs in $LOGS"
[ "$RC_demo" = 0 ] && [ "$RC_test" = 0 ] && [ "$RC_alone" = 0 ]
