/* tests/unit/test_common.c: gs_buf, the allocation and write policy, path helpers, error formatting
 * and exit codes. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/path.h"
#include "common/wrapper.h"

/* A fresh temporary directory, resolved (realpath) so it compares with what the code returns. */
static void make_tmpdir(char *out, size_t size)
{
    char tmpl[] = "/tmp/gs-test-common.XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    char real[PATH_MAX];
    assert_non_null(realpath(tmpl, real));
    snprintf(out, size, "%s", real);
}

static void remove_tree(const char *dir)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void touch(const char *path)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fclose(fp);
}

static void test_buf__init_is_empty_and_addf_appends(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    assert_int_equal(b.len, 0);
    gs_buf_adds(&b, "abc");
    gs_buf_addc(&b, '-');
    gs_buf_addf(&b, "%d/%s", 42, "x");
    assert_string_equal(b.data, "abc-42/x");
    assert_int_equal(b.len, 8);
    gs_buf_release(&b);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
}

static void test_buf__holds_binary_bytes_and_grows_past_many_pages(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    const char bytes[] = {'a', '\0', 'b', (char)0xff};
    for (int i = 0; i < 100000; i++)
        gs_buf_add(&b, bytes, sizeof(bytes));
    assert_int_equal(b.len, 400000);
    assert_true(b.cap > b.len);
    assert_int_equal(b.data[b.len], '\0');
    assert_memory_equal(b.data + 399996, bytes, 4);
    gs_buf_release(&b);
}

static void test_buf__consume_drops_prefix_and_all(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, "hello world");
    gs_buf_consume(&b, 6);
    assert_string_equal(b.data, "world");
    assert_int_equal(b.len, 5);
    gs_buf_consume(&b, 99);
    assert_int_equal(b.len, 0);
    assert_string_equal(b.data, "");
    gs_buf_release(&b);
}

static void test_buf__detach_hands_over_storage_and_empties(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    size_t len = 99;
    char *empty = gs_buf_detach(&b, &len);
    assert_non_null(empty);
    assert_string_equal(empty, "");
    assert_int_equal(len, 0);
    free(empty);
    gs_buf_adds(&b, "owned");
    char *s = gs_buf_detach(&b, &len);
    assert_string_equal(s, "owned");
    assert_int_equal(len, 5);
    assert_null(b.data);
    assert_int_equal(b.len, 0);
    free(s);
}

static void test_buf__reset_keeps_a_valid_empty_string(void **state)
{
    (void)state;
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b, "abc");
    gs_buf_reset(&b);
    assert_string_equal(b.data, "");
    gs_buf_adds(&b, "d");
    assert_string_equal(b.data, "d");
    gs_buf_release(&b);
}

static void check_join(const char *a, const char *b, const char *want)
{
    struct gs_buf out = GS_BUF_INIT;
    gs_path_join(&out, a, b);
    assert_string_equal(out.data, want);
    gs_buf_release(&out);
}

static void test_path_join__exactly_one_slash_between(void **state)
{
    (void)state;
    check_join("a", "b", "a/b");
    check_join("a/", "b", "a/b");
    check_join("a//", "/b", "a/b");
    check_join("/", "b", "/b");
    check_join("/x/y", ".gpusync/config", "/x/y/.gpusync/config");
    check_join("a", "", "a");
}

static void test_path_expand_home__only_leading_tilde_slash(void **state)
{
    (void)state;
    setenv("HOME", "/home/tester", 1);
    char *p = gs_path_expand_home("~/.ssh/id");
    assert_string_equal(p, "/home/tester/.ssh/id");
    free(p);
    p = gs_path_expand_home("~");
    assert_string_equal(p, "/home/tester");
    free(p);
    p = gs_path_expand_home("~bob/x");
    assert_string_equal(p, "~bob/x");
    free(p);
    p = gs_path_expand_home("/abs/~/x");
    assert_string_equal(p, "/abs/~/x");
    free(p);
}

