/* tests/unit/test_ignore.c: syncd/ignore: .gitignore through libgit2 (with and without a git
 * repository), [sync] exclude globs, built-ins, their precedence, and that a scan never descends
 * into an ignored directory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <git2.h>

#include "common/buf.h"
#include "common/path.h"
#include "syncd/ignore.h"
#include "syncd/scan.h"

static char tmpdir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(tmpdir, "/tmp/gs-test-ignore-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes `text` to tmpdir/rel, creating parent directories. */
static void put(const char *rel, const char *text)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, tmpdir, rel);
    char *slash = strrchr(p.data, '/');
    *slash = '\0';
    assert_int_equal(gs_path_mkdir_p(p.data, 0755, NULL), 0);
    *slash = '/';
    FILE *f = fopen(p.data, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    gs_buf_release(&p);
}

static void mkdir_rel(const char *rel)
{
    struct gs_buf p = GS_BUF_INIT;
    gs_path_join(&p, tmpdir, rel);
    assert_int_equal(gs_path_mkdir_p(p.data, 0755, NULL), 0);
    gs_buf_release(&p);
}

/* tmpdir/rel, in a static buffer overwritten by the next call. */
static const char *path_of(const char *rel)
{
    static char p[256];
    snprintf(p, sizeof(p), "%s/%s", tmpdir, rel);
    return p;
}

static struct gs_ignore *open_rules(const char *root, const char *const *ex, size_t n)
{
    struct gs_ignore *ig = NULL;
    struct gs_error err = {0};
    int rc = gs_ignore_open(&ig, root, ex, n, &err);
    if (rc != 0)
        fail_msg("gs_ignore_open: %s", err.msg);
    return ig;
}

static int ignored(struct gs_ignore *ig, const char *path, int is_dir)
{
    struct gs_error err = {0};
    int rc = gs_ignore_path(ig, path, is_dir, &err);
    if (rc < 0)
        fail_msg("gs_ignore_path(%s): %s", path, err.msg);
    return rc;
}

