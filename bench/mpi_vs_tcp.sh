#!/bin/sh
# bench/mpi_vs_tcp.sh (issue 18): decode tokens/s of the same plan over
# cumulo's TCP links (two `cumulo node`s on 127.0.0.1) and over MPI links
# (`mpirun -np 3 cumulo mpi`), on this machine, same model, same prompt, in
# one sitting, alternating. Not a test (prints a table; times are load-bound).
#   sh bench/mpi_vs_tcp.sh [MODEL] [TOKENS] [REPEATS]
# CUMULO_MPI_BIN / CUMULO_MPIRUN choose the MPI build and launcher.
# MPI_VARIANTS: space-separated VAR=VALUE settings, one MPI row each (","
# joins several settings of one row), e.g.
#   MPI_VARIANTS="CUMULO_MPI_NAP_US=0 CUMULO_MPI_NAP_US=50,CUMULO_MPI_SPIN_MS=0"
# (a setting that starts with -- is a `cumulo mpi` option, e.g. --mpi-allreduce)
cd "$(dirname "$0")/.." || exit 1
BIN=$(realpath "${CUMULO_BIN:-build/cumulo}")
MBIN=$(realpath "${CUMULO_MPI_BIN:-build-mpi/cumulo}")
MPIRUN=${CUMULO_MPIRUN:-mpirun}
MODEL=${1:-../shared/models/stories260K-f32.gguf}
N=${2:-200}
REP=${3:-3}
TMP=$(mktemp -d)
PIDS=""
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; rm -rf "$TMP"' EXIT
MPIOPT=""
if "$MPIRUN" --version 2>&1 | grep -q 'Open MPI'; then
    MPIOPT="--oversubscribe"
    [ "$(id -u)" = 0 ] && MPIOPT="$MPIOPT --allow-run-as-root"
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
fi
cat >"$TMP/rank.sh" <<EOF
#!/bin/sh
r=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}
CUMULO_HOST_ID=b-rank\$r exec "$MBIN" "\$@"
EOF
chmod +x "$TMP/rank.sh"
for t in a b; do
    CUMULO_HOST_ID=b-$t "$BIN" node --port 0 --port-file "$TMP/$t.port" --no-mdns --insecure --threads 1 \
        --models "$(dirname "$MODEL")" --cache "$TMP/c$t" >"$TMP/$t.log" 2>&1 &
    PIDS="$PIDS $!"
done
k=0
while { [ ! -s "$TMP/a.port" ] || [ ! -s "$TMP/b.port" ]; } && [ $k -lt 100 ]; do sleep 0.1; k=$((k + 1)); done
NODES="127.0.0.1:$(cat "$TMP/a.port"),127.0.0.1:$(cat "$TMP/b.port")"
tps() { perl -MJSON::PP -e 'local $/; my $j = decode_json(<STDIN>); printf "%.1f", $j->{timings}{gen_tps}'; }
VARIANTS=${MPI_VARIANTS:-default}
printf '%-10s %-40s %s\n' plan link "decode tok/s (each run)"
for plan in "pp:--layers 2,2,1" "tp:--parallel tp"; do
    name=${plan%%:*} opts=${plan#*:}
    tcp=""
    for v in $VARIANTS; do eval "mpi_$(echo "$v" | tr -c 'A-Za-z0-9\n' _)=''"; done
    for i in $(seq "$REP"); do
        # shellcheck disable=SC2086
        tcp="$tcp $("$BIN" run "$MODEL" --nodes "$NODES" --insecure $opts -p "Once upon a time" -n "$N" --temp 0 \
            --threads 1 --json 2>/dev/null | tps)"
        for v in $VARIANTS; do
            key=mpi_$(echo "$v" | tr -c 'A-Za-z0-9\n' _)
            envs="" xo=""
            for piece in $(echo "$v" | tr ',' ' '); do
                case $piece in default) ;; --*) xo="$xo $piece" ;; *) envs="$envs $piece" ;; esac
            done
            # shellcheck disable=SC2086
            r=$(env $envs "$MPIRUN" $MPIOPT -np 3 "$TMP/rank.sh" mpi "$MODEL" $opts $xo -p "Once upon a time" -n "$N" \
                --temp 0 --threads 1 --json 2>/dev/null | tps)
            eval "$key=\"\$$key $r\""
        done
    done
    printf '%-10s %-40s %s\n' "$name" tcp "$tcp"
    for v in $VARIANTS; do
        key=mpi_$(echo "$v" | tr -c 'A-Za-z0-9\n' _)
        eval "printf '%-10s %-40s %s\\n' \"\$name\" \"mpi \$v\" \"\$$key\""
    done
done
