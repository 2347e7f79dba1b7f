/* The CPUs and memory this process may use: affinity, cgroup CPU quotas and memory limits
 * (common/limits.h). */
#include "common/limits.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PATH_CAP 4096
#define FIELDS_MAX 64

/* A field of mountinfo with its octal escapes (\040 for a space, \011, \012, \134) undone, in
 * place. */
static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p;) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 4;
        } else {
            *o++ = *p++;
        }
    }
    *o = 0;
}

/* Whether the comma-separated list has the item. */
static int list_has(const char *list, const char *item)
{
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, item, n) == 0)
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

/* What a cgroup limits: its v1 controller, and the limit one folder sets (0: none) with the file
 * that sets it. */
struct kind {
    const char *v1_controller;
    double (*folder)(const char *dir, int v2);
    const char *v2_file, *v1_file;
};

/* The process's cgroup path in the v2 hierarchy (v2 != 0) or in the v1 hierarchy with the
 * controller, from a file in the format of /proc/self/cgroup; 0 when it has none. */
static int cgroup_path(const char *cgroup_file, int v2, const char *controller, char *out, size_t n)
{
    FILE *f = fopen(cgroup_file, "r");
    if (!f)
        return 0;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    while (!found && getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = 0;
        *c2 = 0;
        int match = v2 ? strcmp(line, "0") == 0 && c1[1] == 0 : list_has(c1 + 1, controller);
        if (match && strlen(c2 + 1) < n) {
            snprintf(out, n, "%s", c2 + 1);
            found = 1;
        }
    }
    free(line);
    fclose(f);
    return found;
}