static void test_path_mkdir_p__creates_missing_parents_and_tolerates_existing(void **state)
{
    (void)state;
    char dir[PATH_MAX], deep[PATH_MAX + 64];
    make_tmpdir(dir, sizeof(dir));
    snprintf(deep, sizeof(deep), "%s/a/b/c", dir);
    struct gs_error err = {0};
    assert_int_equal(gs_path_mkdir_p(deep, 0755, &err), 0);
    struct stat st;
    assert_int_equal(stat(deep, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(gs_path_mkdir_p(deep, 0755, &err), 0); /* again: nothing to do, no error */
    remove_tree(dir);
}

/* A file written whole through a temporary name reads back whole and private; one replaced keeps
 * no temporary beside it; a missing one cannot be read; a symlink at the name is not read
 * through. */
static void test_path_write_atomic__replaces_whole_and_reads_back(void **state)
{
    (void)state;
    char dir[PATH_MAX], file[PATH_MAX + 16], link[PATH_MAX + 16];
    make_tmpdir(dir, sizeof(dir));
    snprintf(file, sizeof(file), "%s/f", dir);
    assert_int_equal(gs_path_write_atomic(file, "first", 5), 0);
    assert_int_equal(gs_path_write_atomic(file, "second\0bytes", 12), 0);
    struct gs_buf b = GS_BUF_INIT;
    assert_int_equal(gs_path_read_file(file, &b), 0);
    assert_int_equal(b.len, 12);
    assert_memory_equal(b.data, "second\0bytes", 12);
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "test $(ls -A '%s' | wc -l) -eq 1", dir);
    assert_int_equal(system(cmd), 0); /* no temporary left */
    gs_buf_reset(&b);
    snprintf(link, sizeof(link), "%s/l", dir);
    assert_int_equal(symlink(file, link), 0);
    assert_int_equal(gs_path_read_file(link, &b), -1);
    assert_int_equal(errno, ELOOP);
    assert_int_equal(gs_path_read_file("/nonexistent/gs", &b), -1);
    assert_int_equal(errno, ENOENT);
    gs_buf_release(&b);
    remove_tree(dir);
}

static void test_path_mkdir_p__names_the_directory_it_cannot_make(void **state)
{
    (void)state;
    char dir[PATH_MAX], file[PATH_MAX + 16], below[PATH_MAX + 32];
    make_tmpdir(dir, sizeof(dir));
    snprintf(file, sizeof(file), "%s/file", dir);
    touch(file);
    snprintf(below, sizeof(below), "%s/file/sub", dir);
    struct gs_error err = {0};
    assert_int_equal(gs_path_mkdir_p(below, 0755, &err), GS_E_IO);
    assert_int_equal(err.code, GS_E_IO);
    assert_non_null(strstr(err.msg, file));
    remove_tree(dir);
}

static void test_path_find_project__walks_up_from_a_subdirectory(void **state)
{
    (void)state;
    char dir[PATH_MAX], path[PATH_MAX + 64];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/.gpusync", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/.gpusync/config", dir);
    touch(path);
    snprintf(path, sizeof(path), "%s/src/deep/er", dir);
    assert_int_equal(gs_path_mkdir_p(path, 0755, NULL), 0);
    struct gs_buf root = GS_BUF_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_path_find_project(path, &root, &err), 0);
    assert_string_equal(root.data, dir);
    /* from the root itself too */
    assert_int_equal(gs_path_find_project(dir, &root, &err), 0);
    assert_string_equal(root.data, dir);
    gs_buf_release(&root);
    remove_tree(dir);
}

static void test_path_find_project__nested_project_wins_over_outer(void **state)
{
    (void)state;
    char dir[PATH_MAX], path[PATH_MAX + 64], inner[PATH_MAX + 16];
    make_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/.gpusync", dir);
    assert_int_equal(gs_path_mkdir_p(path, 0755, NULL), 0);
    snprintf(path, sizeof(path), "%s/.gpusync/config", dir);
    touch(path);
    snprintf(inner, sizeof(inner), "%s/inner", dir);
    snprintf(path, sizeof(path), "%s/.gpusync", inner);
    assert_int_equal(gs_path_mkdir_p(path, 0755, NULL), 0);
    snprintf(path, sizeof(path), "%s/.gpusync/config", inner);
    touch(path);
    struct gs_buf root = GS_BUF_INIT;
    assert_int_equal(gs_path_find_project(inner, &root, NULL), 0);
    assert_string_equal(root.data, inner);
    gs_buf_release(&root);
    remove_tree(dir);
}

