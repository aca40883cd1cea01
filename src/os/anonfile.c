/*
 * anonfile.c: a nameless file in memory (cm_anon_file), whose pages several
 * private mappings can share until one of them writes a page (the kernel
 * copies it then). The KV prefix blocks (src/model/kv_blocks.c) live in one.
 * Never a file on disk: memfd on Linux, an unlinked POSIX shared-memory
 * object elsewhere.
 */
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include <stdatomic.h>

int cm_anon_file(uint64_t bytes) {
    int fd = -1;
#if defined(__linux__)
    fd = memfd_create("cumulo-kv", MFD_CLOEXEC);
#else
    static atomic_uint seq;
    char name[64];
    for (int tries = 0; fd < 0 && tries < 16; tries++) {
        snprintf(name, sizeof name, "/cumulo-kv-%d-%u", (int)getpid(), atomic_fetch_add(&seq, 1));
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) shm_unlink(name);
        else if (errno != EEXIST) break;
    }
#endif
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}
