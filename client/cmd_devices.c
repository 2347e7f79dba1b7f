/* ppserve devices: what this build can compute on. */
#include <stdio.h>

#include "client/commands.h"
#include "common/limits.h"
#ifdef PP_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

int pp_cmd_devices(int argc, char **argv)
{
    (void)argv;
    if (argc > 0) {
        fprintf(stderr, "ppserve devices: takes no arguments\n");
        return 2;
    }
    struct pp_cpus cpus;
    struct pp_memory mem;
    char line[1024];
    pp_cpus_read(&cpus);
    pp_cpus_describe(&cpus, line, sizeof(line));
    printf("cpu: %s\n", line);
    pp_memory_read(&mem);
    pp_memory_describe(&mem, line, sizeof(line));
    printf("memory: %s\n", line);
#ifdef PP_HAVE_CUDA
    int n = 0;
    pp_status st = pp_cuda_device_count(&n);
    if (st != PP_OK) {
        printf("cuda: none (%s); the CPU backend is used\n", pp_error_detail());
        return 0;
    }
    for (int i = 0; i < n; i++) {
        struct pp_cuda_device_info info;
        if (pp_cuda_device_query(i, &info) == PP_OK)
            printf("cuda:%d: %s, sm_%d%d, %.1f GiB, %d SMs\n", i, info.name, info.major,
                   info.minor, (double)info.memory_bytes / (1 << 30), info.multiprocessors);
    }
#else
    printf("cuda: not built (no CUDA toolkit at build time)\n");
#endif
    return 0;
}
