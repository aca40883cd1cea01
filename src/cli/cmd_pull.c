/*
 * cmd_pull.c: `cumulo pull NAME` (download a model from the Hugging Face
 * Hub into the models directory, resumable and verified), `cumulo models`
 * (what is there) and `cumulo rm NAME` (delete it). The commands that take
 * a MODEL (run, chat, serve, info, bench, plan, tokenize) accept the same
 * names once pulled (cm_models_resolve).
 */
#include "cli.h"

#include "base/base.h"
#include "gguf/gguf.h"
#include "hub/hub.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static const char k_pull_usage[] =
    "usage: cumulo pull NAME [--check]\n"
    "  download a GGUF model from the Hugging Face Hub into the models directory\n\n"
    "  NAME is org/repo (the repository's only GGUF, else its Q4_K_M, Q4_0 or Q8_0),\n"
    "  org/repo:QUANT (e.g. bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M), org/repo@REVISION:QUANT,\n"
    "  or hf://org/repo/FILE.gguf. Multi-part files (-00001-of-0000N.gguf) come with all their parts\n"
    "  and are joined into one file (which needs the model's size again in free space for a moment).\n"
    "  An interrupted pull resumes where it stopped (here or in a later `cumulo pull`); every file is\n"
    "  checked against the sha256 the Hub lists before it is used.\n\n"
    "  --check   verify the sha256 of files already pulled (otherwise a file of the right size is kept)\n\n"
    "environment:\n"
    "  CUMULO_MODELS   the models directory (default $XDG_CACHE_HOME/cumulo/models or ~/.cache/cumulo/models)\n"
    "  HF_TOKEN        an access token for gated or private repositories\n"
    "  HF_ENDPOINT     the Hub's address (default https://huggingface.co; a mirror works too)\n"
    "afterwards: cumulo run NAME -p \"...\", cumulo serve NAME, cumulo models, cumulo rm NAME\n";

static void on_bytes(void *ctx, uint64_t done, uint64_t total) {
    (void)total;
    cli_progress_update(ctx, (double)done);
}

static void on_note(void *ctx, const char *line) {
    cli_progress *p = ctx;
    fprintf(stderr, "%spull: %s\n", p->on ? "\n" : "", line);
}

static void on_merge(void *ctx, uint64_t done, uint64_t total) {
    (void)total;
    cli_progress_update(ctx, (double)done);
}

/* Join downloaded parts into `out` and delete them (kept when it fails). */
static int merge_files(const char *const *paths, int n, const char *out, uint64_t total) {
    struct statvfs vs;
    char dir[1400];
    snprintf(dir, sizeof dir, "%s", out);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (!statvfs(slash ? dir : ".", &vs) && (uint64_t)vs.f_bavail * vs.f_frsize < total + (64u << 20))
        return cli_fail("joining %d parts needs %.1f GiB free next to them and %.1f GiB are; the parts are kept: free "
                        "space, then run this again",
                        n, total / 1073741824.0, (double)vs.f_bavail * vs.f_frsize / 1073741824.0);
    fprintf(stderr, "joining %d parts into %s\n", n, out);
    cli_progress prog;
    cli_progress_start(&prog, "join", (double)total);
    char err[1024];
    int rc = cm_gguf_merge(paths, n, out, on_merge, &prog, err, sizeof err);
    if (prog.on) cli_progress_end(&prog);
    if (rc) return cli_fail("%s (the parts are kept)", err);
    for (int i = 0; i < n; i++) unlink(paths[i]);
    return 0;
}

static int join_parts(const cm_hub_file *files, const size_t *pick, size_t np, const char *dir, const cm_hub_ref *r,
                      const char *out, uint64_t total) {
    static char paths[CM_HUB_MAX_PARTS][1400];
    const char *pp[CM_HUB_MAX_PARTS];
    for (size_t i = 0; i < np; i++) {
        if (cm_models_file_path(dir, r->repo, files[pick[i]].path, paths[i], sizeof paths[i]))
            return cli_fail("path too long");
        pp[i] = paths[i];
    }
    return merge_files(pp, (int)np, out, total);
}

