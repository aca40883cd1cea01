/*
 * mpi_link.h: cumulo's links over MPI (issue 18). Every rank of an MPI job
 * runs one bridge thread that carries cumulo's byte streams between ranks as
 * MPI point-to-point messages; net's transport seam (cm_net_set_transport)
 * hands the cluster code a local stream socket for "mpi:R" (rank R), so the
 * coordinator and the nodes run unchanged over it: the same frames, plans and
 * deterministic all-reduce as over TCP. Only the bridge thread calls MPI
 * between cm_mpi_start and cm_mpi_finish (MPI_THREAD_SERIALIZED).
 *
 * Compiled only with `make MPI=1` (build-mpi/); the default binary has none
 * of this. docs/DESIGN.md "Transports" tells the trust model: inside a job
 * the launcher (mpirun, srun) is the trust boundary, links are plaintext.
 */
#ifndef CM_MPI_LINK_H
#define CM_MPI_LINK_H

#include <stdatomic.h>
#include <stddef.h>

typedef struct cm_mpi cm_mpi;

/* MPI_Init_thread, a private communicator that returns errors instead of
 * aborting, a private 0700 directory for this rank's listener, the bridge
 * thread, and the transport seam for host "mpi". A STOP from rank 0 sets
 * *stop (may be NULL on rank 0). flags: CM_MPI_ALLREDUCE offers
 * MPI_Iallreduce as the tensor-parallel sum (mpi_coll.h; every rank must
 * pass the same flags). */
#define CM_MPI_ALLREDUCE 1u
int cm_mpi_start(int *argc, char ***argv, unsigned flags, atomic_int *stop, cm_mpi **out, char *err, size_t errlen);
int cm_mpi_rank(const cm_mpi *m);
int cm_mpi_size(const cm_mpi *m);
/* The host name of this rank's machine, as MPI names it. */
const char *cm_mpi_host(const cm_mpi *m);
/* Ranks found dead so far (their links were closed; a lost node to cumulo). */
int cm_mpi_dead(const cm_mpi *m);
/* Stop: rank 0 with stop_others first tells every other rank to stop; the
 * bridge sends what it holds, leaves, and MPI is finalized. */
void cm_mpi_finish(cm_mpi *m, int stop_others);

#endif
