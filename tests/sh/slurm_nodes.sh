#!/bin/sh
# tests/sh/slurm_nodes.sh (issue 18): `cumulo mpi` under a real Slurm of
# THREE node entries on this one host. (Debian's slurm-wlm 22.05 is built
# with --enable-multiple-slurmd: `slurmd -N NAME` listens on its entry's own
# Port= and expands %n in paths. But such "nodes" share this host's name and
# address, and MPI's ranks would still meet over loopback.) Here each slurmd
# runs as a machine of its own: a network namespace with its own address on
# a bridge (10.79.0.2-4, the bridge itself in a namespace, so the host's
# network is untouched), a UTS namespace
# with its own hostname (cmn1-3 = its NodeName) and a mount namespace in
# which the test's folder $S/cmnK is bind-mounted on $S/node (its spool, pid,
# log and TmpFS, the paths every slurmd reads from the one slurm.conf).
# slurmctld has a fourth namespace (10.79.0.1, hostname cmctl); the test runs
# Slurm's clients (srun, sbatch, squeue, scancel) from there.
#  - `srun --mpi=pmix -N 3 -n 3` (one task per node entry): ids and text equal
#    one machine's `cumulo run --temp 0` and llama.cpp's reference ids, the
#    plan has 3 stages, and each rank ran on a different node entry
#    (SLURM_NODEID 0-2, hostnames cmn1-3 = SLURMD_NODENAME). OpenMPI is held
#    to TCP (pml ob1, btl self,tcp on eth0): the ranks' only way to each other
#    is the bridge, so their messages really cross the namespaces (the bridge
#    ports' byte counters are printed).
#  - `sbatch --nodes=3 examples/slurm/cumulo.sbatch MODEL`: rank 0 serves on
#    its node's address, a completion equals one machine's text, the three
#    ranks ran on three node entries, and scancel ends the job and every rank.
# Cleanup (also on INT/TERM/HUP): jobs cancelled, daemons shut down, anything
# carrying the test's environment marker killed, the namespaces deleted.
# Skips: as slurm.sh (no MPI build, no Slurm, not root, not OpenMPI), and when
# network or UTS namespaces cannot be made. Names start with $CM_NETNS_PREFIX
# (default cmtest).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl
M=$SHARED/models
MBIN=$(realpath "${CUMULO_MPI_BIN:-build-mpi/cumulo}" 2>/dev/null)
F32=$M/stories260K-f32.gguf

. tests/sh/lib/slurm_common.sh
. tests/sh/lib/netns_common.sh
sl_need_tools

T=${CM_NETNS_PREFIX:-cmtest}-sl$$
BR=$T-br C=$T-c
NS_ALL=""
cc_cleanup_hook() {
    sl_stop
    for ns in $NS_ALL; do ip netns del "$ns" 2>/dev/null; done
    [ -n "$CUMULO_KEEP_TMP" ] && cp "$S"/log/*.log "$S"/cmn*/slurmd.log "$TMP/" 2>/dev/null
    return 0
}
if ! command -v ip >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1 || ! command -v nsenter >/dev/null 2>&1 ||
    ! ip netns add "$BR" 2>/dev/null; then
    echo "skip: needs ip netns, nsenter and unshare (network namespaces) to give each slurmd a machine of its own"
    sl_finish 1
fi
NS_ALL="$C $T-1 $T-2 $T-3 $BR"
if ! unshare --uts --mount true 2>/dev/null; then
    echo "skip: cannot make UTS and mount namespaces (unshare --uts --mount)"
    sl_finish 1
fi
nn_bridge "$BR" cmbr0 cmsp 10.79.0 "$C" "$T-1" "$T-2" "$T-3" # C: .1, cmnK: .K+1

# ---- slurm.conf: the controller and three node entries, 2 CPUs each.
S=$TMP/slurm
mkdir -p "$S/state" "$S/log" "$S/node"
export SLURM_CONF="$S/slurm.conf"
sl_conf "$SLURM_CONF" cmctl 10.79.0.1 6817 6818 "$S/node" # ports of the namespaces' own stacks
for k in 1 2 3; do
    mkdir -p "$S/cmn$k/spool" "$S/cmn$k/tmp"
    echo "NodeName=cmn$k NodeAddr=10.79.0.$((k + 1)) CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN" >>"$SLURM_CONF"
done
echo "PartitionName=cm Nodes=cmn[1-3] Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP" >>"$SLURM_CONF"

SL_STARTED=1
SL_X="ip netns exec $C"
# (nsenter and unshare exec their command: $! is the daemon itself; nsenter,
# not ip netns exec, which would mount a /sys without the cgroup tree slurmd reads)
env "$SL_MARK" nsenter --net="/run/netns/$C" unshare --uts sh -c 'hostname cmctl && exec slurmctld -D -i -f "$1"' sh "$SLURM_CONF" \
    >"$S/log/slurmctld.out" 2>&1 &