static void test_path_find_project__not_found_suggests_init(void **state)
{
    (void)state;
    char dir[PATH_MAX];
    make_tmpdir(dir, sizeof(dir));
    struct gs_buf root = GS_BUF_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_path_find_project(dir, &root, &err), GS_E_NOTFOUND);
    assert_non_null(strstr(err.msg, "gpusync init"));
    gs_buf_release(&root);
    remove_tree(dir);
}

static void test_error__set_formats_and_returns_code(void **state)
{
    (void)state;
    struct gs_error err = {0};
    assert_int_equal(gs_error_set(&err, GS_E_IO, "%s: cannot read line %d", "f.txt", 7), GS_E_IO);
    assert_int_equal(err.code, GS_E_IO);
    assert_string_equal(err.msg, "f.txt: cannot read line 7");
    /* NULL err: still returns the code */
    assert_int_equal(gs_error_set(NULL, GS_E_AUTH, "x"), GS_E_AUTH);
}

static void test_error__errno_appends_strerror_and_preserves_errno(void **state)
{
    (void)state;
    struct gs_error err = {0};
    errno = ENOENT;
    assert_int_equal(gs_error_errno(&err, GS_E_IO, "open %s", "/nope"), GS_E_IO);
    assert_int_equal(errno, ENOENT);
    char want[256];
    snprintf(want, sizeof(want), "open /nope: %s", strerror(ENOENT));
    assert_string_equal(err.msg, want);
}

static void test_error__wrap_prefixes_context_and_keeps_code(void **state)
{
    (void)state;
    struct gs_error err = {0};
    gs_error_set(&err, GS_E_TIMEOUT, "no answer");
    assert_int_equal(gs_error_wrap(&err, "connecting to %s", "gpu1"), GS_E_TIMEOUT);
    assert_string_equal(err.msg, "connecting to gpu1: no answer");
    assert_int_equal(err.code, GS_E_TIMEOUT);
}

static void test_error__wrap_truncates_without_overflow(void **state)
{
    (void)state;
    struct gs_error err = {0};
    char big[2 * GS_ERROR_MSG_MAX];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    gs_error_set(&err, GS_E_IO, "%s", big);
    assert_int_equal(strlen(err.msg), GS_ERROR_MSG_MAX - 1);
    gs_error_wrap(&err, "ctx");
    assert_int_equal(strlen(err.msg), GS_ERROR_MSG_MAX - 1);
    assert_memory_equal(err.msg, "ctx: xxx", 8);
}

static void test_error__clear_resets(void **state)
{
    (void)state;
    struct gs_error err = {0};
    gs_error_set(&err, GS_E_IO, "bad");
    gs_error_clear(&err);
    assert_int_equal(err.code, GS_E_OK);
    assert_string_equal(err.msg, "");
}

static void test_error__codes_are_distinct_negative_and_far_from_libssh2(void **state)
{
    (void)state;
    assert_int_equal(GS_E_OK, 0);
    assert_true(GS_IS_ERROR(GS_E_ERR));
    assert_true(GS_IS_ERROR(GS_E_INTERRUPTED));
    assert_false(GS_IS_ERROR(-1));
    assert_false(GS_IS_ERROR(-50)); /* libssh2 codes */
    assert_int_not_equal(GS_E_HOSTKEY_CHANGED, GS_E_HOSTKEY_UNKNOWN);
}

