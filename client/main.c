/* ppserve: the command-line entry point; dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "client/commands.h"
#include "common/log.h"
#include "common/status.h"

struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
};

static const struct command commands[] = {
    {"run", pp_cmd_run, "generate from a model in this process"},
    {"inspect", pp_cmd_inspect, "show a model's shape, RoPE layout, tokenizer and identity"},
    {"synth", pp_cmd_synth, "write a synthetic model (GGUF and/or HF) for demos and tests"},
    {"tokenize", pp_cmd_tokenize, "print the token ids of a text (or --bench a file's MB/s)"},
    {"detokenize", pp_cmd_detokenize, "print the text of token ids"},
    {"devices", pp_cmd_devices, "list the compute devices this build can use"},
#ifdef PP_HAVE_RPC
    {"cluster", pp_cmd_cluster, "start a coordinator and N stages on loopback (Ctrl-C stops them)"},
    {"generate", pp_cmd_generate, "generate through a cluster's gRPC API"},
    {"status", pp_cmd_status, "show a cluster's stages, load and health"},
    {"trace", pp_cmd_trace, "write a cluster's pipeline timeline as Chrome-trace JSON"},
#endif
};

static void usage(FILE *f)
{
    fprintf(f, "usage: ppserve COMMAND [FLAGS]   (ppserve COMMAND --help for its flags)\n\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int pp_cli_fail(const char *cmd, int status)
{
    const char *detail = pp_error_detail();
    fprintf(stderr, "ppserve %s: error: %s\n", cmd,
            detail[0] ? detail : pp_strerror((pp_status)status));
    return 1;
}

int main(int argc, char **argv)
{
    pp_log_init("ppserve", PP_LOG_WARN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "ppserve: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