PIDS=$!
for k in 1 2 3; do
    env "$SL_MARK" nsenter --net="/run/netns/$T-$k" unshare --uts --mount sh -c \
        'hostname "$1" && mount --bind "$2" "$3" && exec slurmd -D -N "$1" -f "$4"' sh "cmn$k" "$S/cmn$k" "$S/node" "$SLURM_CONF" \
        >"$S/log/cmn$k.out" 2>&1 &
    PIDS="$PIDS $!"
done
# shellcheck disable=SC2086
if sl_wait_idle 3 $PIDS; then
    ok
    echo "slurm: slurmctld on 10.79.0.1, slurmd cmn1-3 on 10.79.0.2-4 (namespaces), 3 node entries idle"
else
    bad "slurm: not 3 idle node entries ($sl_state): $(tail -n 3 "$S/log/"* "$S"/cmn*/slurmd.log 2>/dev/null)"
    sl_finish
fi

# OpenMPI over TCP only, on each namespace's eth0 (no shared memory, no UCX).
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=eth0
# Each task records where it ran, then plays a machine of its own.
cat >"$TMP/rank.sh" <<EOF
#!/bin/sh
echo "\$SLURM_PROCID \$SLURM_NODEID \$SLURMD_NODENAME \$(hostname)" >>"$TMP/where.\$SLURM_JOB_ID"
CUMULO_HOST_ID=slurm-rank\${SLURM_PROCID:-0} exec "$MBIN" "\$@"
EOF
chmod +x "$TMP/rank.sh"

