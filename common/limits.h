/* What this process may use of its host: the CPUs of its affinity mask (taskset, a cpuset) within
 * its cgroup's CPU quota (cgroup v2 cpu.max, v1 cpu.cfs_quota_us), and the memory within its
 * cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes): a Kubernetes pod's limits, docker's
 * --cpus and --memory. The host's own counts are the node's. The compute threads default to the
 * usable CPUs (a pool with more threads than CPUs makes every job wait for the threads the
 * scheduler left off a CPU), and a stage offers the coordinator the usable memory (more would be
 * planned into a process the kernel then kills for it). */
#ifndef PP_LIMITS_H
#define PP_LIMITS_H

#include <stddef.h>
#include <stdint.h>

struct pp_cpus {
    int online;           /* CPUs online on the host */
    int affinity;         /* CPUs in this process's affinity mask (online when it cannot be read) */
    double quota;         /* the tightest cgroup quota on this process, in CPUs; 0: none */
    int usable;           /* min(affinity, quota rounded up), at least 1 */
    char quota_file[512]; /* the file the quota came from ("" when none) */
};

/* Reads the host's CPUs, this process's affinity and its cgroups' quotas. */
void pp_cpus_read(struct pp_cpus *c);

/* One line for the log: "2 usable CPUs (2 online, affinity 2, no cgroup quota)". */
void pp_cpus_describe(const struct pp_cpus *c, char *out, size_t n);

/* The tightest CPU quota of the cgroups named in cgroup_file (the format of /proc/self/cgroup)
 * under the cgroup mounts of mountinfo (the format of /proc/self/mountinfo), in CPUs: each v2
 * cgroup's cpu.max and each v1 cpu cgroup's cpu.cfs_quota_us over cpu.cfs_period_us, from the
 * process's cgroup up to its mount's root. 0 when there is none or a file cannot be read; where
 * from is not NULL, the file it came from. pp_cpus_read passes /proc/self/mountinfo and
 * /proc/self/cgroup; tests pass files that describe mounts of their own folders. */
double pp_cpus_cgroup_quota(const char *mountinfo, const char *cgroup_file, char *from, size_t n);

/* The compute threads to start: want, or c->usable when want is 0. Where want is more than
 * c->usable, warn gets one line that says so (otherwise it is empty). */
int pp_cpus_threads(const struct pp_cpus *c, int want, char *warn, size_t n);

struct pp_memory {
    uint64_t host;        /* physical memory of the host */
    uint64_t limit;       /* the tightest cgroup memory limit on this process; 0: none */
    uint64_t usable;      /* min(host, limit) */
    char limit_file[512]; /* the file the limit came from ("" when none), or a setting's name */
};

/* Reads the host's memory and this process's cgroups' limits. */
void pp_memory_read(struct pp_memory *m);

/* One line for the log: "7.50 GiB usable (host 23.45 GiB, cgroup limit 7.50 GiB in ...)". */
void pp_memory_describe(const struct pp_memory *m, char *out, size_t n);

/* Whether copy_bytes beside other_bytes leave PP_MEMORY_HEADROOM of m's usable memory free; if
 * not, why says so with the figures and where the limit came from. */
#define PP_MEMORY_HEADROOM ((uint64_t)64 << 20) /* the process's own code, buffers, activations */
int pp_memory_fits(const struct pp_memory *m, uint64_t copy_bytes, uint64_t other_bytes, char *why,
                   size_t n);

/* pp_cpus_cgroup_quota for memory: the tightest v2 memory.max or v1 memory.limit_in_bytes (v1's
 * "unlimited", 2^63 less a page, is none), in bytes. */
double pp_memory_cgroup_limit(const char *mountinfo, const char *cgroup_file, char *from, size_t n);

#endif
