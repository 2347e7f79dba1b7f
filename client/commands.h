/* The ppserve subcommands; each takes the arguments after its name and returns the exit status. */
#ifndef PP_COMMANDS_H
#define PP_COMMANDS_H

int pp_cmd_run(int argc, char **argv);
int pp_cmd_synth(int argc, char **argv);
int pp_cmd_inspect(int argc, char **argv);
int pp_cmd_devices(int argc, char **argv);
int pp_cmd_tokenize(int argc, char **argv);
int pp_cmd_detokenize(int argc, char **argv);

/* Prints "ppserve CMD: error: <detail or status text>" to stderr; returns 1. */
int pp_cli_fail(const char *cmd, int status);

#endif
