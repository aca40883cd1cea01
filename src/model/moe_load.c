/*
 * moe_load.c: loading the mixture-of-experts layers (see moe.h): the
 * "<arch>.expert_*" hyper-parameters, binding the router ffn_gate_inp
 * [E, n_expert], the stacked experts ffn_{gate,up}_exps [E, F, n_expert] and
 * ffn_down_exps [F, E, n_expert] (3-D GGUF tensors: expert e is the 2-D slab
 * at e * nb[2]) and the shared experts, the active-parameter count, and the
 * checks of tensor-parallel and expert slices. The FFN itself (routing,
 * grouping, expert GEMMs, the weighted sum) is in moe.c. Bytes from the file
 * are validated here and refused with an error, never asserted.
 */
#include "moe.h"

#include <stdio.h>
#include <string.h>
/* ---------------- loading ---------------- */

static bool is_moe_arch(enum cm_arch a) {
    return a == CM_ARCH_QWEN2MOE || a == CM_ARCH_QWEN3MOE || a == CM_ARCH_GPTOSS || a == CM_ARCH_DEEPSEEK2;
}

static int get_u(const cm_gguf *g, const char *arch, const char *suffix, uint64_t def, uint64_t hi, uint64_t *out,
                 char *err, size_t errlen) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!cm_gguf_get_u64(g, key, out)) {
        if (cm_gguf_find_kv(g, key))
            return cm_errf(err, errlen, CM_EUNSUPPORTED, "metadata '%s' is not a single non-negative integer", key);
        *out = def;
    }
    if (*out > hi)
        return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s' = %llu is out of range [0, %llu]", key,
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
        return cm_errf(
            err, errlen, CM_EUNSUPPORTED,
            "architecture '%s' with experts is not supported (experts: qwen2moe, qwen3moe, gpt-oss, deepseek2, llama)",
            an);
    if ((rc = get_u(m->gguf, an, "expert_used_count", 0, ne, &nu, err, errlen))) return rc;
    if (nu == 0)
        return cm_errf(err, errlen, CM_EFORMAT, "metadata '%s.expert_used_count' must be in [1, %llu]", an,
                       (unsigned long long)ne);
    if ((rc = get_u(m->gguf, an, "expert_feed_forward_length", 0, 1u << 26, &fe, err, errlen)) ||
        (rc = get_u(m->gguf, an, "expert_shared_feed_forward_length", 0, 1u << 26, &fs, err, errlen)))
        return rc;
    hp->n_expert = (int)ne;
    hp->n_expert_used = (int)nu;
    /* llama.cpp: Mixtral's experts are n_ff wide; qwen*moe read the expert
     * width, else n_ff / n_used; qwen2moe's shared expert defaults to n_ff. */
    hp->n_ff_exp = hp->arch == CM_ARCH_LLAMA ? hp->n_ff : fe ? (int)fe : hp->n_ff / hp->n_expert_used;
    if (hp->arch == CM_ARCH_DEEPSEEK2) { /* mla.c read the rest; n_ff_shexp holds expert_shared_count */
        hp->n_ff_shexp *= hp->n_ff_exp;
        if (hp->n_expert_groups > 1 &&
            (hp->n_expert % hp->n_expert_groups || hp->n_group_used < 1 || hp->n_group_used > hp->n_expert_groups ||
             (int64_t)hp->n_group_used * (hp->n_expert / hp->n_expert_groups) < hp->n_expert_used ||
             hp->n_expert / hp->n_expert_groups < 2))
            return cm_errf(err, errlen, CM_EFORMAT,
                           "deepseek2: %d experts in %d groups with %d used groups cannot give top %d", hp->n_expert,
                           hp->n_expert_groups, hp->n_group_used, hp->n_expert_used);
    } else {
        hp->n_ff_shexp = hp->arch == CM_ARCH_QWEN2MOE ? (fs ? (int)fs : hp->n_ff) : 0;
        hp->expert_norm =
            hp->arch != CM_ARCH_QWEN2MOE && hp->arch != CM_ARCH_GPTOSS; /* gpt-oss: softmax of the top k */
    }
    if (hp->n_ff_exp < 1) return cm_errf(err, errlen, CM_EFORMAT, "expert feed-forward length of '%s' is 0", an);
    return 0;
}

