/* tests/unit/test_scan.c: syncd/scan: hostile names pass through byte for byte, symlinks are
 * listed and never followed, stat fields are exact, output is sorted, subtree scans stay inside
 * the tree. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/path.h"
#include "syncd/scan.h"

static char tmpdir[64];
static char outside[64];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-scan-XXXXXX");
    strcpy(outside, "/tmp/gs-test-scan-out-XXXXXX");
    return mkdtemp(tmpdir) && mkdtemp(outside) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", tmpdir, outside);
    return system(cmd) == 0 ? 0 : -1;
}

static char *abs_path(const char *rel)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, tmpdir, rel);
    return gs_buf_detach(&p, NULL);
}

static void put(const char *rel, const char *text)
{
    char *p = abs_path(rel);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    free(p);
}

static void mkdir_rel(const char *rel)
{
    char *p = abs_path(rel);
    assert_int_equal(mkdir(p, 0755), 0);
    free(p);
}

static void scan_ok(struct gs_scan *s)
{
    struct gs_error err = {0};
    if (gs_scan_tree(s, tmpdir, NULL, &err) != 0)
        fail_msg("scan: %s", err.msg);
}

static const struct gs_scan_entry *must_find(const struct gs_scan *s, const char *path)
{
    const struct gs_scan_entry *e = gs_scan_find(s, path);
    if (!e)
        fail_msg("scan lacks %s", path);
    return e;
}

static void test_scan__hostile_names_pass_through_unchanged(void **state)
{
    (void)state;
    static const char *names[] = {
        "with space",     "new\nline",  "tab\there", "\xff\xfe not utf-8", "-rf",
        "back\\slash",    "quote\"s",   "日本語.py", " leading space",     "trailing space ",
        "star*question?", "semi;colon", "$(echo)",
    };
    size_t n = sizeof(names) / sizeof(names[0]);
    mkdir_rel("d i r\n");
    for (size_t i = 0; i < n; i++) {
        put(names[i], names[i]);
        struct gs_buf inner = GS_BUF_INIT;
        gs_buf_addf(&inner, "d i r\n/%s", names[i]);
        put(inner.data, "x");
        gs_buf_release(&inner);
    }
    char longname[256];
    memset(longname, 'L', 255);
    longname[255] = '\0';
    put(longname, "long");
    struct gs_scan s = GS_SCAN_INIT;
    scan_ok(&s);
    assert_int_equal(s.n, 2 * n + 2);
    for (size_t i = 0; i < n; i++) {
        const struct gs_scan_entry *e = must_find(&s, names[i]);
        assert_int_equal(e->kind, GS_KIND_FILE);
        assert_int_equal(e->size, strlen(names[i]));
        struct gs_buf inner = GS_BUF_INIT;
        gs_buf_addf(&inner, "d i r\n/%s", names[i]);
        must_find(&s, inner.data);
        gs_buf_release(&inner);
    }
    must_find(&s, longname);
    gs_scan_release(&s);
}

static void test_scan__output_is_sorted_in_byte_order(void **state)
{
    (void)state;
    mkdir_rel("a");
    put("a/b", "");
    put("a.txt", "");
    put("a0", "");
    put("\xc3\xa9", "");
    put("B", "");
    struct gs_scan s = GS_SCAN_INIT;
    scan_ok(&s);
    assert_int_equal(s.n, 6);
    for (size_t i = 1; i < s.n; i++)
        assert_true(strcmp(s.entries[i - 1].path, s.entries[i].path) < 0);
    /* a directory's subtree comes after the directory and is one contiguous run */
    assert_string_equal(s.entries[1].path, "a");
    assert_string_equal(s.entries[2].path, "a.txt");
    assert_string_equal(s.entries[3].path, "a/b");
    gs_scan_release(&s);
}

