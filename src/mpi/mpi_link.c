/*
 * mpi_link.c: the bridge between cumulo's local stream sockets and MPI. Each
 * link is a pair of stream sockets on two ranks (a socketpair end on the
 * dialing rank, a connection to the node's local listener on the other),
 * glued by MPI messages on one tag of a private communicator: OPEN, DATA,
 * CLOSE, STOP, each a 16-byte header (kind, sender, link id) and for DATA the
 * bytes. One tag keeps a sender's messages in order (MPI's non-overtaking
 * rule), so a link's OPEN, DATA and CLOSE arrive as they were sent.
 *
 * The bridge thread is the only caller of MPI after init: it polls the local
 * sockets (1 ms when idle), probes MPI, and sends with MPI_Isend so that two
 * ranks sending to each other never wait on each other. Bytes for a local
 * socket that cannot take them wait in the link's queue (no flow control
 * toward the sender: NEEDSWORK, bounded in practice by cumulo's frames).
 * An MPI error naming a rank (MPI_ERRORS_RETURN) closes every link to it: to
 * the cluster code a lost node, as a dropped TCP connection would be.
 */
#include "mpi/mpi_link.h"
#include "mpi/mpi_coll.h"

#include "base/base.h"
#include "net/net.h"
#include "os/os.h"

#include <mpi.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define LINK_TAG 4242
#define CHUNK (1u << 20) /* local bytes per DATA message at most */
#define MAX_LINKS 1024
#define FINISH_WAIT_MS 5000ull      /* the last meeting of the ranks waits this long */
#define WARM_NS 100000000ull        /* after traffic, the bridge naps (nap_ns) rather than sleeps 1 ms this long */
#define OPEN_WAIT_NS 60000000000ull /* an OPEN waits this long for the node's listener */

enum { K_OPEN = 1, K_DATA = 2, K_CLOSE = 3, K_STOP = 4 };

typedef struct hdr {
    uint32_t kind;
    int32_t from;
    uint64_t id;
} hdr;

typedef struct mlink {
    uint64_t id;
    int peer, fd; /* fd -1: an OPEN waiting for this rank's listener */
    uint64_t since_ns;
    uint8_t *q; /* bytes from the peer not yet written to fd */
    size_t qlen, qoff, qcap;
    bool remote_closed; /* CLOSE came: drop the link once q is written */
} mlink;

typedef struct pending {
    MPI_Request rq;
    uint8_t *buf;
    int peer;
} pending;

struct cm_mpi {
    MPI_Comm comm;
    int rank, size;
    char host[MPI_MAX_PROCESSOR_NAME + 1];
    pthread_t th;
    bool th_started;
    atomic_int quit, stop_others, listening, n_dead;
    atomic_int *stop;
    pthread_mutex_t mu; /* guards fresh[] and next_id (dials come from any thread) */
    struct {
        int fd, peer;
        uint64_t id;
    } fresh[64];
    int n_fresh;
    uint64_t next_id;
    int wake[2];
    char dir[72], path[100]; /* a sun_path holds 108 bytes */
    int lfd;
    mlink links[MAX_LINKS]; /* bridge thread only */
    int n_links;
    pending *tx;
    int n_tx, cap_tx;
    uint8_t *scratch;
    uint8_t *rbuf; /* received messages (bridge thread) */
    size_t rcap;
    uint64_t spin_ns; /* CUMULO_MPI_SPIN_MS: spin this long after traffic (default 5 ms; MPICH 0) */
    uint64_t nap_ns;  /* then, up to WARM_NS after traffic, poll every nap_ns (0: not at all) */
    bool *dead;
    cm_net_transport tr;
    cm_mpi_coll *coll; /* --mpi-allreduce: MPI_Iallreduce for tensor-parallel sums, else NULL */
};

/* ---- sending (bridge thread) ---- */

static void mark_dead(cm_mpi *m, int peer);