static void test_error__exit_codes_match_the_documented_table(void **state)
{
    (void)state;
    assert_int_equal(gs_error_exit_code(GS_E_OK), 0);
    assert_int_equal(gs_error_exit_code(GS_E_ERR), 1);
    assert_int_equal(gs_error_exit_code(GS_E_IO), 1);
    assert_int_equal(gs_error_exit_code(GS_E_USAGE), 2);
    assert_int_equal(gs_error_exit_code(GS_E_CONFIG), 3);
    assert_int_equal(gs_error_exit_code(GS_E_CONNECT), 4);
    assert_int_equal(gs_error_exit_code(GS_E_HOSTKEY_UNKNOWN), 4);
    assert_int_equal(gs_error_exit_code(GS_E_HOSTKEY_CHANGED), 4);
    assert_int_equal(gs_error_exit_code(GS_E_AUTH), 4);
    assert_int_equal(gs_error_exit_code(GS_E_TIMEOUT), 4);
    assert_int_equal(gs_error_exit_code(GS_E_DISCONNECTED), 4);
    assert_int_equal(gs_error_exit_code(GS_E_PROTO), 5);
    assert_int_equal(gs_error_exit_code(GS_E_REMOTE), 5);
    assert_int_equal(gs_error_exit_code(GS_E_CONFLICT), 6);
    assert_int_equal(gs_error_exit_code(GS_E_INTERRUPTED), 130);
    assert_int_equal(gs_error_exit_code(-5), 1);     /* a libssh2 code */
    assert_int_equal(gs_error_exit_code(-99999), 1); /* out of the table */
}

static void test_error__names(void **state)
{
    (void)state;
    assert_string_equal(gs_error_name(GS_E_OK), "success");
    assert_string_equal(gs_error_name(GS_E_HOSTKEY_CHANGED), "host key changed");
    assert_string_equal(gs_error_name(GS_E_AUTH), "authentication failed");
    assert_string_equal(gs_error_name(-99999), "unknown error");
    assert_string_equal(gs_error_name(-1), "unknown error");
}

/* ---- wrapper: GS_ALLOC_GROW, gs_write_all ---- */

static void test_wrapper__alloc_grow_keeps_contents_and_fits(void **state)
{
    (void)state;
    int *v = NULL;
    size_t n = 0, cap = 0;
    for (int i = 0; i < 100000; i++) {
        GS_ALLOC_GROW(v, n + 1, cap);
        assert_true(cap >= n + 1);
        v[n++] = i;
    }
    for (int i = 0; i < 100000; i++)
        assert_int_equal(v[i], i);
    GS_ALLOC_GROW(v, 1000000, cap); /* a jump past the 1.5x step lands exactly where asked */
    assert_true(cap >= 1000000);
    v[999999] = 7;
    assert_int_equal(v[99999], 99999);
    free(v);
}

struct drain {
    int fd;
    size_t got;
    unsigned long sum; /* position-weighted, so reordered or repeated bytes show */
};

static void *drain_pipe(void *arg)
{
    struct drain *d = arg;
    char buf[4096];
    ssize_t n;
    while ((n = read(d->fd, buf, sizeof(buf))) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        for (ssize_t i = 0; i < n; i++)
            d->sum += (unsigned char)buf[i] * (unsigned long)(d->got + (size_t)i + 1);
        d->got += (size_t)n;
    }
    return NULL;
}

static void on_tick(int sig)
{
    (void)sig; /* only there so that write(2) returns early: short counts and EINTR */
}

/* 8 MiB through a 64 KiB pipe while a 1 ms timer interrupts write(2) (no SA_RESTART): the
 * writes come back short or with EINTR, and every byte must still arrive once, in order. */
static void test_wrapper__write_all_survives_short_writes_and_eintr(void **state)
{
    (void)state;
    size_t len = 8u << 20;
    char *data = gs_xmalloc(len);
    unsigned long want = 0;
    for (size_t i = 0; i < len; i++) {
        data[i] = (char)(i * 131 + (i >> 13));
        want += (unsigned char)data[i] * (unsigned long)(i + 1);
    }
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    struct drain d = {.fd = fds[0]};
    pthread_t reader;
    /* The timer's signal must land on the writer: block it in the reader, which inherits this. */
    sigset_t alrm, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, &old);
    assert_int_equal(pthread_create(&reader, NULL, drain_pipe, &d), 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa = {.sa_handler = on_tick}, prev;
    sigaction(SIGALRM, &sa, &prev);
    struct itimerval tick = {{0, 1000}, {0, 1000}}, stop = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &tick, NULL);
    int rc = gs_write_all(fds[1], data, len);
    setitimer(ITIMER_REAL, &stop, NULL);
    sigaction(SIGALRM, &prev, NULL);
    close(fds[1]);
    pthread_join(reader, NULL);
    close(fds[0]);
    assert_int_equal(rc, 0);
    assert_int_equal(d.got, len);
    assert_true(d.sum == want);
    free(data);
}

