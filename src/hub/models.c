/*
 * models.c: the models directory on disk: what `cumulo models` lists, and
 * how a command's MODEL argument ("org/repo:Q4_K_M") becomes a file. The
 * layout is DIR/org/repo/PATH (PATH as in the repository), so a reference
 * resolves by the same rules (cm_hub_choose) on disk as on the Hub.
 */
#include "hub.h"

#include "base/base.h"
#include "gguf/gguf.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool is_dir(const char *p) {
    struct stat sb;
    return !stat(p, &sb) && S_ISDIR(sb.st_mode);
}

static bool gguf_name(const char *n) {
    size_t l = strlen(n);
    return l > 5 && !strcasecmp(n + l - 5, ".gguf");
}

/* The GGUF files of one repository folder (paths relative to it), as a
 * listing cm_hub_choose can read. Sizes from stat; no hashes. */
static int repo_files(const char *rdir, cm_hub_file **out, size_t *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(rdir);
    if (!d) return 0;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.' || !gguf_name(de->d_name) || strlen(de->d_name) >= CM_HUB_MAX_PATH) continue;
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            if (nc > CM_HUB_MAX_FILES) break;
            cm_hub_file *p = cm_realloc(*out, nc * sizeof *p);
            if (!p) break;
            *out = p;
            cap = nc;
        }
        cm_hub_file *f = &(*out)[(*n)++];
        memset(f, 0, sizeof *f);
        snprintf(f->path, sizeof f->path, "%s", de->d_name);
        char full[1400];
        struct stat sb;
        snprintf(full, sizeof full, "%s/%s", rdir, de->d_name);
        if (!stat(full, &sb)) f->size = (uint64_t)sb.st_size;
    }
    closedir(d);
    return 0;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const cm_model_entry *)a)->name, ((const cm_model_entry *)b)->name);
}

/* Calls fn for every DIR/org/repo folder (rdir) with "org/repo" (name);
 * fn returns non-zero to stop the walk, which returns that value. */
static int for_each_repo(const char *dir, int (*fn)(void *ctx, const char *rdir, const char *name), void *ctx) {
    DIR *d1 = opendir(dir);
    if (!d1) return 0; /* nothing pulled yet */
    int rc = 0;
    struct dirent *a;
    while (!rc && (a = readdir(d1))) {
        if (a->d_name[0] == '.') continue;
        char odir[1200];
        snprintf(odir, sizeof odir, "%s/%s", dir, a->d_name);
        DIR *d2 = is_dir(odir) ? opendir(odir) : NULL;
        if (!d2) continue;
        struct dirent *b;
        while (!rc && (b = readdir(d2))) {
            if (b->d_name[0] == '.') continue;
            char rdir[1500], name[600];
            snprintf(rdir, sizeof rdir, "%s/%s", odir, b->d_name);
            if (!is_dir(rdir) || snprintf(name, sizeof name, "%s/%s", a->d_name, b->d_name) >= (int)sizeof name)
                continue;
            rc = fn(ctx, rdir, name);
        }
        closedir(d2);
    }
    closedir(d1);
    return rc;
}

typedef struct list_ctx {
    cm_model_entry *out;
    size_t n, cap;
} list_ctx;

/* One repository's GGUF files into the list (a multi-part file once, by part 1, when complete). */
static int list_repo(void *ctx, const char *rdir, const char *name) {
    list_ctx *l = ctx;
    cm_hub_file *files;
    size_t nf;
    repo_files(rdir, &files, &nf);
    int rc = 0;
    for (size_t i = 0; i < nf && !rc; i++) {
        int k = 1, parts = 1;
        bool split = cm_hub_split_name(files[i].path, &k, &parts);
        if (split && k != 1) continue;
        uint64_t total = files[i].size;
        if (split) {
            cm_hub_ref r = {0};
            snprintf(r.file, sizeof r.file, "%s", files[i].path);
            size_t pick[CM_HUB_MAX_PARTS], np;
            if (cm_hub_choose(&r, files, nf, pick, &np, NULL, 0)) continue;
            total = 0;
            for (size_t p = 0; p < np; p++) total += files[pick[p]].size;
        }
        if (l->n == l->cap) {
            size_t nc = l->cap ? l->cap * 2 : 16;
            cm_model_entry *p = cm_realloc(l->out, nc * sizeof *p);
            if (!p) {
                rc = CM_ENOMEM;
                break;
            }
            l->out = p;
            l->cap = nc;
        }
        cm_model_entry *e = &l->out[l->n];
        memset(e, 0, sizeof *e);
        int w1 = snprintf(e->path, sizeof e->path, "%s/%s", rdir, files[i].path);
        int w2 = snprintf(e->name, sizeof e->name, "%s/%s", name, files[i].path);
        if (w1 < 0 || w2 < 0 || (size_t)w1 >= sizeof e->path || (size_t)w2 >= sizeof e->name) continue;
        l->n++;
        e->size = total;
        e->parts = parts;
        snprintf(e->arch, sizeof e->arch, "?");
        cm_gguf g = {0};
        char ge[256];
        if (!cm_gguf_open(&g, e->path, NULL, NULL, ge, sizeof ge)) {
            char *s = cm_gguf_get_str(&g, "general.architecture");
            if (s) snprintf(e->arch, sizeof e->arch, "%s", s);
            cm_free(s);
        }
        cm_gguf_close(&g);
    }
    cm_free(files);
    return rc;
}

