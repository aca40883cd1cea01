#!/bin/sh
# tests/sh/mpi.sh (issue 18): `cumulo mpi` under `mpirun --oversubscribe` on
# this machine: rank 0 coordinates, ranks 1.. are nodes, their links MPI
# messages (build-mpi/cumulo, `make MPI=1`). Greedy texts and ids must equal
# one machine's `cumulo run --temp 0` (the default, MPI-free binary) for a
# pipeline (3 and 4 ranks), tensor parallel (--parallel tp), hybrid
# (--groups 2,2) and, on a synthetic qwen3moe, expert parallel (--parallel ep);
# the plan line must say which plan ran and the links must have been
# measured over MPI. Also: `cumulo mpi` serving (a completion equals one
# machine's; SIGTERM to the launcher ends every rank), the Slurm example
# script under a stand-in srun, rank 0 failing at start (non-zero, its reason
# shown), and a rank killed mid-generation (OpenMPI --enable-recovery: re-plan
# on the survivors, same ids; the default: the job aborts, no hang). The
# default binary must link no MPI symbol. Without an
# MPI build the script reports "n/a:" (no mpicc) or a plain skip (mpicc there
# but build-mpi/cumulo not built).
# Each rank plays a machine of its own (CUMULO_HOST_ID per rank), as the
# cluster tests' nodes do. MPICH: CUMULO_MPI_BIN=build-mpich/cumulo
# CUMULO_MPIRUN=mpirun.mpich (after make MPI=1 MPICC=mpicc.mpich BUILD=build-mpich).
cd "$(dirname "$0")/../.." || exit 1
. tests/sh/lib/cluster_common.sh
need curl perl python3
M=$SHARED/models
MBIN=$(realpath "${CUMULO_MPI_BIN:-build-mpi/cumulo}" 2>/dev/null)
MPIRUN=${CUMULO_MPIRUN:-mpirun}

if [ ! -x "$MBIN" ]; then
    if command -v "${MPICC:-mpicc}" >/dev/null 2>&1; then
        need_skip "build-mpi/cumulo missing: run make MPI=1 (mpicc is installed)"
    fi
    need_skip "n/a: built without MPI (no mpicc; make MPI=1 needs openmpi or mpich)"
fi
command -v "$MPIRUN" >/dev/null 2>&1 || { bad "$MPIRUN missing while $MBIN exists"; echo "$pass passed, $fail failed"; exit 1; }

# The default binary stays MPI-free; the MPI one has it.
nm "$BIN" 2>/dev/null | grep -q -E ' (MPI|PMPI|ompi)_' && bad "the default binary has MPI symbols" || ok
nm "$MBIN" 2>/dev/null | grep -q ' U MPI_Init_thread' && ok || bad "build-mpi/cumulo does not call MPI_Init_thread"
"$BIN" mpi "$M/stories260K-f32.gguf" -p hi 2>"$TMP/nompi.err" && bad "cumulo mpi ran in the default build" ||
    { grep -q 'built without MPI' "$TMP/nompi.err" && ok || bad "default build: $(cat "$TMP/nompi.err")"; }

# Root needs OpenMPI's consent; oversubscription: more ranks than cores here.
MPIOPT="--oversubscribe"
[ "$(id -u)" = 0 ] && MPIOPT="$MPIOPT --allow-run-as-root"
"$MPIRUN" --version 2>&1 | grep -q 'Open MPI' || MPIOPT="" # MPICH's mpiexec oversubscribes by itself
export OMPI_MCA_btl_vader_single_copy_mechanism=none # containers forbid CMA (ptrace)
export OMPI_MCA_rmaps_base_oversubscribe=1

# A wrapper so each rank is a machine of its own (its rank from OpenMPI or MPICH/PMI).
cat >"$TMP/rank.sh" <<EOF
#!/bin/sh
r=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-\${PMIX_RANK:-0}}}
CUMULO_HOST_ID=mpi-rank\$r exec "$MBIN" "\$@"
EOF
chmod +x "$TMP/rank.sh"