static void send_msg(cm_mpi *m, int peer, uint32_t kind, uint64_t id, const uint8_t *data, size_t n) {
    if (peer < 0 || peer >= m->size || m->dead[peer]) return;
    if (m->n_tx == m->cap_tx) {
        int cap = m->cap_tx ? 2 * m->cap_tx : 64;
        pending *t = realloc(m->tx, (size_t)cap * sizeof *t);
        if (!t) {
            CM_LOGE("mpi: out of memory");
            return;
        }
        m->tx = t;
        m->cap_tx = cap;
    }
    uint8_t *buf = malloc(sizeof(hdr) + n);
    if (!buf) {
        CM_LOGE("mpi: out of memory");
        return;
    }
    hdr h = {kind, m->rank, id};
    memcpy(buf, &h, sizeof h);
    if (n) memcpy(buf + sizeof h, data, n);
    pending *p = &m->tx[m->n_tx];
    if (MPI_Isend(buf, (int)(sizeof h + n), MPI_BYTE, peer, LINK_TAG, m->comm, &p->rq) != MPI_SUCCESS) {
        free(buf);
        mark_dead(m, peer);
        return;
    }
    p->buf = buf;
    p->peer = peer;
    m->n_tx++;
}

static bool test_sends(cm_mpi *m) {
    bool any = false;
    for (int i = 0; i < m->n_tx;) {
        int done = 0;
        MPI_Status st;
        int rc = MPI_Test(&m->tx[i].rq, &done, &st);
        if (rc != MPI_SUCCESS) {
            done = 1;
            mark_dead(m, m->tx[i].peer);
        }
        if (!done) {
            i++;
            continue;
        }
        free(m->tx[i].buf);
        m->tx[i] = m->tx[--m->n_tx];
        any = true;
    }
    return any;
}

/* ---- links (bridge thread) ---- */

static mlink *find(cm_mpi *m, uint64_t id) {
    for (int i = 0; i < m->n_links; i++)
        if (m->links[i].id == id) return &m->links[i];
    return NULL;
}

static void drop(cm_mpi *m, mlink *l, bool tell) {
    if (tell) send_msg(m, l->peer, K_CLOSE, l->id, NULL, 0);
    if (l->fd >= 0) close(l->fd);
    free(l->q);
    *l = m->links[--m->n_links];
}

static mlink *add(cm_mpi *m, uint64_t id, int peer, int fd) {
    if (m->n_links == MAX_LINKS) return NULL;
    mlink *l = &m->links[m->n_links++];
    memset(l, 0, sizeof *l);
    l->id = id;
    l->peer = peer;
    l->fd = fd;
    l->since_ns = cm_now_ns();
    return l;
}

static void mark_dead(cm_mpi *m, int peer) {
    if (peer < 0 || peer >= m->size || m->dead[peer]) return;
    m->dead[peer] = true;
    atomic_fetch_add(&m->n_dead, 1);
    CM_LOGW("mpi: rank %d is gone (MPI returned an error); its links are closed", peer);
    for (int i = 0; i < m->n_links;)
        if (m->links[i].peer == peer) drop(m, &m->links[i], false);
        else i++;
}

static int set_nonblock(int fd) {
    int one = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &one, sizeof one);
    return cm_sock_prepare(fd);
}

