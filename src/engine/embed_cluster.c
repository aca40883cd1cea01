/*
 * embed_cluster.c: the rows of an embedding on a pipeline. The input goes
 * through this machine's layers and down the stages like a prompt, in a
 * sequence slot of its own (a short-lived session: its own KV caches here
 * and on every stage, freed with it), every row marked CM_PIPE_WANT_HIDDEN: the
 * last stage sends each row's final hidden state back (OUTPUT) instead of
 * computing logits, and embed.c applies the output norm and pools them
 * exactly as on one machine (same rows, same arithmetic).
 *
 * The slot: cumulo serve opens the cluster with one sequence more than its
 * generation slots (cmd_serve.c), so an embedding never waits for a reply to
 * end. A pipe that has failed is not recovered from here (recovery needs the
 * pipe to itself: the generation loop does it at its next step); the request
 * fails with the reason instead. NEEDSWORK: a tensor-parallel group (no
 * stages after ours) refuses. Passing cm_engine_forward's rows to the
 * pooling was tried: two members gave one machine's vectors to 1e-6, but
 * three members (KV heads 2/1/1) differed by up to 1.4e-3 relative on a
 * 21-token input (the last row; greedy generation still equal), so it stays
 * refused until that is understood.
 */
#include "engine_impl.h"

#include <string.h>

int cm_engine_embed_rows_cluster(cm_engine *e, const int32_t *ids, int n, float *rows, char *err, size_t errlen) {
    if (!cm_engine_downstream(e))
        return cm_errf(
            err, errlen, CM_EUNSUPPORTED,
            "embeddings are not supported on a tensor-parallel group yet; serve on one machine or a pipeline");
    if (cm_pipe_failed(e->cl))
        return cm_errf(err, errlen, CM_EIO, "the cluster has lost a node; it re-plans at the next generation step");
    cm_session *s = cm_session_new(e, n, err, errlen);
    if (!s) return CM_EBUSY;
    memcpy(s->hist, ids, (size_t)n * sizeof *ids);
    s->n_hist = n;
    cm_pipe_output_expect(e->cl, s->slot, CM_PIPE_OUT_HIDDEN, rows, 0, n);
    int rc = cm_engine_eval_cluster(s, n, CM_PIPE_WANT_HIDDEN, err, errlen);
    if (rc) cm_pipe_output_expect(e->cl, s->slot, CM_PIPE_OUT_HIDDEN, NULL, 0, 0); /* nothing comes: end it */
    else rc = cm_pipe_output_wait(e->cl, s->slot, err, errlen);
    cm_session_free(s);
    return rc;
}
