/*
 * main.c: the cumulo binary's entry point: finds the subcommand and runs it.
 * Each subcommand lives in its own src/cli/cmd_*.c file; this table is the
 * only place that lists them.
 */
#include "cli.h"

#include "base/base.h"

#include <stdio.h>
#include <string.h>

static const cm_command k_commands[] = {
    {"plan", "show how a model splits across a cluster, with predicted speed", cmd_plan},
    {"synth", "write a random-weight model of any architecture and tensor type", cmd_synth},
    {"bench", "prompt and decode speed, % of the memory roofline, vs llama.cpp", cmd_bench},
    {"version", "print the version", cmd_version},
    {"run", "generate text from a prompt on this machine", cmd_run},
    {"finetune", "train a LoRA adapter on JSONL data (llama.cpp's adapter GGUF)", cmd_finetune},
    {"chat", "chat with a model in the terminal", cmd_chat},
    {"info", "architecture, size, quant mix and memory needs of a model", cmd_info},
    {"serve", "serve a model over an OpenAI-compatible HTTP API, with a dashboard", cmd_serve},
    {"key", "create or show the cluster key", cmd_key},
    {"node", "offer this machine to a cluster (a daemon)", cmd_node},
    {"nodes", "list cluster nodes (mDNS and given) with capabilities and link speed", cmd_nodes},
    {"mpi", "run a cluster as one MPI job (mpirun/srun; a `make MPI=1` build)", cmd_mpi},
    {"launch", "start cumulo node on other machines over SSH", cmd_launch},
    {"service", "run the node or a server as a systemd/launchd service", cmd_service},
    {"discover", "list cumulo nodes found on the local network (mDNS)", cmd_discover},
    {"announce", "announce this machine over mDNS until Ctrl-C (test aid)", cmd_announce},
    {"pull", "download a model from the Hugging Face Hub (org/repo:QUANT)", cmd_pull},
    {"models", "list the models pulled into the models directory", cmd_models},
    {"rm", "delete a pulled model", cmd_rm},
    {"merge", "join a multi-part GGUF (-00001-of-0000N) into one file", cmd_merge},
    {"tokenize", "text -> token ids with a model's vocabulary", cmd_tokenize},
    {"detokenize", "token ids -> text with a model's vocabulary", cmd_detokenize},
};

static void usage(FILE *f) {
    fprintf(f, "usage: cumulo <command> [options]   (cumulo <command> --help for details)\n\n"
               "cumulo turns a few ordinary machines into one LLM inference cluster.\n\ncommands:\n");
    for (size_t i = 0; i < CM_ARRAY_LEN(k_commands); i++)
        fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
}

const char *cli_argv0;

int main(int argc, char **argv) {
    cli_argv0 = argv[0];
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return cmd_version(0, NULL);
    for (size_t i = 0; i < CM_ARRAY_LEN(k_commands); i++)
        if (!strcmp(argv[1], k_commands[i].name)) return k_commands[i].main(argc - 1, argv + 1);
    fprintf(stderr, "cumulo: unknown command '%s'; run 'cumulo --help' for the list\n", argv[1]);
    return 2;
}