static void fmt_shape(char *b, size_t n, int nd, const int64_t *ne) {
    size_t o = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < nd && o < n; i++)
        o += (size_t)snprintf(b + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
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
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "tensor '%s' has unsupported type %s", name,
                       cm_type_name(ti->type));
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
    if (cm_tensor_nbytes(t) > ti->nbytes)
        return cm_errf(err, errlen, CM_EFORMAT, "tensor '%s' is shorter than its shape", name);
    m->n_params += (uint64_t)cm_tensor_nelements(t);
    m->weight_bytes += cm_tensor_nbytes(t);
    return 0;
}

int cm_moe_bind_tensor(cm_model *m, cm_tensor *t, int il, const char *suffix, int nd, int64_t ne0, int64_t ne1,
                       int64_t ne2, bool weight, char *err, size_t errlen) {
    return bind(m, t, il, suffix, nd, ne0, ne1, ne2, weight, err, errlen);
}

int cm_moe_bind_layer(cm_model *m, int il, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    cm_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, F = hp->n_ff_exp, X
    = hp->n_expert, FS = hp->n_ff_shexp;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.ffn_gate.0.weight", il);
    if (cm_gguf_find_tensor(m->gguf, name))
        return cm_errf(
            err, errlen, CM_EUNSUPPORTED,
            "tensor '%s': one tensor per expert (old Mixtral layout) is not supported; supported: stacked ffn_{gate,up,down}_exps",
            name);
    snprintf(name, sizeof name, "blk.%d.ffn_gate_up_exps.weight", il);
    if (cm_gguf_find_tensor(m->gguf, name))
        return cm_errf(
            err, errlen, CM_EUNSUPPORTED,
            "tensor '%s': merged gate/up experts are not supported; supported: stacked ffn_{gate,up,down}_exps", name);
    int rc;
    if ((rc = bind(m, &L->ffn_gate_inp, il, "ffn_gate_inp.weight", 2, E, X, 1, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_gate_exps, il, "ffn_gate_exps.weight", 3, E, F, X, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_up_exps, il, "ffn_up_exps.weight", 3, E, F, X, true, err, errlen)) ||
        (rc = bind(m, &L->ffn_down_exps, il, "ffn_down_exps.weight", 3, F, E, X, true, err, errlen)))
        return rc;
    if (FS > 0 && hp->arch != CM_ARCH_DEEPSEEK2 &&
        (rc = bind(m, &L->ffn_gate_inp_shexp, il, "ffn_gate_inp_shexp.weight", 1, E, 1, 1, false, err, errlen)))
        return rc;
    if (FS > 0 && /* deepseek2: ungated shared experts, n_ff_exp * expert_shared_count wide */
        ((rc = bind(m, &L->ffn_gate_shexp, il, "ffn_gate_shexp.weight", 2, E, FS, 1, true, err, errlen)) ||
         (rc = bind(m, &L->ffn_up_shexp, il, "ffn_up_shexp.weight", 2, E, FS, 1, true, err, errlen)) ||
         (rc = bind(m, &L->ffn_down_shexp, il, "ffn_down_shexp.weight", 2, FS, E, 1, true, err, errlen))))
        return rc;
    return 0;
}

int cm_moe_repack_layer(const cm_model *m, int il, char *err, size_t errlen) {
    const cm_layer *L = &m->layers[il];
    const cm_tensor *ts[3] = {&L->ffn_gate_exps, &L->ffn_up_exps, &L->ffn_down_exps};
    cm_tensor v[3];
    const cm_tensor *ws[3];
    int n = 0;
    for (int i = 0; i < 3; i++) {
        const cm_tensor *w = ts[i];
        if (!w->data || w->n_dims != 3 || w->nb[2] != (size_t)w->ne[1] * w->nb[1]) continue;
        v[n] = *w; /* the stack as one matrix of ne[1] * ne[2] rows: each expert's view is a row view of it */
        v[n].ne[1] = w->ne[1] * w->ne[2];
        v[n].ne[2] = 1;
        v[n].n_dims = 2;
        ws[n] = &v[n];
        n++;
    }
    return n ? cm_repack_add(m, cm_kernels_get(), ws, n, err, errlen) : 0;
}

