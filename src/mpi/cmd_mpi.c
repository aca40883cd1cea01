/*
 * cmd_mpi.c: `cumulo mpi` (issue 18): one cumulo cluster as one MPI job.
 * Under `mpirun -np N` (or `srun`), rank 0 is the coordinator (`cumulo run`
 * or `cumulo serve` with --nodes mpi:1,...,mpi:N-1) and every other rank a
 * node listening on its MPI rank; the links between them are mpi_link.c's.
 * Inside the job nothing is keyed or encrypted: the launcher (mpirun, srun)
 * decides which processes belong, it is the trust boundary (docs/DESIGN.md).
 */
#include "cli/cli.h"
#include "mpi/mpi_link.h"

#include "base/base.h"
#include "cluster/cluster.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char k_mpi_usage[] =
    "usage: mpirun -np N cumulo mpi [run|serve] MODEL.gguf [options of cumulo run / cumulo serve]\n"
    "\n"
    "Run one cumulo cluster as an MPI job (mpirun, or srun under Slurm): rank 0 is\n"
    "the coordinator (with -p/--prompt/-f a one-shot `cumulo run`, else `cumulo serve`:\n"
    "the API and the dashboard), every other rank a node. Ranks find each other\n"
    "through MPI (no mDNS), their links are MPI messages, the planner measures them\n"
    "and plans as for TCP nodes (pipeline; --parallel tp|hybrid|ep, --groups, --layers).\n"
    "No cluster key inside the job: the MPI launcher is the trust boundary.\n"
    "\n"
    "  run | serve     force the one-shot or the server form\n"
    "  --threads N     compute threads of every rank (default: all CPUs of each)\n"
    "  --models DIR    where the nodes find MODEL (default: MODEL's directory; else\n"
    "                  rank 0 streams the weights to them)\n"
    "  --mpi-allreduce tensor-parallel sums by MPI_Iallreduce (a group of every rank,\n"
    "                  the first plan) instead of cumulo's ordered exchange: close to,\n"
    "                  but NOT bit-identical with, one machine's results\n"
    "CUMULO_MPI_SPIN_MS: how long each rank's MPI bridge spins after traffic (default 5; MPICH 0).\n"
    "A rank that dies: see docs/DESIGN.md \"Transports\" (OpenMPI's default aborts the job;\n"
    "under mpirun --enable-recovery the coordinator re-plans on the survivors).\n";

static atomic_int g_stop;
static void on_stop(int sig) {
    (void)sig;
    atomic_store(&g_stop, 1);
}

/* A rank > 0: a node on "mpi:RANK" until rank 0 says stop. */
static int run_node(cm_mpi *m, const char *models, long threads) {
    char name[64], err[400];
    snprintf(name, sizeof name, "rank%d@%.40s", cm_mpi_rank(m), cm_mpi_host(m));
    cm_node_opts o = {.bind = "mpi",
                      .port = (uint16_t)cm_mpi_rank(m),
                      .name = name,
                      .models_dir = models,
                      .n_threads = (int)threads,
                      .insecure = true,
                      .mdns = false};
    int rc = cm_node_run(&o, &g_stop, err, sizeof err);
    if (rc) fprintf(stderr, "cumulo: rank %d: %s\n", cm_mpi_rank(m), err);
    return rc ? 1 : 0;
}

/* Rank 0: `cumulo run` or `cumulo serve` with the other ranks as --nodes. */
static int run_coordinator(cm_mpi *m, bool serve, int argc, char **argv) {
    int n = cm_mpi_size(m);
    size_t cap = (size_t)n * 8 + 16;
    char *nodes = cm_calloc(1, cap);
    char **av = cm_calloc((size_t)argc + 8, sizeof *av);
    if (!nodes || !av) {
        cm_free(nodes);
        cm_free(av);
        return cli_fail("out of memory");
    }
    int k = 0;
    av[k++] = serve ? "serve" : "run";
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--models") && i + 1 < argc) {
            i++;
            continue;
        }                                                  /* the nodes' option */
        if (!strcmp(argv[i], "--mpi-allreduce")) continue; /* every rank's, taken by cm_mpi_start */
        av[k++] = argv[i];
    }
    if (n > 1) {
        for (int r = 1; r < n; r++) {
            size_t l = strlen(nodes);
            snprintf(nodes + l, cap - l, "%smpi:%d", r > 1 ? "," : "", r);
        }
        av[k++] = "--nodes";
        av[k++] = nodes;
        av[k++] = "--insecure";
    }
    av[k] = NULL;
    int rc = serve ? cmd_serve(k, av) : cmd_run(k, av);
    cm_free(nodes);
    cm_free(av);
    return rc;
}

int cmd_mpi(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        fputs(k_mpi_usage, stdout);
        return 0;
    }
    int first = 1;
    int form = 0; /* 0: by the options, 1: run, 2: serve */
    if (argc > 1 && !strcmp(argv[1], "run")) {
        form = 1;
        first = 2;
    } else if (argc > 1 && !strcmp(argv[1], "serve")) {
        form = 2;
        first = 2;
    }
    const char *model = NULL, *models = NULL;
    long threads = 0;
    bool prompt = false;
    unsigned flags = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--mpi-allreduce")) flags |= CM_MPI_ALLREDUCE;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt") || !strcmp(a, "-f") || !strcmp(a, "--file")) prompt = true;
        else if ((!strcmp(a, "--threads") || !strcmp(a, "-t")) && i + 1 < argc) threads = strtol(argv[++i], NULL, 10);
        else if (!strcmp(a, "--models") && i + 1 < argc) models = argv[++i];
        else if (a[0] != '-' && !model) model = a;
    }
    if (!model) return cli_fail("no model given; see 'cumulo mpi --help'");
    bool serve = form ? form == 2 : !prompt;
    char dir[1024];
    if (!models) {
        const char *slash = strrchr(model, '/');
        if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - model), model);
        else snprintf(dir, sizeof dir, ".");
        models = dir;
    }

    cm_mpi *m;
    char err[400];
    if (cm_mpi_start(NULL, NULL, flags, &g_stop, &m, err, sizeof err)) return cli_fail("%s", err);
    int rc;
    if (cm_mpi_rank(m) == 0) {
        rc = run_coordinator(m, serve, argc - first, argv + first);
    } else {
        signal(SIGINT, on_stop);
        signal(SIGTERM, on_stop);
        rc = run_node(m, models, threads);
    }
    cm_mpi_finish(m, cm_mpi_rank(m) == 0);
    return rc;
}
