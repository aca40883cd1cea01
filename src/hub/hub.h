/*
 * hub: models by name. A model reference ("org/repo", "org/repo:Q4_K_M",
 * "hf://org/repo/file.gguf") is resolved against the Hugging Face Hub's
 * public HTTP API (a file listing with each LFS file's size and sha256, and
 * downloads that redirect to a CDN and honour byte ranges), downloaded into
 * one models directory shared by run, serve and node, resumed after an
 * interruption and verified by sha256 before it is used.
 *
 * hub.c is pure (reference parsing, the listing's JSON, which files a
 * reference means, the models directory's layout): table-tested without a
 * network. hub_fetch.c does the HTTP through libcurl (TLS, redirects,
 * proxies: never by hand). models.c lists and resolves what is on disk.
 *
 * The endpoint is $HF_ENDPOINT (as the Hub's own tools read it), else
 * https://huggingface.co; $HF_TOKEN is sent as a bearer token to the
 * endpoint only (libcurl drops it on a redirect to another host, where the
 * CDN's signed URL needs none).
 */
#ifndef CM_HUB_H
#define CM_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CM_HUB_MAX_PATH 512   /* a file's path inside its repository */
#define CM_HUB_MAX_REPO 200   /* "org/repo" */
#define CM_HUB_MAX_FILES 4096 /* entries read from one listing */
#define CM_HUB_MAX_PARTS 256  /* parts of a multi-part GGUF */

/* What the user named. */
typedef struct cm_hub_ref {
    char repo[CM_HUB_MAX_REPO]; /* "org/repo" */
    char quant[64];             /* "Q4_K_M" from "org/repo:Q4_K_M"; "" when none */
    char file[CM_HUB_MAX_PATH]; /* "dir/file.gguf" from hf://org/repo/dir/file.gguf; "" when none */
    char revision[96];          /* "main" unless "@rev" was given */
} cm_hub_ref;

/* One file of a repository's listing. */
typedef struct cm_hub_file {
    char path[CM_HUB_MAX_PATH];
    uint64_t size;
    char sha256[65]; /* lowercase hex from the LFS pointer; "" when not an LFS file */
} cm_hub_file;

/* True when s looks like a model reference rather than a file path:
 * "hf://...", or "org/repo[:QUANT][@REV]" that is not an existing file and
 * has exactly one '/' and no ".gguf" suffix. */
bool cm_hub_is_ref(const char *s);
/* Parse "org/repo", "org/repo:QUANT", "org/repo@REV[:QUANT]",
 * "hf://org/repo/path/file.gguf" (also "hf://org/repo:QUANT"). Names are
 * checked against the Hub's rules (letters, digits, '-', '_', '.'; no "..").
 * CM_EINVAL with a message naming what is wrong. */
int cm_hub_parse_ref(const char *s, cm_hub_ref *r, char *err, size_t errlen);

/* Parse a listing (the JSON array GET /api/models/REPO/tree/REV answers)
 * into files (cm_calloc'd; free with cm_free). Directories are skipped.
 * Bounded: at most CM_HUB_MAX_FILES entries; paths longer than
 * CM_HUB_MAX_PATH-1 or with ".." are skipped. CM_EFORMAT on bad JSON. */
int cm_hub_parse_listing(const char *json, size_t len, cm_hub_file **files, size_t *n, char *err, size_t errlen);

/* Which files the reference means, as indexes into files (in part order):
 * the named file (and its sibling parts when it is "-0000K-of-0000N.gguf");
 * else the GGUF whose name carries the quant (case-insensitive, whole
 * token: "Q4_K" does not match "Q4_K_M"); else the only GGUF; else the
 * first of Q4_K_M, Q4_0, Q8_0 present. A missing part of a multi-part
 * file, no match, or a choice left open is CM_ENOENT with a message that
 * lists what the repository offers. */