/* Write what the link holds; false when the local socket failed. */
static bool flush(mlink *l) {
    while (l->qoff < l->qlen) {
        long w = cm_sock_send(l->fd, l->q + l->qoff, l->qlen - l->qoff);
        if (w > 0) {
            l->qoff += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
        return false;
    }
    l->qoff = l->qlen = 0;
    return true;
}

static bool queue(mlink *l, const uint8_t *p, size_t n) {
    if (l->qoff && l->qoff == l->qlen) l->qoff = l->qlen = 0;
    if (l->qlen + n > l->qcap) {
        size_t cap = l->qcap ? l->qcap : 65536;
        while (cap < l->qlen + n) cap *= 2;
        uint8_t *q = realloc(l->q, cap);
        if (!q) return false;
        l->q = q;
        l->qcap = cap;
    }
    memcpy(l->q + l->qlen, p, n);
    l->qlen += n;
    return true;
}

/* An OPEN for this rank: connect to the node's listener (once it listens). */
static void try_accept(cm_mpi *m, mlink *l) {
    if (!atomic_load(&m->listening)) {
        if (cm_now_ns() - l->since_ns > OPEN_WAIT_NS) {
            CM_LOGW("mpi: rank %d dialed this rank, which has no listener; link closed", l->peer);
            drop(m, l, true);
        }
        return;
    }
    /* Bound to "DIR/mpi-rR:N" first, so that the node sees the peer as
     * "mpi-rR:N" (its per-source limits then count per rank, not per job). */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un me = {.sun_family = AF_UNIX}, sa = {.sun_family = AF_UNIX};
    snprintf(me.sun_path, sizeof me.sun_path, "%.72s/mpi-r%d:%llu", m->dir, l->peer,
             (unsigned long long)(l->id & 0xffffffffffull));
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", m->path);
    unlink(me.sun_path);
    bool named = fd >= 0 && bind(fd, (struct sockaddr *)&me, sizeof me) == 0;
    int rc = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (named) unlink(me.sun_path); /* the kernel keeps the name on the connection */
    if (rc != 0 || set_nonblock(fd) != 0) {
        CM_LOGW("mpi: cannot reach this rank's listener: %s", strerror(errno));
        if (fd >= 0) close(fd);
        drop(m, l, true);
        return;
    }
    l->fd = fd;
    if (!flush(l)) drop(m, l, true);
}

static void on_message(cm_mpi *m, int src, const uint8_t *p, size_t n) {
    if (n < sizeof(hdr)) return;
    hdr h;
    memcpy(&h, p, sizeof h);
    p += sizeof h;
    n -= sizeof h;
    mlink *l = find(m, h.id);
    switch (h.kind) {
    case K_OPEN:
        if (!l && !(l = add(m, h.id, src, -1))) {
            send_msg(m, src, K_CLOSE, h.id, NULL, 0);
            break;
        }
        try_accept(m, l);
        break;
    case K_DATA:
        if (!l) break;                          /* closed here; our CLOSE is on its way */
        if (l->fd >= 0 && l->qoff == l->qlen) { /* nothing waiting: straight to the socket, queue what it leaves */
            long w = cm_sock_send(l->fd, p, n);
            if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                drop(m, l, true);
                break;
            }
            if (w > 0) {
                p += w;
                n -= (size_t)w;
            }
        }
        if (n && (!queue(l, p, n) || (l->fd >= 0 && !flush(l)))) drop(m, l, true);
        break;
    case K_CLOSE:
        if (!l) break;
        l->remote_closed = true;
        if (l->qlen == l->qoff || l->fd < 0) drop(m, l, false);
        break;
    case K_STOP:
        if (m->stop) atomic_store(m->stop, 1);
        break;
    default: CM_LOGW("mpi: unknown message kind %u from rank %d", h.kind, src); break;
    }
}

/* Receive what MPI has for us; true when anything came. */
static bool progress_in(cm_mpi *m) {
    bool any = false;
    for (int k = 0; k < 64; k++) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, LINK_TAG, m->comm, &flag, &st) != MPI_SUCCESS || !flag) break;
        int cnt = 0;
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        if ((size_t)cnt > m->rcap) { /* one receive buffer, grown to the largest message (a header + CHUNK) */
            uint8_t *b = realloc(m->rbuf, (size_t)cnt);
            if (!b) {
                CM_LOGE("mpi: out of memory");
                break;
            }
            m->rbuf = b;
            m->rcap = (size_t)cnt;
        }
        int src = st.MPI_SOURCE;
        if (MPI_Recv(m->rbuf, cnt, MPI_BYTE, src, LINK_TAG, m->comm, &st) != MPI_SUCCESS) {
            mark_dead(m, src);
            continue;
        }
        on_message(m, src, m->rbuf, (size_t)cnt);
        any = true;
    }
    return any;
}

static void take_fresh(cm_mpi *m) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_fresh; i++) {
        mlink *l = add(m, m->fresh[i].id, m->fresh[i].peer, m->fresh[i].fd);
        if (!l) {
            close(m->fresh[i].fd);
            continue;
        }
        send_msg(m, l->peer, K_OPEN, l->id, NULL, 0);
    }
    m->n_fresh = 0;
    pthread_mutex_unlock(&m->mu);
}

