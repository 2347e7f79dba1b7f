/* The tokenizer in process: the byte-level alphabet, hand-derived ids on a hand-written GGUF
 * vocabulary (SentencePiece-style and byte-level), byte pieces for streaming, the same ids from the
 * GGUF and tokenizer.json copies of a synthetic tokenizer on random strings, the round trip
 * decode(encode(s)) == s on random UTF-8, random bytes and random ids without a crash, failed
 * allocations during load and encode, and the encoding speed on 1 MB (printed in MB/s).
 * Expected ids are derived in the comments; tests/e2e/test_tokenizer.py checks the same families
 * against the Python reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* after the four headers it relies on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "model/synth-impl.h"
#include "model/textstream.h"
#include "model/tokenizer-impl.h"
#include "model/tokenizer.h"
#include "testutil.h"

#define M PP__META

struct fixture {
    char *dir;
    char spm[4200], spm_cross[4200], bpe[4200]; /* hand-written GGUF files */
    char synth_spm[4200], synth_bpe[4200];      /* synthetic models: <dir>/sX.gguf and <dir>/sX */
};

static struct fixture *fx;

/* ---- hand-written vocabularies ---- */

/* cross: add the token b▁a (271, score 0), which merging can only reach across a ▁. */
static void write_spm(const char *path, int cross)
{
    struct pp__gguf_writer w;
    pp__gguf_init(&w);
    const char *toks[300];
    char bytes[256][8];
    float scores[300] = {0};
    int32_t types[300];
    int n = 0;
    toks[n] = "<unk>", types[n++] = 2;
    toks[n] = "<s>", types[n++] = 3;
    toks[n] = "</s>", types[n++] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        toks[n] = bytes[b], types[n++] = 6;
    }
    static const struct {
        const char *p;
        float score;
        int type;
    } extra[] = {
        {M, -100, 1},     /* 259 */ {"a", -101, 1},  /* 260 */
        {"b", -102, 1},   /* 261 */ {"c", -103, 1},  /* 262 */
        {"日", -104, 1},  /* 263 */ {M "a", -1, 1},  /* 264 */
        {"ab", -2, 1},    /* 265 */ {"bc", -3, 1},   /* 266 */
        {M "ab", -4, 1},  /* 267 */ {M M, -5, 1},    /* 268 */
        {M "abc", -6, 1}, /* 269 */ {"<tag>", 0, 4}, /* 270 */
    };
    for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++) {
        toks[n] = extra[i].p;
        scores[n] = extra[i].score;
        types[n++] = extra[i].type;
    }
    if (cross) {
        toks[n] = "b" M "a";
        scores[n] = 0;
        types[n++] = 1;
    }
    pp__gguf_add_str(&w, "tokenizer.ggml.model", "llama");
    pp__gguf_add_str_array(&w, "tokenizer.ggml.tokens", toks, (uint64_t)n);
    pp__gguf_add_f32_array(&w, "tokenizer.ggml.scores", scores, (uint64_t)n);
    pp__gguf_add_i32_array(&w, "tokenizer.ggml.token_type", types, (uint64_t)n);
    pp__gguf_add_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    pp__gguf_add_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    pp__gguf_add_u32(&w, "tokenizer.ggml.unknown_token_id", 0);
    assert_int_equal(pp__gguf_begin(&w, path), PP_OK);
    assert_int_equal(pp__gguf_finish(&w), PP_OK);
    pp__gguf_free(&w);
}