# mpi_case NAME NP MODEL PROMPT N PLAN_REGEX [run options...]: the MPI job's
# ids and text vs one machine's.
mpi_case() {
    name=$1 np=$2 model=$3 prompt=$4 n=$5 want_plan=$6
    shift 6
    "$BIN" run "$model" -p "$prompt" -n "$n" --temp 0 --threads 1 --json >"$TMP/one.json" 2>/dev/null
    one_ids=$(cc_jsonget "$TMP/one.json" 'join(",", @{$j->{tokens}})')
    one_text=$(cc_jsonget "$TMP/one.json" '$j->{text}' 2>/dev/null)
    [ -n "$one_ids" ] || { bad "$name: no one-machine reference"; return; }
    if [ -n "$REF_IDS" ]; then # llama.cpp's ids for this prompt (cc_ref_case)
        [ "$one_ids" = "$REF_IDS" ] && ok || bad "$name: one machine differs from llama.cpp"
    fi
    # shellcheck disable=SC2086
    if ! timeout 300 "$MPIRUN" $MPIOPT -np "$np" "$TMP/rank.sh" mpi "$model" -p "$prompt" -n "$n" --temp 0 \
        --threads 1 --json "$@" >"$TMP/$name.json" 2>"$TMP/$name.err"; then
        bad "$name: mpirun failed: $(grep -v '^ *$' "$TMP/$name.err" | tail -5)"
        return
    fi
    got_ids=$(cc_jsonget "$TMP/$name.json" 'join(",", @{$j->{tokens}})')
    got_text=$(cc_jsonget "$TMP/$name.json" '$j->{text}' 2>/dev/null)
    [ "$got_ids" = "$one_ids" ] && ok || bad "$name: ids differ from one machine: $got_ids vs $one_ids"
    if [ -n "$REF_IDS" ]; then [ "$got_ids" = "$REF_IDS" ] && ok || bad "$name: ids differ from llama.cpp's"; fi
    [ "$got_text" = "$one_text" ] && ok || bad "$name: text differs from one machine"
    grep -qE "$want_plan" "$TMP/$name.err" && ok || bad "$name: plan is not /$want_plan/: $(grep -E '^(why|mode)' "$TMP/$name.err" | head -3)"
    grep -q "mpi:1" "$TMP/$name.err" && ok || bad "$name: no node mpi:1 in the log"
    rate=$(cc_jsonget "$TMP/$name.json" 'sprintf "%.1f", $j->{timings}{gen_tps}' 2>/dev/null)
    echo "$name: $np ranks, ids equal one machine${REF_IDS:+ and llama.cpp} ($(echo "$got_ids" | tr ',' '\n' | wc -l) ids, decode $rate tok/s)"
}

