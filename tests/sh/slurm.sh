#!/bin/sh
# tests/sh/slurm.sh (issue 18): `cumulo mpi` under a real, single-machine
# Slurm (Debian's slurm-wlm 22.05) that the test starts and stops itself:
# slurmctld and slurmd in the foreground (-D, in the background here) with a
# slurm.conf, state, spool, log and pid files of their own under the test's
# temporary folder, on ports picked free, AuthType=auth/none (no munged, no
# key, nothing outside the folder touched). One node entry = this host, 4
# CPUs declared (SlurmdParameters=config_overrides: more than the machine may
# have, so 3 tasks fit anywhere). Then
#  - `srun --mpi=pmix -n 3 cumulo mpi MODEL -p ... --json` (Slurm's own
#    direct launch through PMIx, no mpirun): ids and text equal one machine's
#    `cumulo run --temp 0`, and llama.cpp's reference ids;
#  - `sbatch examples/slurm/cumulo.sbatch MODEL` (its #SBATCH node and CPU
#    counts overridden for one node): the job serves, a completion equals
#    one machine's text, and scancel ends the job and every rank.
# On exit the jobs are cancelled, the daemons shut down, and any process left
# from them (slurmstepd, a rank) killed, found by a marker in its
# environment. Runs as root (slurmd starts tasks as the submitting user; root
# here, SlurmUser=root). Without an MPI build: "n/a:" (as mpi.sh); with one
# but without slurm-wlm installed: a plain skip (CI fails: scripts/setup.sh
# installs it).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl python3
M=$SHARED/models
MBIN=$(realpath "${CUMULO_MPI_BIN:-build-mpi/cumulo}" 2>/dev/null)
F32=$M/stories260K-f32.gguf

. tests/sh/lib/slurm_common.sh
sl_need_tools

# ---- The cluster: one node, this host, ports picked free.
S=$TMP/slurm
mkdir -p "$S/state" "$S/log" "$S/node/spool" "$S/node/tmp"
NODE=$(hostname -s 2>/dev/null || hostname)
CPORT=$(cc_free_port)
DPORT=$(cc_free_port)
while [ "$DPORT" = "$CPORT" ]; do DPORT=$(cc_free_port); done
export SLURM_CONF="$S/slurm.conf"
sl_conf "$SLURM_CONF" "$NODE" 127.0.0.1 "$CPORT" "$DPORT" "$S/node"
cat >>"$SLURM_CONF" <<EOF
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN
PartitionName=cm Nodes=$NODE Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
EOF

