/*
 * mpi_coll.h: MPI_Iallreduce as the tensor-parallel sum (issue 18, opt-in:
 * `cumulo mpi --mpi-allreduce`), offered to collective.c as its transport's
 * own all-reduce (cm_coll_native). Internal to src/mpi: the bridge thread of
 * mpi_link.c is the only caller of MPI, so a compute thread posts its
 * partial here, wakes the bridge, and waits (with the collective's
 * deadline); the bridge starts MPI_Iallreduce on a communicator of every
 * rank and tests it while it polls.
 *
 * One group per job: it serves only a tensor-parallel group of EVERY rank
 * (size = the job's size), and only the first plan epoch it is opened for,
 * so that every rank uses it for the same ops (a later plan, after a lost
 * rank or a failed op, sums with cumulo's ordered exchange). A timed-out or
 * failed op leaves it broken for the rest of the job.
 */
#ifndef CM_MPI_COLL_H
#define CM_MPI_COLL_H

#include "cluster/collective.h"

#include <mpi.h>
#include <stdbool.h>

typedef struct cm_mpi_coll cm_mpi_coll;

/* Before the bridge thread starts (every rank, in the same place: it dups
 * comm). wake_fd: written to wake the bridge when an op is posted. */
int cm_mpi_coll_new(MPI_Comm comm, int wake_fd, cm_mpi_coll **out, char *err, size_t errlen);
/* Bridge thread: start a posted op, test a running one; true while one is posted or running. */
bool cm_mpi_coll_progress(cm_mpi_coll *c);
/* For cm_coll_set_native. */
const cm_coll_native *cm_mpi_coll_native(cm_mpi_coll *c);
/* An op never finished (a rank died mid-sum): MPI_Finalize must not be called. */
bool cm_mpi_coll_broken(cm_mpi_coll *c);
/* After the bridge thread has left; free_comm: MPI_Comm_free too (before MPI_Finalize). */
void cm_mpi_coll_free(cm_mpi_coll *c, bool free_comm);

#endif
