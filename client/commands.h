/* The ppserve subcommands; each takes the arguments after its name and returns the exit status. */
#ifndef PP_COMMANDS_H
#define PP_COMMANDS_H

int pp_cmd_run(int argc, char **argv);
int pp_cmd_synth(int argc, char **argv);
int pp_cmd_inspect(int argc, char **argv);
int pp_cmd_devices(int argc, char **argv);
int pp_cmd_tokenize(int argc, char **argv);
int pp_cmd_detokenize(int argc, char **argv);
#ifdef PP_HAVE_RPC
/* client/remote/: the commands that talk to a cluster */
int pp_cmd_cluster(int argc, char **argv);
int pp_cmd_generate(int argc, char **argv);
int pp_cmd_status(int argc, char **argv);
int pp_cmd_trace(int argc, char **argv);
#endif

/* Prints "ppserve CMD: error: <detail or status text>" to stderr; returns 1. */
int pp_cli_fail(const char *cmd, int status);

#endif