int cm_models_list(const char *dir, cm_model_entry **out, size_t *n, char *err, size_t errlen) {
    list_ctx l = {0};
    int rc = for_each_repo(dir, list_repo, &l);
    if (rc) {
        cm_free(l.out);
        *out = NULL;
        *n = 0;
        return cm_errf(err, errlen, rc, "out of memory");
    }
    if (l.n) qsort(l.out, l.n, sizeof *l.out, cmp_entry);
    *out = l.out;
    *n = l.n;
    return 0;
}

typedef struct find_ctx {
    const char *base;
    char *out;
    size_t cap;
    int k, max;
} find_ctx;

static int find_in_repo(void *ctx, const char *rdir, const char *name) {
    (void)name;
    find_ctx *f = ctx;
    char p[1700];
    int w = snprintf(p, sizeof p, "%s/%s", rdir, f->base);
    if (w > 0 && (size_t)w < f->cap && !access(p, R_OK)) snprintf(f->out + f->cap * (size_t)f->k++, f->cap, "%s", p);
    return f->k >= f->max;
}

int cm_models_find(const char *dir, const char *base, char *out, size_t cap, int max) {
    if (!*base || strchr(base, '/') || !strcmp(base, "..") || max < 1) return 0;
    find_ctx f = {.base = base, .out = out, .cap = cap, .max = max};
    char p[1600];
    int w = snprintf(p, sizeof p, "%s/%s", dir, base);
    if (w > 0 && (size_t)w < cap && !access(p, R_OK)) snprintf(out + cap * (size_t)f.k++, cap, "%s", p);
    if (f.k < max) for_each_repo(dir, find_in_repo, &f);
    return f.k;
}

int cm_models_resolve(const char *arg, char *out, size_t cap, char *err, size_t errlen) {
    struct stat sb;
    if (!stat(arg, &sb) || !cm_hub_is_ref(arg)) {
        if (strlen(arg) >= cap) return cm_errf(err, errlen, CM_ERANGE, "model path too long");
        snprintf(out, cap, "%s", arg);
        return 0;
    }
    cm_hub_ref r;
    int rc = cm_hub_parse_ref(arg, &r, err, errlen);
    if (rc) return rc;
    char dir[900], rdir[1200];
    rc = cm_models_dir(dir, sizeof dir, err, errlen);
    if (rc) return rc;
    snprintf(rdir, sizeof rdir, "%s/%s", dir, r.repo);
    cm_hub_file *files;
    size_t nf, pick[CM_HUB_MAX_PARTS], np;
    repo_files(rdir, &files, &nf);
    char why[700];
    rc = nf ? cm_hub_choose(&r, files, nf, pick, &np, why, sizeof why) : CM_ENOENT;
    if (!rc) {
        int w = snprintf(out, cap, "%s/%s", rdir, files[pick[0]].path);
        if (w < 0 || (size_t)w >= cap) rc = cm_errf(err, errlen, CM_ERANGE, "model path too long");
    } else if (nf) {
        rc = cm_errf(err, errlen, CM_ENOENT, "'%s' is not pulled (%s); `cumulo pull %s` downloads it", arg, why, arg);
    } else {
        rc = cm_errf(err, errlen, CM_ENOENT,
                     "'%s' is neither a file nor a pulled model (in %s); `cumulo pull %s` downloads it", arg, dir, arg);
    }
    cm_free(files);
    return rc;
}