static void test_scan__symlink_outside_tree_is_listed_not_followed(void **state)
{
    (void)state;
    char secret[128];
    snprintf(secret, sizeof(secret), "%s/secret", outside);
    assert_int_equal(mkdir(secret, 0700), 0);
    strcat(secret, "/key");
    FILE *f = fopen(secret, "w");
    assert_non_null(f);
    fclose(f);
    char *link = abs_path("escape");
    char target[128];
    snprintf(target, sizeof(target), "%s/secret", outside);
    assert_int_equal(symlink(target, link), 0);
    char *rel = abs_path("rel");
    assert_int_equal(symlink("../../etc", rel), 0);
    char *dangling = abs_path("dangling");
    assert_int_equal(symlink("no/such\nfile", dangling), 0);
    struct gs_scan s = GS_SCAN_INIT;
    scan_ok(&s);
    assert_int_equal(s.n, 3);
    const struct gs_scan_entry *e = must_find(&s, "escape");
    assert_int_equal(e->kind, GS_KIND_SYMLINK);
    assert_string_equal(e->link, target);
    assert_string_equal(must_find(&s, "rel")->link, "../../etc");
    assert_string_equal(must_find(&s, "dangling")->link, "no/such\nfile");
    assert_null(gs_scan_find(&s, "escape/key"));
    gs_scan_release(&s);
    free(link);
    free(rel);
    free(dangling);
}

static void test_scan__stat_fields_are_exact(void **state)
{
    (void)state;
    put("run.sh", "#!/bin/sh\n");
    char *p = abs_path("run.sh");
    assert_int_equal(chmod(p, 04755), 0);
    struct timespec ts[2] = {{1700000000, 123456789}, {1700000000, 987654321}};
    assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    mkdir_rel("empty");
    struct gs_scan s = GS_SCAN_INIT;
    scan_ok(&s);
    const struct gs_scan_entry *e = must_find(&s, "run.sh");
    assert_int_equal(e->kind, GS_KIND_FILE);
    assert_int_equal(e->mode, 04755);
    assert_int_equal(e->size, 10);
    assert_int_equal(e->mtime_ns, 1700000000LL * 1000000000LL + 987654321LL);
    assert_int_equal(e->ino, st.st_ino);
    assert_null(e->link);
    assert_int_equal(must_find(&s, "empty")->kind, GS_KIND_DIR); /* empty dirs are listed */
    gs_scan_release(&s);
    free(p);
}

static void test_scan__special_files_are_skipped(void **state)
{
    (void)state;
    char *fifo = abs_path("pipe");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    put("f", "x");
    struct gs_scan s = GS_SCAN_INIT;
    scan_ok(&s);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.n_skipped, 1);
    gs_scan_release(&s);
    free(fifo);
}

static void test_scan__subtree_lists_only_that_directory(void **state)
{
    (void)state;
    mkdir_rel("a");
    mkdir_rel("a/new");
    mkdir_rel("a/new/deep");
    put("a/new/deep/f", "1");
    put("a/new/g", "2");
    put("a/other", "3");
    put("top", "4");
    struct gs_scan s = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_subtree(&s, tmpdir, "a/new", NULL, &err), 0);
    assert_int_equal(s.n, 4);
    assert_string_equal(s.entries[0].path, "a/new");
    assert_string_equal(s.entries[1].path, "a/new/deep");
    assert_string_equal(s.entries[2].path, "a/new/deep/f");
    assert_string_equal(s.entries[3].path, "a/new/g");
    /* adding a second subtree keeps the first and stays sorted */
    assert_int_equal(gs_scan_subtree(&s, tmpdir, "a/other", NULL, &err), 0);
    assert_int_equal(s.n, 5);
    assert_string_equal(s.entries[4].path, "a/other");
    gs_scan_release(&s);
}

static void test_scan__subtree_through_symlink_is_not_followed(void **state)
{
    (void)state;
    char *link = abs_path("out");
    assert_int_equal(symlink(outside, link), 0);
    char inner[128];
    snprintf(inner, sizeof(inner), "%s/x", outside);
    assert_int_equal(mkdir(inner, 0755), 0);
    struct gs_scan s = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_subtree(&s, tmpdir, "out/x", NULL, &err), 0);
    assert_int_equal(s.n, 0);
    assert_int_equal(s.n_skipped, 1);
    gs_scan_release(&s);
    free(link);
}

