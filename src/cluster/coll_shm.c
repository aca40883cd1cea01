/*
 * coll_shm.c: the shared-memory path of two tensor-parallel members on one
 * host (coll_shm.h). Linux only (futex); elsewhere nothing is offered and the
 * pieces go over the connection.
 */
#include "cluster/coll_shm.h"

#include "base/base.h"
#include "cluster/collective.h"
#include "os/os.h"

#include <errno.h>
#include <poll.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#if defined(__linux__)
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#define CM_SHM_OK 1
#else
#define CM_SHM_OK 0
#endif

#define SHM_MAGIC 0x6d68732d6d6c6f63ull /* "colm-shm" */
#define SHM_NAME_MAX 47
#define SPIN_KEEP_NS 50000u /* as net.c: keep the core this long, then yield on every try */
#define CTRL_BYTES 128      /* the writer's line (seq, ...) and the reader's line (ack, ...) */

/* The region's head: the writer's fields and the reader's on lines of their own. */
typedef struct {
    uint64_t magic;
    uint64_t cap;              /* floats per slot */
    _Atomic uint32_t seq;      /* writer: pieces published (slot of piece s: s % 2) */
    _Atomic uint32_t tx_sleep; /* writer: 1 while it sleeps on ack */
    uint8_t pad0[64 - 24];
    _Atomic uint32_t ack;      /* reader: pieces read */
    _Atomic uint32_t rx_sleep; /* reader: 1 while it sleeps on seq */
    uint8_t pad1[64 - 8];
} shm_ctrl;
_Static_assert(sizeof(shm_ctrl) == CTRL_BYTES, "control lines");

struct cm_coll_shm {
    cm_conn *peer;
    uint64_t spin_ns;
    shm_ctrl *mine, *theirs; /* mine: we write pieces; theirs: we read */
    size_t mine_len, theirs_len;
    int64_t mine_cap, theirs_cap; /* each region's slot size (floats), kept here: the peer could rewrite its head */
    int64_t cap;
    uint32_t sent, read; /* pieces published / read so far */
};

static size_t slot_bytes(int64_t cap) { return (size_t)CM_COLL_SHM_SLOT_HDR + (size_t)cap * sizeof(float); }
static size_t region_bytes(int64_t cap) { return CTRL_BYTES + 2 * slot_bytes(cap); }
static uint8_t *slot_at(shm_ctrl *h, int64_t cap, uint32_t s) {
    return (uint8_t *)h + CTRL_BYTES + (size_t)(s % 2) * slot_bytes(cap);
}

#if CM_SHM_OK
static void futex_wait(_Atomic uint32_t *w, uint32_t v, long ns) {
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0); }
#endif

static bool reached(_Atomic uint32_t *w, uint32_t target) {
    return (int32_t)(atomic_load_explicit(w, memory_order_acquire) - target) >= 0;
}

/* The connection while we wait on the region: quiet is fine; a frame (or a
 * close) before our wait is over is a lost or confused peer. A frame of a
 * later op can only follow the peer's store that ends our wait, so the wait
 * is checked again first. 1: the wait is over after all; 0: quiet; else an
 * error code (negative, err set). */
static int peer_check(cm_coll_shm *s, _Atomic uint32_t *w, uint32_t target, char *err, size_t errlen) {
    if (cm_fd_wait_readable(cm_conn_fd(s->peer), 0) <= 0) return 0;
    if (reached(w, target)) return 1;
    unsigned type = 0;
    const uint8_t *pl;
    size_t len;
    char e[300];
    int rc = cm_conn_recv_payload(s->peer, &type, &pl, &len, 1000, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "%s", e);
    if (type == CM_MSG_BYE) return cm_errf(err, errlen, CM_ECLOSED, "peer %s left", cm_conn_peer(s->peer));
    return cm_errf(err, errlen, CM_EPROTO, "sent %s while we waited for its piece in shared memory",
                   cm_msg_type_name(type));
}

/* Wait until *w reaches target: spin (yielding past SPIN_KEEP_NS) for the
 * link's spin time, then sleep on the futex in 1 ms turns, checking the
 * connection and the deadline. flag tells the other side we sleep. */
