/* Unit tests of common/limits: the CPU quota and memory limit of a process's cgroups, read from
 * files in the kernel's formats (a mount table and a cgroup list that point at folders made here,
 * with cgroup v2's cpu.max and memory.max and v1's cpu.cfs_quota_us / cpu.cfs_period_us and
 * memory.limit_in_bytes in them), and the usable CPU count that the affinity mask and the quota
 * give the compute threads. */
#include "testutil.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "common/fs.h"
#include "common/limits.h"

/* path (under pp_test_dir) with the text, its folders made first. */
static void put(const char *rel, const char *text)
{
    char path[1024], dir[1024];
    snprintf(path, sizeof(path), "%s/%s", pp_test_dir, rel);
    snprintf(dir, sizeof(dir), "%s", path);
    *strrchr(dir, '/') = 0;
    assert_int_equal(pp_mkdirs(dir), PP_OK);
    pp_test_write_file(path, text, strlen(text));
}

/* Appends to the mount table out a mountinfo line for a cgroup mount of root at
 * pp_test_dir/mnt. */
static void mount_line(char *out, size_t n, int id, const char *root, const char *mnt,
                       const char *type, const char *super)
{
    size_t used = strlen(out);
    snprintf(out + used, n - used, "%d 31 0:%d %s %s/%s rw,relatime shared:9 - %s %s %s\n", id, id,
             root, pp_test_dir, mnt, type, type, super);
}

/* The quota that the mount table and cgroup list written from these texts give. */
static double quota_of(const char *mountinfo, const char *cgroups, char *from, size_t n)
{
    put("proc/mountinfo", mountinfo);
    put("proc/cgroup", cgroups);
    char mi[1024], cg[1024];
    snprintf(mi, sizeof(mi), "%s/proc/mountinfo", pp_test_dir);
    snprintf(cg, sizeof(cg), "%s/proc/cgroup", pp_test_dir);
    return pp_cpus_cgroup_quota(mi, cg, from, n);
}

/* cgroup v2: the tightest cpu.max from the process's cgroup up to the mount; "max" is none. */
static void test_v2_nested(void **state)
{
    (void)state;
    char mi[2048] = "", from[1024], want[1024];
    mount_line(mi, sizeof(mi), 41, "/", "v2", "cgroup2", "rw");
    put("v2/cpu.max", "max 100000\n");
    put("v2/kube/cpu.max", "400000 100000\n");
    put("v2/kube/pod/cpu.max", "250000 100000\n");
    put("v2/kube/pod/app/cpu.max", "max 100000\n");
    assert_true(quota_of(mi, "0::/kube/pod/app\n", from, sizeof(from)) == 2.5);
    snprintf(want, sizeof(want), "%s/v2/kube/pod/cpu.max", pp_test_dir);
    assert_string_equal(from, want);
    /* the parent's quota when it is the tighter one */
    put("v2/kube/cpu.max", "150000 100000\n");
    assert_true(quota_of(mi, "0::/kube/pod/app\n", from, sizeof(from)) == 1.5);
    snprintf(want, sizeof(want), "%s/v2/kube/cpu.max", pp_test_dir);
    assert_string_equal(from, want);
    /* a quota in the mount's own folder counts too (a container's namespace root) */
    put("v2/cpu.max", "50000 100000\n");
    assert_true(quota_of(mi, "0::/\n", from, sizeof(from)) == 0.5);
    put("v2/cpu.max", "max 100000\n");
    /* a cgroup folder that is gone, or a path that names none: no quota */
    assert_true(quota_of(mi, "0::/kube/other\n", from, sizeof(from)) == 1.5);
    put("v2/kube/cpu.max", "max\n");
    put("v2/kube/pod/cpu.max", "max 100000\n");
    assert_true(quota_of(mi, "0::/kube/pod/app\n", from, sizeof(from)) == 0);
    assert_string_equal(from, "");
}

/* cgroup v1: the cpu hierarchy's quota over period (-1: none); other hierarchies do not count. */
static void test_v1(void **state)
{
    (void)state;
    char mi[4096] = "", from[1024];
    mount_line(mi, sizeof(mi), 32, "/", "v1cpu", "cgroup", "rw,cpu,cpuacct");
    mount_line(mi, sizeof(mi), 35, "/", "v1mem", "cgroup", "rw,memory");
    put("v1cpu/docker/c1/cpu.cfs_quota_us", "-1\n");
    put("v1cpu/docker/c1/cpu.cfs_period_us", "100000\n");
    put("v1cpu/docker/cpu.cfs_quota_us", "300000\n");
    put("v1cpu/docker/cpu.cfs_period_us", "100000\n");
    /* a memory hierarchy that carries cpu-looking files is not the cpu hierarchy */
    put("v1mem/docker/c1/cpu.cfs_quota_us", "10000\n");
    put("v1mem/docker/c1/cpu.cfs_period_us", "100000\n");
    const char *cg = "12:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n1:name=systemd:/\n";
    assert_true(quota_of(mi, cg, from, sizeof(from)) == 3.0);
    /* "cpuacct" or "cpuset" alone is not "cpu" */
    assert_true(quota_of(mi, "4:cpuacct,cpuset:/docker/c1\n", from, sizeof(from)) == 0);
    /* a quota without its period file is no quota */
    put("v1cpu/solo/cpu.cfs_quota_us", "100000\n");
    assert_true(quota_of(mi, "4:cpu:/solo\n", from, sizeof(from)) == 0);
}

