/* Unit tests of model/mapped_file: a read-only map of a whole file, and dropping the pages of a
 * range that was copied out (the data stays readable; the process's resident size shrinks; memory
 * that is not a file map is never touched). */
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/mapped_file.h"

/* Resident pages of this process (/proc/self/statm, second field). */
static long resident_pages(void)
{
    long size = 0, rss = -1;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &rss) != 2)
            rss = -1;
        fclose(f);
    }
    return rss;
}

static void write_file(const char *path, size_t n)
{
    unsigned char *b = malloc(n ? n : 1);
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 131 + 7);
    pp_test_write_file(path, b, n);
    free(b);
}

static void test_drop_pages_of_a_map(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof(path), "%s/w.bin", pp_test_dir);
    const size_t n = (size_t)16 << 20;
    write_file(path, n);
    struct pp_mapped_file f;
    assert_int_equal(pp_mapped_file_open(path, &f), PP_OK);
    assert_int_equal(f.size, (int64_t)n);
    unsigned sum = 0;
    for (size_t i = 0; i < n; i += 512)
        sum += f.data[i];
    long before = resident_pages();
    /* an unaligned range: its whole pages go, the data is read back from the page cache */
    assert_int_equal(pp_mapped_file_drop_pages(f.data + 100, (int64_t)n - 200), 1);
    long after = resident_pages();
    long page = sysconf(_SC_PAGESIZE);
    if (before > 0 && after > 0 && after > before - (long)(n / (size_t)page) / 2)
        fail_msg("resident pages %ld -> %ld after dropping %zu bytes", before, after, n);
    unsigned again = 0;
    for (size_t i = 0; i < n; i += 512)
        again += f.data[i];
    assert_int_equal(again, sum);
    for (size_t i = 0; i < n; i += 4099)
        assert_int_equal(f.data[i], (unsigned char)(i * 131 + 7));
    /* ranges not wholly inside a live map are refused and left alone */
    assert_int_equal(pp_mapped_file_drop_pages(f.data + n - 10, 20), 0);
    assert_int_equal(pp_mapped_file_drop_pages(NULL, 10), 0);
    assert_int_equal(pp_mapped_file_drop_pages(f.data, 0), 0);
    unsigned char *heap = malloc((size_t)1 << 20);
    assert_non_null(heap);
    memset(heap, 0x5a, (size_t)1 << 20);
    assert_int_equal(pp_mapped_file_drop_pages(heap, (int64_t)1 << 20), 0);
    for (size_t i = 0; i < ((size_t)1 << 20); i += 997)
        assert_int_equal(heap[i], 0x5a);
    free(heap);
    const uint8_t *was = f.data;
    pp_mapped_file_close(&f);
    assert_null(f.data);
    /* a closed map is no longer one */
    assert_int_equal(pp_mapped_file_drop_pages(was, 4096), 0);
    unlink(path);
}

static void test_open_errors(void **state)
{
    (void)state;
    struct pp_mapped_file f;
    char path[600];
    snprintf(path, sizeof(path), "%s/missing.bin", pp_test_dir);
    assert_int_equal(pp_mapped_file_open(path, &f), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), "cannot open"));
    assert_non_null(strstr(pp_error_detail(), "missing.bin"));
    assert_int_equal(pp_mapped_file_open(pp_test_dir, &f), PP_ERR_IO);
    assert_non_null(strstr(pp_error_detail(), "is not a regular file"));
    snprintf(path, sizeof(path), "%s/empty.bin", pp_test_dir);
    write_file(path, 0);
    assert_int_equal(pp_mapped_file_open(path, &f), PP_OK);
    assert_null(f.data);
    assert_int_equal(f.size, 0);
    pp_mapped_file_close(&f);
    pp_mapped_file_close(NULL);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drop_pages_of_a_map),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, pp_test_dir_setup, pp_test_dir_teardown);
}