void cm_moe_count_active(cm_model *m) {
    m->n_params_active = m->n_params;
    m->weight_bytes_active = m->weight_bytes;
    const cm_hparams *hp = &m->hp;
    if (!hp->n_expert) return;
    const uint64_t unused = (uint64_t)(hp->n_expert - hp->n_expert_used);
    for (int il = 0; il < hp->n_layer; il++) {
        const cm_tensor *ts[3] = {&m->layers[il].ffn_gate_exps, &m->layers[il].ffn_up_exps,
                                  &m->layers[il].ffn_down_exps};
        for (int i = 0; i < 3; i++) {
            if (!ts[i]->data) continue;
            m->n_params_active -= (uint64_t)(ts[i]->ne[0] * ts[i]->ne[1]) * unused;
            m->weight_bytes_active -= ts[i]->nb[2] * unused;
        }
    }
}

/* deepseek2's slice of query heads / dense FFN rows (tensor-parallel MLA) */
static bool ds_sliced(const cm_model *m, cm_slice s) {
    const cm_slice w = cm_slice_full(m);
    return m->hp.arch == CM_ARCH_DEEPSEEK2 && (s.h0 != w.h0 || s.h1 != w.h1 || s.f0 != w.f0 || s.f1 != w.f1);
}

int cm_moe_check_experts(const cm_model *m, cm_slice s, cm_expert_slice x, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if (!x.ep && ds_sliced(m, s)) /* every member would add every expert's output to the all-reduce */
        return cm_errf(err, errlen, CM_EINVAL, "a deepseek2 slice of heads or FFN rows needs an expert slice (ep)");
    if (!x.ep) return 0;
    if (!hp->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "an expert slice of '%s', which has no experts",
                       cm_arch_name_of(hp->arch));
    if (x.e0 < 0 || x.e0 > x.e1 || x.e1 > hp->n_expert)
        return cm_errf(err, errlen, CM_EINVAL, "expert slice [%d, %d) is out of range (%d experts)", x.e0, x.e1,
                       hp->n_expert);
    if (!ds_sliced(m, s) && (s.h0 != 0 || s.h1 != cm_slice_full(m).h1 || s.f0 != 0 || s.f1 != hp->n_ff))
        return cm_errf(err, errlen, CM_EINVAL, "an expert slice must hold every KV head and FFN row");
    return 0;
}

int cm_moe_check_slice(const cm_model *m, cm_slice s, char *err, size_t errlen) {
    const cm_hparams *hp = &m->hp;
    if (ds_sliced(m, s)) { /* attn_output's columns of the heads, the dense layers' ffn_down columns on blocks */
        for (int il = 0; il < hp->n_layer; il++) {
            const cm_layer *L = &m->layers[il];
            const int bo = cm_type_traits_of(L->wo.type)->block_size, v = hp->mla.head_v;
            if (((int64_t)s.h0 * v) % bo || ((int64_t)s.h1 * v) % bo)
                return cm_errf(err, errlen, CM_EINVAL,
                               "slice heads [%d, %d) do not fall on %s block boundaries of '%s'", s.h0, s.h1,
                               cm_type_name(L->wo.type), L->wo.name);
            const int bd = L->ffn_down.data ? cm_type_traits_of(L->ffn_down.type)->block_size : 1;
            if (s.f0 % bd || s.f1 % bd)
                return cm_errf(err, errlen, CM_EINVAL,
                               "slice ffn rows [%d, %d) do not fall on %s block boundaries of '%s'", s.f0, s.f1,
                               cm_type_name(L->ffn_down.type), L->ffn_down.name);
        }
        return 0;
    }
    if (hp->n_expert && (s.h0 != 0 || s.h1 != cm_slice_full(m).h1 || s.f0 != 0 || s.f1 != hp->n_ff))
        return cm_errf(err, errlen, CM_EUNSUPPORTED,
                       "tensor-parallel slices of a mixture-of-experts model ('%s', %d experts) are not supported; "
                       "use pipeline parallelism",
                       cm_arch_name_of(hp->arch), hp->n_expert);
    return 0;
}