cc_cleanup_hook() {
    sl_stop
    [ -n "$CUMULO_KEEP_TMP" ] && cp "$S"/log/*.log "$S"/node/*.log "$TMP/" 2>/dev/null
    return 0
}

SL_STARTED=1
env "$SL_MARK" slurmctld -D -i -f "$SLURM_CONF" >"$S/log/slurmctld.out" 2>&1 &
CTLD_PID=$!
env "$SL_MARK" slurmd -D -N "$NODE" -f "$SLURM_CONF" >"$S/log/slurmd.out" 2>&1 &
SD_PID=$!
# (not in CC_PIDS: cc_cleanup would kill them before the hook cancels the jobs)

if sl_wait_idle 1 "$CTLD_PID" "$SD_PID"; then
    ok
    echo "slurm: slurmctld :$CPORT and slurmd :$DPORT up, node $NODE idle"
else
    bad "slurm: node $NODE not idle ($sl_state): $(tail -3 "$S/log/slurmctld.log" "$S/node/slurmd.log" "$S/log/"*.out 2>/dev/null)"
    sl_finish
fi

export OMPI_MCA_btl_vader_single_copy_mechanism=none # containers forbid CMA (ptrace)
# Each task plays a machine of its own (as in mpi.sh): its rank from Slurm.
cat >"$TMP/rank.sh" <<EOF
#!/bin/sh
CUMULO_HOST_ID=slurm-rank\${SLURM_PROCID:-0} exec "$MBIN" "\$@"
EOF
chmod +x "$TMP/rank.sh"

# ---- srun direct launch through PMIx: a one-shot generation, 3 tasks.
cc_ref_case f32 0 # one machine's run ($TMP/local.json) against llama.cpp's ids
one_ids=$local_ids
one_text=$(cc_jsonget "$TMP/local.json" '$j->{text}' 2>/dev/null)
if env "$SL_MARK" timeout 300 srun --mpi=pmix -N 1 -n 3 --cpus-per-task=1 --overcommit "$TMP/rank.sh" mpi "$F32" \
    -p "$prompt" -n "$n" --temp 0 --threads 1 --json >"$TMP/srun.json" 2>"$TMP/srun.err"; then
    got_ids=$(cc_jsonget "$TMP/srun.json" 'join(",", @{$j->{tokens}})')
    got_text=$(cc_jsonget "$TMP/srun.json" '$j->{text}' 2>/dev/null)
    [ -n "$got_ids" ] && [ "$got_ids" = "$one_ids" ] && ok || bad "srun: ids differ from one machine: $got_ids vs $one_ids"
    [ "$got_text" = "$one_text" ] && ok || bad "srun: text differs from one machine"
    grep -q "why: pp plan, 3 stages" "$TMP/srun.err" && ok || bad "srun: not a 3-stage pipeline: $(grep -E '^(why|mode)' "$TMP/srun.err" | head -3)"
    grep -q "mpi:2" "$TMP/srun.err" && ok || bad "srun: no node mpi:2 in the log"
    [ "$got_ids" = "$one_ids" ] && echo "srun --mpi=pmix -n 3: ids equal one machine and llama.cpp ($(echo "$got_ids" | tr ',' '\n' | wc -l) ids)"
else
    bad "srun --mpi=pmix failed: $(grep -v '^ *$' "$TMP/srun.err" | tail -5)"
fi

# ---- The example batch script, served: one node, 3 tasks of 1 CPU.
"$BIN" run "$F32" -p "Once upon a time" -n 24 --temp 0 --threads 1 --json >"$TMP/s1.json" 2>/dev/null
want_s=$(cc_jsonget "$TMP/s1.json" '$j->{text}' 2>/dev/null)
SB_PORT=$(cc_free_port)
jobid=$(env "$SL_MARK" CUMULO="$TMP/rank.sh" CUMULO_HOST=127.0.0.1 CUMULO_PORT=$SB_PORT \
    timeout 30 sbatch --parsable --nodes=1 --ntasks=3 --ntasks-per-node=3 --cpus-per-task=1 --overcommit \
    --time=10 --output="$TMP/sb.log" examples/slurm/cumulo.sbatch "$F32" 2>"$TMP/sbatch.err")
jobid=${jobid%%;*}
if [ -z "$jobid" ]; then
    bad "sbatch failed: $(cat "$TMP/sbatch.err")"
elif sl_wait_ready "$TMP/sb.log" "$jobid"; then
    curl -s -m 60 "http://127.0.0.1:$SB_PORT/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$TMP/sb.json"
    got_sb=$(cc_jsonget "$TMP/sb.json" '$j->{choices}[0]{text}' 2>/dev/null)
    [ -n "$got_sb" ] && [ "$got_sb" = "$want_s" ] && ok || bad "sbatch: completion differs from one machine: '$got_sb' vs '$want_s'"
    grep -q "mpi:2" "$TMP/sb.log" && ok || bad "sbatch: no node mpi:2 in the plan"
    ranks=$(sl_left "$MBIN") # what scancel must end below
    [ "$(echo $ranks | wc -w)" = 3 ] && ok || bad "sbatch: not 3 ranks running the job: [$ranks]"
    [ "$got_sb" = "$want_s" ] && echo "sbatch examples/slurm/cumulo.sbatch: job $jobid serves on :$SB_PORT, a completion equals one machine's text"
else
    bad "sbatch: job $jobid not ready: $(squeue -h -j "$jobid" -o '%T %R' 2>/dev/null) $(tail -5 "$TMP/sb.log" 2>/dev/null)"
fi
[ -n "$jobid" ] && sl_cancel "$jobid"

sl_finish
