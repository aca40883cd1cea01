/*
 * cmd_mpi_none.c: `cumulo mpi` in a build without MPI (the default build,
 * which links no MPI library): it says how to get the real one
 * (src/mpi/cmd_mpi.c, built by `make MPI=1` into build-mpi/).
 */
#include "cli.h"

#include <stdio.h>

int cmd_mpi(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_fail("this cumulo was built without MPI: build `make MPI=1` (needs mpicc: Debian's openmpi-bin and "
                    "libopenmpi-dev, or mpich) and run build-mpi/cumulo under mpirun or srun");
}