/* Byte-level: ids 0..255 the GPT-2 characters of the bytes, then the merged pieces. */
static void write_bpe(const char *path)
{
    static const char *const merges[] = {
        "Ġ t", /* 256 Ġt */ "h e",  /* 257 he */ "Ġt he", /* 258 Ġthe */
        "1 2", /* 259 12 */ "12 3", /* 260 123 */ "Ċ Ċ",  /* 261 ĊĊ */
        "Ġ Ġ", /* 262 ĠĠ */ "æ Ĺ",  /* 263 */ "æĹ ¥",     /* 264 日 */
    };
    static const char *const merged[] = {"Ġt",
                                         "he",
                                         "Ġthe",
                                         "12",
                                         "123",
                                         "ĊĊ",
                                         "ĠĠ",
                                         "æĹ",
                                         "æĹ¥",
                                         "Ġhe",
                                         "<|begin_of_text|>",
                                         "<|end_of_text|>"};
    char chars[256][3];
    const char *toks[268];
    int32_t types[268];
    for (int b = 0; b < 256; b++) {
        size_t k = pp__tok_byte_to_char((uint8_t)b, chars[b]);
        chars[b][k] = '\0';
        toks[b] = chars[b];
        types[b] = 1;
    }
    for (int i = 0; i < 12; i++) {
        toks[256 + i] = merged[i];
        types[256 + i] = i >= 10 ? 3 : 1;
    }
    struct pp__gguf_writer w;
    pp__gguf_init(&w);
    pp__gguf_add_str(&w, "tokenizer.ggml.model", "gpt2");
    pp__gguf_add_str(&w, "tokenizer.ggml.pre", "llama-bpe");
    pp__gguf_add_str_array(&w, "tokenizer.ggml.tokens", toks, 268);
    pp__gguf_add_i32_array(&w, "tokenizer.ggml.token_type", types, 268);
    pp__gguf_add_str_array(&w, "tokenizer.ggml.merges", merges, 9);
    pp__gguf_add_u32(&w, "tokenizer.ggml.bos_token_id", 266);
    pp__gguf_add_u32(&w, "tokenizer.ggml.eos_token_id", 267);
    pp__gguf_add_bool(&w, "tokenizer.ggml.add_bos_token", 1);
    assert_int_equal(pp__gguf_begin(&w, path), PP_OK);
    assert_int_equal(pp__gguf_finish(&w), PP_OK);
    pp__gguf_free(&w);
}

static void write_synth(const char *gguf, const char *hf, enum pp_synth_tokenizer kind)
{
    struct pp_synth_spec s;
    pp_synth_spec_defaults(&s);
    s.dim = 32, s.n_layers = 1, s.n_heads = 2, s.n_kv_heads = 2, s.ffn_dim = 64;
    s.vocab_size = 700, s.max_context = 64, s.tokenizer = kind;
    assert_int_equal(pp_synth_write_gguf(&s, gguf), PP_OK);
    assert_int_equal(pp_synth_write_hf(&s, hf), PP_OK);
}

static int setup(void **state)
{
    fx = calloc(1, sizeof(*fx));
    fx->dir = pp_test_tmpdir();
    snprintf(fx->spm, sizeof(fx->spm), "%s/spm.gguf", fx->dir);
    snprintf(fx->bpe, sizeof(fx->bpe), "%s/bpe.gguf", fx->dir);
    snprintf(fx->synth_spm, sizeof(fx->synth_spm), "%s/sspm", fx->dir);
    snprintf(fx->synth_bpe, sizeof(fx->synth_bpe), "%s/sbpe", fx->dir);
    snprintf(fx->spm_cross, sizeof(fx->spm_cross), "%s/spm_cross.gguf", fx->dir);
    write_spm(fx->spm, 0);
    write_spm(fx->spm_cross, 1);
    write_bpe(fx->bpe);
    char gguf[4300];
    snprintf(gguf, sizeof(gguf), "%s.gguf", fx->synth_spm);
    write_synth(gguf, fx->synth_spm, PP_SYNTH_TOKENIZER_SPM);
    snprintf(gguf, sizeof(gguf), "%s.gguf", fx->synth_bpe);
    write_synth(gguf, fx->synth_bpe, PP_SYNTH_TOKENIZER_BPE);
    return 0;
}

static int teardown(void **state)
{
    pp_test_rmdir(fx->dir);
    free(fx);
    return 0;
}

static struct pp_tokenizer *open_tok(const char *path)
{
    struct pp_tokenizer *t = NULL;
    pp_status st = pp_tokenizer_open(path, &t);
    if (st != PP_OK)
        fail_msg("open %s: %s", path, pp_error_detail());
    return t;
}

