/* pp_synth_write_hf: the synthetic model as an HF checkpoint directory: the safetensors file (or
 * shards of contiguous tensors, balanced by bytes, plus model.safetensors.index.json), config.json,
 * tokenizer.json and tokenizer_config.json. The JSON contents come from synth_hf_json.c. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/fs.h"
#include "model/synth-impl.h"

#define PATH_CAP 4096

static pp_status join(char *out, const char *dir, const char *name)
{
    if ((size_t)snprintf(out, PATH_CAP, "%s/%s", dir, name) >= PATH_CAP)
        return pp_error(PP_ERR_INVALID_ARG, "synth: output path %s/%s too long", dir, name);
    return PP_OK;
}

static pp_status remove_stale(const char *dir, const char *name)
{
    char path[PATH_CAP];
    pp_status st = join(path, dir, name);
    if (!st && unlink(path) != 0 && errno != ENOENT)
        st = pp_error(PP_ERR_IO, "%s: cannot remove the stale file: %s", path, strerror(errno));
    return st;
}

static void shard_name(char *out, int32_t shard, int32_t shards)
{
    if (shards == 1)
        snprintf(out, 64, "model.safetensors");
    else
        snprintf(out, 64, "model-%05d-of-%05d.safetensors", shard + 1, shards);
}

static uint64_t tensor_bytes(const struct pp__synth_model *m, const struct pp__synth_tensor *t)
{
    enum pp_dtype store = pp__synth_store_type(m, t, 0);
    return (uint64_t)pp_dtype_row_bytes(store, 1) * (uint64_t)pp__synth_tensor_numel(t);
}

/* Tensors go to shards in order; a shard closes once the bytes so far reach its share of the
 * total, and every shard gets at least one tensor. */
static void assign_shards(const struct pp__synth_model *m, int32_t *shard_of, uint64_t *total)
{
    int64_t n = pp__synth_tensor_count(m);
    int32_t shards = m->s.shards, cur = 0;
    int64_t in_cur = 0;
    uint64_t cum = 0;
    *total = 0;
    for (int64_t i = 0; i < n; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        *total += tensor_bytes(m, &t);
    }
    for (int64_t i = 0; i < n; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        if (in_cur > 0 && cur < shards - 1 &&
            (cum >= *total / (uint64_t)shards * (uint64_t)(cur + 1) || n - i <= shards - 1 - cur)) {
            cur++;
            in_cur = 0;
        }
        shard_of[i] = cur;
        in_cur++;
        cum += tensor_bytes(m, &t);
    }
}

static pp_status sink(void *ctx, const void *data, uint64_t n)
{
    return pp__st_write(ctx, data, n);
}

static pp_status write_shard(const struct pp__synth_model *m, const char *dir,
                             const int32_t *shard_of, int32_t shard)
{
    char name[64], path[PATH_CAP];
    shard_name(name, shard, m->s.shards);
    pp_status st = join(path, dir, name);
    if (st)
        return st;
    int64_t n = pp__synth_tensor_count(m);
    struct pp__st_writer w;
    pp__st_init(&w);
    for (int64_t i = 0; i < n && !st; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        int64_t row[2] = {1, t.shape[0]}; /* a vector HF stores as [1, n] */
        if (shard_of[i] == shard)
            st = pp__st_add(&w, t.hf_name, pp__synth_store_type(m, &t, 0), t.hf_row ? 2 : t.n_dims,
                            t.hf_row ? row : t.shape);
    }
    if (!st)
        st = pp__st_begin(&w, path);
    for (int64_t i = 0; i < n && !st; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        if (shard_of[i] == shard)
            st = pp__synth_emit(m, &t, 0, sink, &w);
    }
    if (!st)
        st = pp__st_finish(&w);
    pp__st_free(&w);
    return st;
}