static void *bridge_main(void *arg) {
    cm_mpi *m = arg;
    struct pollfd *pf = malloc((MAX_LINKS + 1) * sizeof *pf);
    int *at = malloc((MAX_LINKS + 1) * sizeof *at);
    bool busy = false, stopped_others = false;
    uint64_t moved_ns = 0, quit_ns = 0;
    while (pf && at) {
        if (atomic_load(&m->quit)) {
            if (atomic_load(&m->stop_others) && !stopped_others) {
                for (int r = 1; r < m->size; r++) send_msg(m, r, K_STOP, 0, NULL, 0);
                stopped_others = true;
            }
            if (!quit_ns) quit_ns = cm_now_ns();
            test_sends(m);
            if (!m->n_tx) break;
            if (cm_now_ns() - quit_ns > FINISH_WAIT_MS * 1000000ull) { /* sends to a rank that died unnoticed */
                CM_LOGW("mpi: rank %d: %d sends never completed (a dead rank?); left behind", m->rank, m->n_tx);
                m->n_tx = 0; /* their buffers stay allocated: MPI may still read them */
                break;
            }
        }
        take_fresh(m);
        int np = 0;
        pf[np++] = (struct pollfd){m->wake[0], POLLIN, 0};
        for (int i = 0; i < m->n_links; i++) {
            mlink *l = &m->links[i];
            if (l->fd < 0) continue;
            short ev = l->remote_closed ? 0 : POLLIN;
            if (l->qoff < l->qlen) ev |= POLLOUT;
            at[np] = i;
            pf[np++] = (struct pollfd){l->fd, ev, 0};
        }
        /* MPI has no descriptor to wait on: spin (yielding the CPU) for
         * spin_ns after bytes last moved, the next message of a decode loop
         * or an all-reduce is usually that close; then, up to WARM_NS after
         * traffic, poll every nap_ns (a nanosleep between polls: little CPU,
         * and a token's next hop seldom waits more than a nap); then sleep
         * 1 ms at a time. Sends in flight keep it spinning a while: MPI
         * progresses them only inside our calls. */
        uint64_t now = cm_now_ns();
        if (busy) moved_ns = now;
        bool spin = busy || now - moved_ns < m->spin_ns || (m->n_tx && now - moved_ns < 20000000ull);
        bool warm = !spin && m->nap_ns && now - moved_ns < WARM_NS;
        if (spin && !busy) sched_yield();
        int r = poll(pf, (nfds_t)np, spin || warm ? 0 : 1);
        if (warm && r == 0) nanosleep(&(struct timespec){0, (long)m->nap_ns}, NULL);
        busy = false;
        if (r > 0 && (pf[0].revents & POLLIN)) {
            char b[64];
            while (read(m->wake[0], b, sizeof b) > 0) {}
        }
        /* Walk the links from the back: drop() moves the last link into the
         * dropped one's slot, which this order has already visited. */
        for (int k = np - 1; r > 0 && k >= 1; k--) {
            if (!pf[k].revents) continue;
            mlink *l = &m->links[at[k]];
            if ((pf[k].revents & POLLOUT) && !flush(l)) {
                drop(m, l, !l->remote_closed);
                continue;
            }
            if (l->remote_closed && l->qoff == l->qlen) {
                drop(m, l, false);
                continue;
            }
            if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (l->remote_closed) continue;
            ssize_t n = read(l->fd, m->scratch, CHUNK);
            if (n > 0) {
                send_msg(m, l->peer, K_DATA, l->id, m->scratch, (size_t)n);
                busy = true;
            } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) drop(m, l, true);
        }
        for (int i = m->n_links - 1; i >= 0; i--)
            if (m->links[i].fd < 0) try_accept(m, &m->links[i]);
        if (progress_in(m)) busy = true;
        if (test_sends(m)) busy = true;
        if (m->coll && cm_mpi_coll_progress(m->coll)) busy = true;
    }
    free(pf);
    free(at);
    return NULL;
}

/* ---- the transport seam (any thread) ---- */

