/* The processes `ppserve cluster` supervises: finding the daemon binaries, starting them with fork
 * and execv (no shell), noticing when one exits, and stopping them all.
 *
 * Signals: pp_cluster_signals_block runs first, before any thread exists, so every thread inherits
 * the mask and SIGINT, SIGTERM and SIGCHLD are only ever taken synchronously by
 * pp_cluster_wait_event. Children get the original mask back, a process group of their own (so a
 * terminal's Ctrl-C reaches ppserve alone, which stops them in order) and PR_SET_PDEATHSIG, so they
 * get SIGTERM if ppserve dies without stopping them. */
#ifndef PP_CLUSTER_PROC_H
#define PP_CLUSTER_PROC_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

struct pp_child {
    char name[32]; /* "coordinator", "stage 1": how messages name it */
    pid_t pid;     /* 0 before it starts and after it is reaped */
    int exited;    /* reaped; its waitpid status is in status */
    int status;
};

/* Finds the executable `name` next to the running ppserve (dirname of /proc/self/exe), else on
 * PATH; writes its path into out[cap]. Returns 0, or -1 after printing where it looked. */
int pp_cluster_find_daemon(const char *name, char *out, size_t cap);

/* Resets SIGCHLD to its default (so children can be reaped) and blocks SIGINT, SIGTERM and SIGCHLD
 * in the calling thread; *old receives the previous mask, which children get back. */
void pp_cluster_signals_block(sigset_t *old);

/* Starts path with argv (argv[0] first, NULL-terminated) as child c: stdin from /dev/null,
 * stdout to stderr (logs only; ppserve's own stdout stays clean), stderr inherited. Returns 0, or
 * -1 after printing why. An exec failure shows up as exit status 127 with a message from the child.
 */
int pp_cluster_spawn(struct pp_child *c, const char *path, char *const argv[],
                     const sigset_t *child_mask);

/* Reaps every child that has exited (without blocking); returns the first one that exited in this
 * call, or NULL. */
struct pp_child *pp_cluster_reap(struct pp_child *kids, int n);

/* Waits up to timeout_s (0: just looks) for SIGINT, SIGTERM or SIGCHLD; returns the signal number,
 * or 0 when none came. */
int pp_cluster_wait_event(double timeout_s);

/* SIGTERM to every running child, up to grace_s for them to exit (a SIGINT or SIGTERM meanwhile
 * cuts the wait short), then SIGKILL for the rest; every child is reaped on return. Says on stderr
 * which ones had to be killed. */
void pp_cluster_stop(struct pp_child *kids, int n, double grace_s);

/* "exited with status 3", "was killed by signal 9 (Killed)". */
void pp_cluster_describe_exit(int status, char *out, size_t cap);

#endif