/* The first line of dir/name as two integers (the second may be absent); how many were read. */
static int read_ints(const char *dir, const char *name, long long *a, long long *b)
{
    char path[PATH_CAP + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char buf[128];
    int got = 0;
    if (fgets(buf, sizeof(buf), f)) {
        char *end;
        errno = 0;
        *a = strtoll(buf, &end, 10);
        if (end != buf && errno == 0) {
            got = 1;
            char *end2;
            *b = strtoll(end, &end2, 10);
            if (end2 != end && errno == 0)
                got = 2;
        }
    }
    fclose(f);
    return got;
}

/* The quota set in one cgroup folder, in CPUs; 0 for none ("max", -1, or unreadable). */
static double folder_quota(const char *dir, int v2)
{
    long long q = 0, p = 0;
    if (v2) {
        if (read_ints(dir, "cpu.max", &q, &p) != 2) /* "max 100000" reads no integer */
            return 0;
    } else {
        long long unused;
        if (read_ints(dir, "cpu.cfs_quota_us", &q, &unused) < 1 ||
            read_ints(dir, "cpu.cfs_period_us", &p, &unused) < 1)
            return 0;
    }
    return q > 0 && p > 0 ? (double)q / (double)p : 0;
}

/* v1 writes "no limit" as the largest page count in bytes (9223372036854771712 with 4 KiB pages) */
#define MEMORY_NO_LIMIT ((double)(1ull << 62))

/* The memory limit set in one cgroup folder, in bytes; 0 for none ("max", unlimited, or
 * unreadable). */
static double folder_memory(const char *dir, int v2)
{
    long long b = 0, unused;
    if (read_ints(dir, v2 ? "memory.max" : "memory.limit_in_bytes", &b, &unused) < 1)
        return 0; /* v2 "max" reads no integer */
    return b > 0 && (double)b < MEMORY_NO_LIMIT ? (double)b : 0;
}

static const struct kind CPU_QUOTA = {"cpu", folder_quota, "cpu.max", "cpu.cfs_quota_us"};
static const struct kind MEMORY_LIMIT = {"memory", folder_memory, "memory.max",
                                         "memory.limit_in_bytes"};

/* The tightest limit from the process's cgroup (path, in a mount of root at mnt) up to the
 * mount's folder. */
static double walk(const struct kind *k, const char *mnt, const char *root, const char *path,
                   int v2, char *from, size_t n, double best)
{
    size_t rl = strlen(root);
    const char *rel = path;
    if (strcmp(root, "/") == 0)
        rel = path;
    else if (strncmp(path, root, rl) == 0 && (path[rl] == '/' || path[rl] == 0))
        rel = path + rl;
    else
        rel = ""; /* the cgroup is outside this mount's view: its folder is the closest we see */
    char dir[PATH_CAP];
    int len = snprintf(dir, sizeof(dir), "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
    if (len < 0 || (size_t)len >= sizeof(dir))
        return best;
    size_t top = strlen(mnt);
    while (len > 0 && dir[len - 1] == '/' && (size_t)len > top)
        dir[--len] = 0;
    for (;;) {
        double q = k->folder(dir, v2);
        if (q > 0 && (best == 0 || q < best)) {
            best = q;
            if (from)
                snprintf(from, n, "%s/%s", dir, v2 ? k->v2_file : k->v1_file);
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= top || !slash || (size_t)(slash - dir) < top)
            break;
        *slash = 0;
    }
    return best;
}

/* The tightest limit of kind k over the cgroup mounts of mountinfo (pp_cpus_cgroup_quota). */
static double cgroup_limit(const struct kind *k, const char *mountinfo, const char *cgroup_file,
                           char *from, size_t n)
{
    if (from && n)
        from[0] = 0;
    FILE *f = fopen(mountinfo, "r");
    if (!f)
        return 0;
    double best = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *field[FIELDS_MAX];
        int nf = 0;
        for (char *save = NULL, *t = strtok_r(line, " ", &save); t && nf < FIELDS_MAX;
             t = strtok_r(NULL, " ", &save))
            field[nf++] = t;
        /* id parent major:minor root mount-point options [optional...] - type source super */
        int dash = 6;
        while (dash < nf && strcmp(field[dash], "-") != 0)
            dash++;
        if (dash + 3 >= nf)
            continue;
        const char *type = field[dash + 1], *super = field[dash + 3];
        int v2 = strcmp(type, "cgroup2") == 0;
        if (!v2 && !(strcmp(type, "cgroup") == 0 && list_has(super, k->v1_controller)))
            continue;
        char path[PATH_CAP];
        if (!cgroup_path(cgroup_file, v2, k->v1_controller, path, sizeof(path)))
            continue;
        unescape(field[3]);
        unescape(field[4]);
        best = walk(k, field[4], field[3], path, v2, from, n, best);
    }
    free(line);
    fclose(f);
    return best;
}

double pp_cpus_cgroup_quota(const char *mountinfo, const char *cgroup_file, char *from, size_t n)
{
    return cgroup_limit(&CPU_QUOTA, mountinfo, cgroup_file, from, n);
}

double pp_memory_cgroup_limit(const char *mountinfo, const char *cgroup_file, char *from, size_t n)
{
    return cgroup_limit(&MEMORY_LIMIT, mountinfo, cgroup_file, from, n);
}

/* CPUs in the affinity mask; 0 when it cannot be read. */
static int affinity_count(void)
{
    for (int cpus = 1024; cpus <= 1 << 18; cpus *= 2) {
        cpu_set_t *set = CPU_ALLOC(cpus);
        if (!set)
            return 0;
        size_t size = CPU_ALLOC_SIZE(cpus);
        int got = sched_getaffinity(0, size, set);
        int count = got == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (got == 0)
            return count;
        if (errno != EINVAL)
            return 0;
    }
    return 0;
}

void pp_cpus_read(struct pp_cpus *c)
{
    memset(c, 0, sizeof(*c));
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    c->online = online > 0 ? (int)online : 1;
    int a = affinity_count();
    c->affinity = a > 0 ? a : c->online;
    c->quota = pp_cpus_cgroup_quota("/proc/self/mountinfo", "/proc/self/cgroup", c->quota_file,
                                    sizeof(c->quota_file));
    c->usable = c->affinity;
    if (c->quota > 0) {
        /* a quota of 1.5 CPUs runs 2 threads at three quarters of the time each */
        int q = (int)c->quota;
        if (q < c->quota - 1e-9)
            q++;
        if (q < c->usable)
            c->usable = q;
    }
    if (c->usable < 1)
        c->usable = 1;
}

void pp_cpus_describe(const struct pp_cpus *c, char *out, size_t n)
{
    if (c->quota > 0)
        snprintf(out, n, "%d usable CPU%s (%d online, affinity %d, cgroup quota %.2f in %s)",
                 c->usable, c->usable == 1 ? "" : "s", c->online, c->affinity, c->quota,
                 c->quota_file);
    else
        snprintf(out, n, "%d usable CPU%s (%d online, affinity %d, no cgroup quota)", c->usable,
                 c->usable == 1 ? "" : "s", c->online, c->affinity);
}

int pp_cpus_threads(const struct pp_cpus *c, int want, char *warn, size_t n)
{
    if (n)
        warn[0] = 0;
    if (want <= 0)
        return c->usable;
    if (want > c->usable) {
        char cpus[700];
        pp_cpus_describe(c, cpus, sizeof(cpus));
        snprintf(warn, n,
                 "%d compute threads on %s: the threads beyond them wait for a CPU, and each step "
                 "waits for the last of them",
                 want, cpus);
    }
    return want;
}

void pp_memory_read(struct pp_memory *m)
{
    memset(m, 0, sizeof(*m));
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    m->host = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    m->limit = (uint64_t)pp_memory_cgroup_limit("/proc/self/mountinfo", "/proc/self/cgroup",
                                                m->limit_file, sizeof(m->limit_file));
    m->usable = m->limit > 0 && (m->host == 0 || m->limit < m->host) ? m->limit : m->host;
}

void pp_memory_describe(const struct pp_memory *m, char *out, size_t n)
{
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if (m->limit > 0)
        snprintf(out, n, "%.2f GiB usable (host %.2f GiB, cgroup limit %.2f GiB in %s)",
                 (double)m->usable / gib, (double)m->host / gib, (double)m->limit / gib,
                 m->limit_file);
    else
        snprintf(out, n, "%.2f GiB usable (host %.2f GiB, no cgroup limit)",
                 (double)m->usable / gib, (double)m->host / gib);
}

int pp_memory_fits(const struct pp_memory *m, uint64_t copy_bytes, uint64_t other_bytes, char *why,
                   size_t n)
{
    const double mib = 1024.0 * 1024.0;
    if (n)
        why[0] = 0;
    if (m->usable == 0 || copy_bytes + other_bytes + PP_MEMORY_HEADROOM <= m->usable)
        return 1;
    char where[600];
    if (m->limit > 0 && m->limit <= m->host && m->limit_file[0] == '/')
        snprintf(where, sizeof(where), "the cgroup limit in %s", m->limit_file);
    else if (m->limit > 0 && m->limit <= m->host)
        snprintf(where, sizeof(where), "%s", m->limit_file); /* a setting's name */
    else
        snprintf(where, sizeof(where), "the host's memory");
    snprintf(why, n,
             "the weights (%.1f MiB) beside the KV cache (%.1f MiB) and %.0f MiB for the rest need "
             "more than the %.1f MiB this process may use (%s)",
             (double)copy_bytes / mib, (double)other_bytes / mib, (double)PP_MEMORY_HEADROOM / mib,
             (double)m->usable / mib, where);
    return 0;
}
