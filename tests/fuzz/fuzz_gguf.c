/* libFuzzer target: arbitrary bytes as a GGUF model file, through the whole load path a user
 * reaches (header, metadata, tensor directory, config, layer binding, tokenizer). Any input must
 * end in PP_OK or a status with a message; sanitizers catch everything else. */
#include "fuzz_util.h"
#include "common/alloc.h"
#include "model/model.h"
#include "model/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = pp_fuzz_memfile(data, size, path, sizeof(path));
    if (fd < 0)
        return 0;
    struct pp_model *m = NULL;
    if (pp_model_open(path, 0, -1, &m) == PP_OK) {
        struct pp_tokenizer *t = NULL;
        if (pp_tokenizer_load(m, &t) == PP_OK) {
            int32_t *ids = NULL, n = 0;
            if (pp_tokenizer_encode(t, "fuzz me \xe2\x96\x81 ok", 15, 1, &ids, &n) == PP_OK) {
                char buf[64];
                for (int32_t i = 0; i < n; i++)
                    pp_tokenizer_piece(t, ids[i], buf, sizeof(buf));
                pp_free(PP_MEM_MISC, ids);
            }
            pp_tokenizer_free(t);
        }
        pp_model_free(m);
    }
    close(fd);
    return 0;
}
