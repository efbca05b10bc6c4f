/* tests/unit/test_resident_memory.c: what a project remembers of the server's resident listener
 * (syncd/resident.h): kept under its key only, private, never a value with a newline, a refusal
 * that holds for a day and then lapses, and forgotten on request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cmocka.h>

#include "syncd/resident.h"

static char project[64];

static int setup(void **state)
{
    (void)state;
    char dir[128];
    snprintf(project, sizeof(project), "/tmp/gs-test-resident.XXXXXX");
    if (!mkdtemp(project))
        return -1;
    snprintf(dir, sizeof(dir), "%s/.gpusync", project);
    return mkdir(dir, 0700);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", project);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_resident__recalled_under_its_key_only(void **state)
{
    (void)state;
    char key[GS_RESIDENT_KEY], other[GS_RESIDENT_KEY];
    struct gs_resident r;
    gs_resident_key("root@gpu:22", "gpusync/project-a", key);
    gs_resident_key("root@gpu:22", "gpusync/project-b", other);
    assert_string_not_equal(key, other);
    assert_int_equal(gs_resident_recall(project, key, &r), -1);
    gs_resident_remember(project, key, "/root/.gpusync/run/a.sock", "/root/proj");
    assert_int_equal(gs_resident_recall(project, key, &r), 0);
    assert_string_equal(r.socket, "/root/.gpusync/run/a.sock");
    assert_string_equal(r.root, "/root/proj");
    assert_int_equal(gs_resident_recall(project, other, &r), -1);
    struct stat st;
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", project, GS_RESIDENT_FILE);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    gs_resident_forget(project);
    assert_int_equal(gs_resident_recall(project, key, &r), -1);
}

static void test_resident__a_value_with_a_newline_or_a_relative_path_is_not_kept(void **state)
{
    (void)state;
    char key[GS_RESIDENT_KEY];
    struct gs_resident r;
    gs_resident_key("t", "c", key);
    gs_resident_remember(project, key, "/run/a.sock", "/root/x\n/etc");
    assert_int_equal(gs_resident_recall(project, key, &r), -1);
    gs_resident_remember(project, key, "run/a.sock", "/root/x");
    assert_int_equal(gs_resident_recall(project, key, &r), -1);
}

static void test_resident__a_refusal_holds_a_day(void **state)
{
    (void)state;
    char key[GS_RESIDENT_KEY], path[128];
    struct gs_resident r;
    gs_resident_key("t", "c", key);
    gs_resident_refused(project, key);
    assert_int_equal(gs_resident_recall(project, key, &r), 1);
    /* the same refusal, stored a day and a minute ago */
    snprintf(path, sizeof(path), "%s/%s", project, GS_RESIDENT_FILE);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "gpusync-resident 1\n%s\nrefused\n%lld\n", key,
            (long long)time(NULL) - GS_RESIDENT_RETRY_S - 60);
    fclose(fp);
    assert_int_equal(gs_resident_recall(project, key, &r), -1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_resident__recalled_under_its_key_only),
        T(test_resident__a_value_with_a_newline_or_a_relative_path_is_not_kept),
        T(test_resident__a_refusal_holds_a_day),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