int cmd_pull(int argc, char **argv) {
    if (cli_help(argc, argv, k_pull_usage, 0)) return 0;
    const char *name = NULL;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = true;
        else if (argv[i][0] == '-') return cli_fail("pull: unknown option '%s'; see 'cumulo pull --help'", argv[i]);
        else if (name) return cli_fail("pull: one model at a time ('%s' and '%s')", name, argv[i]);
        else name = argv[i];
    }
    if (!name) return cli_fail("pull needs a model name, e.g. cumulo pull org/repo:Q4_K_M (see --help)");
    char err[1024], dir[900];
    cm_hub_ref r;
    if (cm_hub_parse_ref(name, &r, err, sizeof err)) return cli_fail("%s", err);
    if (cm_models_dir(dir, sizeof dir, err, sizeof err)) return cli_fail("%s", err);
    cm_hub_client c;
    cm_hub_client_init(&c);
    cm_hub_file *files;
    size_t nf;
    fprintf(stderr, "pull: listing %s at %s\n", r.repo, c.endpoint);
    if (cm_hub_list(&c, &r, &files, &nf, err, sizeof err)) return cli_fail("%s", err);
    size_t pick[CM_HUB_MAX_PARTS], np;
    if (cm_hub_choose(&r, files, nf, pick, &np, err, sizeof err)) {
        cm_free(files);
        return cli_fail("%s", err);
    }
    uint64_t total = 0;
    for (size_t i = 0; i < np; i++) total += files[pick[i]].size;
    fprintf(stderr, "pull: %s%s (%.1f MiB%s)\n", files[pick[0]].path, np > 1 ? " and its other parts" : "",
            total / 1048576.0, np > 1 ? ", all parts" : "");
    int status = 0;
    char first[1400] = "", merged[1400] = "";
    if (np > 1) { /* the parts are joined into STEM.gguf: pulled already? */
        if (cm_models_file_path(dir, r.repo, files[pick[0]].path, merged, sizeof merged)) {
            cm_free(files);
            return cli_fail("path too long");
        }
        snprintf(merged + strlen(merged) - 20, 6, ".gguf");
        if (!access(merged, R_OK)) {
            cm_free(files);
            printf("%s\n", merged);
            fprintf(stderr, "pull: already here (joined from %zu parts)\n", np);
            return 0;
        }
    }
    for (size_t i = 0; i < np && !status; i++) {
        const cm_hub_file *f = &files[pick[i]];
        char dest[1400], label[80];
        if (cm_models_file_path(dir, r.repo, f->path, dest, sizeof dest)) {
            status = cli_fail("path too long");
            break;
        }
        if (!i) snprintf(first, sizeof first, "%s", dest);
        if (!f->sha256[0])
            fprintf(stderr, "pull: %s: the hub lists no sha256 for it; only its size is checked\n", f->path);
        snprintf(label, sizeof label, np > 1 ? "part %zu/%zu" : "download", i + 1, np);
        cli_progress prog;
        cli_progress_start(&prog, label, (double)f->size);
        prog.bytes = true;
        c.progress = on_bytes;
        c.progress_ctx = &prog;
        c.note = on_note;
        int rc = cm_hub_download(&c, &r, f, dest, check, err, sizeof err);
        if (prog.on) cli_progress_end(&prog);
        if (rc) status = cli_fail("%s", err);
    }
    if (!status && np > 1) status = join_parts(files, pick, np, dir, &r, merged, total);
    cm_free(files);
    if (status) return status;
    printf("%s\n", np > 1 ? merged : first);
    fprintf(stderr, "pull: done; run it with: cumulo run %s -p \"Hello\"\n", name);
    return 0;
}