static void test_ignore__gitignore_negation_keeps_file(void **state)
{
    (void)state;
    put(".gitignore", "*.log\n!keep.log\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "a.log", 0), 1);
    assert_int_equal(ignored(ig, "sub/b.log", 0), 1);
    assert_int_equal(ignored(ig, "keep.log", 0), 0);
    assert_int_equal(ignored(ig, "sub/keep.log", 0), 0);
    assert_int_equal(ignored(ig, "main.py", 0), 0);
    gs_ignore_free(ig);
}

static void test_ignore__nested_gitignore_applies_only_below_it(void **state)
{
    (void)state;
    put(".gitignore", "*.tmp\n");
    put("sub/.gitignore", "x.txt\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "sub/x.txt", 0), 1);
    assert_int_equal(ignored(ig, "sub/deep/x.txt", 0), 1);
    assert_int_equal(ignored(ig, "x.txt", 0), 0);
    assert_int_equal(ignored(ig, "other/x.txt", 0), 0);
    assert_int_equal(ignored(ig, "sub/a.tmp", 0), 1); /* the parent's rules still apply below */
    assert_int_equal(ignored(ig, "important.tmp", 0), 1);
    gs_ignore_free(ig);
}

/* git: a negation in a deeper .gitignore re-includes what a shallower one ignores, and the deeper
 * file decides for everything below it. (libgit2's git_ignore_path_is_ignored asks the shallowest
 * file first, so this once said "ignored".) */
static void test_ignore__nested_negation_overrides_parent_rule(void **state)
{
    (void)state;
    put(".gitignore", "*.tmp\n");
    put("sub/.gitignore", "!important.tmp\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "sub/important.tmp", 0), 0);
    assert_int_equal(ignored(ig, "sub/deep/important.tmp", 0), 0);
    assert_int_equal(ignored(ig, "important.tmp", 0), 1);
    assert_int_equal(ignored(ig, "sub/other.tmp", 0), 1);
    gs_ignore_free(ig);
}

/* The audit's case: the rule and its negation both below the root, two levels apart. */
static void test_ignore__deeper_negation_reincludes_file(void **state)
{
    (void)state;
    put("sub/.gitignore", "*.tmp\n");
    put("sub/inner/.gitignore", "!keep.tmp\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "sub/inner/keep.tmp", 0), 0);
    assert_int_equal(ignored(ig, "sub/inner/other.tmp", 0), 1);
    assert_int_equal(ignored(ig, "sub/keep.tmp", 0), 1);
    assert_int_equal(ignored(ig, "keep.tmp", 0), 0);
    struct gs_error err = {0};
    assert_int_equal(gs_ignore_entry(ig, "sub/inner/keep.tmp", 0, &err), 0);
    assert_int_equal(gs_ignore_entry(ig, "sub/inner/other.tmp", 0, &err), 1);
    gs_ignore_free(ig);
}

/* A deeper `!logs/` brings back a directory that a shallower `logs/` hides, with what it holds. */
static void test_ignore__deeper_negation_reincludes_directory(void **state)
{
    (void)state;
    put(".gitignore", "logs/\n");
    put("sub/.gitignore", "!logs/\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "sub/logs", 1), 0);
    assert_int_equal(ignored(ig, "sub/logs/a.txt", 0), 0);
    assert_int_equal(ignored(ig, "logs", 1), 1);
    assert_int_equal(ignored(ig, "logs/a.txt", 0), 1);
    gs_ignore_free(ig);
}

/* git: "It is not possible to re-include a file if a parent directory of that file is excluded",
 * whether the negation sits beside the rule or in the excluded directory's own .gitignore (which
 * git never reads). */
static void test_ignore__negation_cannot_reinclude_under_excluded_directory(void **state)
{
    (void)state;
    put(".gitignore", "build/\n!build/keep.txt\n/out/*\n!/out/keep.txt\n");
    put("build/.gitignore", "!keep.txt\n!*\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "build/keep.txt", 0), 1);
    assert_int_equal(ignored(ig, "build/x", 0), 1);
    assert_int_equal(ignored(ig, "build/.gitignore", 0), 1);
    /* "out/ star" leaves the directory itself included, so the negation works there */
    assert_int_equal(ignored(ig, "out", 1), 0);
    assert_int_equal(ignored(ig, "out/keep.txt", 0), 0);
    assert_int_equal(ignored(ig, "out/x", 0), 1);
    gs_ignore_free(ig);
}

/* git treats a symlink as a file, whatever it points at: `data/` matches directories only, so a
 * symlink named data is kept, while a pattern without the slash matches it. The link must exist:
 * a query about it once looked through it with stat(2). */
static void test_ignore__dir_pattern_does_not_match_symlink_to_directory(void **state)
{
    (void)state;
    put(".gitignore", "data/\nlink\n");
    put("real/f", "x");
    put("sub/data/f", "x");
    assert_int_equal(symlink("real", path_of("data")), 0);
    assert_int_equal(symlink("real", path_of("link")), 0);
    assert_int_equal(symlink("../real", path_of("sub/data2")), 0);
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "data", 0), 0);
    assert_int_equal(ignored(ig, "sub/data2", 0), 0);
    assert_int_equal(ignored(ig, "link", 0), 1);
    assert_int_equal(ignored(ig, "sub/data", 1), 1); /* a real directory still matches */
    struct gs_error err = {0};
    assert_int_equal(gs_ignore_entry(ig, "data", 0, &err), 0);
    gs_ignore_free(ig);
}

/* Lines as git reads them (each answer checked against git check-ignore): a UTF-8 BOM and CRLF
 * ends are dropped, '#' starts a comment, a backslash quotes '#', '!' and a trailing space, and
 * other trailing spaces do not count. */
static void test_ignore__gitignore_lines_read_as_git_reads_them(void **state)
{
    (void)state;
    put(".gitignore", "\xef\xbb\xbf*.log\r\n# comment\r\n\\#hash\nspaced   \nkept\\ \n\\!bang\n"
                      "/anch/*.o\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "a.log", 0), 1);
    assert_int_equal(ignored(ig, "# comment", 0), 0);
    assert_int_equal(ignored(ig, "#hash", 0), 1);
    assert_int_equal(ignored(ig, "spaced", 0), 1);
    assert_int_equal(ignored(ig, "spaced   ", 0), 0);
    assert_int_equal(ignored(ig, "kept ", 0), 1);
    assert_int_equal(ignored(ig, "kept", 0), 0);
    assert_int_equal(ignored(ig, "!bang", 0), 1);
    assert_int_equal(ignored(ig, "anch/x.o", 0), 1);
    assert_int_equal(ignored(ig, "sub/anch/x.o", 0), 0);
    gs_ignore_free(ig);
}

static void test_ignore__dir_pattern_and_anchored_pattern(void **state)
{
    (void)state;
    put(".gitignore", "data/\n/build\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "data", 1), 1);
    assert_int_equal(ignored(ig, "sub/data", 1), 1);
    assert_int_equal(ignored(ig, "sub/data", 0), 0);   /* a file named data */
    assert_int_equal(ignored(ig, "data/x.bin", 0), 1); /* through its directory */
    assert_int_equal(ignored(ig, "build", 1), 1);
    assert_int_equal(ignored(ig, "src/build", 1), 0);
    gs_ignore_free(ig);
}

static void test_ignore__exclude_globs_have_gitignore_semantics(void **state)
{
    (void)state;
    const char *ex[] = {"*.ckpt", "/out", "logs/", "a/**/tmp", "!best.ckpt", "cache/**"};
    struct gs_ignore *ig = open_rules(tmpdir, ex, 6);
    assert_int_equal(ignored(ig, "model.ckpt", 0), 1);
    assert_int_equal(ignored(ig, "runs/1/model.ckpt", 0), 1);
    assert_int_equal(ignored(ig, "runs/best.ckpt", 0), 0);
    assert_int_equal(ignored(ig, "out", 1), 1);
    assert_int_equal(ignored(ig, "out/x", 0), 1);
    assert_int_equal(ignored(ig, "src/out", 1), 0);
    assert_int_equal(ignored(ig, "logs", 1), 1);
    assert_int_equal(ignored(ig, "logs", 0), 0);
    assert_int_equal(ignored(ig, "a/tmp", 1), 1);
    assert_int_equal(ignored(ig, "a/b/c/tmp", 0), 1);
    assert_int_equal(ignored(ig, "b/tmp", 0), 0);
    assert_int_equal(ignored(ig, "cache", 1), 0); /* a trailing slash-star-star is what is inside */
    assert_int_equal(ignored(ig, "cache/f", 0), 1);
    gs_ignore_free(ig);
}

static void test_ignore__exclude_decides_over_gitignore(void **state)
{
    (void)state;
    put("data/.keep", "");
    put(".gitignore", "*.csv\ndata/\n");
    const char *ex[] = {"!small.csv", "*.py"};
    struct gs_ignore *ig = open_rules(tmpdir, ex, 2);
    assert_int_equal(ignored(ig, "big.csv", 0), 1);
    assert_int_equal(ignored(ig, "small.csv", 0), 0); /* re-included for sync */
    assert_int_equal(ignored(ig, "train.py", 0), 1);
    /* as in git, nothing under an ignored directory comes back: the scanner never goes there */
    assert_int_equal(ignored(ig, "data/small.csv", 0), 1);
    gs_ignore_free(ig);
}

static void test_ignore__editor_scratch_files_are_builtin(void **state)
{
    (void)state;
    const char *scratch[] = {".#main.py",
                             "#main.py#",
                             "main.py~",
                             "src/.main.py.swp",
                             ".x.swo",
                             ".x.swx",
                             "4913",
                             "src/Main.kt___jb_tmp___",
                             "Main.kt___jb_old___"};
    for (size_t i = 0; i < sizeof(scratch) / sizeof(scratch[0]); i++)
        assert_int_equal(gs_ignore_is_builtin(scratch[i]), 1);
    const char *real[] = {"main.py", "notes.swp", "#define.h",    "a~b",
                          "49130",   "~",         "___jb_tmp___", "x___jb_tmp___.py"};
    for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++)
        assert_int_equal(gs_ignore_is_builtin(real[i]), 0);
}

static void test_ignore__builtins_win_over_everything(void **state)
{
    (void)state;
    put(".gitignore", "!.git\n!.gpusync\n!*\n");
    const char *ex[] = {"!.gpusync", "!.git/", "!*.gpusync-conflict-*"};
    struct gs_ignore *ig = open_rules(tmpdir, ex, 3);
    assert_int_equal(ignored(ig, ".git", 1), 1);
    assert_int_equal(ignored(ig, ".git/config", 0), 1);
    assert_int_equal(ignored(ig, "vendor/lib/.git", 0), 1); /* a submodule's gitlink file */
    assert_int_equal(ignored(ig, ".gpusync", 1), 1);
    assert_int_equal(ignored(ig, ".gpusync/index.db", 0), 1);
    assert_int_equal(ignored(ig, "src/.gpusync-tmp-1234", 0), 1);
    assert_int_equal(ignored(ig, "train.py.gpusync-conflict-20261121-101500", 0), 1);
    assert_int_equal(ignored(ig, "train.py.gpusync-conflict-20261121-101500-2", 0), 1);
    assert_int_equal(ignored(ig, ".gpusync-conflict-notes", 0), 0); /* no NAME before it */
    assert_int_equal(ignored(ig, ".github", 1), 0);
    gs_ignore_free(ig);
}

static void test_ignore__gitignore_edit_takes_effect_without_reopening(void **state)
{
    (void)state;
    put(".gitignore", "*.a\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    assert_int_equal(ignored(ig, "x.b", 0), 0);
    put(".gitignore", "*.a\n*.b\n");
    assert_int_equal(ignored(ig, "x.b", 0), 1);
    gs_ignore_free(ig);
}

static void test_ignore__project_inside_git_repository_uses_its_rules(void **state)
{
    (void)state;
    git_libgit2_init();
    git_repository *repo = NULL;
    assert_int_equal(git_repository_init(&repo, tmpdir, 0), 0);
    git_repository_free(repo);
    git_libgit2_shutdown();
    put(".gitignore", "*.tmp\n");      /* above the project */
    put(".git/info/exclude", "*.o\n"); /* git's own exclude file */
    put("proj/.gitignore", "secret\n");
    struct gs_buf root = GS_BUF_INIT;
    gs_path_join(&root, tmpdir, "proj");
    struct gs_ignore *ig = open_rules(root.data, NULL, 0);
    assert_int_equal(ignored(ig, "a.tmp", 0), 1);
    assert_int_equal(ignored(ig, "lib/x.o", 0), 1);
    assert_int_equal(ignored(ig, "secret", 0), 1);
    assert_int_equal(ignored(ig, "a.py", 0), 0);
    gs_ignore_free(ig);
    gs_buf_release(&root);
}

static void test_ignore__repository_that_ignores_the_project_is_not_used(void **state)
{
    (void)state;
    git_libgit2_init();
    git_repository *repo = NULL;
    assert_int_equal(git_repository_init(&repo, tmpdir, 0), 0);
    git_repository_free(repo);
    git_libgit2_shutdown();
    put(".gitignore", "*\n"); /* a home directory kept in git, ignoring everything else */
    put("proj/.gitignore", "*.log\n");
    struct gs_buf root = GS_BUF_INIT;
    gs_path_join(&root, tmpdir, "proj");
    struct gs_ignore *ig = open_rules(root.data, NULL, 0);
    assert_int_equal(ignored(ig, "train.py", 0), 0);
    assert_int_equal(ignored(ig, "run.log", 0), 1); /* the project's own rules still apply */
    gs_ignore_free(ig);
    gs_buf_release(&root);
}

/* The same answers inside a git repository whose work tree holds the project, in git's order:
 * a deeper .gitignore over a shallower one (above the project too), then .git/info/exclude, then
 * core.excludesFile. */
static void test_ignore__inside_repository_deeper_rules_win(void **state)
{
    (void)state;
    git_libgit2_init();
    git_repository *repo = NULL;
    git_config *cfg = NULL;
    assert_int_equal(git_repository_init(&repo, tmpdir, 0), 0);
    assert_int_equal(git_repository_config(&cfg, repo), 0);
    assert_int_equal(git_config_set_string(cfg, "core.excludesFile", path_of("excludes")), 0);
    git_config_free(cfg);
    git_repository_free(repo);
    git_libgit2_shutdown();
    put("excludes", "*.bak\n*.o\n");
    put(".git/info/exclude", "*.o\n!keep.bak\n");
    put(".gitignore", "*.tmp\ndata/\n"); /* above the project */
    put("proj/sub/.gitignore", "!keep.tmp\n!keep.o\n");
    put("proj/real/f", "x");
    assert_int_equal(symlink("real", path_of("proj/data")), 0);
    struct gs_ignore *ig = open_rules(path_of("proj"), NULL, 0);
    assert_int_equal(ignored(ig, "sub/keep.tmp", 0), 0);
    assert_int_equal(ignored(ig, "sub/x.tmp", 0), 1);
    assert_int_equal(ignored(ig, "x.tmp", 0), 1);
    assert_int_equal(ignored(ig, "data", 0), 0); /* a symlink */
    assert_int_equal(ignored(ig, "sub/data", 1), 1);
    assert_int_equal(ignored(ig, "sub/keep.o", 0), 0); /* .gitignore over info/exclude */
    assert_int_equal(ignored(ig, "x.o", 0), 1);
    assert_int_equal(ignored(ig, "x.bak", 0), 1);    /* core.excludesFile */
    assert_int_equal(ignored(ig, "keep.bak", 0), 0); /* info/exclude over core.excludesFile */
    gs_ignore_free(ig);
}

/* The scanner, which asks about one entry at a time (gs_ignore_entry), keeps what git keeps. */
static void test_ignore__scan_keeps_reincluded_file_and_symlink(void **state)
{
    (void)state;
    put(".gitignore", "data/\n");
    put("sub/.gitignore", "*.tmp\n");
    put("sub/inner/.gitignore", "!keep.tmp\n");
    put("sub/inner/keep.tmp", "k");
    put("sub/inner/other.tmp", "o");
    put("real/f", "x");
    assert_int_equal(symlink("real", path_of("data")), 0);
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    struct gs_scan scan = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&scan, tmpdir, ig, &err), 0);
    assert_non_null(gs_scan_find(&scan, "sub/inner/keep.tmp"));
    assert_null(gs_scan_find(&scan, "sub/inner/other.tmp"));
    const struct gs_scan_entry *data = gs_scan_find(&scan, "data");
    assert_non_null(data);
    assert_int_equal(data->kind, GS_KIND_SYMLINK);
    gs_scan_release(&scan);
    gs_ignore_free(ig);
}

static void test_ignore__scan_does_not_descend_into_ignored_directory(void **state)
{
    (void)state;
    put(".gitignore", "data/\n");
    for (int i = 0; i < 50; i++) {
        char name[64];
        snprintf(name, sizeof(name), "data/part-%02d/x.bin", i);
        put(name, "x");
    }
    put("src/main.py", "print(1)\n");
    mkdir_rel(".git/objects");
    put(".gpusync/config", "[remote]\n");
    struct gs_ignore *ig = open_rules(tmpdir, NULL, 0);
    struct gs_scan scan = GS_SCAN_INIT;
    struct gs_error err = {0};
    assert_int_equal(gs_scan_tree(&scan, tmpdir, ig, &err), 0);
    /* .gitignore, src, src/main.py; data, .git and .gpusync each counted once, unvisited */
    assert_int_equal(scan.n, 3);
    assert_int_equal(scan.n_ignored, 3);
    for (size_t i = 0; i < scan.n; i++)
        assert_null(strstr(scan.entries[i].path, "data"));
    gs_scan_release(&scan);
    gs_ignore_free(ig);
}

static void test_ignore__bad_exclude_is_a_config_error(void **state)
{
    (void)state;
    const char *ex[] = {"/"};
    struct gs_ignore *ig = NULL;
    struct gs_error err = {0};
    assert_int_equal(gs_ignore_open(&ig, tmpdir, ex, 1, &err), GS_E_CONFIG);
    assert_null(ig);
    assert_non_null(strstr(err.msg, "exclude"));
}

/* The watcher asks once per event: a query must stay in the microseconds. */
static void test_ignore__query_is_cheap(void **state)
{
    (void)state;
    put(".gitignore", "*.log\n");
    put("a/b/.gitignore", "*.tmp\n");
    const char *ex[] = {"*.ckpt", "/out"};
    struct gs_ignore *ig = open_rules(tmpdir, ex, 2);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int n = 20000;
    for (int i = 0; i < n; i++)
        assert_int_equal(ignored(ig, "a/b/c/model.py", 0), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;
    print_message("gs_ignore_path, depth 4: %.2f us per query\n", us);
    assert_true(us < 500.0);
    gs_ignore_free(ig);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_ignore__gitignore_negation_keeps_file),
        T(test_ignore__nested_gitignore_applies_only_below_it),
        T(test_ignore__nested_negation_overrides_parent_rule),
        T(test_ignore__deeper_negation_reincludes_file),
        T(test_ignore__deeper_negation_reincludes_directory),
        T(test_ignore__negation_cannot_reinclude_under_excluded_directory),
        T(test_ignore__dir_pattern_does_not_match_symlink_to_directory),
        T(test_ignore__gitignore_lines_read_as_git_reads_them),
        T(test_ignore__dir_pattern_and_anchored_pattern),
        T(test_ignore__exclude_globs_have_gitignore_semantics),
        T(test_ignore__exclude_decides_over_gitignore),
        T(test_ignore__builtins_win_over_everything),
        T(test_ignore__editor_scratch_files_are_builtin),
        T(test_ignore__gitignore_edit_takes_effect_without_reopening),
        T(test_ignore__project_inside_git_repository_uses_its_rules),
        T(test_ignore__repository_that_ignores_the_project_is_not_used),
        T(test_ignore__inside_repository_deeper_rules_win),
        T(test_ignore__scan_keeps_reincluded_file_and_symlink),
        T(test_ignore__scan_does_not_descend_into_ignored_directory),
        T(test_ignore__bad_exclude_is_a_config_error),
        T(test_ignore__query_is_cheap),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
