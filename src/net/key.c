/*
 * key.c: the cluster key file — 64 hex digits and a newline, mode 0600,
 * written atomically. Must never print or log the key itself (only its
 * fingerprint), and never accept a file that is not exactly one key.
 */
#include "net.h"

#include "base/base.h"
#include "os/os.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cm_net_key_default_path(char *out, size_t cap, char *err, size_t errlen) {
    const char *env = cm_config_get()->key_file;
    int n;
    if (env) n = snprintf(out, cap, "%s", env);
    else {
        const char *home = cm_config_get()->home;
        if (!home)
            return cm_errf(err, errlen, CM_ENOENT, "no key file path: set CUMULO_KEY_FILE or HOME, or pass --key-file");
        n = snprintf(out, cap, "%s/.config/cumulo/cluster.key", home);
    }
    if (n < 0 || (size_t)n >= cap) return cm_errf(err, errlen, CM_ERANGE, "key file path too long");
    return 0;
}

int cm_net_key_parse(const char *hex, uint8_t key[CM_KEY_BYTES], char *err, size_t errlen) {
    while (*hex == ' ' || *hex == '\t' || *hex == '\n' || *hex == '\r') hex++;
    size_t n = 0;
    while (hex[n] && !(hex[n] == ' ' || hex[n] == '\t' || hex[n] == '\n' || hex[n] == '\r')) n++;
    for (const char *t = hex + n; *t; t++)
        if (!(*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r'))
            return cm_errf(err, errlen, CM_EFORMAT, "a cluster key is one word of 64 hex digits");
    size_t bin = 0;
    if (n != 2 * CM_KEY_BYTES || sodium_hex2bin(key, CM_KEY_BYTES, hex, n, NULL, &bin, NULL) != 0 ||
        bin != CM_KEY_BYTES) {
        sodium_memzero(key, CM_KEY_BYTES);
        return cm_errf(err, errlen, CM_EFORMAT, "a cluster key is 64 hex digits");
    }
    return 0;
}

int cm_net_key_load(const char *path, uint8_t key[CM_KEY_BYTES], char *err, size_t errlen) {
    char *text = NULL;
    size_t len = 0;
    int rc = cm_file_read_all(path, &text, &len, err, errlen);
    if (rc == CM_ENOENT)
        return cm_errf(err, errlen, CM_ENOENT,
                       "no cluster key at '%s' (create one with 'cumulo key --new', or copy it "
                       "from another node)",
                       path);
    if (rc) return rc;
    char e[128];
    rc = cm_net_key_parse(text, key, e, sizeof e);
    sodium_memzero(text, len);
    cm_free(text);
    if (rc) return cm_errf(err, errlen, rc, "bad key file '%s': %s", path, e);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        CM_LOGW("key file '%s' is readable by other users (mode %03o); run chmod 600 on it", path,
                (unsigned)(st.st_mode & 0777));
    return 0;
}

/* mkdir -p of the parent directory, mode 0700 for what we create. */
static int make_parent(const char *path, char *err, size_t errlen) {
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s", path);
    if (n < 0 || (size_t)n >= sizeof dir) return cm_errf(err, errlen, CM_ERANGE, "path too long");
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return cm_errf(err, errlen, CM_EIO, "cannot create '%s': %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return cm_errf(err, errlen, CM_EIO, "cannot create '%s': %s", dir, strerror(errno));
    return 0;
}

int cm_net_key_save(const char *path, const uint8_t key[CM_KEY_BYTES], char *err, size_t errlen) {
    int rc = make_parent(path, err, errlen);
    if (rc) return rc;
    char hex[2 * CM_KEY_BYTES + 2];
    sodium_bin2hex(hex, sizeof hex, key, CM_KEY_BYTES);
    hex[2 * CM_KEY_BYTES] = '\n';
    rc = cm_file_write_atomic(path, hex, 2 * CM_KEY_BYTES + 1, 0600, err, errlen);
    sodium_memzero(hex, sizeof hex);
    return rc;
}

void cm_net_key_generate(uint8_t key[CM_KEY_BYTES]) {
    if (sodium_init() < 0) CM_ASSERT(!"libsodium failed to initialise");
    randombytes_buf(key, CM_KEY_BYTES);
}

void cm_net_key_fingerprint(const uint8_t key[CM_KEY_BYTES], char out[17]) {
    static const char label[] = "cumulo key fingerprint v1";
    uint8_t h[8];
    crypto_generichash(h, sizeof h, (const uint8_t *)label, sizeof label - 1, key, CM_KEY_BYTES);
    sodium_bin2hex(out, 17, h, sizeof h);
}