/* A mount whose root is the process's cgroup (a container's view): its own folder holds the
 * quota. A mount point with a space is written \040 in the table. */
static void test_mount_root_and_escapes(void **state)
{
    (void)state;
    char mi[2048], from[1024], want[1024];
    snprintf(mi, sizeof(mi), "50 31 0:50 /kubepods/pod7 %s/my\\040cg rw - cgroup cgroup rw,cpu\n",
             pp_test_dir);
    put("my cg/cpu.cfs_quota_us", "200000\n");
    put("my cg/cpu.cfs_period_us", "100000\n");
    assert_true(quota_of(mi, "3:cpu:/kubepods/pod7\n", from, sizeof(from)) == 2.0);
    snprintf(want, sizeof(want), "%s/my cg/cpu.cfs_quota_us", pp_test_dir);
    assert_string_equal(from, want);
    /* below the mount's root: the folders between are read too */
    put("my cg/app/cpu.cfs_quota_us", "120000\n");
    put("my cg/app/cpu.cfs_period_us", "100000\n");
    assert_true(quota_of(mi, "3:cpu:/kubepods/pod7/app\n", from, sizeof(from)) == 1.2);
}

/* Both hierarchies (a hybrid host): the tighter one. Garbage and missing files: no quota. */
static void test_hybrid_and_garbage(void **state)
{
    (void)state;
    char mi[4096] = "", from[1024];
    mount_line(mi, sizeof(mi), 60, "/", "h1", "cgroup", "rw,cpu");
    mount_line(mi, sizeof(mi), 61, "/", "h2", "cgroup2", "rw");
    put("h1/x/cpu.cfs_quota_us", "400000\n");
    put("h1/x/cpu.cfs_period_us", "100000\n");
    put("h2/x/cpu.max", "300000 100000\n");
    assert_true(quota_of(mi, "1:cpu:/x\n0::/x\n", from, sizeof(from)) == 3.0);
    put("h2/x/cpu.max", "three hundred\n");
    put("h1/x/cpu.cfs_period_us", "0\n");
    assert_true(quota_of(mi, "1:cpu:/x\n0::/x\n", from, sizeof(from)) == 0);
    /* a truncated mount table line and a cgroup list without the cgroup */
    assert_true(quota_of("7 1 0:7 / /nowhere rw -\n", "0::/x\n", from, sizeof(from)) == 0);
    assert_true(quota_of(mi, "", from, sizeof(from)) == 0);
    char none[1024];
    snprintf(none, sizeof(none), "%s/no-such-file", pp_test_dir);
    assert_true(pp_cpus_cgroup_quota(none, none, from, sizeof(from)) == 0);
}

/* Memory: the tightest memory.max (v2) or memory.limit_in_bytes (v1, whose "unlimited" is the
 * largest page count in bytes); the memory hierarchy, not the cpu one. */
static void test_memory(void **state)
{
    (void)state;
    char mi[4096] = "", line[1024], from[1024], want[1024];
    mount_line(mi, sizeof(mi), 70, "/", "m2", "cgroup2", "rw");
    mount_line(mi, sizeof(mi), 71, "/", "m1", "cgroup", "rw,memory");
    mount_line(mi, sizeof(mi), 72, "/", "c1", "cgroup", "rw,cpu");
    put("m2/pod/memory.max", "max\n");
    put("m2/pod/app/memory.max", "8589934592\n");
    put("m2/pod/app/cpu.max", "100000 100000\n");
    const char *cg = "0::/pod/app\n";
    put("proc/mountinfo", mi);
    put("proc/cgroup", cg);
    char pmi[1024], pcg[1024];
    snprintf(pmi, sizeof(pmi), "%s/proc/mountinfo", pp_test_dir);
    snprintf(pcg, sizeof(pcg), "%s/proc/cgroup", pp_test_dir);
    assert_true(pp_memory_cgroup_limit(pmi, pcg, from, sizeof(from)) == 8589934592.0);
    snprintf(want, sizeof(want), "%s/m2/pod/app/memory.max", pp_test_dir);
    assert_string_equal(from, want);
    assert_true(pp_cpus_cgroup_quota(pmi, pcg, from, sizeof(from)) == 1.0);
    /* v1: unlimited is none; a limit in a parent counts; cpu's hierarchy holds no memory limit */
    put("m1/pod/app/memory.limit_in_bytes", "9223372036854771712\n");
    put("m1/pod/memory.limit_in_bytes", "4294967296\n");
    put("c1/pod/app/memory.limit_in_bytes", "1048576\n");
    put("proc/cgroup", "9:memory:/pod/app\n3:cpu:/pod/app\n");
    assert_true(pp_memory_cgroup_limit(pmi, pcg, from, sizeof(from)) == 4294967296.0);
    snprintf(want, sizeof(want), "%s/m1/pod/memory.limit_in_bytes", pp_test_dir);
    assert_string_equal(from, want);
    /* both: the tighter one */
    put("proc/cgroup", "9:memory:/pod/app\n0::/pod/app\n");
    assert_true(pp_memory_cgroup_limit(pmi, pcg, from, sizeof(from)) == 4294967296.0);
    put("m2/pod/app/memory.max", "1073741824\n");
    assert_true(pp_memory_cgroup_limit(pmi, pcg, from, sizeof(from)) == 1073741824.0);

    struct pp_memory m;
    pp_memory_read(&m);
    assert_true(m.host > 0 && m.usable > 0 && m.usable <= m.host);
    assert_true(m.limit == 0 ? m.usable == m.host
                             : m.usable == (m.limit < m.host ? m.limit : m.host));
    pp_memory_describe(&m, line, sizeof(line));
    assert_non_null(strstr(line, " GiB usable (host "));
}