# where_check JOBID WHAT: the job's 3 ranks ran on 3 node entries (node ids
# 0-2, hostnames = node names, 3 different ones).
where_check() {
    w=$TMP/where.$1
    nids=$(cut -d' ' -f2 "$w" 2>/dev/null | sort -u | tr '\n' ' ')
    hosts=$(cut -d' ' -f4 "$w" 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$(wc -l <"$w" 2>/dev/null)" = 3 ] && [ "$nids" = "0 1 2 " ] && [ "$hosts" = "cmn1 cmn2 cmn3 " ] && ok ||
        bad "$2: ranks not on 3 node entries: $(tr '\n' ';' <"$w" 2>/dev/null)"
    awk '$3 != $4 { exit 1 }' "$w" 2>/dev/null && ok || bad "$2: a rank's hostname is not its node entry's: $(tr '\n' ';' <"$w")"
    echo "$2: rank node-id node hostname: $(sort "$w" | tr '\n' ';')"
}
# port_bytes: bytes through the bridge ports of cmn1-3 (rx + tx each).
port_bytes() {
    for k in 2 3 4; do
        ip -n "$BR" -s -j link show "cmsp$k" 2>/dev/null |
            perl -MJSON::PP -e 'local $/; my $s = decode_json(<STDIN>)->[0]{stats64}; print $s->{rx}{bytes} + $s->{tx}{bytes}, " "'
    done
}

# ---- srun direct launch through PMIx across the three node entries.
cc_ref_case f32 0 # one machine's run ($TMP/local.json) against llama.cpp's ids
one_ids=$local_ids
one_text=$(cc_jsonget "$TMP/local.json" '$j->{text}' 2>/dev/null)
before=$(port_bytes)
if env "$SL_MARK" timeout 300 ip netns exec "$C" srun --mpi=pmix -N 3 -n 3 --ntasks-per-node=1 --cpus-per-task=1 \
    --job-name=cm-srun "$TMP/rank.sh" mpi "$F32" -p "$prompt" -n "$n" --temp 0 --threads 1 --json \
    >"$TMP/srun.json" 2>"$TMP/srun.err"; then
    got_ids=$(cc_jsonget "$TMP/srun.json" 'join(",", @{$j->{tokens}})')
    got_text=$(cc_jsonget "$TMP/srun.json" '$j->{text}' 2>/dev/null)
    [ -n "$got_ids" ] && [ "$got_ids" = "$one_ids" ] && ok || bad "srun -N 3: ids differ from one machine: $got_ids vs $one_ids"
    [ "$got_ids" = "$want" ] && ok || bad "srun -N 3: ids differ from llama.cpp's"
    [ "$got_text" = "$one_text" ] && ok || bad "srun -N 3: text differs from one machine"
    grep -q "why: pp plan, 3 stages" "$TMP/srun.err" && ok || bad "srun -N 3: not a 3-stage pipeline: $(grep -E '^(why|mode)' "$TMP/srun.err" | head -3)"
    [ "$got_ids" = "$one_ids" ] && echo "srun --mpi=pmix -N 3 -n 3: ids equal one machine and llama.cpp ($(echo "$got_ids" | tr ',' '\n' | wc -l) ids), 3 stages"
    sjob=$(ls "$TMP"/where.* 2>/dev/null | head -1)
    where_check "${sjob##*.}" "srun -N 3"
else
    bad "srun --mpi=pmix -N 3 failed: $(grep -v '^ *$' "$TMP/srun.err" | tail -5)"
fi
echo "bridge ports of cmn1-3, bytes (rx+tx) before/after the srun job: $before/ $(port_bytes)"

# ---- MPICH through Slurm's PMI-2 (srun --mpi=pmi2; Slurm's pmi2 plugin also
# speaks the PMI-1 wire protocol of MPICH's built-in client), when an MPICH
# build is there (make MPI=1 MPICC=mpicc.mpich BUILD=build-mpich). MPICH's UCX
# is held to TCP on eth0, so its ranks too meet only across the bridge.
MPICH_BIN=$(realpath "${CUMULO_MPICH_BIN:-build-mpich/cumulo}" 2>/dev/null)
if [ ! -x "$MPICH_BIN" ] && ! command -v mpicc.mpich >/dev/null 2>&1; then
    echo "skip: n/a: no MPICH here (mpicc.mpich): srun --mpi=pmi2 not tested"
elif [ ! -x "$MPICH_BIN" ]; then
    echo "skip: n/a: build-mpich/cumulo not built (make test builds the OpenMPI variant only; make MPI=1 MPICC=mpicc.mpich BUILD=build-mpich tests srun --mpi=pmi2)"
else
    sed "s|$MBIN|$MPICH_BIN|" "$TMP/rank.sh" >"$TMP/rank_mpich.sh"
    chmod +x "$TMP/rank_mpich.sh"
    seen=$(ls "$TMP"/where.* 2>/dev/null)
    if env "$SL_MARK" UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 timeout 300 ip netns exec "$C" srun --mpi=pmi2 -N 3 -n 3 \
        --ntasks-per-node=1 --cpus-per-task=1 --job-name=cm-mpich "$TMP/rank_mpich.sh" mpi "$F32" -p "$prompt" -n "$n" \
        --temp 0 --threads 1 --json >"$TMP/pmi2.json" 2>"$TMP/pmi2.err"; then
        got_ids=$(cc_jsonget "$TMP/pmi2.json" 'join(",", @{$j->{tokens}})')
        [ -n "$got_ids" ] && [ "$got_ids" = "$one_ids" ] && ok || bad "srun --mpi=pmi2 (MPICH): ids differ from one machine: $got_ids"
        grep -q "why: pp plan, 3 stages" "$TMP/pmi2.err" && ok || bad "srun --mpi=pmi2 (MPICH): not a 3-stage pipeline"
        mjob=$(ls "$TMP"/where.* | grep -v -x -F "$seen")
        where_check "${mjob##*.}" "srun --mpi=pmi2 -N 3 (MPICH)"
        [ "$got_ids" = "$one_ids" ] && echo "srun --mpi=pmi2 -N 3 -n 3 (MPICH $(mpichversion 2>/dev/null | sed -n 's/MPICH Version:[[:space:]]*//p')): ids equal one machine"
    else
        bad "srun --mpi=pmi2 (MPICH) failed: $(grep -v '^ *$' "$TMP/pmi2.err" | tail -5)"
    fi
fi

# ---- The example batch script over the three node entries, served.
"$BIN" run "$F32" -p "Once upon a time" -n 24 --temp 0 --threads 1 --json >"$TMP/s1.json" 2>/dev/null
want_s=$(cc_jsonget "$TMP/s1.json" '$j->{text}' 2>/dev/null)
jobid=$(env "$SL_MARK" CUMULO="$TMP/rank.sh" CUMULO_HOST=0.0.0.0 CUMULO_PORT=8080 \
    timeout 30 ip netns exec "$C" sbatch --parsable --nodes=3 --ntasks=3 --ntasks-per-node=1 --cpus-per-task=1 \
    --time=10 --output="$TMP/sb.log" examples/slurm/cumulo.sbatch "$F32" 2>"$TMP/sbatch.err")
jobid=${jobid%%;*}
if [ -z "$jobid" ]; then
    bad "sbatch failed: $(cat "$TMP/sbatch.err")"
elif sl_wait_ready "$TMP/sb.log" "$jobid"; then
    host0=$(awk '$1 == 0 { print $4 }' "$TMP/where.$jobid") # rank 0: the API
    addr0=10.79.0.$((${host0#cmn} + 1))
    ip netns exec "$C" curl -s -m 60 "http://$addr0:8080/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$TMP/sb.json"
    got_sb=$(cc_jsonget "$TMP/sb.json" '$j->{choices}[0]{text}' 2>/dev/null)
    [ -n "$got_sb" ] && [ "$got_sb" = "$want_s" ] && ok || bad "sbatch: completion differs from one machine: '$got_sb' vs '$want_s'"
    grep -q "mpi:2" "$TMP/sb.log" && ok || bad "sbatch: no node mpi:2 in the plan"
    ranks=$(sl_left "$MBIN")
    [ "$(echo $ranks | wc -w)" = 3 ] && ok || bad "sbatch: not 3 ranks running the job: [$ranks]"
    where_check "$jobid" "sbatch --nodes=3"
    [ "$got_sb" = "$want_s" ] && echo "sbatch --nodes=3 examples/slurm/cumulo.sbatch: job $jobid serves on $host0 ($addr0:8080), a completion equals one machine's text"
else
    bad "sbatch: job $jobid not ready: $($SL_X squeue -h -j "$jobid" -o '%T %R' 2>/dev/null) $(tail -5 "$TMP/sb.log" 2>/dev/null)"
fi
[ -n "$jobid" ] && sl_cancel "$jobid"

sl_finish
