/* The sampling flags of `ppserve run` and `ppserve generate`, with one set of names, ranges and
 * help texts: entries for a struct pp_arg table. s is a struct pp_sampling *, stops a
 * struct pp_str_list *, ignore_eos an int *. */
#ifndef PP_SAMPLING_ARGS_H
#define PP_SAMPLING_ARGS_H

#include "client/args.h"

#define PP_SAMPLING_ARGS(s, stops, ignore_eos)                                                     \
    {"temperature", PP_ARG_FLOAT, &(s)->temperature, 0, 100, "0 = greedy (default)"},              \
    {"top-k", PP_ARG_INT, &(s)->top_k, 0, 1 << 24, "keep the k most likely (0 = off)"},            \
    {"top-p", PP_ARG_FLOAT, &(s)->top_p, 1e-9, 1, "nucleus mass in (0, 1] (1 = off)"},             \
    {"min-p", PP_ARG_FLOAT, &(s)->min_p, 0, 0.999999,                                            \
     "drop tokens below min_p x the top probability"},                                             \
    {"repeat-penalty", PP_ARG_FLOAT, &(s)->repeat_penalty, 1e-6, 100,                              \
     "penalise seen tokens (1 = off)"},                                                            \
    {"seed", PP_ARG_U64, &(s)->seed, 0, 0, "sampling seed (default 0)"},                           \
    {"stop", PP_ARG_STRINGS, (stops), 0, 0, "stop string (repeatable)"},                           \
    {"ignore-eos", PP_ARG_FLAG, (ignore_eos), 0, 0, "keep generating past end-of-sequence"}

#endif
