/* pp_bench_machine: the machine figures of pp_bench (bench/machine.c) alone, as one JSON line, for
 * the pipeline benchmark (bench/pipeline/bench_pipeline.py), which derives its decode bound from
 * them. The caller pins it (taskset) to the cores the stages will use.
 *
 *   pp_bench_machine [--threads N] [--no-fma]
 *
 * Prints {"threads": N, "read_bytes_per_s": …, "fma_flops_per_s": …, "fma_isa": …, "cpu": …}
 * (the FMA figure is 0 with --no-fma or on a CPU without FMA); exit status 2 on a bad flag, 1
 * when the 1 GiB buffer of the bandwidth test cannot be had. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/json_write.h"

static int usage(void)
{
    fprintf(stderr, "usage: pp_bench_machine [--threads N] [--no-fma]\n");
    return 2;
}

int main(int argc, char **argv)
{
    int threads = 1, fma = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 64)
                return usage();
            threads = (int)v;
        } else if (strcmp(argv[i], "--no-fma") == 0) {
            fma = 0;
        } else {
            return usage();
        }
    }
    double bw = pp_bench_read_bandwidth(threads);
    if (bw <= 0.0) {
        fprintf(stderr, "pp_bench_machine: no memory for the 1 GiB bandwidth buffer\n");
        return 1;
    }
    double peak = fma ? pp_bench_fma_peak(threads) : 0.0;
    char cpu[160];
    pp_bench_cpu_name(cpu, sizeof(cpu));
    struct pp_buf quoted = {0};
    pp_buf_json_string(&quoted, cpu, strlen(cpu));
    printf("{\"threads\": %d, \"read_bytes_per_s\": %.6e, \"fma_flops_per_s\": %.6e, "
           "\"fma_isa\": \"%s\", \"cpu\": %s}\n",
           threads, bw, peak, pp_bench_fma_isa(), quoted.failed ? "null" : quoted.data);
    pp_buf_free(&quoted);
    return 0;
}