F32=$M/stories260K-f32.gguf
Q8=$M/stories260K-q8_0.gguf
# Against llama.cpp's reference ids too (stories260K reference cases 0 and 1).
cc_ref_case f32 0
REF_IDS=$want mpi_case pp3 3 "$F32" "$prompt" "$n" "why: pp plan, 3 stages"
REF_IDS=$want mpi_case tp3 3 "$F32" "$prompt" "$n" "why: tp plan, 1 stage: .*mpi:1.*mpi:2|why: tp plan, 1 stage: .*mpi:2.*mpi:1" --parallel tp
# --mpi-allreduce (opt-in): tensor-parallel sums by MPI_Iallreduce, in the
# library's order, so the bits may differ from one machine's: the check is
# closeness. Every generated token's top-5 logprobs within LP_TOL of one
# machine's (the ordered exchange's own distance is printed beside it), and
# the same ids wherever one machine's top-2 margin exceeds 2 * LP_TOL (a
# smaller margin may flip a greedy pick; then the rest is not compared).
# Every rank must say it summed by MPI_Iallreduce; the default run (tp3) none.
# Measured (stories260K-f32, case 0, 64 tokens, OpenMPI 4.1.4): the exchange
# 7.2e-6 from one machine, MPI_Iallreduce 5.2e-6; LP_TOL about 7x that.
LP_TOL=5e-5
lp_compare() { # ONE.json OTHER.json: "maxdiff compared flip_at margin_there"
    perl -MJSON::PP -e '
        sub rd { local $/; open my $f, "<", $_[0] or exit 2; decode_json(<$f>)->{logprobs} || [] }
        my ($a, $b) = (rd($ARGV[0]), rd($ARGV[1]));
        my ($d, $n, $flip, $margin) = (0, 0, -1, 0);
        for my $i (0 .. $#$a) {
            if ($i > $#$b) { $flip = $i; last }
            my %t = map { $_->[0] => $_->[1] } @{$b->[$i]{top}};
            for my $e (@{$a->[$i]{top}}) {
                next unless exists $t{$e->[0]};
                my $x = abs($e->[1] - $t{$e->[0]});
                $d = $x if $x > $d;
                $n++;
            }
            if ($a->[$i]{id} != $b->[$i]{id}) { my $tp = $a->[$i]{top}; $flip = $i; $margin = $tp->[0][1] - $tp->[1][1]; last }
        }
        printf "%.3g %d %d %.3g\n", $d, $n, $flip, $margin;' "$1" "$2"
}
cc_ref_case f32 0
"$BIN" run "$F32" -p "$prompt" -n "$n" --temp 0 --threads 1 --json --logprobs 5 >"$TMP/lp_one.json" 2>/dev/null
for v in exch native; do
    extra=""
    [ $v = native ] && extra=--mpi-allreduce
    # shellcheck disable=SC2086
    CUMULO_LOG=info timeout 300 "$MPIRUN" $MPIOPT -np 3 "$TMP/rank.sh" mpi "$F32" -p "$prompt" -n "$n" --temp 0 --threads 1 --json \
        --logprobs 5 --parallel tp $extra >"$TMP/lp_$v.json" 2>"$TMP/lp_$v.err" || bad "tp3 $v: mpirun failed: $(tail -3 "$TMP/lp_$v.err")"
done
said=$(grep -c "tensor-parallel sums by MPI_Iallreduce" "$TMP/lp_native.err")
[ "$said" = 3 ] && ok || bad "--mpi-allreduce: $said of 3 ranks summed by MPI_Iallreduce"
grep -q "MPI_Iallreduce" "$TMP/lp_exch.err" && bad "the default tp run used MPI_Iallreduce" || ok
set -- $(lp_compare "$TMP/lp_one.json" "$TMP/lp_exch.json")
ex_d=$1
set -- $(lp_compare "$TMP/lp_one.json" "$TMP/lp_native.json")
na_d=$1 na_n=$2 na_flip=$3 na_margin=$4
[ "$na_n" -ge "$n" ] 2>/dev/null && ok || bad "--mpi-allreduce: only ${na_n:-no} logprobs compared"
perl -e 'exit !($ARGV[0] <= $ARGV[1])' "$na_d" "$LP_TOL" && ok || bad "--mpi-allreduce: logprobs differ from one machine's by $na_d (> $LP_TOL)"
[ "$na_flip" = -1 ] || perl -e 'exit !($ARGV[0] < 2 * $ARGV[1])' "$na_margin" "$LP_TOL" && ok ||
    bad "--mpi-allreduce: ids differ at token $na_flip where one machine's top-2 margin is $na_margin"
echo "tp3 --mpi-allreduce: max |logprob - one machine's| $na_d (ordered exchange: $ex_d; tolerance $LP_TOL), $na_n compared, ids $([ "$na_flip" = -1 ] && echo equal || echo "differ from token $na_flip (margin $na_margin)")"

cc_ref_case q8_0 1
REF_IDS=$want mpi_case pp4 4 "$Q8" "$prompt" "$n" "why: pp plan, 4 stages"
REF_IDS=$want mpi_case tp4 4 "$Q8" "$prompt" "$n" "why: tp plan, 1 stage" --parallel tp
mpi_case hybrid4 4 "$Q8" "One day" 40 "^mode hybrid" --groups 2,2

# Expert parallel on a small synthetic qwen3moe (cluster_ep.sh's first model).
VOCAB=$SHARED/vocab/ggml-vocab-llama-spm.gguf
if "$BIN" synth --arch qwen3moe --dim 256 --layers 3 --heads 4 --kv-heads 2 --ffn 768 --expert-ffn 256 --experts 8 \
    --experts-used 2 --type q8_0 --seed 21 --vocab "$VOCAB" -o "$TMP/moe8.gguf" 2>/dev/null; then
    mpi_case ep3 3 "$TMP/moe8.gguf" "Once upon a time" 24 "^mode ep|why: ep plan" --parallel ep
else
    bad "synth qwen3moe failed"
fi

# Rank 0 failing at start (no such model): its reason is shown, the job ends
# non-zero and every node rank stops (STOP), never a hang.
# shellcheck disable=SC2086
timeout 120 "$MPIRUN" $MPIOPT -np 3 "$TMP/rank.sh" mpi "$TMP/no-such-model.gguf" -p hi -n 3 >/dev/null 2>"$TMP/nomodel.err"
nrc=$?
[ "$nrc" != 0 ] && [ "$nrc" != 124 ] && ok || bad "no such model: the job exited $nrc"
grep -q "no-such-model" "$TMP/nomodel.err" && ok || bad "no such model: rank 0's reason not shown: $(tail -3 "$TMP/nomodel.err")"

# Serve form: rank 0 serves the API; a completion equals one machine's text,
# and SIGTERM to the launcher ends every rank (no rank left behind).
"$BIN" run "$F32" -p "Once upon a time" -n 24 --temp 0 --threads 1 --json >"$TMP/s1.json" 2>/dev/null
want_s=$(cc_jsonget "$TMP/s1.json" '$j->{text}' 2>/dev/null)
# shellcheck disable=SC2086
"$MPIRUN" $MPIOPT -np 3 "$TMP/rank.sh" mpi "$F32" --port 0 --threads 1 >"$TMP/serve.out" 2>"$TMP/serve.log" &
spid=$!
if cc_wait_grep "$TMP/serve.log" "ready:" 600; then
    sport=$(sed -n 's/.*listening on http:\/\/[^ ]*:\([0-9][0-9]*\)\/.*/\1/p' "$TMP/serve.log" | head -1)
    curl -s -m 60 "http://127.0.0.1:$sport/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$TMP/serve.json"
    got_s=$(cc_jsonget "$TMP/serve.json" '$j->{choices}[0]{text}' 2>/dev/null)
    [ -n "$got_s" ] && [ "$got_s" = "$want_s" ] && ok || bad "serve: completion differs from one machine: '$got_s'"
    grep -q "mpi:2" "$TMP/serve.log" && ok || bad "serve: no node mpi:2 in the plan"
else
    bad "serve: not ready: $(tail -3 "$TMP/serve.log")"
fi
ranks=$(pgrep -P "$spid" 2>/dev/null) # the launcher's children: the ranks (hydra: its proxy, whose children they are)
for r in $ranks; do ranks="$ranks $(pgrep -P "$r" 2>/dev/null)"; done
kill -TERM "$spid" 2>/dev/null
k=0
while kill -0 "$spid" 2>/dev/null && [ $k -lt 300 ]; do sleep 0.1; k=$((k + 1)); done
kill -0 "$spid" 2>/dev/null && { bad "serve: mpirun still running 30 s after SIGTERM"; kill -9 "$spid"; } || ok
wait "$spid" 2>/dev/null
k=0
while :; do # the ranks may still be leaving (their last barrier waits up to 5 s)
    left=""
    for r in $ranks; do kill -0 "$r" 2>/dev/null && left="$left $r"; done
    [ -z "$left" ] || [ $k -ge 150 ] && break
    sleep 0.1
    k=$((k + 1))
done
[ $k -gt 0 ] && echo "serve: ranks left $((k / 10)).$((k % 10)) s after the launcher"
[ -n "$ranks" ] && [ -z "$left" ] && ok || { bad "serve: ranks [$(echo $ranks)] left behind 15 s after SIGTERM: [$left]"; for r in $left; do kill -9 "$r"; done; }

# examples/slurm/cumulo.sbatch with a stand-in `srun` (no Slurm here: it
# drops srun's options and runs the command under mpirun with SLURM_NTASKS
# ranks): the script's command line serves, and a completion equals one
# machine's text. Under a real srun/slurmctld: tests/sh/slurm.sh.
mkdir -p "$TMP/fakebin"
{
    echo '#!/bin/sh'
    echo 'while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done'
    echo "exec \"$MPIRUN\" $MPIOPT -np \"\$SLURM_NTASKS\" \"\$@\""
} >"$TMP/fakebin/srun"
chmod +x "$TMP/fakebin/srun"
SB_PORT=$(cc_free_port)
PATH="$TMP/fakebin:$PATH" SLURM_NTASKS=3 SLURM_CPUS_PER_TASK=1 CUMULO="$TMP/rank.sh" CUMULO_HOST=127.0.0.1 \
    CUMULO_PORT=$SB_PORT bash examples/slurm/cumulo.sbatch "$F32" >"$TMP/sb.out" 2>"$TMP/sb.log" &
sbpid=$!
if cc_wait_grep "$TMP/sb.log" "ready:" 600; then
    curl -s -m 60 "http://127.0.0.1:$SB_PORT/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' >"$TMP/sb.json"
    got_sb=$(cc_jsonget "$TMP/sb.json" '$j->{choices}[0]{text}' 2>/dev/null)
    [ -n "$got_sb" ] && [ "$got_sb" = "$want_s" ] && ok || bad "sbatch script: completion differs from one machine: '$got_sb'"
    grep -q "mpi:2" "$TMP/sb.log" && ok || bad "sbatch script: no node mpi:2 in the plan"
else
    bad "sbatch script: not ready: $(tail -3 "$TMP/sb.log")"
fi
sbl=$(pgrep -P "$sbpid" 2>/dev/null) # bash -> mpirun (exec'd by the stand-in srun)
# shellcheck disable=SC2086
kill -TERM $sbl 2>/dev/null
k=0
while kill -0 "$sbpid" 2>/dev/null && [ $k -lt 300 ]; do sleep 0.1; k=$((k + 1)); done
# shellcheck disable=SC2086
kill -0 "$sbpid" 2>/dev/null && { bad "sbatch script: still running 30 s after SIGTERM"; kill -9 $sbl "$sbpid"; } || ok
wait "$sbpid" 2>/dev/null

# Failures (OpenMPI). A rank killed mid-generation:
#  (a) under `mpirun --enable-recovery` the job lives on: rank 0 sees the node
#      fall silent, re-plans on the survivors, and the text equals one machine's;
#  (b) under the default (OpenMPI and MPICH), the launcher aborts the whole
#      job: it must end (not hang), with a non-zero status.
# kill_rank R: SIGKILL the process of rank R (found by its environment).
kill_rank() {
    for p in $(pgrep -f "$MBIN mpi" 2>/dev/null); do
        if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qxE "(OMPI_COMM_WORLD_RANK|PMI_RANK)=$1"; then kill -9 "$p"; return 0; fi
    done
    return 1
}
# fail_case NAME MPIRUN_OPTS: 3 ranks, 500 tokens, rank 2 killed once the cluster is ready.
# Sets frc (the launcher's exit status).
fail_case() {
    fname=$1 fopts=$2
    : >"$TMP/$fname.err"
    # shellcheck disable=SC2086
    # (CUMULO_MPI_SPIN_MS=0 CUMULO_MPI_NAP_US=0: the 1 ms poll, a decode slow enough that the kill lands mid-generation)
    CUMULO_MPI_SPIN_MS=0 CUMULO_MPI_NAP_US=0 timeout 120 "$MPIRUN" $MPIOPT $fopts -np 3 "$TMP/rank.sh" mpi "$F32" -p "Once upon a time" -n 500 --temp 0 \
        --threads 1 --json >"$TMP/$fname.json" 2>"$TMP/$fname.err" &
    fpid=$!
    cc_wait_grep "$TMP/$fname.err" "cluster ready" 300 || bad "$fname: the cluster did not start: $(tail -3 "$TMP/$fname.err")"
    sleep 0.3
    kill_rank 2 || bad "$fname: rank 2 not found"
    wait "$fpid"
    frc=$?
}
if [ ! -d /proc/self ]; then
    echo "skip: n/a: the failure cases find ranks through /proc"
elif "$MPIRUN" --version 2>&1 | grep -q 'Open MPI'; then
    "$BIN" run "$F32" -p "Once upon a time" -n 500 --temp 0 --threads 1 --json >"$TMP/one500.json" 2>/dev/null
    want500=$(cc_jsonget "$TMP/one500.json" 'join(",", @{$j->{tokens}})')
    fail_case recover --enable-recovery
    got500=$(cc_jsonget "$TMP/recover.json" 'join(",", @{$j->{tokens}})' 2>/dev/null)
    [ "$frc" = 0 ] && ok || bad "--enable-recovery: mpirun exited $frc: $(tail -3 "$TMP/recover.err")"
    grep -q "re-planning on the survivors" "$TMP/recover.err" && ok || bad "--enable-recovery: no re-plan after rank 2 died"
    [ -n "$got500" ] && [ "$got500" = "$want500" ] && ok || bad "--enable-recovery: ids after the re-plan differ from one machine"
    echo "rank 2 killed under --enable-recovery: mpirun exit $frc, $(grep -c '' "$TMP/recover.err") log lines, ids equal one machine: $([ "$got500" = "$want500" ] && echo yes || echo no)"
    fail_case abort ""
    [ "$frc" != 0 ] && [ "$frc" != 124 ] && ok || bad "default: mpirun exited $frc after a rank died (want an abort, not 0 or a hang)"
    echo "rank 2 killed under the default: mpirun exit $frc (the job aborted)"
else # MPICH's hydra: no --enable-recovery here; the default must abort, not hang
    echo "skip: n/a: recovery from a dead rank is tested under OpenMPI's --enable-recovery only"
    fail_case abort ""
    [ "$frc" != 0 ] && [ "$frc" != 124 ] && ok || bad "default: $MPIRUN exited $frc after a rank died (want an abort, not 0 or a hang)"
    echo "rank 2 killed under the default: $MPIRUN exit $frc (the job aborted)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
