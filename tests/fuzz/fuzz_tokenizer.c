/* libFuzzer target: arbitrary bytes as text for both tokenizer families of a synthetic model
 * (written once at start-up). Encoding must succeed on any bytes, and byte-level BPE must
 * round-trip exactly (decode(encode(s)) == s); a mismatch aborts so the fuzzer reports it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "model/synth.h"
#include "model/tokenizer.h"

static struct pp_tokenizer *spm, *bpe;

static struct pp_tokenizer *make(const char *dir, enum pp_synth_tokenizer kind)
{
    struct pp_synth_spec s;
    pp_synth_shape("tiny", &s);
    s.tokenizer = kind;
    s.vocab_size = 600;
    char path[512];
    snprintf(path, sizeof(path), "%s/m.gguf", dir);
    struct pp_tokenizer *t = NULL;
    if (pp_synth_write_gguf(&s, path) != PP_OK || pp_tokenizer_open(path, &t) != PP_OK) {
        fprintf(stderr, "fuzz_tokenizer: setup failed: %s\n", pp_error_detail());
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char a[] = "/tmp/pp-fuzz-spm-XXXXXX", b[] = "/tmp/pp-fuzz-bpe-XXXXXX";
    spm = make(mkdtemp(a), PP_SYNTH_TOKENIZER_SPM);
    bpe = make(mkdtemp(b), PP_SYNTH_TOKENIZER_BPE);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = NULL, n = 0;
    if (pp_tokenizer_encode_ex(spm, (const char *)data, size, PP_TOKENIZE_PARSE_SPECIAL, &ids,
                               &n) != PP_OK)
        abort();
    pp_free(PP_MEM_MISC, ids);
    if (pp_tokenizer_encode_ex(bpe, (const char *)data, size, 0, &ids, &n) != PP_OK)
        abort();
    struct {
        char buf[1 << 16];
    } *out = malloc(sizeof(*out));
    size_t len = 0;
    for (int32_t i = 0; i < n; i++) {
        int k = pp_tokenizer_piece(bpe, ids[i], out->buf + len, sizeof(out->buf) - len);
        if (k < 0)
            abort();
        len += (size_t)k;
    }
    if (len != size || memcmp(out->buf, data, size) != 0)
        abort(); /* byte-level BPE lost or changed bytes */
    free(out);
    pp_free(PP_MEM_MISC, ids);
    return 0;
}