int cm_hub_choose(const cm_hub_ref *r, const cm_hub_file *files, size_t n, size_t *pick, size_t *npick, char *err,
                  size_t errlen);

/* "NAME-0000K-of-0000N.gguf": sets *k and *n (1 <= k <= n) and returns
 * true; false for any other name. */
bool cm_hub_split_name(const char *path, int *k, int *n);

/* The models directory: $CUMULO_MODELS, else $XDG_CACHE_HOME/cumulo/models,
 * else $HOME/.cache/cumulo/models. CM_ENOENT when none can be formed. */
int cm_models_dir(char *out, size_t cap, char *err, size_t errlen);
/* Where a pulled file lives: DIR/org/repo/PATH. */
int cm_models_file_path(const char *dir, const char *repo, const char *path, char *out, size_t cap);

/* ---- hub_fetch.c (libcurl) ---- */
typedef void (*cm_hub_progress_fn)(void *ctx, uint64_t done, uint64_t total);
typedef struct cm_hub_client {
    char endpoint[256]; /* no trailing '/' */
    const char *token;  /* NULL or $HF_TOKEN */
    int retries;        /* resumed attempts after a dropped connection (default 5) */
    cm_hub_progress_fn progress;
    void *progress_ctx;
    void (*note)(void *ctx, const char *line); /* NULL, or told of resumed transfers */
} cm_hub_client;
/* Fill from the environment (HF_ENDPOINT, HF_TOKEN). */
void cm_hub_client_init(cm_hub_client *c);
/* GET the listing of r's repository at r->revision (recursive; follows the
 * Hub's "Link: <...>; rel=next" pages). 401/403 name HF_TOKEN, 404 names
 * the repository. */
int cm_hub_list(const cm_hub_client *c, const cm_hub_ref *r, cm_hub_file **files, size_t *n, char *err, size_t errlen);
/* Download f of r's repository to dest: bytes go to dest + ".part",
 * resumed from its length with a Range request (after an interruption in
 * this run or an earlier one), hashed as they arrive (the .part's bytes
 * first), renamed to dest only when the size and sha256 match. A wrong
 * hash deletes the .part and is CM_EFORMAT naming both hashes. dest
 * already there with the right size is left alone (verified when
 * `verify`). */
int cm_hub_download(const cm_hub_client *c, const cm_hub_ref *r, const cm_hub_file *f, const char *dest, bool verify,
                    char *err, size_t errlen);
/* sha256 of a file as lowercase hex (65 bytes with the NUL). */
int cm_hub_file_sha256(const char *path, char out[65], char *err, size_t errlen);

/* ---- models.c (what is on disk) ---- */
typedef struct cm_model_entry {
    char path[1024]; /* full path */
    char name[600];  /* "org/repo/file.gguf" relative to the models dir */
    uint64_t size;   /* all parts together */
    int parts;       /* 1, or N for a complete multi-part file (listed once, by part 1) */
    char arch[64];   /* general.architecture, or "?" when unreadable */
} cm_model_entry;
/* The GGUF files under dir (three levels: org/repo/file), sorted by name,
 * incomplete .part files left out. cm_free(*out). */
int cm_models_list(const char *dir, cm_model_entry **out, size_t *n, char *err, size_t errlen);
/* Files named `base` a node may already hold: DIR/base, then
 * DIR/org/repo/base for every pulled repository (up to max paths, each
 * cap bytes, into out). Returns how many exist. */
int cm_models_find(const char *dir, const char *base, char *out, size_t cap, int max);
/* A model argument as the commands take it: an existing file is itself;
 * a reference (cm_hub_is_ref) is looked up in the models dir (the file it
 * chooses among those pulled, part 1 of a multi-part file); anything else
 * is CM_ENOENT with "no such file; `cumulo pull NAME` downloads it" when
 * it looks like a reference. */
int cm_models_resolve(const char *arg, char *out, size_t cap, char *err, size_t errlen);

#endif
