/*
 * netif.c: network interface listing and IPv4 multicast UDP sockets, the
 * platform-specific part of mDNS (Linux: IP_PKTINFO; macOS/BSD: IP_RECVIF,
 * SO_REUSEPORT). It moves datagrams only; it must never parse them.
 */
#include "os.h"

#include "../base/base.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <arpa/inet.h>
#include <unistd.h>
#if defined(__APPLE__) || defined(__FreeBSD__)
#include <net/if_dl.h>
#endif

int cm_netif_list(cm_netif *out, int max) {
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) != 0) return CM_EIO;
    int n = 0;
    for (struct ifaddrs *i = ifa; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !i->ifa_name) continue;
        cm_netif *o = &out[n];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", i->ifa_name);
        o->index = if_nametoindex(i->ifa_name);
        memcpy(o->ipv4, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, 4);
        if (i->ifa_netmask) memcpy(o->mask4, &((struct sockaddr_in *)(void *)i->ifa_netmask)->sin_addr, 4);
        o->up = (i->ifa_flags & IFF_UP) && (i->ifa_flags & IFF_RUNNING);
        o->loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
        o->multicast = (i->ifa_flags & IFF_MULTICAST) != 0;
        n++;
    }
    freeifaddrs(ifa);
    return n;
}

int cm_mcast4_open(uint16_t port, char *err, size_t errlen) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return cm_errf(err, errlen, CM_EIO, "cannot open udp socket: %s", strerror(errno));
    int one = 1;
    unsigned char ttl = 255, loop = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
#if defined(__APPLE__) || defined(__FreeBSD__)
    /* BSD stacks need SO_REUSEPORT to share 5353 with mDNSResponder */
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(fd, IPPROTO_IP, IP_RECVIF, &one, sizeof one);
#else
    /* Linux delivers multicast to every SO_REUSEADDR socket on the port (avahi sets it too) */
    setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
#endif
    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &ttl, sizeof ttl);
    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &loop, sizeof loop);
    int ittl = 255;
    setsockopt(fd, IPPROTO_IP, IP_TTL, &ittl, sizeof ittl);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        return cm_errf(err, errlen, CM_EIO, "cannot bind udp port %u: %s", port, strerror(e));
    }
    int fl = fcntl(fd, F_GETFL, 0);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
        close(fd);
        return cm_errf(err, errlen, CM_EIO, "cannot configure udp socket: %s", strerror(errno));
    }
    return fd;
}

static int mcast4_membership(int fd, int opt, const uint8_t group[4], const uint8_t ifaddr[4], unsigned ifindex) {
#if defined(__linux__)
    struct ip_mreqn mr;
    memset(&mr, 0, sizeof mr);
    memcpy(&mr.imr_multiaddr, group, 4);
    memcpy(&mr.imr_address, ifaddr, 4);
    mr.imr_ifindex = (int)ifindex;
#else
    (void)ifindex;
    struct ip_mreq mr;
    memset(&mr, 0, sizeof mr);
    memcpy(&mr.imr_multiaddr, group, 4);
    memcpy(&mr.imr_interface, ifaddr, 4);
#endif
    if (setsockopt(fd, IPPROTO_IP, opt, &mr, sizeof mr) != 0) {
        /* already a member (e.g. two addresses on one interface) is fine */
        if (opt == IP_ADD_MEMBERSHIP && errno == EADDRINUSE) return 0;
        return CM_EIO;
    }
    return 0;
}

int cm_mcast4_join(int fd, const uint8_t group[4], const uint8_t ifaddr[4], unsigned ifindex) {
    return mcast4_membership(fd, IP_ADD_MEMBERSHIP, group, ifaddr, ifindex);
}

int cm_mcast4_leave(int fd, const uint8_t group[4], const uint8_t ifaddr[4], unsigned ifindex) {
    return mcast4_membership(fd, IP_DROP_MEMBERSHIP, group, ifaddr, ifindex);
}

int cm_udp4_send(int fd, const void *buf, size_t n, const uint8_t dst[4], uint16_t port, const uint8_t ifaddr[4]) {
    if (ifaddr && dst[0] >= 224 && dst[0] <= 239) {
        struct in_addr ia;
        memcpy(&ia, ifaddr, 4);
        if (setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &ia, sizeof ia) != 0) return CM_EIO;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    memcpy(&sa.sin_addr, dst, 4);
    ssize_t k = sendto(fd, buf, n, 0, (struct sockaddr *)&sa, sizeof sa);
    if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? CM_EAGAIN : CM_EIO;
    return 0;
}

long cm_udp4_recv(int fd, void *buf, size_t cap, uint8_t src[4], uint16_t *sport, unsigned *ifindex) {
    struct sockaddr_in sa;
    struct iovec iov = {buf, cap};
    union {
        char b[256];
        struct cmsghdr align;
    } ctl;
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_name = &sa;
    mh.msg_namelen = sizeof sa;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.b;
    mh.msg_controllen = sizeof ctl.b;
    ssize_t k = recvmsg(fd, &mh, 0);
    if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return CM_EAGAIN;
        return CM_EIO;
    }
    memcpy(src, &sa.sin_addr, 4);
    *sport = ntohs(sa.sin_port);
    *ifindex = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
#if defined(__APPLE__) || defined(__FreeBSD__)
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVIF) {
            struct sockaddr_dl sdl;
            memcpy(&sdl, CMSG_DATA(c), CM_MIN(sizeof sdl, (size_t)c->cmsg_len - CMSG_LEN(0)));
            *ifindex = sdl.sdl_index;
        }
#else
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo pi;
            memcpy(&pi, CMSG_DATA(c), sizeof pi);
            *ifindex = (unsigned)pi.ipi_ifindex;
        }
#endif
    }
    if (mh.msg_flags & MSG_TRUNC) return (long)cap; /* oversize: caller sees a cut packet */
    return (long)k;
}

int cm_fd_wait_readable(int fd, int timeout_ms) {
    struct pollfd pf = {fd, POLLIN, 0};
    int r = poll(&pf, 1, timeout_ms < 0 ? 0 : timeout_ms);
    if (r < 0) return errno == EINTR ? 0 : CM_EIO;
    return r > 0 ? 1 : 0;
}

void cm_fd_close(int fd) {
    if (fd >= 0) close(fd);
}
