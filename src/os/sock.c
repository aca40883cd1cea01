/*
 * sock.c: the platform differences of TCP sockets (SIGPIPE suppression is
 * MSG_NOSIGNAL on Linux, SO_NOSIGPIPE on macOS). Everything portable about
 * sockets lives in src/net/; this file must stay tiny.
 */
#include "os.h"

#include "../base/base.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>

int cm_sock_prepare(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return -1;
    /* Test hook: small socket buffers, so that a frozen peer blocks its
     * senders after a few kB (tests/sh/cluster_deadline.sh). */
    if (cm_config_get()->test_sockbuf > 0) {
        int b = cm_config_get()->test_sockbuf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    }
#if defined(SO_NOSIGPIPE)
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one) < 0) return -1;
#endif
    return 0;
}

long cm_sock_send(int fd, const void *p, size_t n) {
#if defined(MSG_NOSIGNAL)
    return (long)send(fd, p, n, MSG_NOSIGNAL);
#else
    return (long)send(fd, p, n, 0);
#endif
}

void cm_sock_shutdown(int fd) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
}
