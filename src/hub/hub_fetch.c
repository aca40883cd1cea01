/*
 * hub_fetch.c: the Hub over HTTP, through libcurl: the file listing (with
 * its pages) and resumable, verified downloads. Everything a server sends
 * is bounded (a listing page at most CM_HUB_LISTING_MAX bytes, a file at
 * most the size its listing declared) and every transfer has a connect
 * deadline and a stall deadline, so a dead server is an error, not a hang.
 */
#include "hub.h"

#include "base/base.h"
#include "os/os.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CM_HUB_LISTING_MAX (16u << 20) /* bytes of one listing page */
#define CM_HUB_MAX_PAGES 64
#define CM_HUB_CONNECT_S 20L
#define CM_HUB_STALL_S 60L /* no byte for this long: the transfer failed */

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

void cm_hub_client_init(cm_hub_client *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", cm_config_get()->hf_endpoint);
    size_t l = strlen(c->endpoint);
    while (l && c->endpoint[l - 1] == '/') c->endpoint[--l] = 0;
    c->token = cm_config_get()->hf_token;
    c->retries = 5;
}

/* A handle with what every request shares. */
static CURL *handle(const cm_hub_client *c, struct curl_slist **hdrs) {
    pthread_once(&g_curl_once, curl_once);
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "cumulo/" CM_VERSION);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, CM_HUB_CONNECT_S);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, CM_HUB_STALL_S);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    *hdrs = NULL;
    if (c->token) {
        /* libcurl sends a custom Authorization header to the first host only,
         * never to a host a redirect leads to (unless told otherwise). */
        char a[600];
        snprintf(a, sizeof a, "Authorization: Bearer %s", c->token);
        *hdrs = curl_slist_append(NULL, a);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
    }
    return h;
}

/* What an HTTP status means to the user. */
static int http_error(long code, const char *what, const char *repo, char *err, size_t errlen) {
    if (code == 401 || code == 403)
        return cm_errf(err, errlen, CM_EAUTH,
                       "%s: the hub answered %ld (%s): %s is gated or private; accept its terms on the hub and "
                       "set HF_TOKEN to an access token",
                       what, code, code == 401 ? "unauthorized" : "forbidden", repo);
    if (code == 404)
        return cm_errf(err, errlen, CM_ENOENT, "%s: not found on the hub (404): check the name '%s'", what, repo);
    return cm_errf(err, errlen, CM_EIO, "%s: the hub answered HTTP %ld", what, code);
}

/* ---- listing ---- */
typedef struct membuf {
    char *p;
    size_t n, cap;
    bool over;
    char next[1024];
} membuf;

