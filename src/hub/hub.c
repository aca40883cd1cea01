/*
 * hub.c: the pure half of model references: parsing what the user typed,
 * reading the Hub's listing, choosing the files a reference means, and the
 * models directory's layout. No network, no files (see hub_fetch.c and
 * models.c), so every rule here is table-tested (tests/unit/test_hub.c).
 */
#include "hub.h"

#include "base/base.h"

#include <cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The Hub's repository and organisation names: letters, digits, '-', '_', '.'. */
static bool name_ok(const char *s, size_t n) {
    if (n == 0 || n > 96) return false;
    if (s[0] == '.' || s[0] == '-') return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return false;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '.' && s[i + 1] == '.') return false;
    return true;
}

/* A path inside a repository: segments of name characters and '/', no "..". */
static bool path_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= CM_HUB_MAX_PATH || s[0] == '/' || strstr(s, "..") || strstr(s, "//")) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\\' || c == '?' || c == '#' || c == '%') return false;
    }
    return true;
}

static bool ends_with_ci(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcasecmp(s + a - b, suf);
}

bool cm_hub_is_ref(const char *s) {
    if (!s || !*s) return false;
    if (!strncmp(s, "hf://", 5)) return true;
    if (ends_with_ci(s, ".gguf") || s[0] == '/' || s[0] == '.' || s[0] == '~') return false;
    const char *slash = strchr(s, '/');
    if (!slash || strchr(slash + 1, '/')) return false;
    cm_hub_ref r;
    return cm_hub_parse_ref(s, &r, NULL, 0) == 0;
}

int cm_hub_parse_ref(const char *s, cm_hub_ref *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    snprintf(r->revision, sizeof r->revision, "main");
    bool url = !strncmp(s, "hf://", 5);
    const char *p = url ? s + 5 : s;
    if (strlen(p) >= 1024) return cm_errf(err, errlen, CM_EINVAL, "model name too long");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", p);
    /* org */
    char *slash = strchr(buf, '/');
    if (!slash) return cm_errf(err, errlen, CM_EINVAL, "'%s' is not a model name: expected org/repo[:QUANT]", s);
    *slash = 0;
    const char *org = buf;
    char *rest = slash + 1;
    /* repo ends at '/', ':' or '@' */
    size_t rl = strcspn(rest, "/:@");
    char tail = rest[rl];
    rest[rl] = 0;
    if (!name_ok(org, strlen(org)) || !name_ok(rest, rl))
        return cm_errf(err, errlen, CM_EINVAL,
                       "'%s' is not a model name: org and repo are letters, digits, '-', '_' and '.'", s);
    size_t ol = strlen(org); /* name_ok bounds both to 96 bytes */
    memcpy(r->repo, org, ol);
    r->repo[ol] = '/';
    memcpy(r->repo + ol + 1, rest, rl + 1);
    char *q = rest + rl + 1;
    if (tail == '@') {
        size_t vl = strcspn(q, "/:");
        char t2 = q[vl];
        q[vl] = 0;
        if (!name_ok(q, vl) || vl >= sizeof r->revision)
            return cm_errf(err, errlen, CM_EINVAL, "'%s': bad revision after '@'", s);
        snprintf(r->revision, sizeof r->revision, "%s", q);
        tail = t2;
        q += vl + 1;
    }
    if (tail == '/') {
        if (!url)
            return cm_errf(err, errlen, CM_EINVAL, "'%s': name a file inside a repository as hf://org/repo/FILE.gguf",
                           s);
        if (!path_ok(q)) return cm_errf(err, errlen, CM_EINVAL, "'%s': bad file path", s);
        snprintf(r->file, sizeof r->file, "%s", q);
    } else if (tail == ':') {
        size_t ql = strlen(q);
        if (ql == 0 || ql >= sizeof r->quant) return cm_errf(err, errlen, CM_EINVAL, "'%s': bad quant after ':'", s);
        for (size_t i = 0; i < ql; i++)
            if (!isalnum((unsigned char)q[i]) && q[i] != '_' && q[i] != '-')
                return cm_errf(err, errlen, CM_EINVAL, "'%s': bad quant after ':' (like Q4_K_M)", s);
        snprintf(r->quant, sizeof r->quant, "%s", q);
    } else if (tail != 0) {
        return cm_errf(err, errlen, CM_EINVAL, "'%s' is not a model name", s);
    }
    return 0;
}