/* Whether a copy fits: exactly up to the usable memory less the headroom; the reason names the
 * figures and the limit's file, or the host. */
static void test_memory_fits(void **state)
{
    (void)state;
    struct pp_memory m = {
        .host = (uint64_t)16 << 30, .limit = (uint64_t)1 << 30, .usable = (uint64_t)1 << 30};
    snprintf(m.limit_file, sizeof(m.limit_file), "/sys/fs/cgroup/pod/memory.max");
    char why[1024];
    uint64_t room = m.usable - PP_MEMORY_HEADROOM;
    assert_true(pp_memory_fits(&m, room - (100 << 20), 100 << 20, why, sizeof(why)));
    assert_string_equal(why, "");
    assert_false(pp_memory_fits(&m, room - (100 << 20) + 1, 100 << 20, why, sizeof(why)));
    assert_non_null(strstr(why, "the weights (860.0 MiB) beside the KV cache (100.0 MiB) and 64 "
                                "MiB for the rest need more than the 1024.0 MiB this process may "
                                "use (the cgroup limit in /sys/fs/cgroup/pod/memory.max)"));
    m.limit = 0;
    m.usable = m.host;
    assert_false(pp_memory_fits(&m, (uint64_t)17 << 30, 0, why, sizeof(why)));
    assert_non_null(strstr(why, "(the host's memory)"));
    m.usable = 0; /* unknown: nothing to say */
    assert_true(pp_memory_fits(&m, (uint64_t)17 << 30, 0, why, sizeof(why)));
}

/* This process: usable is the affinity mask's count (or the quota, if tighter), at least 1, and
 * follows a narrower mask. The compute threads default to it and warn above it. */
static void test_this_process(void **state)
{
    (void)state;
    struct pp_cpus c;
    pp_cpus_read(&c);
    assert_true(c.online >= 1 && c.affinity >= 1 && c.usable >= 1);
    assert_true(c.usable <= c.affinity);
    if (c.quota > 0)
        assert_true(c.usable >= c.quota - 1e-9 && c.usable < c.quota + 1);
    else
        assert_int_equal(c.usable, c.affinity);

    cpu_set_t old, one;
    assert_int_equal(sched_getaffinity(0, sizeof(old), &old), 0);
    int cpu = 0;
    while (!CPU_ISSET(cpu, &old))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    pp_cpus_read(&c);
    assert_int_equal(sched_setaffinity(0, sizeof(old), &old), 0);
    assert_int_equal(c.affinity, 1);
    assert_int_equal(c.usable, 1);

    char warn[1024], line[1024];
    assert_int_equal(pp_cpus_threads(&c, 0, warn, sizeof(warn)), 1);
    assert_string_equal(warn, "");
    assert_int_equal(pp_cpus_threads(&c, 1, warn, sizeof(warn)), 1);
    assert_string_equal(warn, "");
    assert_int_equal(pp_cpus_threads(&c, 3, warn, sizeof(warn)), 3);
    assert_non_null(strstr(warn, "3 compute threads on 1 usable CPU ("));
    pp_cpus_describe(&c, line, sizeof(line));
    assert_non_null(strstr(line, "1 usable CPU ("));
    assert_non_null(strstr(line, "affinity 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v2_nested),
        cmocka_unit_test(test_v1),
        cmocka_unit_test(test_mount_root_and_escapes),
        cmocka_unit_test(test_hybrid_and_garbage),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_memory_fits),
        cmocka_unit_test(test_this_process),
    };
    return cmocka_run_group_tests(tests, pp_test_dir_setup, pp_test_dir_teardown);
}