static void expect_ids(const struct pp_tokenizer *t, const char *text, size_t len,
                       const int32_t *want, int32_t n_want)
{
    int32_t *ids = NULL, n = 0;
    assert_int_equal(pp_tokenizer_encode(t, text, len, pp_tokenizer_add_bos(t), &ids, &n), PP_OK);
    int same = n == n_want && memcmp(ids, want, (size_t)n * sizeof(int32_t)) == 0;
    if (!same) {
        fprintf(stderr, "text '%.*s': got", (int)len, text);
        for (int32_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    pp_free(PP_MEM_MISC, ids);
    assert_true(same);
}

#define EXPECT(t, text, ...)                                                                       \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        expect_ids(t, text, sizeof(text) - 1, want_, (int32_t)(sizeof(want_) / sizeof(int32_t)));  \
    } while (0)

/* ---- tests ---- */

static void test_byte_alphabet_is_a_bijection(void **state)
{
    int seen[512] = {0};
    for (int b = 0; b < 256; b++) {
        char c[2];
        size_t n = pp__tok_byte_to_char((uint8_t)b, c);
        uint32_t cp = n == 1 ? (uint8_t)c[0] : ((uint32_t)(c[0] & 0x1f) << 6) | (c[1] & 0x3f);
        assert_true(cp < 512);
        assert_false(seen[cp]);
        seen[cp] = 1;
        assert_int_equal(pp__tok_char_to_byte(cp), b);
    }
    assert_int_equal(pp__tok_char_to_byte(' '), -1); /* space is Ġ (U+0120) in the alphabet */
    assert_int_equal(pp__tok_char_to_byte(0x120), ' ');
    assert_int_equal(pp__tok_char_to_byte(0x10a), '\n'); /* Ċ */
}

static void test_spm_hand_ids(void **state)
{
    struct pp_tokenizer *t = open_tok(fx->spm);
    assert_int_equal(pp_tokenizer_kind(t), PP_TOKENIZER_SPM);
    assert_true(pp_tokenizer_add_bos(t)); /* GGUF llama default */
    EXPECT(t, "ab", 1, 267);              /* ▁a (-1), then ▁a+b = ▁ab (-4) */
    EXPECT(t, "abc", 1, 269);             /* ▁a; bc (-3) beats ▁ab (-4); ▁a+bc = ▁abc */
    EXPECT(t, " a", 1, 259, 264);         /* ▁▁a: ▁a (-1) beats ▁▁ (-5) */
    EXPECT(t, "a  b", 1, 264, 268, 261);
    EXPECT(t, "a\xe2\x82\xac", 1, 264, 3 + 0xe2, 3 + 0x82, 3 + 0xac); /* € by bytes */
    EXPECT(t, "\xff", 1, 259, 3 + 0xff);
    EXPECT(t, "a<tag>b", 1, 264, 270, 259, 261); /* each segment gets the ▁ prefix */
    EXPECT(t, "<s>ab", 1, 1, 267);
    EXPECT(t, "", 1);
    /* the text is cut before each word's ▁ only when no token spans one: with b▁a in the
     * vocabulary, ▁,b,▁,a merges ▁a (-1), then b+▁a = b▁a (0) */
    EXPECT(t, "b a", 1, 259, 261, 264);
    struct pp_tokenizer *x = open_tok(fx->spm_cross);
    EXPECT(x, "b a", 1, 259, 271);
    EXPECT(x, "ab", 1, 267);
    pp_tokenizer_free(x);
    /* decoding strips the one dummy-prefix space; pieces stream raw bytes */
    static const int32_t ids[] = {1, 259, 264, 3 + 0xe2, 3 + 0x82, 3 + 0xac};
    char *text;
    size_t len;
    assert_int_equal(pp_tokenizer_decode(t, ids, 6, &text, &len), PP_OK);
    assert_int_equal(len, 5);
    assert_memory_equal(text, " a\xe2\x82\xac", 5);
    pp_free(PP_MEM_MISC, text);
    char buf[8];
    assert_int_equal(pp_tokenizer_piece(t, 3 + 0xe2, buf, sizeof(buf)), 1);
    assert_int_equal((uint8_t)buf[0], 0xe2);
    assert_int_equal(pp_tokenizer_piece(t, 264, buf, sizeof(buf)), 2);
    assert_memory_equal(buf, " a", 2);
    assert_int_equal(pp_tokenizer_piece(t, 1, buf, sizeof(buf)), 0);
    assert_int_equal(pp_tokenizer_piece(t, 9999, buf, sizeof(buf)), -1);
    static const int32_t bad[] = {1, 9999};
    assert_int_equal(pp_tokenizer_decode(t, bad, 2, &text, &len), PP_ERR_OUT_OF_RANGE);
    pp_tokenizer_free(t);
}

static void test_bpe_hand_ids(void **state)
{
    struct pp_tokenizer *t = open_tok(fx->bpe);
    assert_int_equal(pp_tokenizer_kind(t), PP_TOKENIZER_BYTE_BPE);
    EXPECT(t, "the", 266, 't', 257);        /* t,h,e: he; no merge t+he */
    EXPECT(t, " the", 266, 258);            /* Ġt (0), he (1), Ġthe (2) */
    EXPECT(t, "12345", 266, 260, '4', '5'); /* \p{N}{1,3}: 123 | 45 */
    EXPECT(t, "a\n\nb", 266, 'a', 261, 'b');
    EXPECT(t, "a   b", 266, 'a', 262, 32, 'b'); /* "  " then " b" */
    EXPECT(t, "日本", 266, 264, 0xe6, 0x9c, 0xac);
    EXPECT(t, "\xf0\x9f\x8e\x89", 266, 0xf0, 0x9f, 0x8e, 0x89);
    EXPECT(t, "x<|end_of_text|>y", 266, 'x', 267, 'y');
    EXPECT(t, "\xff\xfe", 266, 0xff, 0xfe);
    EXPECT(t, "don't", 266, 'd', 'o', 'n', '\'', 't');
    EXPECT(t, " he", 266, 265); /* ignore_merges (llama-bpe): Ġhe is a token, emitted whole */
    char buf[8];
    assert_int_equal(pp_tokenizer_piece(t, 258, buf, sizeof(buf)), 4);
    assert_memory_equal(buf, " the", 4);
    assert_int_equal(pp_tokenizer_piece(t, 0xe6, buf, sizeof(buf)), 1); /* half a character */
    assert_int_equal((uint8_t)buf[0], 0xe6);
    pp_tokenizer_free(t);
}

/* Byte-level tokens that end inside a character stream through pp_textstream: nothing is shown
 * until the character completes, and a stop string that spans tokens ends the stream. */
static void test_streaming_pieces(void **state)
{
    struct pp_tokenizer *t = open_tok(fx->bpe);
    static const char text[] = "日本 the end";
    int32_t *ids, n;
    assert_int_equal(pp_tokenizer_encode_ex(t, text, sizeof(text) - 1, 0, &ids, &n), PP_OK);
    static const char *const stops[] = {"e e"}; /* "th|e| e|nd": spans three tokens */
    struct pp_textstream ts;
    pp_textstream_init(&ts, stops, 1);
    struct pp_buf shown = {0};
    int stopped = 0;
    for (int32_t i = 0; i < n && !stopped; i++) {
        char piece[64];
        int k = pp_tokenizer_piece(t, ids[i], piece, sizeof(piece));
        assert_true(k >= 0 && k <= (int)sizeof(piece));
        stopped = pp_textstream_push(&ts, piece, (size_t)k) == 1;
        const char *out;
        size_t m = pp_textstream_take(&ts, 0, &out);
        /* ids: 日 (one token), then 本 as three byte tokens: held until its last byte */
        if (i == 1 || i == 2)
            assert_int_equal(m, 0);
        if (i == 3)
            assert_int_equal(m, 3);
        pp_buf_put(&shown, out, m);
    }
    const char *out;
    size_t m = pp_textstream_take(&ts, 1, &out);
    pp_buf_put(&shown, out, m);
    assert_true(stopped);
    assert_int_equal(shown.len, strlen("日本 th"));
    assert_memory_equal(shown.data, "日本 th", shown.len);
    pp_buf_free(&shown);
    pp_textstream_free(&ts);
    pp_free(PP_MEM_MISC, ids);
    pp_tokenizer_free(t);
}

/* Random UTF-8 from a pool of interesting pieces, or random bytes when raw. */
static size_t random_text(unsigned *seed, char *out, size_t cap, int raw)
{
    static const char *const pool[] = {
        "a",    "b",  "c",    "x",  "The",      " the",         "he",         " ",      "  ",
        "\n",   "\t", "\r\n", "0",  "12",       "345",          "'s",         "'LL",    ".",
        ",",    "!",  "-",    "日", "本",       "語",           "한",         "é",      "ß",
        "ñ",    "😀",  "🎉",    "€",  "\xc2\xa0", "\xe3\x80\x80", "lighthouse", "keeper", " road",
        "don't"};
    size_t n = 0, parts = (size_t)(rand_r(seed) % 16);
    for (size_t i = 0; i < parts; i++) {
        if (raw) {
            if (n < cap)
                out[n++] = (char)(rand_r(seed) & 0xff);
            continue;
        }
        const char *p = pool[rand_r(seed) % (sizeof(pool) / sizeof(pool[0]))];
        size_t k = strlen(p);
        if (n + k > cap)
            break;
        memcpy(out + n, p, k);
        n += k;
    }
    return n;
}

static void round_trip(const struct pp_tokenizer *t, const char *s, size_t n)
{
    int32_t *ids;
    int32_t n_ids;
    assert_int_equal(pp_tokenizer_encode_ex(t, s, n, 0, &ids, &n_ids), PP_OK);
    char *back;
    size_t len;
    assert_int_equal(pp_tokenizer_decode(t, ids, n_ids, &back, &len), PP_OK);
    if (len != n || memcmp(back, s, n) != 0)
        fail_msg("round trip of '%.*s' gave '%.*s'", (int)n, s, (int)len, back);
    pp_free(PP_MEM_MISC, back);
    pp_free(PP_MEM_MISC, ids);
}

/* decode(encode(s)) == s, special-token parsing off. SentencePiece: the dummy ▁ prefix is added
 * by encode and removed by decode, so the round trip is exact for any s without a literal U+2581
 * (the space marker itself, which decodes as a space). Byte-level: exact for any bytes. */
static void test_round_trip_property(void **state)
{
    char gguf[4300];
    snprintf(gguf, sizeof(gguf), "%s.gguf", fx->synth_spm);
    struct pp_tokenizer *spm = open_tok(gguf);
    snprintf(gguf, sizeof(gguf), "%s.gguf", fx->synth_bpe);
    struct pp_tokenizer *bpe = open_tok(gguf);
    unsigned seed = 12345;
    char s[512];
    for (int i = 0; i < 3000; i++) {
        size_t n = random_text(&seed, s, sizeof(s), 0);
        round_trip(spm, s, n);
        round_trip(bpe, s, n);
        n = random_text(&seed, s, sizeof(s), 1); /* random bytes, invalid UTF-8 included */
        round_trip(bpe, s, n);
        if (!memmem(s, n, M, 3))
            round_trip(spm, s, n);
    }
    pp_tokenizer_free(spm);
    pp_tokenizer_free(bpe);
}

/* The GGUF metadata and tokenizer.json of one synthetic tokenizer give the same ids. */
static void test_gguf_and_json_agree(void **state)
{
    const char *dirs[2] = {fx->synth_spm, fx->synth_bpe};
    for (int k = 0; k < 2; k++) {
        char gguf[4300];
        snprintf(gguf, sizeof(gguf), "%s.gguf", dirs[k]);
        struct pp_tokenizer *a = open_tok(gguf), *b = open_tok(dirs[k]);
        assert_int_equal(pp_tokenizer_bos(a), pp_tokenizer_bos(b));
        assert_int_equal(pp_tokenizer_eos(a), pp_tokenizer_eos(b));
        assert_int_equal(pp_tokenizer_add_bos(a), pp_tokenizer_add_bos(b));
        unsigned seed = 99 + (unsigned)k;
        char s[512];
        for (int i = 0; i < 2000; i++) {
            size_t n = random_text(&seed, s, sizeof(s), i % 3 == 0);
            int32_t *x, *y, nx, ny;
            assert_int_equal(pp_tokenizer_encode(a, s, n, 1, &x, &nx), PP_OK);
            assert_int_equal(pp_tokenizer_encode(b, s, n, 1, &y, &ny), PP_OK);
            assert_int_equal(nx, ny);
            assert_memory_equal(x, y, (size_t)nx * sizeof(int32_t));
            pp_free(PP_MEM_MISC, x);
            pp_free(PP_MEM_MISC, y);
        }
        pp_tokenizer_free(a);
        pp_tokenizer_free(b);
    }
}

static void test_random_ids_decode(void **state)
{
    struct pp_tokenizer *t = open_tok(fx->synth_bpe);
    unsigned seed = 7;
    int32_t ids[64];
    for (int i = 0; i < 500; i++) {
        for (int k = 0; k < 64; k++)
            ids[k] = (int32_t)(rand_r(&seed) % 700);
        char *text;
        size_t len;
        assert_int_equal(pp_tokenizer_decode(t, ids, 64, &text, &len), PP_OK);
        pp_free(PP_MEM_MISC, text);
    }
    pp_tokenizer_free(t);
}

/* Every allocation of a load and an encode may fail: a clean error, never a crash or a leak. */
static void test_failed_allocations(void **state)
{
    const char *paths[3] = {fx->spm, fx->bpe, fx->synth_bpe};
    for (int k = 0; k < 3; k++) {
        int64_t before = pp_mem_live(PP_MEM_MISC);
        for (int64_t nth = 1;; nth++) {
            pp_alloc_fail_at(nth);
            struct pp_tokenizer *t = NULL;
            pp_status st = pp_tokenizer_open(paths[k], &t);
            int32_t *ids = NULL, n = 0;
            if (st == PP_OK)
                st = pp_tokenizer_encode(t, "the  lighthouse 123 日本", 25, 1, &ids, &n);
            pp_alloc_fail_at(0);
            pp_free(PP_MEM_MISC, ids);
            pp_tokenizer_free(t);
            assert_int_equal(pp_mem_live(PP_MEM_MISC), before);
            if (st == PP_OK)
                break;
            assert_true(st == PP_ERR_NOMEM || st == PP_ERR_IO || st == PP_ERR_NOT_FOUND);
            assert_true(nth < 100000);
        }
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sanitizer builds run several times slower; the bound is for the plain build. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPEED_LIMIT_S 10.0
#else
#define SPEED_LIMIT_S 1.0
#endif

/* 1 MB of text encodes in well under a second (the heap keeps merging O(n log n)). */
static void test_speed_one_megabyte(void **state)
{
    size_t cap = 1 << 20, n = 0;
    char *text = malloc(cap);
    unsigned seed = 3;
    while (n < cap) {
        char s[512];
        size_t k = random_text(&seed, s, sizeof(s), 0);
        if (k > cap - n)
            k = cap - n;
        memcpy(text + n, s, k);
        n += k;
    }
    const char *dirs[2] = {fx->synth_spm, fx->synth_bpe};
    for (int k = 0; k < 2; k++) {
        struct pp_tokenizer *t = open_tok(dirs[k]);
        double t0 = now();
        int32_t *ids, n_ids;
        assert_int_equal(pp_tokenizer_encode_ex(t, text, n, 0, &ids, &n_ids), PP_OK);
        double dt = now() - t0;
        printf("tokenizer %s: %zu bytes -> %d tokens in %.3f s = %.1f MB/s\n",
               pp_tokenizer_kind_name(pp_tokenizer_kind(t)), n, n_ids, dt, (double)n / 1e6 / dt);
        assert_true(dt < SPEED_LIMIT_S);
        pp_free(PP_MEM_MISC, ids);
        pp_tokenizer_free(t);
    }
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_alphabet_is_a_bijection),
        cmocka_unit_test(test_spm_hand_ids),
        cmocka_unit_test(test_bpe_hand_ids),
        cmocka_unit_test(test_streaming_pieces),
        cmocka_unit_test(test_round_trip_property),
        cmocka_unit_test(test_gguf_and_json_agree),
        cmocka_unit_test(test_random_ids_decode),
        cmocka_unit_test(test_failed_allocations),
        cmocka_unit_test(test_speed_one_megabyte),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
