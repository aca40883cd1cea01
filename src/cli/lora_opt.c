/*
 * lora_opt.c: the --lora option that run, chat and serve share. Only
 * collects the values; the engine parses "FILE[:SCALE]" and validates the
 * adapters against the model (model/lora.h).
 */
#include "cli.h"

#include <string.h>

int cli_lora_opt(int argc, char **argv, int *i, cli_loras *l) {
    const char *a = argv[*i];
    if (strcmp(a, "--lora")) return 0;
    if (*i + 1 >= argc || !*argv[*i + 1]) {
        cli_fail("option '--lora' needs FILE.gguf[:SCALE]");
        return -1;
    }
    if (l->n == CLI_LORA_MAX) {
        cli_fail("at most %d --lora adapters", CLI_LORA_MAX);
        return -1;
    }
    l->spec[l->n++] = argv[++*i];
    return 1;
}