static const char k_models_usage[] =
    "usage: cumulo models [--json]\n"
    "  list the models pulled into the models directory ($CUMULO_MODELS or ~/.cache/cumulo/models)\n"
    "  with their size and architecture\n";

int cmd_models(int argc, char **argv) {
    if (cli_help(argc, argv, k_models_usage, 0)) return 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else return cli_fail("models: unknown argument '%s'; see 'cumulo models --help'", argv[i]);
    }
    char err[512], dir[900];
    if (cm_models_dir(dir, sizeof dir, err, sizeof err)) return cli_fail("%s", err);
    cm_model_entry *m;
    size_t n;
    if (cm_models_list(dir, &m, &n, err, sizeof err)) return cli_fail("%s", err);
    if (json) {
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < n; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", m[i].name);
            cJSON_AddStringToObject(o, "path", m[i].path);
            cJSON_AddNumberToObject(o, "bytes", (double)m[i].size);
            cJSON_AddNumberToObject(o, "parts", m[i].parts);
            cJSON_AddStringToObject(o, "architecture", m[i].arch);
            cJSON_AddItemToArray(arr, o);
        }
        cli_json_print(arr, false);
    } else if (!n) {
        printf("no models in %s; get one with: cumulo pull org/repo:QUANT\n", dir);
    } else {
        printf("%-64s %10s  %-12s\n", "NAME", "SIZE", "ARCH");
        for (size_t i = 0; i < n; i++) {
            char sz[32];
            double g = m[i].size / 1073741824.0;
            if (g >= 1) snprintf(sz, sizeof sz, "%.2f GiB", g);
            else snprintf(sz, sizeof sz, "%.1f MiB", m[i].size / 1048576.0);
            char nm[80];
            if (m[i].parts > 1) snprintf(nm, sizeof nm, " (%d parts)", m[i].parts);
            else nm[0] = 0;
            printf("%-64s %10s  %-12s%s\n", m[i].name, sz, m[i].arch, nm);
        }
        printf("(%zu in %s)\n", n, dir);
    }
    cm_free(m);
    return 0;
}

static const char k_rm_usage[] =
    "usage: cumulo rm NAME\n"
    "  delete a pulled model: NAME as `cumulo models` lists it (org/repo/FILE.gguf), or as pulled\n"
    "  (org/repo:QUANT, hf://org/repo/FILE.gguf); all parts of a multi-part file go together\n";

int cmd_rm(int argc, char **argv) {
    if (cli_help(argc, argv, k_rm_usage, 0)) return 0;
    if (argc != 2 || argv[1][0] == '-') return cli_fail("rm needs one model name; see 'cumulo rm --help'");
    char err[1024], dir[900], ref[1200];
    if (cm_models_dir(dir, sizeof dir, err, sizeof err)) return cli_fail("%s", err);
    /* "org/repo/FILE.gguf" as listed is "hf://org/repo/FILE.gguf" */
    const char *a = argv[1];
    if (strncmp(a, "hf://", 5) && strchr(a, '/') && strchr(strchr(a, '/') + 1, '/'))
        snprintf(ref, sizeof ref, "hf://%s", a);
    else snprintf(ref, sizeof ref, "%s", a);
    cm_hub_ref r;
    if (cm_hub_parse_ref(ref, &r, err, sizeof err)) return cli_fail("%s", err);
    char path[1400];
    if (!cm_hub_is_ref(ref) || cm_models_resolve(ref, path, sizeof path, err, sizeof err))
        return cli_fail("'%s' is not among the pulled models (cumulo models lists them)", a);
    /* every part of a multi-part file */
    int k, parts;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int removed = 0;
    if (cm_hub_split_name(base, &k, &parts)) {
        size_t l = strlen(path);
        for (int p = 1; p <= parts; p++) {
            char q[1400];
            snprintf(q, sizeof q, "%.*s-%05d-of-%05d.gguf", (int)(l - 20), path, p, parts);
            if (!unlink(q)) removed++;
        }
    } else if (!unlink(path)) {
        removed = 1;
    }
    if (!removed) return cli_fail("cannot delete '%s'", path);
    /* a leftover .part of it, then the repository's folder if now empty */
    char part[1500];
    snprintf(part, sizeof part, "%s.part", path);
    unlink(part);
    char rdir[1200];
    snprintf(rdir, sizeof rdir, "%s/%s", dir, r.repo);
    rmdir(rdir);
    char *slash = strrchr(rdir, '/');
    if (slash) {
        *slash = 0;
        rmdir(rdir);
    }
    printf("deleted %s (%d file%s)\n", path, removed, removed == 1 ? "" : "s");
    return 0;
}

