/*
 * moe.c: mixture-of-experts FFN layers (see moe.h for the arithmetic and
 * the order in which expert outputs are combined).
 *
 * Loading: the router ffn_gate_inp [E, n_expert], the stacked experts
 * ffn_{gate,up}_exps [E, F, n_expert] and ffn_down_exps [F, E, n_expert]
 * (3-D GGUF tensors: expert e is the 2-D slab at e * nb[2]), and qwen2moe's
 * shared expert. Compute: one pool run per layer, in steps separated by
 * barriers: (1) inputs converted for weights whose vec_dot_type differs from
 * the experts' gate, (2) router logits, (3) softmax, top-k, weights and the
 * grouping of (token, slot) assignments by expert (thread 0), (4) each
 * expert's tokens gathered into contiguous rows, (5) gate and up of every
 * active expert as one GEMM over its tokens (rows of all experts split
 * across threads), (6) silu(gate) * up converted for down, (7) down GEMMs,
 * (8) the weighted sum per token in top-k order. Only the chosen experts'
 * rows are read. Expert parallelism (cm_moe_run.ep): steps 4-7 run only the
 * experts [e0, e1), whose assignments are one contiguous run of rows (they
 * are grouped by expert), and step 8 waits for the caller's gather of the
 * other members' rows (cm_moe_combine), so the sum is the same chain. It must never allocate in cm_moe_ffn(): scratch is sized by
 * cm_moe_new().
 */
#include "moe.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---------------- loading ---------------- */

static bool is_moe_arch(enum cm_arch a) { return a == CM_ARCH_QWEN2MOE || a == CM_ARCH_QWEN3MOE; }

static int get_u(const cm_gguf *g, const char *arch, const char *suffix, uint64_t def, uint64_t hi, uint64_t *out,
                 char *err, size_t errlen) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!cm_gguf_get_u64(g, key, out)) {
        if (cm_gguf_find_kv(g, key)) return cm_errf(err, errlen, CM_EUNSUPPORTED, "metadata '%s' is not a single non-negative integer", key);
        *out = def;
    }
    if (*out > hi) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %llu is out of range [0, %llu]", key,
                                  (unsigned long long)*out, (unsigned long long)hi);
    return 0;
}

int cm_moe_load_hparams(cm_model *m, char *err, size_t errlen) {
    cm_hparams *hp = &m->hp;
    const char *an = cm_arch_name_of(hp->arch);
    uint64_t ne, nu, fe, fs;
    int rc;
    if ((rc = get_u(m->gguf, an, "expert_count", 0, 1024, &ne, err, errlen))) return rc;
    if (ne == 0) {
        if (is_moe_arch(hp->arch))
            return cm_errf(err, errlen, CM_EFORMAT, "architecture '%s' needs metadata '%s.expert_count' > 0", an, an);
        return 0;
    }
    if (hp->arch != CM_ARCH_LLAMA && !is_moe_arch(hp->arch))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "architecture '%s' with experts is not supported (experts: qwen2moe, qwen3moe, llama)", an);
    if ((rc = get_u(m->gguf, an, "expert_used_count", 0, ne, &nu, err, errlen))) return rc;
    if (nu == 0) return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s.expert_used_count' must be in [1, %llu]", an,
                                (unsigned long long)ne);
    if ((rc = get_u(m->gguf, an, "expert_feed_forward_length", 0, 1u << 26, &fe, err, errlen)) ||
        (rc = get_u(m->gguf, an, "expert_shared_feed_forward_length", 0, 1u << 26, &fs, err, errlen)))
        return rc;
    hp->n_expert = (int)ne;
    hp->n_expert_used = (int)nu;
    /* llama.cpp: Mixtral's experts are n_ff wide; qwen*moe read the expert
     * width, else n_ff / n_used; qwen2moe's shared expert defaults to n_ff. */
    hp->n_ff_exp = hp->arch == CM_ARCH_LLAMA ? hp->n_ff : fe ? (int)fe : hp->n_ff / hp->n_expert_used;
    hp->n_ff_shexp = hp->arch == CM_ARCH_QWEN2MOE ? (fs ? (int)fs : hp->n_ff) : 0;
    hp->expert_norm = hp->arch != CM_ARCH_QWEN2MOE;
    if (hp->n_ff_exp < 1) return cm_errf(err, errlen, CM_EFORMAT, "expert feed-forward length of '%s' is 0", an);
    return 0;
}

