/* Small helpers the benchmarks share: load average, sorting, greedy picks, writing results. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "common/json_write.h"

int pp_bench_write_json(const char *path, const char *who, const struct pp_json *j)
{
    if (j->out.failed) {
        fprintf(stderr, "%s: cannot write %s: the JSON text is incomplete (out of memory)\n", who,
                path);
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
        return -1;
    }
    int ok = fwrite(j->out.data, 1, j->out.len, f) == j->out.len && fputc('\n', f) != EOF;
    int err = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        fprintf(stderr, "%s: cannot write %s: %s\n", who, path,
                err ? strerror(err) : "short write");
        return -1;
    }
    return 0;
}

double pp_bench_loadavg(void)
{
    double l = -1.0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1.0;
        fclose(f);
    }
    return l;
}

int pp_bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int pp_bench_argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

void pp_bench_json_pair(struct pp_json *j, const char *key, double a, double b)
{
    pp_json_key(j, key);
    pp_json_begin_array(j);
    pp_json_double(j, a);
    pp_json_double(j, b);
    pp_json_end_array(j);
}