int cm_hub_parse_listing(const char *json, size_t len, cm_hub_file **files, size_t *n, char *err, size_t errlen) {
    *files = NULL;
    *n = 0;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return cm_errf(err, errlen, CM_EFORMAT, "the hub's file listing is not a JSON array");
    }
    int count = cJSON_GetArraySize(root);
    size_t cap = count < 0 ? 0 : (size_t)count;
    if (cap > CM_HUB_MAX_FILES) cap = CM_HUB_MAX_FILES;
    cm_hub_file *out = cm_calloc(cap ? cap : 1, sizeof *out);
    if (!out) {
        cJSON_Delete(root);
        return cm_errf(err, errlen, CM_ENOMEM, "out of memory");
    }
    size_t k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (k == cap) break;
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(it, "path");
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(it, "size");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "file")) continue;
        if (!cJSON_IsString(path) || !path_ok(path->valuestring)) continue;
        cm_hub_file *f = &out[k];
        snprintf(f->path, sizeof f->path, "%s", path->valuestring);
        if (cJSON_IsNumber(size) && size->valuedouble >= 0 && size->valuedouble < 1e18)
            f->size = (uint64_t)size->valuedouble;
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(it, "lfs");
        if (cJSON_IsObject(lfs)) {
            const cJSON *oid = cJSON_GetObjectItemCaseSensitive(lfs, "oid");
            const cJSON *ls = cJSON_GetObjectItemCaseSensitive(lfs, "size");
            if (cJSON_IsNumber(ls) && ls->valuedouble >= 0 && ls->valuedouble < 1e18)
                f->size = (uint64_t)ls->valuedouble;
            const char *o = cJSON_IsString(oid) ? oid->valuestring : "";
            if (!strncmp(o, "sha256:", 7)) o += 7;
            bool hex = strlen(o) == 64;
            for (int i = 0; hex && i < 64; i++) hex = isxdigit((unsigned char)o[i]);
            if (hex) {
                for (int i = 0; i < 64; i++) f->sha256[i] = (char)tolower((unsigned char)o[i]);
                f->sha256[64] = 0;
            }
        }
        k++;
    }
    cJSON_Delete(root);
    *files = out;
    *n = k;
    return 0;
}

bool cm_hub_split_name(const char *path, int *k, int *n) {
    size_t l = strlen(path);
    /* STEM-00001-of-00003.gguf: the suffix is 20 bytes */
    if (l < 21 || !ends_with_ci(path, ".gguf")) return false;
    const char *s = path + l - 20;
    if (s[0] != '-' || strncmp(s + 6, "-of-", 4)) return false;
    int a = 0, b = 0;
    for (int i = 1; i <= 5; i++) {
        if (!isdigit((unsigned char)s[i]) || !isdigit((unsigned char)s[i + 9])) return false;
        a = a * 10 + (s[i] - '0');
        b = b * 10 + (s[i + 9] - '0');
    }
    if (a < 1 || b < 1 || a > b) return false;
    *k = a;
    *n = b;
    return true;
}

/* Same file name up to the "-0000K-of-0000N.gguf" suffix. */
static bool same_split_stem(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    return la == lb && la > 20 && !strncmp(a, b, la - 20) && !strcmp(a + la - 14, b + lb - 14);
}

/* Does the file's base name carry the quant as a whole token? */
static bool has_quant(const char *path, const char *quant) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t ql = strlen(quant);
    for (const char *p = base; *p; p++) {
        if (strncasecmp(p, quant, ql)) continue;
        bool left = p == base || p[-1] == '-' || p[-1] == '.' || p[-1] == '_';
        char c = p[ql];
        bool right = c == '.' || c == '-';
        if (left && right) return true;
    }
    return false;
}