static void fmt_shape(char *b, size_t n, int nd, const int64_t *ne) {
    size_t o = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < nd && o < n; i++) o += (size_t)snprintf(b + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < n) snprintf(b + o, n - o, "]");
}

/* Bind blk.<il>.<suffix> with shape ne[0..nd) (like load.c's bind, up to 3-D).
 * weight: any type the kernels support; otherwise F32 only. */
static int bind(cm_model *m, cm_tensor *t, int il, const char *suffix, int nd, int64_t ne0, int64_t ne1, int64_t ne2,
                bool weight, char *err, size_t errlen) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    memset(t, 0, sizeof *t);
    const cm_gguf_tensor_info *ti = cm_gguf_find_tensor(m->gguf, name);
    if (!ti) return cm_errf(err, errlen, CM_EFORMAT, "missing tensor '%s'", name);
    if (weight ? !cm_kernels_supports((enum cm_type)ti->type) : ti->type != CM_TYPE_F32)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s", name, cm_type_name(ti->type));
    const int64_t want[3] = {ne0, ne1, ne2};
    bool ok = true;
    for (int i = 0; i < CM_MAX_DIMS; i++)
        if ((i < ti->n_dims ? ti->ne[i] : 1) != (i < nd ? want[i] : 1)) ok = false;
    if (!ok) {
        char hs[96], ws[96];
        fmt_shape(hs, sizeof hs, ti->n_dims, ti->ne);
        fmt_shape(ws, sizeof ws, nd, want);
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' has shape %s, expected %s", name, hs, ws);
    }
    if (cm_row_size((enum cm_type)ti->type, ne0) == 0)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s': row length %lld is not a multiple of the %s block", name,
                       (long long)ne0, cm_type_name(ti->type));
    cm_tensor_init(t, (enum cm_type)ti->type, nd, want, (void *)ti->data, ti->name);
    if (cm_tensor_nbytes(t) > ti->nbytes) return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is shorter than its shape", name);
    m->n_params += (uint64_t)cm_tensor_nelements(t);
    m->weight_bytes += cm_tensor_nbytes(t);
    return 0;
}

int cm_moe_bind_layer(cm_model *m, int il, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    cm_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, X = hp->n_expert, FS = hp->n_ff_shexp;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate.0.weight", il);
    if (cm_gguf_find_tensor(m->gguf, name))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "tensor '%s': one tensor per expert (old Mixtral layout) is not supported; supported: stacked ffn_{gate,up,down}_exps", name);
    int rc;
    if ((rc = bind(m, &L->ffn_gate_inp, il, "ffn_gate_inp.weight", 2, E, X, 1, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_gate_exps, il, "ffn_gate_exps.weight", 3, E, F, X, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_up_exps, il, "ffn_up_exps.weight", 3, E, F, X, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_down_exps, il, "ffn_down_exps.weight", 3, F, E, X, true, err, errlen)))
        return rc;
    if (FS > 0 &&
        ((rc = bind(m, &L->ffn_gate_inp_shexp, il, "ffn_gate_inp_shexp.weight", 1, E, 1, 1, false, err, errlen)) ||
         (rc = bind(m, &L->ffn_gate_shexp, il, "ffn_gate_shexp.weight", 2, E, FS, 1, true, err, errlen)) ||
         (rc = bind(m, &L->ffn_up_shexp, il, "ffn_up_shexp.weight", 2, E, FS, 1, true, err, errlen)) ||
         (rc = bind(m, &L->ffn_down_shexp, il, "ffn_down_shexp.weight", 2, FS, E, 1, true, err, errlen))))
        return rc;
    return 0;
}