static int tr_connect(void *ctx, uint16_t port, int timeout_ms, int *fd, char *err, size_t errlen) {
    cm_mpi *m = ctx;
    (void)timeout_ms;
    int peer = port;
    if (peer >= m->size || peer == m->rank)
        return cm_errf(err, errlen, CM_EINVAL, "mpi:%d: the job has ranks 0-%d, this is rank %d", peer, m->size - 1,
                       m->rank);
    if (m->dead[peer]) return cm_errf(err, errlen, CM_ECLOSED, "mpi:%d: that rank is gone", peer);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return cm_errf(err, errlen, CM_EIO, "mpi:%d: socketpair: %s", peer, strerror(errno));
    if (set_nonblock(sv[1]) != 0) {
        close(sv[0]);
        close(sv[1]);
        return cm_errf(err, errlen, CM_EIO, "mpi: fcntl");
    }
    pthread_mutex_lock(&m->mu);
    bool full = m->n_fresh == (int)CM_ARRAY_LEN(m->fresh);
    if (!full) {
        m->fresh[m->n_fresh].fd = sv[1];
        m->fresh[m->n_fresh].peer = peer;
        m->fresh[m->n_fresh].id = (uint64_t)m->rank << 40 | ++m->next_id;
        m->n_fresh++;
    }
    pthread_mutex_unlock(&m->mu);
    if (full) {
        close(sv[0]);
        close(sv[1]);
        return cm_errf(err, errlen, CM_EBUSY, "mpi: too many dials at once");
    }
    if (write(m->wake[1], "w", 1) < 0) { /* the bridge polls every ms anyway */
    }
    *fd = sv[0];
    return 0;
}

static int tr_listen(void *ctx, uint16_t port, int *fd, uint16_t *bound, char *err, size_t errlen) {
    cm_mpi *m = ctx;
    (void)port;
    if (atomic_load(&m->listening)) return cm_errf(err, errlen, CM_EBUSY, "mpi: this rank already listens");
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", m->path);
    unlink(m->path);
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(s, 64) != 0 || cm_sock_prepare(s) != 0) {
        int e = errno;
        if (s >= 0) close(s);
        return cm_errf(err, errlen, CM_EIO, "mpi: cannot listen on %s: %s", m->path, strerror(e));
    }
    *fd = s;
    *bound = (uint16_t)m->rank;
    atomic_store(&m->listening, 1);
    return 0;
}

/* ---- start and finish ---- */

int cm_mpi_start(int *argc, char ***argv, unsigned flags, atomic_int *stop, cm_mpi **out, char *err, size_t errlen) {
    *out = NULL;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return cm_errf(err, errlen, CM_EIO, "MPI_Init_thread failed");
    if (provided < MPI_THREAD_SERIALIZED) {
        MPI_Finalize();
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "this MPI offers no MPI_THREAD_SERIALIZED (level %d)", provided);
    }
    cm_mpi *m = cm_calloc(1, sizeof *m);
    if (!m) {
        MPI_Finalize();
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN); /* a dead rank: an error here, not an abort */
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->size);
    int hl = 0;
    MPI_Get_processor_name(m->host, &hl);
    m->stop = stop;
    m->lfd = -1;
    /* The spin helps OpenMPI's shared-memory path and hurt MPICH's (UCX) on
     * the loaded test machine (bench/README.md, "MPI links"): measured defaults. */
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int ll = 0;
    MPI_Get_library_version(lib, &ll);
    const char *spin = cm_config_get()->mpi_spin_ms;
    m->spin_ns = (uint64_t)((spin && *spin ? atof(spin) : strstr(lib, "MPICH") ? 0.0 : 5.0) * 1e6);
    const char *nap = cm_config_get()->mpi_nap_us;
    double nap_us = nap && *nap ? atof(nap) : 50.0;
    m->nap_ns = (uint64_t)((nap_us < 0 ? 0 : nap_us > 999 ? 999 : nap_us) * 1e3);
    pthread_mutex_init(&m->mu, NULL);
    m->dead = cm_calloc((size_t)m->size, sizeof *m->dead);
    m->scratch = malloc(CHUNK);
    const char *tmp = cm_config_get()->tmpdir;
    snprintf(m->dir, sizeof m->dir, "%s/cumulo-mpi-XXXXXX", tmp && *tmp && strlen(tmp) < 48 ? tmp : "/tmp");
    if (!m->dead || !m->scratch || !mkdtemp(m->dir) || pipe(m->wake) != 0 || cm_sock_prepare(m->wake[0]) != 0 ||
        cm_sock_prepare(m->wake[1]) != 0) {
        int e = errno;
        cm_free(m->dead);
        free(m->scratch);
        cm_free(m);
        MPI_Finalize();
        return cm_errf(err, errlen, CM_EIO, "mpi: cannot set up this rank: %s", strerror(e));
    }
    snprintf(m->path, sizeof m->path, "%s/node.sock", m->dir); /* mkdtemp made it 0700: only this user */
    if ((flags & CM_MPI_ALLREDUCE) && cm_mpi_coll_new(m->comm, m->wake[1], &m->coll, err, errlen)) {
        cm_mpi_finish(m, 0);
        return CM_EIO;
    }
    if (m->coll) cm_coll_set_native(cm_mpi_coll_native(m->coll));
    m->tr = (cm_net_transport){.host = "mpi", .connect = tr_connect, .listen = tr_listen, .ctx = m};
    cm_net_set_transport(&m->tr);
    if (pthread_create(&m->th, NULL, bridge_main, m) != 0) {
        cm_mpi_finish(m, 0);
        return cm_errf(err, errlen, CM_EIO, "mpi: cannot start the bridge thread");
    }
    m->th_started = true;
    *out = m;
    return 0;
}