/* The parts of a multi-part file, from the name of any of them. */
static int part_names(const char *any, char (*paths)[1400], const char **pp, int *n) {
    int k, parts;
    size_t l = strlen(any);
    if (!cm_hub_split_name(any, &k, &parts) || l >= 1400) return -1;
    for (int p = 1; p <= parts; p++) {
        snprintf(paths[p - 1], 1400, "%.*s-%05d-of-%05d.gguf", (int)(l - 20), any, p, parts);
        pp[p - 1] = paths[p - 1];
    }
    *n = parts;
    return 0;
}

static const char k_merge_usage[] =
    "usage: cumulo merge PART.gguf [OUT.gguf]\n"
    "  join a multi-part GGUF (NAME-00001-of-0000N.gguf ...; name any part) into one file, OUT or\n"
    "  NAME.gguf beside the parts; the parts are left in place. `cumulo pull` does this by itself.\n";

int cmd_merge(int argc, char **argv) {
    if (cli_help(argc, argv, k_merge_usage, 0)) return 0;
    if (argc < 2 || argc > 3 || argv[1][0] == '-')
        return cli_fail("merge needs PART.gguf [OUT.gguf]; see 'cumulo merge --help'");
    static char paths[CM_HUB_MAX_PARTS][1400];
    const char *pp[CM_HUB_MAX_PARTS];
    int n;
    if (part_names(argv[1], paths, pp, &n))
        return cli_fail("'%s' is not named like a part (NAME-00001-of-0000N.gguf)", argv[1]);
    char out[1400];
    if (argc == 3) snprintf(out, sizeof out, "%s", argv[2]);
    else snprintf(out, sizeof out, "%.*s.gguf", (int)(strlen(argv[1]) - 20), argv[1]);
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        struct stat sb;
        if (stat(pp[i], &sb)) return cli_fail("part %d of %d is missing: '%s'", i + 1, n, pp[i]);
        total += (uint64_t)sb.st_size;
    }
    char err[1024];
    cli_progress prog;
    cli_progress_start(&prog, "join", (double)total);
    int rc = cm_gguf_merge(pp, n, out, on_merge, &prog, err, sizeof err);
    if (prog.on) cli_progress_end(&prog);
    if (rc) return cli_fail("%s", err);
    printf("%s\n", out);
    return 0;
}

const char *cli_model_path(const char *arg) {
    static char path[1400];
    char err[1200];
    if (cm_models_resolve(arg, path, sizeof path, err, sizeof err)) {
        cli_fail("%s", err);
        return NULL;
    }
    int k, parts;
    const char *base = strrchr(path, '/');
    if (cm_hub_split_name(base ? base + 1 : path, &k, &parts)) { /* by name first: no open for ordinary files */
        cm_gguf g;
        int no = 0, count = 1;
        bool split = !cm_gguf_open(&g, path, NULL, NULL, err, sizeof err) && cm_gguf_split_info(&g, &no, &count);
        cm_gguf_close(&g);
        if (split) {
            cli_fail("'%s' is part %d of %d of a multi-part GGUF; join the parts once with: cumulo merge %s", path,
                     no + 1, count, path);
            return NULL;
        }
    }
    return path;
}
