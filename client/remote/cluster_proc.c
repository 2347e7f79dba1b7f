/* Child processes of `ppserve cluster`: start, reap, stop. */
#include "client/remote/cluster_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/remote/remote.h"

static int executable(const char *path)
{
    return access(path, X_OK) == 0;
}

int pp_cluster_find_daemon(const char *name, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            if ((size_t)snprintf(out, cap, "%s/%s", self, name) < cap && executable(out))
                return 0;
        }
    }
    const char *path = getenv("PATH");
    for (const char *p = path; p && *p;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && (size_t)snprintf(out, cap, "%.*s/%s", (int)len, p, name) < cap &&
            executable(out))
            return 0;
        p = end ? end + 1 : p + len;
    }
    fprintf(stderr, "ppserve cluster: error: cannot find %s next to ppserve (%s) or on PATH; "
            "build it with `cmake --build build --target %s`\n", name, n > 0 ? self : "?", name);
    return -1;
}

void pp_cluster_signals_block(sigset_t *old)
{
    signal(SIGCHLD, SIG_DFL); /* SIG_IGN would reap children behind our back */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, old);
}

/* In the child, between fork and exec: async-signal-safe calls only. */
static void child_exec(const char *path, char *const argv[], const sigset_t *mask, pid_t parent,
                       const char *exec_failed, size_t exec_failed_len)
{
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent)
        _exit(126); /* the parent is already gone */
    setpgid(0, 0);
    int fd = open("/dev/null", O_RDONLY);
    if (fd >= 0) {
        dup2(fd, 0);
        if (fd > 2)
            close(fd);
    }
    dup2(2, 1);
    sigprocmask(SIG_SETMASK, mask, NULL);
    execv(path, argv);
    ssize_t w = write(2, exec_failed, exec_failed_len);
    (void)w;
    _exit(127);
}

int pp_cluster_spawn(struct pp_child *c, const char *path, char *const argv[],
                     const sigset_t *child_mask)
{
    char exec_failed[512];
    int len = snprintf(exec_failed, sizeof(exec_failed),
                       "ppserve cluster: error: %s: cannot execute %s\n", c->name, path);
    size_t elen = len < 0 ? 0 : (size_t)len < sizeof(exec_failed) ? (size_t)len
                                                                   : sizeof(exec_failed) - 1;
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ppserve cluster: error: cannot start %s: fork: %s\n", c->name,
                strerror(errno));
        return -1;
    }
    if (pid == 0)
        child_exec(path, argv, child_mask, parent, exec_failed, elen);
    c->pid = pid;
    c->exited = 0;
    c->status = 0;
    return 0;
}

struct pp_child *pp_cluster_reap(struct pp_child *kids, int n)
{
    struct pp_child *first = NULL;
    for (int i = 0; i < n; i++) {
        if (kids[i].pid <= 0 || kids[i].exited)
            continue;
        int status;
        pid_t r = waitpid(kids[i].pid, &status, WNOHANG);
        if (r == kids[i].pid || (r < 0 && errno == ECHILD)) {
            kids[i].exited = 1;
            kids[i].status = r == kids[i].pid ? status : 0;
            if (!first)
                first = &kids[i];
        }
    }
    return first;
}

int pp_cluster_wait_event(double timeout_s)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGCHLD);
    if (timeout_s < 0)
        timeout_s = 0;
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    for (;;) {
        int sig = sigtimedwait(&set, NULL, &ts);
        if (sig > 0)
            return sig;
        if (errno != EINTR)
            return 0; /* EAGAIN: the time is up */
    }
}

void pp_cluster_stop(struct pp_child *kids, int n, double grace_s)
{
    /* one at a time, in order (the coordinator, then the stages from the first): each closes its
     * outgoing hop before the next one goes, so no stage sees its next hop vanish under it */
    double deadline = pp_clock_mono() + grace_s;
    int hurry = 0;
    for (int i = 0; i < n && !hurry; i++) {
        if (kids[i].pid <= 0 || kids[i].exited)
            continue;
        kill(kids[i].pid, SIGTERM);
        pp_cluster_reap(kids, n);
        while (!kids[i].exited) {
            double left = deadline - pp_clock_mono();
            if (left <= 0)
                break;
            int sig = pp_cluster_wait_event(left < 0.1 ? left : 0.1);
            pp_cluster_reap(kids, n);
            if (sig == SIGINT || sig == SIGTERM) {
                fprintf(stderr, "ppserve cluster: asked again: killing what is left\n");
                hurry = 1;
                break;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (kids[i].pid <= 0 || kids[i].exited)
            continue;
        fprintf(stderr, "ppserve cluster: %s (pid %d) did not stop: killing it\n", kids[i].name,
                (int)kids[i].pid);
        kill(kids[i].pid, SIGKILL);
        int status = 0;
        while (waitpid(kids[i].pid, &status, 0) < 0 && errno == EINTR)
            ;
        kids[i].exited = 1;
        kids[i].status = status;
    }
}

void pp_cluster_describe_exit(int status, char *out, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(out, cap, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(out, cap, "ended (wait status 0x%x)", (unsigned)status);
}