static int wait_for(cm_coll_shm *s, _Atomic uint32_t *w, uint32_t target, _Atomic uint32_t *flag, int timeout_ms,
                    char *err, size_t errlen) {
    if (reached(w, target)) return 0;
    uint64_t t0 = cm_now_ns(), deadline = t0 + (uint64_t)(timeout_ms > 0 ? timeout_ms : 1) * 1000000ull;
    for (unsigned i = 1;; i++) {
        for (int j = 0; j < 16; j++) {
            if (reached(w, target)) return 0;
            cm_cpu_relax();
        }
        uint64_t now = cm_now_ns();
        if (now - t0 >= s->spin_ns) break;
        if (now - t0 >= SPIN_KEEP_NS) cm_thread_yield();
        if (i % 256 == 0) {
            int pc = peer_check(s, w, target, err, errlen);
            if (pc) return pc > 0 ? 0 : pc;
        }
    }
    for (;;) {
#if CM_SHM_OK
        atomic_store(flag, 1);
        uint32_t v = atomic_load(w);
        if ((int32_t)(v - target) >= 0) {
            atomic_store(flag, 0);
            return 0;
        }
        futex_wait(w, v, 1000000L);
        atomic_store(flag, 0);
#else
        (void)flag;
        cm_sleep_ms(1);
#endif
        if (reached(w, target)) return 0;
        int pc = peer_check(s, w, target, err, errlen);
        if (pc) return pc > 0 ? 0 : pc;
        if (cm_now_ns() >= deadline)
            return cm_errf(err, errlen, CM_ETIMEDOUT, "no piece in shared memory within %d ms", timeout_ms);
    }
}

uint8_t *cm_coll_shm_tx_slot(cm_coll_shm *s, int timeout_ms, int *rc, char *err, size_t errlen) {
    /* slot (sent+1) % 2 last held piece sent-1: the peer must have read it */
    uint32_t need = s->sent >= 1 ? s->sent - 1 : 0;
    *rc = wait_for(s, &s->mine->ack, need, &s->mine->tx_sleep, timeout_ms, err, errlen);
    if (*rc) return NULL;
    return slot_at(s->mine, s->mine_cap, s->sent + 1) + CM_COLL_SHM_SLOT_HDR - CM_COLL_HDR_BYTES;
}

void cm_coll_shm_tx_publish(cm_coll_shm *s) {
    s->sent++;
    atomic_store(&s->mine->seq, s->sent); /* seq_cst: ordered before the load of rx_sleep */
#if CM_SHM_OK
    if (atomic_load(&s->mine->rx_sleep)) futex_wake(&s->mine->seq);
#endif
}

const uint8_t *cm_coll_shm_rx_slot(cm_coll_shm *s, int timeout_ms, int *rc, char *err, size_t errlen) {
    *rc = wait_for(s, &s->theirs->seq, s->read + 1, &s->theirs->rx_sleep, timeout_ms, err, errlen);
    if (*rc) return NULL;
    return slot_at(s->theirs, s->theirs_cap, s->read + 1) + CM_COLL_SHM_SLOT_HDR - CM_COLL_HDR_BYTES;
}

void cm_coll_shm_rx_done(cm_coll_shm *s) {
    s->read++;
    atomic_store(&s->theirs->ack, s->read);
#if CM_SHM_OK
    if (atomic_load(&s->theirs->tx_sleep)) futex_wake(&s->theirs->ack);
#endif
}

int64_t cm_coll_shm_cap(const cm_coll_shm *s) { return s ? s->cap : 0; }

void cm_coll_shm_close(cm_coll_shm *s) {
    if (!s) return;
#if CM_SHM_OK
    if (s->mine) munmap(s->mine, s->mine_len);
    if (s->theirs) munmap(s->theirs, s->theirs_len);
#endif
    cm_free(s);
}

/* ---- set-up ---- */

static int send_setup(cm_conn *peer, uint64_t epoch, uint64_t op_id, int step, const void *data, uint32_t n,
                      int timeout_ms, char *err, size_t errlen) {
    uint8_t p[CM_COLL_HDR_BYTES + SHM_NAME_MAX];
    memset(p, 0, CM_COLL_HDR_BYTES);
    cm_wr_u64(p, epoch);
    cm_wr_u64(p + 8, op_id);
    p[18] = (uint8_t)CM_COLL_POINT_SHM;
    p[19] = (uint8_t)step;
    cm_wr_u32(p + 24, n);
    if (data && n) memcpy(p + CM_COLL_HDR_BYTES, data, n);
    return cm_conn_send_payload(peer, CM_MSG_ALLREDUCE, p, CM_COLL_HDR_BYTES + (data ? n : 0), timeout_ms, err, errlen);
}

