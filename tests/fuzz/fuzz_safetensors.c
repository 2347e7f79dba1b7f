/* libFuzzer target: arbitrary bytes as a safetensors file. */
#include "fuzz_util.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = pp_fuzz_memfile(data, size, path, sizeof(path));
    if (fd < 0)
        return 0;
    struct pp_safetensors *s = NULL;
    if (pp_safetensors_open(path, &s) == PP_OK) {
        /* touch every tensor's declared bytes: they must lie inside the map */
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < s->n; i++) {
            const struct pp_safetensors_entry *e = &s->entries[i];
            if (!e->supported)
                continue;
            int64_t bytes = pp_tensor_elems(&e->t) * (e->t.dtype == PP_DTYPE_F32 ? 4 : 2);
            if (bytes > 0)
                sink ^= ((const uint8_t *)e->t.data)[bytes - 1];
        }
        (void)sink;
        pp_safetensors_free(s);
    }
    close(fd);
    return 0;
}