/* Select f and, when it is part of a multi-part file, all its parts in order. */
static int pick_with_parts(const cm_hub_file *files, size_t n, size_t f, size_t *pick, size_t *npick, char *err,
                           size_t errlen) {
    int k, parts;
    if (!cm_hub_split_name(files[f].path, &k, &parts)) {
        pick[0] = f;
        *npick = 1;
        return 0;
    }
    if (parts > CM_HUB_MAX_PARTS)
        return cm_errf(err, errlen, CM_EUNSUPPORTED, "'%s' has %d parts (at most %d)", files[f].path, parts,
                       CM_HUB_MAX_PARTS);
    for (int want = 1; want <= parts; want++) {
        size_t found = n;
        for (size_t i = 0; i < n && found == n; i++) {
            int a, b;
            if (cm_hub_split_name(files[i].path, &a, &b) && a == want && b == parts &&
                same_split_stem(files[i].path, files[f].path))
                found = i;
        }
        if (found == n)
            return cm_errf(err, errlen, CM_ENOENT, "part %d of %d of '%s' is not in the repository", want, parts,
                           files[f].path);
        pick[want - 1] = found;
    }
    *npick = (size_t)parts;
    return 0;
}

/* The GGUF files, part 1 only for multi-part ones, into a message. */
static void list_offer(const cm_hub_file *files, size_t n, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && o + 4 < cap; i++) {
        int k, parts;
        if (!ends_with_ci(files[i].path, ".gguf")) continue;
        if (cm_hub_split_name(files[i].path, &k, &parts) && k != 1) continue;
        int w = snprintf(out + o, cap - o, "%s%s", o ? ", " : "", files[i].path);
        if (w < 0 || (size_t)w >= cap - o) {
            snprintf(out + (cap > 5 ? cap - 5 : 0), 5, "...");
            break;
        }
        o += (size_t)w;
    }
    if (!o) snprintf(out, cap, "no .gguf files");
}

int cm_hub_choose(const cm_hub_ref *r, const cm_hub_file *files, size_t n, size_t *pick, size_t *npick, char *err,
                  size_t errlen) {
    *npick = 0;
    char offer[600];
    if (r->file[0]) {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(files[i].path, r->file)) return pick_with_parts(files, n, i, pick, npick, err, errlen);
        list_offer(files, n, offer, sizeof offer);
        return cm_errf(err, errlen, CM_ENOENT, "%s has no file '%s'; it has: %s", r->repo, r->file, offer);
    }
    size_t cand[CM_HUB_MAX_FILES], nc = 0;
    for (size_t i = 0; i < n; i++) {
        int k, parts;
        if (!ends_with_ci(files[i].path, ".gguf")) continue;
        if (cm_hub_split_name(files[i].path, &k, &parts) && k != 1) continue;
        if (r->quant[0] && !has_quant(files[i].path, r->quant)) continue;
        cand[nc++] = i;
    }
    list_offer(files, n, offer, sizeof offer);
    if (nc == 0) {
        if (r->quant[0])
            return cm_errf(err, errlen, CM_ENOENT, "%s has no %s file; it has: %s", r->repo, r->quant, offer);
        return cm_errf(err, errlen, CM_ENOENT, "%s has no GGUF files (cumulo runs GGUF models)", r->repo);
    }
    if (nc == 1) return pick_with_parts(files, n, cand[0], pick, npick, err, errlen);
    if (!r->quant[0]) {
        static const char *const pref[] = {"Q4_K_M", "Q4_0", "Q8_0"};
        for (size_t p = 0; p < CM_ARRAY_LEN(pref); p++)
            for (size_t i = 0; i < nc; i++)
                if (has_quant(files[cand[i]].path, pref[p]))
                    return pick_with_parts(files, n, cand[i], pick, npick, err, errlen);
    }
    return cm_errf(err, errlen, CM_ENOENT, "%s%s%s names %zu files (%s); add the file: hf://%s/FILE.gguf", r->repo,
                   r->quant[0] ? ":" : "", r->quant, nc, offer, r->repo);
}

int cm_models_dir(char *out, size_t cap, char *err, size_t errlen) {
    const int rc = cm_cache_dir(cm_config_get()->models, "models", out, cap);
    if (rc == CM_ENOENT) return cm_errf(err, errlen, rc, "no models directory: set CUMULO_MODELS or HOME");
    if (rc) return cm_errf(err, errlen, rc, "models directory path too long");
    return 0;
}

int cm_models_file_path(const char *dir, const char *repo, const char *path, char *out, size_t cap) {
    int w = snprintf(out, cap, "%s/%s/%s", dir, repo, path);
    return w < 0 || (size_t)w >= cap ? CM_ERANGE : 0;
}
