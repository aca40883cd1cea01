/*
 * test_lease.c: a node's lease (issue 19, src/cluster/node_lease.c) without
 * sockets: the first coordinator's ASSIGN takes it and the node's HELLO
 * shows it; a second coordinator is refused with the reason unless it says
 * TAKE; the same coordinator (a re-plan, or a redial with the same id) is
 * never refused; the lease ends with its connection, and expires after 3 x
 * the loss bound of silence unless an ASSIGN is still loading; renewals
 * count only from the owner. (Over TCP: tests/sh/cluster_lease.sh.)
 */
#include "test.h"

#include "cluster/node_guard.h"
#include "os/os.h"

#include <stdlib.h>
#include <string.h>

static void hello(cm_msg_hello *h, const char *name, uint8_t id) {
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    memset(h->node_id, id, sizeof h->node_id);
}

static void test_lease(void) {
    pthread_mutex_t send_mu = PTHREAD_MUTEX_INITIALIZER;
    cm_node_lease l;
    cm_node_lease_init(&l, &send_mu);
    cm_msg_hello me, a, b, c, shown;
    hello(&me, "node3", 1);
    hello(&a, "vm", 2);
    hello(&b, "laptop", 3);
    hello(&c, "mac", 4);
    cm_msg_assign as = {.epoch = 77};
    snprintf(as.model_name, sizeof as.model_name, "llama-1b.gguf");
    char why[512];
    bool took;
    /* free: shown as free, the first ASSIGN takes it */
    shown = me;
    cm_node_lease_hello(&l, &shown);
    CHECK(shown.lease_epoch == 0 && !cm_lease_foreign(&shown, &a));
    CHECK(cm_node_lease_assign(&l, &me, &a, NULL, &as, &took, why, sizeof why) == 0 && !took);
    shown = me;
    cm_node_lease_hello(&l, &shown);
    CHECK(shown.lease_epoch == 77 && cm_lease_foreign(&shown, &b) && !cm_lease_foreign(&shown, &a));
    /* another coordinator: refused, with who and since when (while loading too) */
    as.epoch = 90;
    CHECK(cm_node_lease_assign(&l, &me, &b, NULL, &as, &took, why, sizeof why) == CM_EBUSY);
    CHECKF(strstr(why, "node3 serves llama-1b.gguf for coordinator vm at ") && strstr(why, " since ") &&
               strstr(why, "(epoch 77); --take to take it over"),
           "%s", why);
    cm_node_lease_loaded(&l);
    CHECK(cm_node_lease_assign(&l, &me, &b, NULL, &as, &took, why, sizeof why) == CM_EBUSY);
    /* the owner again (a re-plan): fine, the epoch moves on */
    as.epoch = 91;
    CHECK(cm_node_lease_assign(&l, &me, &a, NULL, &as, &took, why, sizeof why) == 0 && !took);
    cm_node_lease_loaded(&l);
    /* TAKE: the other coordinator takes it over */
    as.flags = CM_ASSIGN_F_TAKE;
    as.epoch = 100;
    CHECK(cm_node_lease_assign(&l, &me, &b, NULL, &as, &took, why, sizeof why) == 0 && took);
    cm_node_lease_loaded(&l);
    shown = me;
    cm_node_lease_hello(&l, &shown);
    CHECK(shown.lease_epoch == 100 && cm_lease_foreign(&shown, &a) && !cm_lease_foreign(&shown, &b) &&
          !strncmp(shown.lease_owner, "laptop at ", 10));
    /* silence: renewals from anyone but the owner do not count; past the
     * bound (3 x CUMULO_LOST_MS = 600 ms here) the lease expires and a third
     * coordinator takes the node without TAKE */
    as.flags = 0;
    for (int i = 0; i < 8; i++) {
        cm_sleep_ms(100);
        cm_node_lease_renew(&l, &c);
    }
    shown = me;
    cm_node_lease_hello(&l, &shown);
    CHECK(shown.lease_epoch == 0);
    CHECK(cm_node_lease_assign(&l, &me, &c, NULL, &as, &took, why, sizeof why) == 0 && took);
    cm_node_lease_loaded(&l);
    /* the owner's renewals keep it */
    for (int i = 0; i < 8; i++) {
        cm_sleep_ms(100);
        cm_node_lease_renew(&l, &c);
    }
    CHECK(cm_node_lease_assign(&l, &me, &a, NULL, &as, &took, why, sizeof why) == CM_EBUSY);
    /* its connection ends: free again */
    cm_node_lease_conn_end(&l, NULL);
    shown = me;
    cm_node_lease_hello(&l, &shown);
    CHECK(shown.lease_epoch == 0);
    CHECK(cm_node_lease_assign(&l, &me, &a, NULL, &as, &took, why, sizeof why) == 0 && !took);
    cm_node_lease_release(&l);
}

int main(void) {
    setenv("CUMULO_LOST_MS", "200", 1);
    cm_config_reload();
    RUN(test_lease);
    TEST_END();
}