static void test_wrapper__write_all_reports_epipe_and_ebadf(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    close(fds[0]);
    void (*was)(int) = signal(SIGPIPE, SIG_IGN);
    errno = 0;
    assert_int_equal(gs_write_all(fds[1], "x", 1), -1);
    assert_int_equal(errno, EPIPE);
    signal(SIGPIPE, was);
    close(fds[1]);
    errno = 0;
    assert_int_equal(gs_write_all(-1, "x", 1), -1);
    assert_int_equal(errno, EBADF);
    assert_int_equal(gs_write_all(-1, "", 0), 0); /* nothing to write is done at once */
}

/* File times as nanoseconds: exact inside 1677-2262 (before 1970 too), the nearest end outside. */
static void test_clock__file_times_saturate_instead_of_wrapping(void **state)
{
    (void)state;
    assert_true(gs_time_ns(1700000000, 123456789) == 1700000000123456789LL);
    assert_true(gs_time_ns(-1, 999999999) == -1);
    assert_true(gs_time_ns(-315619200, 7) == -315619200000000000LL + 7);
    assert_true(gs_time_ns(9223372036LL, 854775807) == INT64_MAX);
    assert_true(gs_time_ns(9223372036LL, 854775808) == INT64_MAX);
    assert_true(gs_time_ns(10413792000LL, 0) == INT64_MAX); /* 2300 */
    assert_true(gs_time_ns(-10413792000LL, 0) == INT64_MIN);
    long nsec;
    assert_true(gs_time_sec(1700000000123456789LL, &nsec) == 1700000000 && nsec == 123456789);
    assert_true(gs_time_sec(-1, &nsec) == -1 && nsec == 999999999); /* rounded down */
    assert_true(gs_time_sec(-2000000000LL, &nsec) == -2 && nsec == 0);
    assert_true(gs_time_sec(INT64_MIN, NULL) == -9223372037LL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buf__init_is_empty_and_addf_appends),
        cmocka_unit_test(test_buf__holds_binary_bytes_and_grows_past_many_pages),
        cmocka_unit_test(test_buf__consume_drops_prefix_and_all),
        cmocka_unit_test(test_buf__detach_hands_over_storage_and_empties),
        cmocka_unit_test(test_buf__reset_keeps_a_valid_empty_string),
        cmocka_unit_test(test_path_join__exactly_one_slash_between),
        cmocka_unit_test(test_path_expand_home__only_leading_tilde_slash),
        cmocka_unit_test(test_path_mkdir_p__creates_missing_parents_and_tolerates_existing),
        cmocka_unit_test(test_path_write_atomic__replaces_whole_and_reads_back),
        cmocka_unit_test(test_path_mkdir_p__names_the_directory_it_cannot_make),
        cmocka_unit_test(test_path_find_project__walks_up_from_a_subdirectory),
        cmocka_unit_test(test_path_find_project__nested_project_wins_over_outer),
        cmocka_unit_test(test_path_find_project__not_found_suggests_init),
        cmocka_unit_test(test_error__set_formats_and_returns_code),
        cmocka_unit_test(test_error__errno_appends_strerror_and_preserves_errno),
        cmocka_unit_test(test_error__wrap_prefixes_context_and_keeps_code),
        cmocka_unit_test(test_error__wrap_truncates_without_overflow),
        cmocka_unit_test(test_error__clear_resets),
        cmocka_unit_test(test_error__codes_are_distinct_negative_and_far_from_libssh2),
        cmocka_unit_test(test_error__exit_codes_match_the_documented_table),
        cmocka_unit_test(test_error__names),
        cmocka_unit_test(test_clock__file_times_saturate_instead_of_wrapping),
        cmocka_unit_test(test_wrapper__alloc_grow_keeps_contents_and_fits),
        cmocka_unit_test(test_wrapper__write_all_survives_short_writes_and_eintr),
        cmocka_unit_test(test_wrapper__write_all_reports_epipe_and_ebadf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
