/* tests/unit/test_linked.c: syncd/linked: the files with other hard links a scan finds are kept,
 * and a write through any of their names (a size, mtime or ctime change) is told once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "syncd/linked.h"
#include "syncd/scan.h"

static char tmpdir[64];
static int rootfd = -1;
static char told[8][64];
static int n_told;

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-linked-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    rootfd = open(tmpdir, O_RDONLY | O_DIRECTORY);
    n_told = 0;
    return rootfd < 0 ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[160];
    close(rootfd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void put(const char *rel, const char *text, const char *mode)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, rel);
    FILE *fp = fopen(path, mode);
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void hard_link(const char *from, const char *to)
{
    char a[128], b[128];
    snprintf(a, sizeof(a), "%s/%s", tmpdir, from);
    snprintf(b, sizeof(b), "%s/%s", tmpdir, to);
    assert_int_equal(link(a, b), 0);
}

static void changed(void *ctx, const char *path)
{
    (void)ctx;
    assert_true(n_told < 8);
    snprintf(told[n_told++], sizeof(told[0]), "%s", path);
}

static void scan_into(struct gs_linked *l, int whole)
{
    struct gs_scan s = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&s, tmpdir, NULL, &err), 0);
    gs_linked_take_scan(l, &s, whole, NULL, NULL);
    gs_scan_release(&s);
}

static void test_linked__a_write_through_another_name_is_told_once(void **state)
{
    (void)state;
    put("plain.txt", "one name\n", "w");
    put("a.txt", "two names\n", "w");
    hard_link("a.txt", "b.txt");
    struct gs_linked l = {0};
    scan_into(&l, 1);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.v[0].path, "a.txt");
    assert_string_equal(l.v[1].path, "b.txt");
    gs_linked_check(&l, rootfd, changed, NULL);
    assert_int_equal(n_told, 0);
    put("b.txt", "more\n", "a"); /* through b: a changed as well */
    gs_linked_check(&l, rootfd, changed, NULL);
    assert_int_equal(n_told, 2);
    assert_string_equal(told[0], "a.txt");
    assert_string_equal(told[1], "b.txt");
    gs_linked_check(&l, rootfd, changed, NULL);
    assert_int_equal(n_told, 2);
    gs_linked_release(&l);
}

/* A scan of part of the tree adds what it finds and drops a file linked once now; a file removed
 * is told and dropped. */
static void test_linked__partial_scans_add_and_drop(void **state)
{
    (void)state;
    put("a.txt", "x\n", "w");
    hard_link("a.txt", "b.txt");
    struct gs_linked l = {0};
    scan_into(&l, 0);
    assert_int_equal(l.n, 2);
    char b[128];
    snprintf(b, sizeof(b), "%s/b.txt", tmpdir);
    assert_int_equal(unlink(b), 0);
    scan_into(&l, 0); /* a.txt is linked once now: dropped */
    assert_int_equal(l.n, 1);
    assert_string_equal(l.v[0].path, "b.txt");
    gs_linked_check(&l, rootfd, changed, NULL); /* b.txt is gone: told, then dropped */
    assert_int_equal(n_told, 1);
    assert_string_equal(told[0], "b.txt");
    assert_int_equal(l.n, 0);
    gs_linked_release(&l);
}

/* A sweep (a whole scan with `told`) tells of a file linked from outside since, and of a known
 * one written since its last look; not of one that did not change. */
static void test_linked__a_sweep_tells_of_new_links_and_unseen_writes(void **state)
{
    (void)state;
    put("a.txt", "a\n", "w");
    put("b.txt", "b\n", "w");
    hard_link("a.txt", "a2.txt");
    struct gs_linked l = {0};
    scan_into(&l, 1);
    assert_int_equal(l.n, 2);
    hard_link("b.txt", "b2.txt"); /* (outside the project, as far as an event goes) */
    put("a2.txt", "more\n", "a");
    struct gs_scan s = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&s, tmpdir, NULL, &err), 0);
    gs_linked_take_scan(&l, &s, 1, changed, NULL);
    gs_scan_release(&s);
    assert_int_equal(n_told, 4); /* a and a2 written; b and b2 new */
    assert_string_equal(told[0], "a.txt");
    assert_string_equal(told[1], "a2.txt");
    assert_string_equal(told[2], "b.txt");
    assert_string_equal(told[3], "b2.txt");
    assert_int_equal(l.n, 4);
    gs_linked_release(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linked__a_write_through_another_name_is_told_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_linked__partial_scans_add_and_drop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linked__a_sweep_tells_of_new_links_and_unseen_writes,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