/* Receive and drop what is left for this rank (links are gone); true when anything came. */
static bool drain(cm_mpi *m) {
    bool any = false;
    for (;;) {
        int flag = 0, cnt = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, LINK_TAG, m->comm, &flag, &st) != MPI_SUCCESS || !flag) return any;
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        uint8_t *buf = malloc(cnt > 0 ? (size_t)cnt : 1);
        if (!buf) return any;
        MPI_Recv(buf, cnt, MPI_BYTE, st.MPI_SOURCE, LINK_TAG, m->comm, MPI_STATUS_IGNORE);
        free(buf);
        any = true;
    }
}

int cm_mpi_rank(const cm_mpi *m) { return m->rank; }
int cm_mpi_size(const cm_mpi *m) { return m->size; }
const char *cm_mpi_host(const cm_mpi *m) { return m->host; }
int cm_mpi_dead(const cm_mpi *m) { return atomic_load(&((cm_mpi *)m)->n_dead); }

void cm_mpi_finish(cm_mpi *m, int stop_others) {
    if (!m) return;
    atomic_store(&m->stop_others, stop_others);
    atomic_store(&m->quit, 1);
    if (m->th_started) pthread_join(m->th, NULL);
    cm_net_set_transport(NULL);
    if (m->coll) cm_coll_set_native(NULL);
    bool coll_ok = !m->coll || !cm_mpi_coll_broken(m->coll);
    while (m->n_links) drop(m, &m->links[m->n_links - 1], false);
    free(m->tx); /* (the bridge leaves with n_tx 0: done, or abandoned to MPI) */
    unlink(m->path);
    rmdir(m->dir);
    close(m->wake[0]);
    close(m->wake[1]);
    /* Meet every rank before finalizing (rank 0's STOP must have arrived),
     * but never wait on a rank that died unnoticed (mpirun --enable-recovery):
     * after FINISH_WAIT_MS leave without MPI_Finalize, which would wait too. */
    MPI_Request rq;
    int done = 0;
    uint64_t until = cm_now_ns() + FINISH_WAIT_MS * 1000000ull;
    if (!atomic_load(&m->n_dead) && coll_ok && MPI_Ibarrier(m->comm, &rq) == MPI_SUCCESS)
        while (!done && cm_now_ns() < until && MPI_Test(&rq, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS)
            if (!done && !drain(m)) cm_sleep_ms(1);
    if (done) {
        drain(m); /* what was sent before its sender met us (MPICH/UCX warns of unmatched messages) */
        cm_mpi_coll_free(m->coll, true);
        m->coll = NULL;
        MPI_Comm_free(&m->comm);
        MPI_Finalize();
    } else {
        CM_LOGW("mpi: rank %d: not every rank reached the end (one died?); leaving without MPI_Finalize", m->rank);
    }
    cm_mpi_coll_free(m->coll, false);
    pthread_mutex_destroy(&m->mu);
    cm_free(m->dead);
    free(m->scratch);
    free(m->rbuf);
    cm_free(m);
}