/* The peer's set-up frame of this step: *n its count, name (when given) its bytes. */
static int recv_setup(cm_conn *peer, uint64_t epoch, uint64_t op_id, int step, char *name, uint32_t *n, int timeout_ms,
                      char *err, size_t errlen) {
    unsigned type = 0;
    const uint8_t *p;
    size_t len;
    char e[300];
    int rc = cm_conn_recv_payload(peer, &type, &p, &len, timeout_ms, e, sizeof e);
    if (rc) return cm_errf(err, errlen, rc, "%s", e);
    if (type != CM_MSG_ALLREDUCE || len < CM_COLL_HDR_BYTES || cm_rd_u64(p) != epoch || cm_rd_u64(p + 8) != op_id ||
        p[18] != CM_COLL_POINT_SHM || p[19] != step)
        return cm_errf(err, errlen, CM_EPROTO, "expected its shared-memory %s, got %s of %zu bytes",
                       step == 1 ? "offer" : "answer", cm_msg_type_name(type), len);
    *n = cm_rd_u32(p + 24);
    size_t want = name ? *n : 0;
    if (*n > (name ? SHM_NAME_MAX : 1u) || len != CM_COLL_HDR_BYTES + want)
        return cm_errf(err, errlen, CM_EPROTO, "shared-memory set-up frame of %zu bytes carries %u", len, *n);
    if (name) {
        memcpy(name, p + CM_COLL_HDR_BYTES, *n);
        name[*n] = 0;
        for (uint32_t i = 0; i < *n; i++)
            if (!(name[i] == '/' && i == 0) && !(name[i] >= '0' && name[i] <= '9') &&
                !(name[i] >= 'a' && name[i] <= 'z') && name[i] != '-')
                return cm_errf(err, errlen, CM_EPROTO, "shared-memory offer with a bad name");
    }
    return 0;
}

#if CM_SHM_OK
/* Our region under a fresh random name; false (nothing left behind) where the platform refuses. */
static bool region_create(cm_coll_shm *s, int64_t cap, char *name) {
    uint8_t rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    int o = snprintf(name, SHM_NAME_MAX + 1, "/cumulo-tp-");
    for (int i = 0; i < 16; i++) o += snprintf(name + o, (size_t)(SHM_NAME_MAX + 1 - o), "%02x", rnd[i]);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return name[0] = 0, false;
    size_t len = region_bytes(cap);
    void *m = ftruncate(fd, (off_t)len) == 0 ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return name[0] = 0, false;
    }
    s->mine = m;
    s->mine_len = len;
    s->mine->magic = SHM_MAGIC;
    s->mine->cap = (uint64_t)cap;
    s->mine_cap = cap;
    return true;
}

/* The peer's region: ours to read when it is the size its head says. */
static bool region_open(cm_coll_shm *s, const char *name) {
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return false;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= region_bytes(1))
        m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return false;
    shm_ctrl *h = m;
    if (h->magic != SHM_MAGIC || h->cap < 1 || h->cap > CM_COLL_SHM_MAX_FLOATS ||
        region_bytes((int64_t)h->cap) > (size_t)st.st_size) {
        munmap(m, (size_t)st.st_size);
        return false;
    }
    s->theirs = h;
    s->theirs_len = (size_t)st.st_size;
    s->theirs_cap = (int64_t)h->cap;
    return true;
}
#endif

int cm_coll_shm_open(cm_conn *peer, uint64_t epoch, uint64_t op_id, int64_t cap, bool offer, uint64_t spin_ns,
                     int timeout_ms, cm_coll_shm **out, char *err, size_t errlen) {
    *out = NULL;
    cm_coll_shm *s = cm_calloc(1, sizeof *s);
    if (!s) return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    s->peer = peer;
    s->spin_ns = spin_ns;
    char name[SHM_NAME_MAX + 1] = "", theirs[SHM_NAME_MAX + 1] = "";
    if (cap > CM_COLL_SHM_MAX_FLOATS) cap = CM_COLL_SHM_MAX_FLOATS;
#if CM_SHM_OK
    if (offer && cap > 0) region_create(s, cap, name);
#else
    (void)offer;
#endif
    uint32_t n = 0, peer_ok = 0;
    bool ok = false;
    int rc = send_setup(peer, epoch, op_id, 1, name, (uint32_t)strlen(name), timeout_ms, err, errlen);
    if (!rc) rc = recv_setup(peer, epoch, op_id, 1, theirs, &n, timeout_ms, err, errlen);
#if CM_SHM_OK
    if (!rc && n && s->mine) ok = region_open(s, theirs);
#endif
    if (!rc) rc = send_setup(peer, epoch, op_id, 2, NULL, ok, timeout_ms, err, errlen);
    /* the peer is here and answers at once: a loaded machine's scheduling
     * delay is no reason to fail the op */
    if (!rc) rc = recv_setup(peer, epoch, op_id, 2, NULL, &peer_ok, CM_MAX(timeout_ms, 10000), err, errlen);
#if CM_SHM_OK
    if (name[0]) shm_unlink(name); /* the peer has it open, or never will */
#endif
    if (rc || !ok || !peer_ok) {
        cm_coll_shm_close(s);
        return rc;
    }
    s->cap = CM_MIN(s->mine_cap, s->theirs_cap);
    *out = s;
    return 0;
}