void cm_moe_count_active(cm_model *m) {
    m->n_params_active = m->n_params;
    m->weight_bytes_active = m->weight_bytes;
    const cm_hparams *hp = &m->hp;
    if (!hp->n_expert) return;
    const uint64_t unused = (uint64_t)(hp->n_expert - hp->n_expert_used);
    for (int il = 0; il < hp->n_layer; il++) {
        const cm_tensor *ts[3] = {&m->layers[il].ffn_gate_exps, &m->layers[il].ffn_up_exps, &m->layers[il].ffn_down_exps};
        for (int i = 0; i < 3; i++) {
            if (!ts[i]->data) continue;
            m->n_params_active -= (uint64_t)(ts[i]->ne[0] * ts[i]->ne[1]) * unused;
            m->weight_bytes_active -= ts[i]->nb[2] * unused;
        }
    }
}

int cm_moe_check_experts(const cm_model *m, cm_slice s, cm_expert_slice x, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if (!x.ep) return 0;
    if (!hp->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "an expert slice of '%s', which has no experts", cm_arch_name_of(hp->arch));
    if (x.e0 < 0 || x.e0 > x.e1 || x.e1 > hp->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "expert slice [%d, %d) is out of range (%d experts)", x.e0, x.e1,
                       hp->n_expert);
    if (s.h0 != 0 || s.h1 != hp->n_head_kv || s.f0 != 0 || s.f1 != hp->n_ff)
        return cm_errf(err, errlen, CM_EINVAL, "an expert slice must hold every KV head and FFN row");
    return 0;
}

int cm_moe_check_slice(const cm_model *m, cm_slice s, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if (hp->n_expert && (s.h0 != 0 || s.h1 != hp->n_head_kv || s.f0 != 0 || s.f1 != hp->n_ff))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "tensor-parallel slices of a mixture-of-experts model ('%s', %d experts) are not supported; "
                       "use pipeline parallelism", cm_arch_name_of(hp->arch), hp->n_expert);
    return 0;
}

/* ---------------- scratch ---------------- */

struct cm_moe {
    int max_batch, n_expert, k;
    float *probs;                /* [B][n_expert] router logits, then probabilities */
    float *shg;                  /* [B] shared-expert gate logit, then its sigmoid */
    int32_t *sel;                /* [B][k] chosen experts, top-k order */
    float *w;                    /* [B][k] their weights */
    int32_t *cnt, *off, *act;    /* per expert: tokens, first assignment; active experts ascending */
    int n_act;
    int32_t *tok, *slot, *aof;   /* assignment a -> token, slot; (token, slot) -> a */
    uint8_t *mark;               /* [n_expert] top-k selection marks (thread 0) */
    uint8_t *xr, *xu, *xsg, *xsu; /* [B] inputs converted for router / up_exps / shexp gate / shexp up */
    uint8_t *xg, *xgu;           /* [A] gathered gate (and up) inputs */
    float *g, *u;                /* [A][F] */
    uint8_t *dq;                 /* [A] down inputs */
    float *y;                    /* [A][E] expert outputs */
    float *gs, *us, *ys;         /* shared expert [B][FS], [B][FS], [B][E] */
    uint8_t *dqs;                /* [B] its down inputs */
    size_t rs_e, rs_f, rs_fs;    /* bytes per converted row of E, F, FS floats (any type fits) */
};

static void *zalloc(size_t n) {
    void *p = cm_aligned_alloc(n ? n : 64);
    if (p) memset(p, 0, n ? n : 64);
    return p;
}

