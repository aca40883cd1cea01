# tests/sh/lib/slurm_common.sh: shared by the tests that start a Slurm of
# their own (tests/sh/slurm.sh: one node entry; tests/sh/slurm_nodes.sh:
# three node entries, each slurmd in a network namespace). Not a test itself.
# Source it after tests/sh/lib/cluster_common.sh; it needs $TMP, $MBIN, ok/bad.
#
# Every process the test starts carries the environment entry $SL_MARK
# (daemons, their slurmstepd, the job's tasks): cleanup finds them by it.
# $SL_X is the prefix of every Slurm client command (empty, or
# "ip netns exec NS" when the controller lives in a namespace).
SL_MARK="CM_SLURM_TEST=$TMP"
SL_X=""

# sl_need_tools: skip (and exit) unless the MPI build, Slurm's commands, root
# and OpenMPI's mpirun are there.
sl_finish() { echo "$pass passed, $fail failed${1:+, $1 skipped}"; [ "$fail" = 0 ]; exit $?; }
sl_need_tools() {
    if [ ! -x "$MBIN" ]; then
        if command -v "${MPICC:-mpicc}" >/dev/null 2>&1; then
            echo "skip: build-mpi/cumulo missing: run make MPI=1 (mpicc is installed)"
        else
            echo "skip: n/a: built without MPI (no mpicc; make MPI=1 needs openmpi or mpich)"
        fi
        sl_finish 1
    fi
    for c in slurmctld slurmd srun sbatch sinfo squeue scancel scontrol; do
        command -v $c >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin"
        command -v $c >/dev/null 2>&1 || { echo "skip: $c missing: install slurm-wlm (slurmctld slurmd slurm-client; scripts/setup.sh)"; sl_finish 1; }
    done
    if [ "$(id -u)" != 0 ]; then
        echo "skip: not root: the test's slurmd must run as root (SlurmdUser=root)"
        sl_finish 1
    fi
    mpirun --version 2>&1 | grep -q 'Open MPI' ||
        { echo "skip: n/a: srun --mpi=pmix is tested with OpenMPI (mpirun here is not OpenMPI's)"; sl_finish 1; }
}

# sl_conf FILE CTLD_HOST CTLD_ADDR CTLD_PORT SLURMD_PORT NODEDIR: the common
# part of a test slurm.conf (no munged: auth/none; no cgroups; files under
# $S and NODEDIR, the slurmd's own folder). The caller appends the node and
# partition lines.
sl_conf() {
    cat >"$1" <<EOF
ClusterName=cmtest
SlurmctldHost=$2($3)
SlurmctldPort=$4
SlurmdPort=$5
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$S/state
SlurmdSpoolDir=$6/spool
TmpFS=$6/tmp
MailProg=/bin/true
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$6/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$6/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=5
EOF
}

# sl_pids: the processes carrying $SL_MARK (one grep over every environ), never this shell.
sl_pids() {
    grep -l -s -z -x -F "$SL_MARK" /proc/[0-9]*/environ 2>/dev/null | sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' |
        grep -v -x "$$"
}
# sl_sweep SIGNAL: send SIGNAL to every process carrying $SL_MARK.
sl_sweep() {
    for p in $(sl_pids); do kill "-$1" "$p" 2>/dev/null; done
}
# sl_left [EXE]: the pids still carrying $SL_MARK (running EXE).
sl_left() {
    for p in $(sl_pids); do
        [ -z "$1" ] || [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$1" ] || continue
        printf ' %s' "$p"
    done
}
# sl_stop: cancel every job, shut the daemons down, then TERM and KILL
# whatever still carries the marker. Safe to call twice.
sl_stop() {
    [ -n "$SL_STARTED" ] || return 0
    SL_STARTED=""
    # shellcheck disable=SC2086
    timeout 10 $SL_X scancel --quiet --full --user=root 2>/dev/null
    # shellcheck disable=SC2086
    timeout 10 $SL_X scontrol shutdown >/dev/null 2>&1
    k=0
    while [ -n "$(sl_left)" ] && [ $k -lt 100 ]; do sleep 0.1; k=$((k + 1)); done
    sl_sweep TERM
    sleep 0.5
    sl_sweep 9
    k=0 # processes in D state or still exiting: a namespace is deleted only after them
    while [ -n "$(sl_left)" ] && [ $k -lt 50 ]; do sleep 0.1; k=$((k + 1)); done
    return 0
}

# sl_wait_idle N PID...: wait (60 s at most) until sinfo shows N idle nodes,
# false at once when a daemon PID has died; sets sl_state (what sinfo said).
sl_wait_idle() {
    sl_n=$1
    shift
    k=0
    while [ $k -lt 120 ]; do
        # shellcheck disable=SC2086
        sl_state=$(timeout 5 $SL_X sinfo -h -N -o '%N:%T' 2>/dev/null | sort -u | tr '\n' ' ')
        [ "$(echo "$sl_state" | grep -o ':idle' | wc -l)" = "$sl_n" ] && return 0
        for p in "$@"; do kill -0 "$p" 2>/dev/null || return 1; done
        sleep 0.5
        k=$((k + 1))
    done
    return 1
}

# sl_wait_ready LOG JOBID: LOG says "ready:" (120 s at most); false at once
# when the job has left the queue's pending and running states.
sl_wait_ready() {
    k=0
    while ! grep -q "ready:" "$1" 2>/dev/null; do
        k=$((k + 1))
        [ $k -gt 240 ] && return 1
        if [ $((k % 4)) = 0 ]; then
            # shellcheck disable=SC2086
            st=$(timeout 5 $SL_X squeue -h -j "$2" -t all -o %T 2>/dev/null)
            case $st in PENDING | CONFIGURING | RUNNING | "") ;; *) return 1 ;; esac
        fi
        sleep 0.5
    done
}

# sl_cancel JOBID: scancel; the job must leave the queue (MinJobAge=5) and
# its ranks ($MBIN) end within 30 s.
sl_cancel() {
    # shellcheck disable=SC2086
    timeout 10 $SL_X scancel "$1"
    k=0
    while [ $k -lt 60 ]; do
        # shellcheck disable=SC2086
        [ -z "$(timeout 5 $SL_X squeue -h -j "$1" -t all -o %T 2>/dev/null | grep -v -E 'CANCELLED|COMPLETED|FAILED')" ] &&
            [ -z "$(sl_left "$MBIN")" ] && break
        sleep 0.5
        k=$((k + 1))
    done
    [ $k -lt 60 ] && ok || bad "scancel: job $1 or its ranks still there 30 s later"
}
