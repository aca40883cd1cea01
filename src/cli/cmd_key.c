/*
 * cmd_key.c: `cumulo key` — create or show the cluster key that every node of
 * a cluster must share. Prints the key itself only when asked (--print), and
 * never overwrites an existing key unless told to (--force).
 */
#include "cli.h"

#include "base/base.h"
#include "net/net.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: cumulo key [--new [--force]] [--file PATH] [--print] [--import HEX|-]\n\n"
               "Create or show the cluster key. Nodes prove to each other that they hold it before\n"
               "anything else is accepted, and it keys the encryption of every frame.\n\n"
               "  (no option)   create the key if there is none; print its path and fingerprint\n"
               "  --new         create a new key (refuses to replace one unless --force)\n"
               "  --file PATH   key file (default: $CUMULO_KEY_FILE, else ~/.config/cumulo/cluster.key)\n"
               "  --print       print the key (64 hex digits) on stdout, to copy to other machines\n"
               "  --import HEX  store this key (- reads it from stdin); with --force replaces one\n\n"
               "The file is written atomically with mode 0600; processes of one user share it.\n");
}

int cmd_key(int argc, char **argv) {
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return 0;
    }
    bool make_new = false, force = false, print = false;
    const char *file = NULL, *import = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--new")) make_new = true;
        else if (!strcmp(argv[i], "--force")) force = true;
        else if (!strcmp(argv[i], "--print")) print = true;
        else if (!strcmp(argv[i], "--file") || !strcmp(argv[i], "--import")) {
            if (i + 1 >= argc) return cli_fail("option '%s' needs a value", argv[i]);
            if (argv[i][2] == 'f') file = argv[++i];
            else import = argv[++i];
        } else {
            return cli_fail("key: unknown option '%s'; see 'cumulo key --help'", argv[i]);
        }
    }
    if (make_new && import) return cli_fail("key: --new and --import exclude each other");
    char path[4096], err[512];
    if (file) snprintf(path, sizeof path, "%s", file);
    else if (cm_net_key_default_path(path, sizeof path, err, sizeof err)) return cli_fail("%s", err);

    uint8_t key[CM_KEY_BYTES];
    int rc = cm_net_key_load(path, key, err, sizeof err);
    bool exists = rc != CM_ENOENT;
    if (rc && rc != CM_ENOENT && !(force && (make_new || import))) return cli_fail("%s", err);
    if ((make_new || import) && exists && !force)
        return cli_fail("key: '%s' already exists; add --force to replace it (every node then needs "
                        "the new key)",
                        path);
    bool created = false;
    if (import) {
        char line[256] = {0};
        const char *hex = import;
        if (!strcmp(import, "-")) {
            if (!fgets(line, sizeof line, stdin)) return cli_fail("key: nothing on stdin");
            hex = line;
        }
        if (cm_net_key_parse(hex, key, err, sizeof err)) return cli_fail("key: %s", err);
        sodium_memzero(line, sizeof line);
        created = true;
    } else if (make_new || !exists) {
        cm_net_key_generate(key);
        created = true;
    }
    if (created && cm_net_key_save(path, key, err, sizeof err)) return cli_fail("%s", err);
    char fp[17];
    cm_net_key_fingerprint(key, fp);
    if (print) {
        char hex[2 * CM_KEY_BYTES + 1];
        sodium_bin2hex(hex, sizeof hex, key, CM_KEY_BYTES);
        printf("%s\n", hex);
        sodium_memzero(hex, sizeof hex);
    }
    fprintf(print ? stderr : stdout, "%s key %s (fingerprint %s)\n", created ? "created" : "using", path, fp);
    sodium_memzero(key, sizeof key);
    return 0;
}