void cm_moe_free(cm_moe *s) {
    if (!s) return;
    void *ps[] = {s->probs, s->shg, s->sel, s->w, s->cnt, s->off, s->act, s->tok, s->slot, s->aof, s->mark, s->xr,
                  s->xu, s->xsg, s->xsu, s->xg, s->xgu, s->g, s->u, s->dq, s->y, s->gs, s->us, s->ys, s->dqs};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++) cm_aligned_free(ps[i]);
    cm_free(s);
}

/* F32 is the widest activation type: 4 bytes per element bound any row. */
static size_t row_bound(int64_t n) { return ((size_t)n * 4 + 63) & ~(size_t)63; }

cm_moe *cm_moe_new(const cm_model *m, int max_batch) {
    const cm_hparams *hp = &m->hp;
    cm_moe *s = cm_calloc(1, sizeof *s);
    if (!s) return NULL;
    const size_t B = (size_t)max_batch, X = (size_t)hp->n_expert, K = (size_t)hp->n_expert_used, A = B * K;
    const size_t E = (size_t)hp->n_embd, F = (size_t)hp->n_ff_exp, FS = (size_t)hp->n_ff_shexp;
    s->max_batch = max_batch;
    s->n_expert = hp->n_expert;
    s->k = hp->n_expert_used;
    s->rs_e = row_bound((int64_t)E);
    s->rs_f = row_bound((int64_t)F);
    s->rs_fs = row_bound((int64_t)FS);
    s->probs = zalloc(B * X * 4);
    s->shg = zalloc(B * 4);
    s->sel = zalloc(A * 4);
    s->w = zalloc(A * 4);
    s->cnt = zalloc(X * 4);
    s->off = zalloc((X + 1) * 4);
    s->act = zalloc(X * 4);
    s->tok = zalloc(A * 4);
    s->slot = zalloc(A * 4);
    s->aof = zalloc(A * 4);
    s->mark = zalloc(X);
    s->xr = zalloc(B * s->rs_e);
    s->xu = zalloc(B * s->rs_e);
    s->xsg = zalloc(B * s->rs_e);
    s->xsu = zalloc(B * s->rs_e);
    s->xg = zalloc(A * s->rs_e);
    s->xgu = zalloc(A * s->rs_e);
    s->g = zalloc(A * F * 4);
    s->u = zalloc(A * F * 4);
    s->dq = zalloc(A * s->rs_f);
    s->y = zalloc(A * E * 4);
    s->gs = zalloc(B * FS * 4);
    s->us = zalloc(B * FS * 4);
    s->ys = zalloc(B * E * 4);
    s->dqs = zalloc(B * s->rs_fs);
    void *ps[] = {s->probs, s->shg, s->sel, s->w, s->cnt, s->off, s->act, s->tok, s->slot, s->aof, s->mark, s->xr,
                  s->xu, s->xsg, s->xsu, s->xg, s->xgu, s->g, s->u, s->dq, s->y, s->gs, s->us, s->ys, s->dqs};
    for (size_t i = 0; i < CM_ARRAY_LEN(ps); i++)
        if (!ps[i]) { cm_moe_free(s); return NULL; }
    return s;
}

/* ---------------- compute ---------------- */

static void convert(const cm_moe_run *r, enum cm_act_site site, int row, int64_t col0, enum cm_type vdt,
                    const float *x, void *xq, int64_t n) {
    r->k->from_float[vdt](x, xq, n);
    if (r->hook) r->hook(r->hook_user, r->il, site, row, col0, vdt, x, xq, n);
}

static enum cm_type vdt_of(const cm_tensor *w) { return cm_type_traits_of(w->type)->vec_dot_type; }

static size_t act_row_size(enum cm_type vdt, int64_t n) {
    return vdt == CM_TYPE_F32 ? (size_t)n * sizeof(float) : cm_row_size(vdt, n);
}

/* The activations of all n tokens for weight w: the caller's converted rows
 * when w's vec_dot_type is the experts' gate's, the floats for F32, else buf
 * (*need: the caller must convert into buf first). */