static pp_status write_index(const struct pp__synth_model *m, const char *dir,
                             const int32_t *shard_of, uint64_t total)
{
    char path[PATH_CAP], name[64];
    pp_status st = join(path, dir, "model.safetensors.index.json");
    if (st)
        return st;
    struct pp_buf b = {0};
    pp_buf_printf(&b, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {",
                    (unsigned long long)total);
    int64_t n = pp__synth_tensor_count(m);
    for (int64_t i = 0; i < n; i++) {
        struct pp__synth_tensor t;
        pp__synth_tensor_get(m, i, &t);
        shard_name(name, shard_of[i], m->s.shards);
        pp_buf_puts(&b, i ? ",\n    " : "\n    ");
        pp__synth_json_cstr(&b, t.hf_name);
        pp_buf_puts(&b, ": ");
        pp__synth_json_cstr(&b, name);
    }
    pp_buf_puts(&b, "\n  }\n}\n");
    st = b.failed ? pp_error(PP_ERR_NOMEM, "synth: no memory for %s", path)
                  : pp__out_write_file(path, b.data, b.len);
    pp_buf_free(&b);
    return st;
}

static pp_status write_weights(const struct pp__synth_model *m, const char *dir)
{
    int64_t n = pp__synth_tensor_count(m);
    int32_t *shard_of = pp_alloc(PP_MEM_MISC, (size_t)n * sizeof(*shard_of));
    if (!shard_of)
        return pp_error(PP_ERR_NOMEM, "synth: no memory for the shard map");
    uint64_t total;
    assign_shards(m, shard_of, &total);
    pp_status st =
        remove_stale(dir, m->s.shards == 1 ? "model.safetensors.index.json" : "model.safetensors");
    for (int32_t k = 0; k < m->s.shards && !st; k++)
        st = write_shard(m, dir, shard_of, k);
    if (!st && m->s.shards > 1)
        st = write_index(m, dir, shard_of, total);
    pp_free(PP_MEM_MISC, shard_of);
    return st;
}

typedef pp_status (*json_builder)(const void *arg, struct pp_buf *b);

static pp_status config_json(const void *arg, struct pp_buf *b)
{
    return pp__synth_hf_config(arg, b);
}

static pp_status tokenizer_config_json(const void *arg, struct pp_buf *b)
{
    return pp__synth_hf_tokenizer_config(arg, b);
}

static pp_status tokenizer_json(const void *arg, struct pp_buf *b)
{
    const struct pp__synth_model *m = arg;
    struct pp__synth_vocab v;
    pp_status st = pp__synth_vocab_build_kind(m->s.tokenizer, m->s.vocab_size, &v);
    if (!st)
        st = pp__synth_hf_tokenizer(&v, b);
    pp__synth_vocab_free(&v);
    return st;
}

static pp_status write_json(const char *dir, const char *name, json_builder build, const void *arg)
{
    char path[PATH_CAP];
    pp_status st = join(path, dir, name);
    if (st)
        return st;
    struct pp_buf b = {0};
    st = build(arg, &b);
    if (!st && b.failed)
        st = pp_error(PP_ERR_NOMEM, "synth: no memory for %s", path);
    if (!st)
        st = pp__out_write_file(path, b.data, b.len);
    pp_buf_free(&b);
    return st;
}

pp_status pp_synth_write_hf(const struct pp_synth_spec *s, const char *dir)
{
    struct pp__synth_model m;
    pp_status st = pp__synth_resolve(s, &m);
    if (st)
        return st;
    if (!dir)
        return pp_error(PP_ERR_INVALID_ARG, "synth: output directory is NULL");
    /* config.json last, so a first write that fails leaves no folder that looks loadable */
    if ((st = pp_mkdirs(dir)) || (st = write_weights(&m, dir)) ||
        (st = write_json(dir, "tokenizer.json", tokenizer_json, &m)) ||
        (st = write_json(dir, "tokenizer_config.json", tokenizer_config_json, &m)))
        return st;
    return write_json(dir, "config.json", config_json, &m);
}