static size_t mem_write(char *d, size_t sz, size_t nm, void *ctx) {
    membuf *b = ctx;
    size_t n = sz * nm;
    if (b->n + n > CM_HUB_LISTING_MAX) {
        b->over = true;
        return 0;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        char *np = cm_realloc(b->p, nc);
        if (!np) return 0;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* "Link: <URL>; rel="next"" -> next page's URL. */
static size_t link_header(char *d, size_t sz, size_t nm, void *ctx) {
    membuf *b = ctx;
    size_t n = sz * nm;
    if (n > 6 && !strncasecmp(d, "link:", 5)) {
        char line[2048];
        size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
        memcpy(line, d, l);
        line[l] = 0;
        char *lt = strchr(line, '<'), *gt = lt ? strchr(lt, '>') : NULL;
        if (lt && gt && strstr(gt, "rel=\"next\"") && (size_t)(gt - lt - 1) < sizeof b->next) {
            memcpy(b->next, lt + 1, (size_t)(gt - lt - 1));
            b->next[gt - lt - 1] = 0;
        }
    }
    return n;
}

int cm_hub_list(const cm_hub_client *c, const cm_hub_ref *r, cm_hub_file **files, size_t *n, char *err, size_t errlen) {
    *files = NULL;
    *n = 0;
    char url[1024];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/%s?recursive=true", c->endpoint, r->repo, r->revision);
    int rc = 0;
    for (int page = 0; page < CM_HUB_MAX_PAGES && url[0] && !rc; page++) {
        struct curl_slist *hdrs;
        CURL *h = handle(c, &hdrs);
        if (!h) return cm_errf(err, errlen, CM_ENOMEM, "cannot start an HTTP client");
        membuf b = {0};
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mem_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, link_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, &b);
        CURLcode cr = curl_easy_perform(h);
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdrs);
        if (b.over)
            rc = cm_errf(err, errlen, CM_EFORMAT, "the listing of %s is larger than %u MiB", r->repo,
                         CM_HUB_LISTING_MAX >> 20);
        else if (cr != CURLE_OK)
            rc = cm_errf(err, errlen, CM_EIO, "cannot list %s at %s: %s", r->repo, c->endpoint, curl_easy_strerror(cr));
        else if (code != 200) rc = http_error(code, "listing", r->repo, err, errlen);
        cm_hub_file *pf = NULL;
        size_t pn = 0;
        if (!rc) rc = cm_hub_parse_listing(b.p ? b.p : "", b.n, &pf, &pn, err, errlen);
        cm_free(b.p);
        if (!rc && pn) {
            cm_hub_file *all = cm_realloc(*files, (*n + pn) * sizeof *all);
            if (!all) rc = cm_errf(err, errlen, CM_ENOMEM, "out of memory");
            else {
                memcpy(all + *n, pf, pn * sizeof *pf);
                *files = all;
                *n += pn;
            }
        }
        cm_free(pf);
        snprintf(url, sizeof url, "%s", b.next);
        if (*n >= CM_HUB_MAX_FILES) break;
    }
    if (rc) {
        cm_free(*files);
        *files = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- download ---- */
int cm_hub_file_sha256(const char *path, char out[65], char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return cm_errf(err, errlen, CM_ENOENT, "cannot open '%s': %s", path, strerror(errno));
    crypto_hash_sha256_state st;
    crypto_hash_sha256_init(&st);
    unsigned char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) crypto_hash_sha256_update(&st, buf, k);
    bool bad = ferror(f);
    fclose(f);
    if (bad) return cm_errf(err, errlen, CM_EIO, "cannot read '%s'", path);
    unsigned char h[32];
    crypto_hash_sha256_final(&st, h);
    sodium_bin2hex(out, 65, h, 32);
    return 0;
}

typedef struct dl {
    int fd;
    uint64_t have, size;
    crypto_hash_sha256_state st;
    CURL *h;
    bool checked, failed, restart;
    const cm_hub_client *c;
} dl;

static size_t dl_write(char *d, size_t sz, size_t nm, void *ctx) {
    dl *x = ctx;
    size_t n = sz * nm;
    if (!x->checked) { /* the first body byte of the final response: did it honour the range? */
        long code = 0;
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
        x->checked = true;
        if (code == 200 && x->have > 0) { /* a full body: start over */
            if (ftruncate(x->fd, 0) || lseek(x->fd, 0, SEEK_SET) < 0) {
                x->failed = true;
                return 0;
            }
            x->have = 0;
            crypto_hash_sha256_init(&x->st);
        } else if (code != 200 && code != 206) {
            return 0; /* an error page: not file bytes */
        }
    }
    if (x->have + n > x->size) {
        x->failed = true;
        return 0;
    } /* more than the listing said */
    for (size_t o = 0; o < n;) {
        ssize_t w = write(x->fd, d + o, n - o);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            x->failed = true;
            return 0;
        }
        o += (size_t)w;
    }
    crypto_hash_sha256_update(&x->st, (const unsigned char *)d, n);
    x->have += n;
    if (x->c->progress) x->c->progress(x->c->progress_ctx, x->have, x->size);
    return n;
}