static const uint8_t *input_for(const cm_moe_run *r, const cm_tensor *w, uint8_t *buf, size_t *stride, bool *need) {
    const enum cm_type vdt = vdt_of(w);
    const cm_layer *L = &r->m->layers[r->il];
    *need = false;
    if (vdt == vdt_of(&L->ffn_gate_exps)) {
        *stride = r->xq_stride;
        return r->xq;
    }
    if (vdt == CM_TYPE_F32) {
        *stride = (size_t)r->m->hp.n_embd * sizeof(float);
        return (const uint8_t *)r->xn;
    }
    *stride = act_row_size(vdt, r->m->hp.n_embd);
    *need = true;
    return buf;
}

/* Expert e of a stacked [ne0, ne1, n_expert] tensor as a 2-D view. */
static cm_tensor expert_view(const cm_tensor *w, int e) {
    cm_tensor t = *w;
    t.data = (char *)w->data + (size_t)e * w->nb[2];
    t.ne[2] = 1;
    t.n_dims = 2;
    return t;
}

/* Step 3 (thread 0): softmax over the experts, top k, weights, and the
 * grouping of the n * k (token, slot) assignments by expert. */
static void route(cm_moe *s, const cm_moe_run *r) {
    const cm_hparams *hp = &r->m->hp;
    const int X = hp->n_expert, K = hp->n_expert_used, n = r->n;
    const bool sh = r->m->layers[r->il].ffn_gate_inp_shexp.data != NULL;
    for (int j = 0; j < n; j++) {
        float *p = s->probs + (size_t)j * X;
        /* ggml_soft_max_f32: max, expf, double sum, times the float 1/sum */
        float mx = -INFINITY;
        for (int e = 0; e < X; e++) mx = p[e] > mx ? p[e] : mx;
        double sum = 0;
        for (int e = 0; e < X; e++) {
            p[e] = expf(p[e] - mx);
            sum += (double)p[e];
        }
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < X; e++) p[e] *= inv;
        /* ggml_argsort_top_k: descending; ties by lower id */
        int32_t *sel = s->sel + (size_t)j * K;
        float *w = s->w + (size_t)j * K;
        memset(s->mark, 0, (size_t)X);
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++)
                if (!s->mark[e] && (best < 0 || p[e] > p[best])) best = e;
            s->mark[best] = 1;
            sel[k] = best;
            w[k] = p[best];
        }
        if (hp->expert_norm) { /* ggml_sum_rows (double sum), clamp to the F16 minimum, ggml_div */
            double ws = 0;
            for (int k = 0; k < K; k++) ws += (double)w[k];
            float wsf = (float)ws;
            if (wsf < 6.103515625e-5f) wsf = 6.103515625e-5f;
            for (int k = 0; k < K; k++) w[k] = w[k] / wsf;
        }
        if (sh) { /* llama.cpp's sigmoid: silu(v) / v */
            const float v = s->shg[j];
            const float si = v / (1.0f + expf(-v));
            s->shg[j] = si / v;
        }
    }
    memset(s->cnt, 0, (size_t)X * sizeof(int32_t));
    for (int i = 0; i < n * K; i++) s->cnt[s->sel[i]]++;
    s->n_act = 0;
    s->off[0] = 0;
    for (int e = 0; e < X; e++) {
        s->off[e + 1] = s->off[e] + s->cnt[e];
        if (s->cnt[e]) s->act[s->n_act++] = e;
        s->cnt[e] = 0; /* reused as the fill cursor, restored below */
    }
    for (int j = 0; j < n; j++)
        for (int k = 0; k < K; k++) {
            const int e = s->sel[(size_t)j * K + k];
            const int a = s->off[e] + s->cnt[e]++;
            s->tok[a] = j;
            s->slot[a] = k;
            s->aof[(size_t)j * K + k] = a;
        }
}

