/* Unit test of the benches' CPU name (bench/machine.c, pp_bench_cpu_name), which each bench prints
 * and records so that figures from different hosts are not compared: on x86 the brand string and
 * the family and model numbers must be the ones Linux gives in /proc/cpuinfo. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

/* The value of /proc/cpuinfo's first line whose key is key, blanks around it cut off; 0 if
 * none. */
static int cpuinfo(const char *key, char *out, size_t n)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    int found = 0;
    while (!found && f && fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char *k_end = colon;
        while (k_end > line && (k_end[-1] == ' ' || k_end[-1] == '\t'))
            k_end--;
        if ((size_t)(k_end - line) != strlen(key) || strncmp(line, key, strlen(key)) != 0)
            continue;
        char *v = colon + 1;
        while (*v == ' ')
            v++;
        v[strcspn(v, "\n")] = 0;
        size_t len = strlen(v);
        while (len > 0 && v[len - 1] == ' ')
            v[--len] = 0;
        snprintf(out, n, "%s", v);
        found = 1;
    }
    if (f)
        fclose(f);
    return found;
}

static void test_cpu_name_matches_cpuinfo(void **state)
{
    (void)state;
    char name[160], want[400], fam[32], model[32];
    pp_bench_cpu_name(name, sizeof(name));
    assert_true(name[0] != 0);
    if (!cpuinfo("model name", want, sizeof(want)))
        skip(); /* no /proc/cpuinfo model name: nothing to compare with */
#if defined(__x86_64__)
    assert_true(cpuinfo("cpu family", fam, sizeof(fam)) && cpuinfo("model", model, sizeof(model)));
    char full[600];
    snprintf(full, sizeof(full), "%s (family %s, model %s)", want, fam, model);
    assert_string_equal(name, full);
#else
    (void)fam;
    (void)model;
    assert_string_equal(name, want);
#endif
}

/* A short buffer holds the name's start, still a string. */
static void test_cpu_name_truncates(void **state)
{
    (void)state;
    char full[160], shortened[8];
    pp_bench_cpu_name(full, sizeof(full));
    pp_bench_cpu_name(shortened, sizeof(shortened));
    assert_int_equal(strlen(shortened), strlen(full) < 7 ? strlen(full) : 7);
    assert_memory_equal(shortened, full, strlen(shortened));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_name_matches_cpuinfo),
        cmocka_unit_test(test_cpu_name_truncates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