/* Hash what a .part already holds (the resumed download's first bytes). */
static int hash_existing(dl *x, char *err, size_t errlen, const char *part) {
    unsigned char buf[1 << 16];
    if (lseek(x->fd, 0, SEEK_SET) < 0) return cm_errf(err, errlen, CM_EIO, "cannot seek '%s'", part);
    uint64_t left = x->have;
    while (left) {
        ssize_t k = read(x->fd, buf, left < sizeof buf ? left : sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return cm_errf(err, errlen, CM_EIO, "cannot read '%s'", part);
        crypto_hash_sha256_update(&x->st, buf, (size_t)k);
        left -= (uint64_t)k;
    }
    return 0;
}

int cm_hub_download(const cm_hub_client *c, const cm_hub_ref *r, const cm_hub_file *f, const char *dest, bool verify,
                    char *err, size_t errlen) {
    struct stat sb;
    if (!stat(dest, &sb) && (uint64_t)sb.st_size == f->size) {
        if (!verify || !f->sha256[0]) return 0;
        char got[65];
        int rc = cm_hub_file_sha256(dest, got, err, errlen);
        if (rc) return rc;
        if (!strcmp(got, f->sha256)) return 0;
        return cm_errf(err, errlen, CM_EFORMAT,
                       "'%s' is there but its sha256 is %s, not %s; delete it (cumulo rm) and pull again", dest, got,
                       f->sha256);
    }
    if (cm_mkdir_p(dest, 0755, true))
        return cm_errf(err, errlen, CM_EIO, "cannot create the directories of '%s': %s", dest, strerror(errno));
    char part[1100];
    snprintf(part, sizeof part, "%s.part", dest);
    dl x = {.size = f->size, .c = c};
    x.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (x.fd < 0) return cm_errf(err, errlen, CM_EIO, "cannot write '%s': %s", part, strerror(errno));
    int rc = 0;
    if (fstat(x.fd, &sb)) rc = cm_errf(err, errlen, CM_EIO, "cannot stat '%s'", part);
    x.have = rc ? 0 : (uint64_t)sb.st_size;
    if (!rc && x.have > x.size) { /* not this file's bytes */
        if (ftruncate(x.fd, 0)) rc = cm_errf(err, errlen, CM_EIO, "cannot truncate '%s'", part);
        x.have = 0;
    }
    crypto_hash_sha256_init(&x.st);
    if (!rc) rc = hash_existing(&x, err, errlen, part);
    char url[1400];
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", c->endpoint, r->repo, r->revision, f->path);
    for (int attempt = 0; !rc && x.have < x.size; attempt++) {
        if (lseek(x.fd, (off_t)x.have, SEEK_SET) < 0) {
            rc = cm_errf(err, errlen, CM_EIO, "cannot seek '%s'", part);
            break;
        }
        struct curl_slist *hdrs;
        x.h = handle(c, &hdrs);
        if (!x.h) {
            rc = cm_errf(err, errlen, CM_ENOMEM, "cannot start an HTTP client");
            break;
        }
        x.checked = x.failed = false;
        uint64_t before = x.have;
        char range[64];
        snprintf(range, sizeof range, "%llu-", (unsigned long long)x.have);
        if (x.have) curl_easy_setopt(x.h, CURLOPT_RANGE, range);
        curl_easy_setopt(x.h, CURLOPT_URL, url);
        curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, dl_write);
        curl_easy_setopt(x.h, CURLOPT_WRITEDATA, &x);
        CURLcode cr = curl_easy_perform(x.h);
        long code = 0;
        curl_easy_getinfo(x.h, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(x.h);
        curl_slist_free_all(hdrs);
        if (x.failed) {
            rc = cm_errf(err, errlen, CM_EIO, "%s: %s", f->path,
                         x.have >= x.size ? "the server sent more bytes than the listing's size"
                                          : "cannot write the file (disk full?)");
            break;
        }
        if (code >= 400 && code != 416) {
            rc = http_error(code, f->path, r->repo, err, errlen);
            break;
        }
        if (code == 416) { /* our range is past what the server has: start again */
            if (ftruncate(x.fd, 0)) {
                rc = cm_errf(err, errlen, CM_EIO, "cannot truncate '%s'", part);
                break;
            }
            x.have = 0;
            crypto_hash_sha256_init(&x.st);
        }
        if (x.have >= x.size) break;
        if (attempt >= c->retries) {
            rc = cm_errf(err, errlen, CM_EIO,
                         "%s: download interrupted at %llu of %llu bytes (%s); run pull again to resume", f->path,
                         (unsigned long long)x.have, (unsigned long long)x.size,
                         cr != CURLE_OK ? curl_easy_strerror(cr) : "connection closed early");
            break;
        }
        if (x.have == before) cm_sleep_ms(500u << (attempt < 4 ? attempt : 4)); /* no progress: back off */
        char line[700];
        snprintf(line, sizeof line, "%s: connection lost at %llu of %llu bytes (%s); resuming", f->path,
                 (unsigned long long)x.have, (unsigned long long)x.size,
                 cr != CURLE_OK ? curl_easy_strerror(cr) : "closed early");
        CM_LOGI("%s", line);
        if (c->note) c->note(c->progress_ctx, line);
    }
    close(x.fd);
    if (rc) return rc;
    if (f->sha256[0]) {
        unsigned char h[32];
        char got[65];
        crypto_hash_sha256_final(&x.st, h);
        sodium_bin2hex(got, sizeof got, h, 32);
        if (strcmp(got, f->sha256)) {
            unlink(part);
            return cm_errf(err, errlen, CM_EFORMAT,
                           "%s: sha256 is %s, the hub says %s: the download is corrupt and was deleted; pull again",
                           f->path, got, f->sha256);
        }
    }
    if (rename(part, dest)) return cm_errf(err, errlen, CM_EIO, "cannot rename '%s': %s", part, strerror(errno));
    return 0;
}