/* silu(g) * u for blocks [b0, b1) of one row and its conversion (or none for F32). */
static void swiglu_blocks(const cm_moe_run *r, enum cm_act_site site, int row, int64_t col_base, enum cm_type vdt,
                          float *g, const float *u, uint8_t *dst, int bs, int64_t b0, int64_t b1) {
    for (int64_t i = b0 * bs; i < b1 * bs; i++) {
        float v = g[i];
        v = v / (1.0f + expf(-v)); /* ggml_silu_f32 */
        g[i] = v * u[i];
    }
    if (vdt != CM_TYPE_F32)
        convert(r, site, row, col_base + b0 * bs, vdt, g + b0 * bs, dst + cm_row_size(vdt, b0 * bs), (b1 - b0) * bs);
}

void cm_moe_ffn(cm_moe *s, const cm_moe_run *r, int ith, int nth) {
    const cm_model *m = r->m;
    const cm_hparams *hp = &m->hp;
    const cm_layer *L = &m->layers[r->il];
    const cm_kernels *kt = r->k;
    const int n = r->n, X = hp->n_expert;
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, FS = hp->n_ff_shexp;
    const bool sh = L->ffn_gate_inp_shexp.data != NULL;
    int64_t t0, t1;

    /* 1. inputs for weights of another vec_dot_type than the experts' gate */
    size_t rs_r, rs_u, rs_sg = 0, rs_su = 0;
    bool need_r, need_u, need_sg = false, need_su = false;
    const uint8_t *xr = input_for(r, &L->ffn_gate_inp, s->xr, &rs_r, &need_r);
    const uint8_t *xu = input_for(r, &L->ffn_up_exps, s->xu, &rs_u, &need_u);
    const uint8_t *xsg = NULL, *xsu = NULL;
    if (sh) {
        xsg = input_for(r, &L->ffn_gate_shexp, s->xsg, &rs_sg, &need_sg);
        xsu = input_for(r, &L->ffn_up_shexp, s->xsu, &rs_su, &need_su);
        if (need_su && vdt_of(&L->ffn_up_shexp) == vdt_of(&L->ffn_gate_shexp)) xsu = xsg, rs_su = rs_sg, need_su = false;
    }
    if (need_u && vdt_of(&L->ffn_up_exps) == vdt_of(&L->ffn_gate_inp) && need_r) xu = xr, need_u = false;
    if (need_r || need_u || need_sg || need_su) {
        cm_split_range(n, ith, nth, &t0, &t1);
        for (int64_t j = t0; j < t1; j++) {
            const float *x = r->xn + j * E;
            if (need_r) convert(r, CM_ACT_ROUTER_IN, (int)j, 0, vdt_of(&L->ffn_gate_inp), x, s->xr + j * rs_r, E);
            if (need_u) convert(r, CM_ACT_UP_IN, (int)j, 0, vdt_of(&L->ffn_up_exps), x, s->xu + j * rs_u, E);
            if (need_sg) convert(r, CM_ACT_SHEXP_IN, (int)j, 0, vdt_of(&L->ffn_gate_shexp), x, s->xsg + j * rs_sg, E);
            if (need_su) convert(r, CM_ACT_SHEXP_IN, (int)j, E, vdt_of(&L->ffn_up_shexp), x, s->xsu + j * rs_su, E);
        }
        cm_pool_barrier(r->pool);
    }

    /* 2. router logits (and the shared expert's gate logit as one more row) */
    cm_split_range(X + (sh ? 1 : 0), ith, nth, &t0, &t1);
    if (t1 > t0) {
        const int64_t r1 = CM_MIN(t1, X);
        if (r1 > t0) cm_matmul_rows(kt, &L->ffn_gate_inp, xr, rs_r, n, s->probs, X, t0, r1);
        if (t1 > X)
            cm_matmul_rows(kt, &L->ffn_gate_inp_shexp, r->xn, (size_t)E * sizeof(float), n, s->shg, 1, 0, 1);
    }
    cm_pool_barrier(r->pool);

    /* 3. top-k and grouping */
    if (ith == 0) route(s, r);
    cm_pool_barrier(r->pool);

    /* Expert parallelism: only the active experts in [e0, e1) run here: the
     * assignments [off[e0], off[e1]) and the active list's matching run. */
    const int e_lo = r->ep ? r->e0 : 0, e_hi = r->ep ? r->e1 : X;
    int act_lo = 0, act_hi = s->n_act;
    while (act_lo < act_hi && s->act[act_lo] < e_lo) act_lo++;
    while (act_hi > act_lo && s->act[act_hi - 1] >= e_hi) act_hi--;
    const int a_lo = s->off[e_lo], a_hi = s->off[e_hi];

    /* 4. gather each expert's input rows, in assignment order */
    const size_t rs_g = r->xq_stride;
    const size_t gb = act_row_size(vdt_of(&L->ffn_gate_exps), E), ub = act_row_size(vdt_of(&L->ffn_up_exps), E);
    const bool sep_up = xu != r->xq;
    cm_split_range(a_hi - a_lo, ith, nth, &t0, &t1);
    for (int64_t a = a_lo + t0; a < a_lo + t1; a++) {
        memcpy(s->xg + a * s->rs_e, (const uint8_t *)r->xq + (size_t)s->tok[a] * rs_g, gb);
        if (sep_up) memcpy(s->xgu + a * s->rs_e, xu + (size_t)s->tok[a] * rs_u, ub);
    }
    cm_pool_barrier(r->pool);

    /* 5. gate and up: the rows of every active expert (then the shared
     * expert's) as one range split across threads; each piece is one GEMM
     * over that expert's tokens. */
    const int n_act = act_hi - act_lo;
    const uint8_t *xup = sep_up ? s->xgu : s->xg;
    cm_split_range((int64_t)n_act * F + (sh ? FS : 0), ith, nth, &t0, &t1);
    for (int64_t u = t0; u < t1;) {
        if (u < (int64_t)n_act * F) {
            const int e = s->act[act_lo + u / F];
            const int64_t r0 = u % F, r1 = CM_MIN(F, r0 + (t1 - u));
            const int o = s->off[e], c = s->off[e + 1] - o;
            cm_tensor wg = expert_view(&L->ffn_gate_exps, e), wu = expert_view(&L->ffn_up_exps, e);
            cm_matmul_rows(kt, &wg, s->xg + (size_t)o * s->rs_e, s->rs_e, c, s->g + (size_t)o * F, F, r0, r1);
            cm_matmul_rows(kt, &wu, xup + (size_t)o * s->rs_e, s->rs_e, c, s->u + (size_t)o * F, F, r0, r1);
            u += r1 - r0;
        } else {
            const int64_t r0 = u - (int64_t)n_act * F, r1 = CM_MIN(FS, r0 + (t1 - u));
            cm_matmul_rows(kt, &L->ffn_gate_shexp, xsg, rs_sg, n, s->gs, FS, r0, r1);
            cm_matmul_rows(kt, &L->ffn_up_shexp, xsu, rs_su, n, s->us, FS, r0, r1);
            u += r1 - r0;
        }
    }
    cm_pool_barrier(r->pool);

    /* 6. silu(gate) * up, converted for down, by (row, block) units */
    const enum cm_type vd = vdt_of(&L->ffn_down_exps), vds = sh ? vdt_of(&L->ffn_down_shexp) : CM_TYPE_F32;
    const int bs = cm_type_traits_of(vd)->block_size, bss = cm_type_traits_of(vds)->block_size;
    const int64_t nb = F / bs, nbs = sh ? FS / bss : 0;
    const int64_t An = a_hi - a_lo; /* this member's assignments */
    cm_split_range(An * nb + (int64_t)n * nbs, ith, nth, &t0, &t1);
    for (int64_t u = t0; u < t1;) {
        if (u < An * nb) {
            const int64_t a = a_lo + u / nb, b0 = u % nb, b1 = CM_MIN(nb, b0 + (t1 - u));
            swiglu_blocks(r, CM_ACT_EXP_DOWN, s->tok[a], (int64_t)s->slot[a] * F, vd, s->g + a * F, s->u + a * F,
                          s->dq + a * s->rs_f, bs, b0, b1);
            u += b1 - b0;
        } else {
            const int64_t v = u - An * nb, j = v / nbs, b0 = v % nbs, b1 = CM_MIN(nbs, b0 + (t1 - u));
            swiglu_blocks(r, CM_ACT_SHEXP_DOWN, (int)j, 0, vds, s->gs + j * FS, s->us + j * FS, s->dqs + j * s->rs_fs,
                          bss, b0, b1);
            u += b1 - b0;
        }
    }
    cm_pool_barrier(r->pool);

    /* 7. down: E rows per active expert (then the shared expert's) */
    const bool f32d = vd == CM_TYPE_F32, f32ds = vds == CM_TYPE_F32;
    cm_split_range((int64_t)n_act * E + (sh ? E : 0), ith, nth, &t0, &t1);
    for (int64_t u = t0; u < t1;) {
        if (u < (int64_t)n_act * E) {
            const int e = s->act[act_lo + u / E];
            const int64_t r0 = u % E, r1 = CM_MIN(E, r0 + (t1 - u));
            const int o = s->off[e], c = s->off[e + 1] - o;
            cm_tensor wd = expert_view(&L->ffn_down_exps, e);
            const void *x = f32d ? (const void *)(s->g + (size_t)o * F) : (const void *)(s->dq + (size_t)o * s->rs_f);
            cm_matmul_rows(kt, &wd, x, f32d ? (size_t)F * sizeof(float) : s->rs_f, c, s->y + (size_t)o * E, E, r0, r1);
            u += r1 - r0;
        } else {
            const int64_t r0 = u - (int64_t)n_act * E, r1 = CM_MIN(E, r0 + (t1 - u));
            const void *x = f32ds ? (const void *)s->gs : (const void *)s->dqs;
            cm_matmul_rows(kt, &L->ffn_down_shexp, x, f32ds ? (size_t)FS * sizeof(float) : s->rs_fs, n, s->ys, E, r0, r1);
            u += r1 - r0;
        }
    }
    if (r->defer_combine) return; /* the caller gathers the other members' rows, then cm_moe_combine */
    cm_pool_barrier(r->pool);
    cm_moe_combine(s, r, ith, nth);
}