static void test_scan__subtree_under_builtin_is_ignored(void **state)
{
    (void)state;
    mkdir_rel(".gpusync");
    mkdir_rel(".gpusync/runs");
    struct gs_scan s = GS_SCAN_INIT;
    assert_int_equal(gs_scan_subtree(&s, tmpdir, ".gpusync/runs", NULL, NULL), 0);
    assert_int_equal(s.n, 0);
    assert_int_equal(s.n_ignored, 1);
    gs_scan_release(&s);
}

/* Makes `levels` nested folders of 200-byte names under `rel` (through descriptors: their path
 * outgrows PATH_MAX) with a file `f` in the deepest. */
static void make_deep_tree(const char *rel, int levels)
{
    char name[201];
    memset(name, 'n', 200);
    name[200] = '\0';
    char *p = abs_path(rel);
    int fd = open(p, O_RDONLY | O_DIRECTORY);
    free(p);
    assert_true(fd >= 0);
    for (int i = 0; i < levels; i++) {
        assert_int_equal(mkdirat(fd, name, 0755), 0);
        int next = openat(fd, name, O_RDONLY | O_DIRECTORY);
        close(fd);
        assert_true((fd = next) >= 0);
    }
    int f = openat(fd, "f", O_WRONLY | O_CREAT, 0644);
    assert_true(f >= 0);
    close(f);
    close(fd);
}

/* A path too long to be opened by name (over PATH_MAX with the root) is left out and listed in
 * too_long (once: nothing below it), with the .gitignore rules in use (they read each folder's
 * .gitignore by path); the rest of the tree is listed, and the scan does not fail. */
static void test_scan__a_path_over_path_max_is_listed_too_long_and_the_rest_listed(void **state)
{
    (void)state;
    put("top", "1");
    mkdir_rel("deep");
    make_deep_tree("deep", 22);
    struct gs_ignore *ig = NULL;
    struct gs_error err = {0};
    assert_int_equal(gs_ignore_open(&ig, tmpdir, NULL, 0, &err), 0);
    struct gs_scan s = GS_SCAN_INIT;
    if (gs_scan_tree(&s, tmpdir, ig, &err) != 0)
        fail_msg("scan: %.200s", err.msg);
    must_find(&s, "top");
    must_find(&s, "deep");
    assert_int_equal(s.n_too_long, 1);
    assert_true(strlen(tmpdir) + 1 + strlen(s.too_long[0]) + sizeof("/.gitignore") > PATH_MAX);
    assert_true(!strncmp(s.too_long[0], "deep/", 5));
    for (size_t i = 0; i < s.n; i++) {
        assert_true(strlen(tmpdir) + 1 + strlen(s.entries[i].path) < PATH_MAX);
        assert_true(strncmp(s.entries[i].path, s.too_long[0], strlen(s.too_long[0])));
    }
    gs_scan_release(&s);
    gs_ignore_free(ig);
}

static void test_scan__missing_root_is_an_error(void **state)
{
    (void)state;
    struct gs_scan s = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&s, "/nonexistent/gpusync-project", NULL, &err), GS_E_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/gpusync-project"));
    assert_int_equal(s.n, 0);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_scan__hostile_names_pass_through_unchanged),
        T(test_scan__output_is_sorted_in_byte_order),
        T(test_scan__symlink_outside_tree_is_listed_not_followed),
        T(test_scan__stat_fields_are_exact),
        T(test_scan__special_files_are_skipped),
        T(test_scan__subtree_lists_only_that_directory),
        T(test_scan__subtree_through_symlink_is_not_followed),
        T(test_scan__subtree_under_builtin_is_ignored),
        T(test_scan__missing_root_is_an_error),
        T(test_scan__a_path_over_path_max_is_listed_too_long_and_the_rest_listed),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