void cm_moe_rows(cm_moe *s, float **y, const int32_t **rows) {
    *y = s->y;
    *rows = s->off;
}

void cm_moe_combine(cm_moe *s, const cm_moe_run *r, int ith, int nth) {
    const cm_hparams *hp = &r->m->hp;
    const int n = r->n, K = hp->n_expert_used;
    const int64_t E = hp->n_embd;
    const bool sh = r->m->layers[r->il].ffn_gate_inp_shexp.data != NULL;
    int64_t t0, t1;
    /* 8. per token: weighted expert outputs added in top-k order, then the
     * gated shared expert (llama.cpp: ggml_mul, then the ggml_add chain) */
    cm_split_range((int64_t)n * E, ith, nth, &t0, &t1);
    for (int64_t idx = t0; idx < t1; idx++) {
        const int64_t j = idx / E, i = idx % E;
        const int32_t *aof = s->aof + j * K;
        const float *w = s->w + j * K;
        float acc = s->y[(size_t)aof[0] * E + i] * w[0];
        for (int k = 1; k < K; k++) {
            const float t = s->y[(size_t)aof[k] * E + i] * w[k];
            acc = acc + t;
        }
        if (sh) {
            const float t = s->ys[j * E + i] * s->shg[j];
            acc = acc + t;
        }
        r->out[idx] = acc;
    }
}
