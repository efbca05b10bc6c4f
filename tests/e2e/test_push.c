/* tests/e2e/test_push.c: `gpusync push`, `pull` and `status` run as a user runs them, against the
 * sandbox sshd (issue 3): after every push the remote tree is compared with the local one entry by
 * entry (kind, mode, size, bytes, symlink target). Covers the first sync, every kind of change,
 * touch without change, server-side conflicts, hostile names, symlinks out of the tree, ignore
 * rules, --dry-run, status --json, pull, sshd or client killed mid-push (through the WAN
 * simulator), a full remote disk, the SFTP fallback and a seeded randomised convergence run
 * (GS_TEST_SEED). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/quote.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"
#include "wansim_harness.h"

#define RUN_TIMEOUT_MS 90000
#define CONFLICT_TAG   ".gpusync-conflict-"
#define TMP_TAG        ".gpusync-tmp-"

static struct gs_test_sshd sshd;

/* ---- running the CLI ---- */

/* Execs gpusync with `args` in `cwd` (in the child; never returns). */
static void exec_gpusync(const char *cwd, const char *const *args)
{
    setsid(); /* no controlling terminal, as in CI or an editor */
    if (cwd && chdir(cwd) != 0)
        _exit(126);
    gs_test_exec_gpusync(args);
}

/* Runs gpusync in `cwd` with `args` (NULL-terminated), stdin empty, and collects its output. */
static struct gs_test_result run_gpusync(const char *cwd, const char *const *args)
{
    return gs_test_run_gpusync(cwd, NULL, NULL, args, RUN_TIMEOUT_MS);
}

/* Starts gpusync in the background with stdout and stderr into `log`; returns its pid. */
static pid_t spawn_gpusync(const char *cwd, const char *log, const char *const *args)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        exec_gpusync(cwd, args);
    }
    return pid;
}

/* Waits for `pid` up to `ms`; returns its decoded status, or -1 after killing it at the deadline.
 */
static int wait_child(pid_t pid, int ms)
{
    int64_t end = gs_clock_mono_ms() + ms;
    int status;
    while (gs_clock_mono_ms() < end) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return gs_test_exit_status(status);
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void expect_status(const struct gs_test_result *r, int want, const char *what)
{
    if (r->status != want)
        fail_msg("%s: exit %d, want %d\nstdout: %s\nstderr: %s", what, r->status, want, r->out.data,
                 r->err.data);
}

/* ---- files ---- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void path_at(char *out, size_t size, const char *root, const char *rel)
{
    /* an empty `root` joins relative paths: path_at(child, rel, name) */
    int n = !*root        ? snprintf(out, size, "%s", rel ? rel : "")
            : rel && *rel ? snprintf(out, size, "%s/%s", root, rel)
                          : snprintf(out, size, "%s", root);
    if (n < 0 || (size_t)n >= size)
        fail_msg("path too long: %s/%s", root, rel);
}

/* Writes `len` bytes to root/rel with `mode` (creating parents), replacing what was there. */
static void put_bytes(const char *root, const char *rel, const void *data, size_t len, mode_t mode)
{
    char path[4096];
    path_at(path, sizeof(path), root, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    setenv("D", path, 1); /* through the environment: names may hold any byte but NUL */
    assert_int_equal(gs_test_sh("mkdir -p -- \"$D\""), 0);
    *slash = '/';
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        fail_msg("open %s: %s", path, strerror(errno));
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

static void put_text(const char *root, const char *rel, const char *text, mode_t mode)
{
    put_bytes(root, rel, text, strlen(text), mode);
}

/* Writes `size` pseudo-random bytes from `seed`. */
static void put_random(const char *root, const char *rel, size_t size, uint64_t seed, mode_t mode)
{
    unsigned char *data = malloc(size + 8);
    for (size_t i = 0; i < size; i += 8) {
        uint64_t v = rng_next(&seed);
        memcpy(data + i, &v, 8);
    }
    put_bytes(root, rel, data, size, mode);
    free(data);
}

static void make_dirs(const char *root, const char *rel)
{
    char path[4096];
    path_at(path, sizeof(path), root, rel);
    setenv("D", path, 1);
    assert_int_equal(gs_test_sh("mkdir -p -- \"$D\""), 0);
}

static void make_link(const char *root, const char *rel, const char *target)
{
    char path[4096];
    path_at(path, sizeof(path), root, rel);
    unlink(path);
    if (symlink(target, path) != 0)
        fail_msg("symlink %s: %s", path, strerror(errno));
}

static void remove_path(const char *root, const char *rel)
{
    char path[4096];
    struct stat st;
    path_at(path, sizeof(path), root, rel);
    if (lstat(path, &st) != 0)
        fail_msg("test bug: removing %s, which does not exist", path);
    setenv("D", path, 1);
    assert_int_equal(gs_test_sh("rm -rf -- \"$D\""), 0);
}

static void move_path(const char *root, const char *from, const char *to)
{
    char a[4096], b[4096];
    path_at(a, sizeof(a), root, from);
    path_at(b, sizeof(b), root, to);
    if (rename(a, b) != 0)
        fail_msg("rename %s -> %s: %s", a, b, strerror(errno));
}

static int exists(const char *root, const char *rel)
{
    char path[4096];
    struct stat st;
    path_at(path, sizeof(path), root, rel);
    return lstat(path, &st) == 0;
}

/* 1 when both files hold the same bytes. */
static int same_bytes(const char *a, const char *b)
{
    struct gs_buf x = GS_BUF_INIT, y = GS_BUF_INIT;
    int same = gs_test_slurp(a, &x) == 0 && gs_test_slurp(b, &y) == 0 && x.len == y.len &&
               (x.len == 0 || memcmp(x.data, y.data, x.len) == 0);
    gs_buf_release(&x);
    gs_buf_release(&y);
    return same;
}

/* ---- comparing trees ---- */

struct diff {
    const char *lroot, *rroot;
    int allow_conflicts;     /* NAME.gpusync-conflict-* on the server is expected */
    const char *const *skip; /* local paths that are ignored (must not be compared) */
    char why[8192];
};

static int skipped(const struct diff *d, const char *rel)
{
    if (!strcmp(rel, ".gpusync") || !strcmp(rel, ".git"))
        return 1;
    for (size_t i = 0; d->skip && d->skip[i]; i++)
        if (!strcmp(rel, d->skip[i]))
            return 1;
    return 0;
}

static int diff_dir(struct diff *d, const char *rel);

/* Compares one entry present on both sides. */
static int diff_entry(struct diff *d, const char *rel, const struct stat *ls, const struct stat *rs)
{
    char lp[4096], rp[4096];
    path_at(lp, sizeof(lp), d->lroot, rel);
    path_at(rp, sizeof(rp), d->rroot, rel);
    if ((ls->st_mode & S_IFMT) != (rs->st_mode & S_IFMT))
        return snprintf(d->why, sizeof(d->why), "kind differs: %s (local %o, server %o)", rel,
                        ls->st_mode & S_IFMT, rs->st_mode & S_IFMT);
    if (S_ISLNK(ls->st_mode)) {
        char lt[4096] = "", rt[4096] = "";
        ssize_t ln = readlink(lp, lt, sizeof(lt) - 1), rn = readlink(rp, rt, sizeof(rt) - 1);
        if (ln < 0 || rn < 0 || ln != rn || memcmp(lt, rt, (size_t)ln))
            return snprintf(d->why, sizeof(d->why), "symlink target differs: %s ('%s' vs '%s')",
                            rel, lt, rt);
        return 0;
    }
    if ((ls->st_mode & 07777) != (rs->st_mode & 07777))
        return snprintf(d->why, sizeof(d->why), "mode differs: %s (local %04o, server %04o)", rel,
                        ls->st_mode & 07777, rs->st_mode & 07777);
    if (S_ISDIR(ls->st_mode))
        return diff_dir(d, rel);
    if (ls->st_size != rs->st_size)
        return snprintf(d->why, sizeof(d->why), "size differs: %s (local %lld, server %lld)", rel,
                        (long long)ls->st_size, (long long)rs->st_size);
    if (!same_bytes(lp, rp))
        return snprintf(d->why, sizeof(d->why), "content differs: %s", rel);
    return 0;
}

/* Lists the names in root/rel (sorted, malloc'd, NULL-terminated). */
static char **list_dir(const char *root, const char *rel)
{
    char path[4096];
    path_at(path, sizeof(path), root, rel);
    struct dirent **names = NULL;
    int n = scandir(path, &names, NULL, alphasort);
    char **out = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof(*out));
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, ".."))
            out[k++] = strdup(names[i]->d_name);
        free(names[i]);
    }
    free(names);
    return out;
}

static void free_list(char **l)
{
    for (size_t i = 0; l[i]; i++)
        free(l[i]);
    free(l);
}

static int diff_dir(struct diff *d, const char *rel)
{
    char **local = list_dir(d->lroot, rel), **remote = list_dir(d->rroot, rel);
    int rc = 0;
    for (size_t i = 0; !rc && local[i]; i++) {
        char child[4096], lp[4096], rp[4096];
        path_at(child, sizeof(child), rel, local[i]);
        if (skipped(d, child))
            continue;
        path_at(lp, sizeof(lp), d->lroot, child);
        path_at(rp, sizeof(rp), d->rroot, child);
        struct stat ls, rs;
        if (lstat(lp, &ls) != 0)
            continue; /* vanished while walking: not ours to judge */
        if (lstat(rp, &rs) != 0)
            rc = snprintf(d->why, sizeof(d->why), "missing on the server: %s", child);
        else
            rc = diff_entry(d, child, &ls, &rs);
    }
    for (size_t i = 0; !rc && remote[i]; i++) {
        char child[4096];
        path_at(child, sizeof(child), rel, remote[i]);
        if (skipped(d, child) || exists(d->lroot, child))
            continue;
        if (d->allow_conflicts && strstr(remote[i], CONFLICT_TAG))
            continue;
        rc = snprintf(d->why, sizeof(d->why), "extra on the server: %s", child);
    }
    free_list(local);
    free_list(remote);
    return rc;
}

/* Fails the test unless the server tree matches the local one. */
static void expect_same_tree_opts(const char *local, const char *remote, int allow_conflicts,
                                  const char *const *skip, const char *when)
{
    struct diff d = {
        .lroot = local, .rroot = remote, .allow_conflicts = allow_conflicts, .skip = skip};
    if (diff_dir(&d, ""))
        fail_msg("%s: trees differ: %s", when, d.why);
}

/* ---- a project ---- */

struct proj {
    char dir[64];     /* holds both trees */
    char local[128];  /* the local project */
    char remote[128]; /* its remote directory on the (same) machine */
    int port;         /* where gpusync connects: sshd or the WAN simulator */
};

/* Makes a local project against port `port` (0: the sandbox sshd) with [sync] transport. */
static void proj_new(struct proj *p, int port, const char *transport)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->dir, sizeof(p->dir), "/tmp/gs-e2e-push.XXXXXX");
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->local, sizeof(p->local), "%s/local", p->dir);
    snprintf(p->remote, sizeof(p->remote), "%s/remote", p->dir);
    assert_int_equal(mkdir(p->local, 0755), 0);
    p->port = port ? port : sshd.port;
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", p->port);
    struct gs_test_result r =
        run_gpusync(p->local, ARGS("init", target, "--path", p->remote, "--accept-new-host-key"));
    expect_status(&r, 0, "gpusync init");
    gs_test_result_release(&r);
    if (transport) /* init wrote one: a second would be a duplicate key (exit 3) */
        assert_int_equal(gs_test_sh("sed -i 's/^\\ttransport = .*/\\ttransport = %s/' "
                                    "'%s/.gpusync/config'",
                                    transport, p->local),
                         0);
}

static void proj_add_config(struct proj *p, const char *text)
{
    char cfg[256];
    snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", p->local);
    FILE *fp = fopen(cfg, "a");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void proj_free(struct proj *p)
{
    if (p->dir[0])
        gs_test_sh("umount -l '%s/remote' 2>/dev/null; rm -rf '%s'", p->dir, p->dir);
    p->dir[0] = '\0';
}

static json_t *parse_json(const struct gs_test_result *r, const char *what)
{
    json_error_t jerr;
    json_t *o = json_loads(r->out.data, 0, &jerr);
    if (!o)
        fail_msg("%s: output is not JSON (%s): %s\nstderr: %s", what, jerr.text, r->out.data,
                 r->err.data);
    return o;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        fail_msg("JSON has no integer '%s'", key);
    return (long long)json_integer_value(v);
}

/* Fails unless the integer field `key` of `o` is `want`, showing the whole object. */
static void expect_count(json_t *o, const char *key, long long want)
{
    if (jint(o, key) != want) {
        char *text = json_dumps(o, 0);
        fail_msg("'%s' is %lld, want %lld in %s", key, jint(o, key), want, text);
    }
}

/* Runs `push --json [extra]` and checks the exit status; returns the summary (caller decrefs). */
static json_t *push_json_ex(struct proj *p, int want, const char *extra)
{
    struct gs_test_result r = extra ? run_gpusync(p->local, ARGS("push", "--json", extra))
                                    : run_gpusync(p->local, ARGS("push", "--json"));
    expect_status(&r, want, "gpusync push --json");
    json_t *o = parse_json(&r, "push --json");
    gs_test_result_release(&r);
    return o;
}

static json_t *status_json(struct proj *p)
{
    struct gs_test_result r = run_gpusync(p->local, ARGS("status", "--json"));
    expect_status(&r, 0, "gpusync status --json");
    json_t *o = parse_json(&r, "status --json");
    gs_test_result_release(&r);
    return o;
}

/* Pushes (expecting success, no failures) and compares the trees. Returns the summary. */
static json_t *push_and_compare(struct proj *p, int allow_conflicts, const char *when)
{
    json_t *o = push_json_ex(p, 0, NULL);
    if (!json_is_true(json_object_get(o, "ok")) || jint(o, "failed_count") != 0)
        fail_msg("%s: push reported failures: %s", when, json_dumps(o, 0));
    expect_same_tree_opts(p->local, p->remote, allow_conflicts, NULL, when);
    return o;
}

static void push_compare_drop(struct proj *p, const char *when)
{
    json_decref(push_and_compare(p, 0, when));
}

/* A mixed project: nested and empty directories, empty, small, medium and one 3 MiB file, modes
 * 0644/0755/0600, relative and dangling symlinks. Returns the number of regular files. */
static int generate_tree(const char *root, uint64_t seed)
{
    static const char *dirs[] = {"",         "src",     "src/models", "src/utils",
                                 "data/raw", "scripts", "docs/a/b/c"};
    int files = 0;
    for (int i = 0; i < 90; i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "%s%sf%03d.%s", dirs[i % 7], i % 7 ? "/" : "", i,
                 i % 3 ? "py" : "txt");
        size_t size = i % 10 == 0 ? 0 : i % 7 == 3 ? 70000 + (size_t)i : 100 + (size_t)i * 37;
        mode_t mode = i % 5 == 0 ? 0755 : i % 11 == 0 ? 0600 : 0644;
        put_random(root, rel, size, seed + (uint64_t)i, mode);
        files++;
    }
    put_random(root, "data/raw/big.bin", 3 << 20, seed ^ 0xb16, 0644);
    make_dirs(root, "empty/nested-empty");
    make_dirs(root, "empty2");
    make_link(root, "src/link-rel", "models/f002.py");
    make_link(root, "dangling", "no/such/file");
    make_link(root, "scripts/dirlink", "../src");
    return files + 1;
}

/* ---- group ---- */

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&sshd) != 0)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_test_sshd_destroy(&sshd);
    return 0;
}

static struct proj cur; /* the current test's project, removed by its teardown */

static int proj_teardown(void **state)
{
    (void)state;
    proj_free(&cur);
    return 0;
}

/* ---- scenarios shared by the agent and SFTP transports ---- */

static void scenario_first_sync(struct proj *p)
{
    int files = generate_tree(p->local, 42);
    json_t *o = push_and_compare(p, 0, "first sync");
    expect_count(o, "sent", files);
    expect_count(o, "deleted", 0);
    json_decref(o);
    o = push_and_compare(p, 0, "second push, nothing changed");
    expect_count(o, "sent", 0);
    json_decref(o);
}

static void scenario_changes(struct proj *p)
{
    generate_tree(p->local, 7);
    push_compare_drop(p, "first sync");
    json_t *o;

    put_text(p->local, "src/new file.py", "print('new')\n", 0644);
    o = push_and_compare(p, 0, "create");
    expect_count(o, "sent", 1);
    json_decref(o);

    put_text(p->local, "src/f001.py", "modified\n", 0644);
    o = push_and_compare(p, 0, "modify");
    expect_count(o, "sent", 1);
    json_decref(o);

    remove_path(p->local, "src/utils/f017.py");
    o = push_and_compare(p, 0, "delete");
    expect_count(o, "deleted", 1);
    expect_count(o, "sent", 0);
    json_decref(o);

    move_path(p->local, "data/raw/big.bin", "data/raw/big-renamed.bin");
    o = push_and_compare(p, 0, "rename a file");
    expect_count(o, "renamed", 1);
    expect_count(o, "sent", 0);
    json_decref(o);

    move_path(p->local, "src/models", "src/networks");
    o = push_and_compare(p, 0, "rename a directory");
    expect_count(o, "renamed", 1); /* one rename, not one per file */
    expect_count(o, "sent", 0);
    expect_count(o, "deleted", 0);
    json_decref(o);

    make_dirs(p->local, "new-dir/sub/leaf");
    push_compare_drop(p, "mkdir (empty directories)");
    remove_path(p->local, "empty/nested-empty");
    push_compare_drop(p, "rmdir");
    remove_path(p->local, "docs");
    push_compare_drop(p, "remove a directory tree");

    char path[256];
    snprintf(path, sizeof(path), "%s/src/f008.py", p->local);
    assert_int_equal(chmod(path, 0755), 0);
    o = push_and_compare(p, 0, "chmod +x");
    assert_int_equal(jint(o, "sent") + jint(o, "bytes"), 0); /* a mode change sends no content */
    assert_int_equal(jint(o, "chmods"), 1);                  /* but the summary counts it */
    json_decref(o);

    make_link(p->local, "link-new", "src/f001.py");
    o = push_and_compare(p, 0, "symlink create");
    assert_int_equal(jint(o, "symlinks"), 1);
    json_decref(o);
    make_link(p->local, "link-new", "src/new file.py");
    push_compare_drop(p, "symlink retarget");
    remove_path(p->local, "link-new");
    push_compare_drop(p, "symlink delete");
    remove_path(p->local, "src/link-rel");
    make_dirs(p->local, "src/link-rel");
    put_text(p->local, "src/link-rel/now-a-dir.txt", "x\n", 0644);
    push_compare_drop(p, "symlink replaced by a directory");
    remove_path(p->local, "src/f001.py");
    make_link(p->local, "src/f001.py", "f004.py");
    push_compare_drop(p, "file replaced by a symlink");
}

static void scenario_conflict(struct proj *p)
{
    put_text(p->local, "train.py", "v1\n", 0644);
    put_text(p->local, "gone.py", "g1\n", 0644);
    push_compare_drop(p, "first push");
    put_text(p->remote, "train.py", "edited on the server\n", 0644);
    put_text(p->remote, "gone.py", "also edited on the server\n", 0644);
    put_text(p->remote, "server-only.txt", "made on the server\n", 0644);
    put_text(p->local, "train.py", "v2\n", 0644);
    remove_path(p->local, "gone.py");

    json_t *o = push_json_ex(p, 0, NULL);
    json_t *conflicts = json_object_get(o, "conflicts");
    assert_true(json_is_array(conflicts));
    if (json_array_size(conflicts) != 2)
        fail_msg("want 2 conflicts reported: %s", json_dumps(o, 0));
    int saw_train = 0, saw_gone = 0;
    size_t i;
    json_t *c;
    json_array_foreach(conflicts, i, c)
    {
        const char *path = json_string_value(json_object_get(c, "path"));
        const char *kept = json_string_value(json_object_get(c, "kept"));
        assert_non_null(path);
        assert_non_null(kept);
        assert_non_null(strstr(kept, CONFLICT_TAG));
        if (!exists(p->remote, kept)) /* "kept" is the copy's path in the project */
            fail_msg("conflict copy %s reported but not on the server", kept);
        saw_train |= !strcmp(path, "train.py");
        saw_gone |= !strcmp(path, "gone.py");
    }
    assert_true(saw_train && saw_gone);
    json_decref(o);

    /* the server's edits are kept beside the new version; nothing is lost */
    char **names = list_dir(p->remote, "");
    int kept_train = 0, kept_gone = 0;
    for (size_t k = 0; names[k]; k++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", p->remote, names[k]);
        struct gs_buf b = GS_BUF_INIT;
        if (!strncmp(names[k], "train.py" CONFLICT_TAG, strlen("train.py" CONFLICT_TAG))) {
            assert_int_equal(gs_test_slurp(path, &b), 0);
            assert_string_equal(b.data, "edited on the server\n");
            kept_train++;
        } else if (!strncmp(names[k], "gone.py" CONFLICT_TAG, strlen("gone.py" CONFLICT_TAG))) {
            assert_int_equal(gs_test_slurp(path, &b), 0);
            assert_string_equal(b.data, "also edited on the server\n");
            kept_gone++;
        }
        gs_buf_release(&b);
    }
    free_list(names);
    assert_int_equal(kept_train, 1);
    assert_int_equal(kept_gone, 1);
    assert_false(exists(p->remote, "gone.py"));
    /* a file gpusync never wrote is never deleted */
    assert_true(exists(p->remote, "server-only.txt"));
    remove_path(p->remote, "server-only.txt");
    expect_same_tree_opts(p->local, p->remote, 1, NULL, "after the conflict push");
    o = push_and_compare(p, 1, "push after the conflict");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    expect_count(o, "sent", 0);
    json_decref(o);
}

/* Sets rel's mtime (atime too) under root. */
static void set_mtime(const char *root, const char *rel, time_t sec, long nsec)
{
    char path[512];
    path_at(path, sizeof(path), root, rel);
    struct timespec ts[2] = {{sec, nsec}, {sec, nsec}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW), 0);
}

/* Fails unless the server copy of rel has the local copy's mtime: to the nanosecond over the
 * agent, to the second over SFTP (its attributes carry whole seconds). */
static void expect_same_mtime(const struct proj *p, const char *rel, int ns)
{
    char l[512], r[512];
    struct stat ls, rs;
    path_at(l, sizeof(l), p->local, rel);
    path_at(r, sizeof(r), p->remote, rel);
    assert_int_equal(lstat(l, &ls), 0);
    assert_int_equal(lstat(r, &rs), 0);
    if (ls.st_mtim.tv_sec != rs.st_mtim.tv_sec || (ns && ls.st_mtim.tv_nsec != rs.st_mtim.tv_nsec))
        fail_msg("%s: mtime %lld.%09ld here, %lld.%09ld on the server", rel,
                 (long long)ls.st_mtim.tv_sec, ls.st_mtim.tv_nsec, (long long)rs.st_mtim.tv_sec,
                 rs.st_mtim.tv_nsec);
}

/* `touch` changes no byte, but `make` on the server must see it: the push sends the mtime (one
 * chmod each, counted under chmods), no content, and the server copy takes the local mtime;
 * `status` counts it as pending; a second push sends nothing. `ns`: the transport keeps
 * nanoseconds and mtimes before 1970 (the agent; SFTP's attributes are u32 seconds). */
static void scenario_touch(struct proj *p, int ns)
{
    put_text(p->local, "src/main.c", "int main(void) { return 0; }\n", 0644);
    put_text(p->local, "Makefile", "all: main\n", 0644);
    put_text(p->local, "old.txt", "older than 1970\n", 0600);
    set_mtime(p->local, "src/main.c", 1700000000, 0); /* long past: each stat is cached */
    set_mtime(p->local, "Makefile", 1700000000, 5);
    set_mtime(p->local, "old.txt", 1700000000, 0);
    push_compare_drop(p, "first push");
    expect_same_mtime(p, "Makefile", ns); /* a put takes the local mtime as well */

    set_mtime(p->local, "src/main.c", 1800000000, ns ? 123456789 : 0);
    set_mtime(p->local, "old.txt", ns ? -86400 : 86400, ns ? 42 : 0);
    json_t *o = status_json(p);
    expect_count(o, "pending", 2);
    expect_count(o, "bytes_pending", 0);
    json_decref(o);
    o = push_and_compare(p, 0, "push after touch");
    expect_count(o, "sent", 0);
    expect_count(o, "bytes", 0);
    expect_count(o, "chmods", 2);
    expect_count(o, "unchanged", 0);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    expect_same_mtime(p, "src/main.c", ns);
    expect_same_mtime(p, "old.txt", ns);
    expect_same_mtime(p, "Makefile", ns);

    o = push_and_compare(p, 0, "second push");
    expect_count(o, "sent", 0);
    expect_count(o, "chmods", 0);
    expect_count(o, "bytes", 0);
    json_decref(o);
}

/* Fails unless the server copy of rel has mtime sec.nsec. */
static void expect_server_mtime(const struct proj *p, const char *rel, long long sec, long nsec)
{
    char r[512];
    struct stat rs;
    path_at(r, sizeof(r), p->remote, rel);
    assert_int_equal(lstat(r, &rs), 0);
    if (rs.st_mtim.tv_sec != sec || rs.st_mtim.tv_nsec != nsec)
        fail_msg("%s: mtime %lld.%09ld on the server, want %lld.%09ld", rel,
                 (long long)rs.st_mtim.tv_sec, rs.st_mtim.tv_nsec, sec, nsec);
}

/* Files dated past what 64-bit nanoseconds hold (2300) and, over SFTP, outside 1970-2106 (1960)
 * get the nearest time there is, and are settled: the next pushes find them as gpusync left
 * them. A file of 2300 used to land in 1901 (the nanoseconds wrapped), and each push found it
 * "changed there" and sent it again. */
static void scenario_far_times(struct proj *p, int sftp)
{
    put_text(p->local, "future.txt", "from 2300\n", 0644);
    put_text(p->local, "ancient.txt", "from 1960\n", 0644);
    set_mtime(p->local, "future.txt", 10413792000, 5); /* 2300-01-01 */
    set_mtime(p->local, "ancient.txt", -315619200, 7); /* 1960-01-01 */
    json_decref(push_json_ex(p, 0, NULL));
    if (sftp) {
        expect_server_mtime(p, "future.txt", 4294967295LL, 0); /* 2106-02-07 */
        expect_server_mtime(p, "ancient.txt", 0, 0);
    } else {
        expect_server_mtime(p, "future.txt", 9223372036LL, 854775807); /* 2262-04-11 */
        expect_server_mtime(p, "ancient.txt", -315619200, 7);
    }
    for (int i = 0; i < 2; i++) {
        json_t *o = push_json_ex(p, 0, NULL);
        expect_count(o, "sent", 0);
        expect_count(o, "chmods", 0);
        expect_count(o, "server_changed", 0);
        assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
        json_decref(o);
    }
    json_t *o = status_json(p);
    expect_count(o, "pending", 0);
    json_decref(o);
}

static void test_push__times_past_what_nanoseconds_hold_are_settled(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_far_times(&cur, 0);
}

static void test_sftp__times_outside_what_sftp_holds_are_settled(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_far_times(&cur, 1);
}

/* An edit made on the server that keeps the size and the mtime to the second passes the quick
 * check; a touch here must not stamp it, which would hide it for good: the push sends the local
 * file whole and keeps the server's as a conflict copy, reported in --json. */
static void scenario_touch_over_a_server_edit(struct proj *p)
{
    put_text(p->local, "cfg.yaml", "lr: 0.1\n", 0644);
    set_mtime(p->local, "cfg.yaml", 1700000000, 0);
    push_compare_drop(p, "first push");
    put_text(p->remote, "cfg.yaml", "lr: 0.5\n", 0644); /* same size */
    set_mtime(p->remote, "cfg.yaml", 1700000000, 999);  /* same second */
    set_mtime(p->local, "cfg.yaml", 1700000100, 0);

    json_t *o = push_json_ex(p, 0, NULL);
    json_t *conflicts = json_object_get(o, "conflicts");
    if (json_array_size(conflicts) != 1 || jint(o, "failed_count") != 0)
        fail_msg("want the server's edit kept as one conflict: %s", json_dumps(o, 0));
    json_t *c = json_array_get(conflicts, 0);
    assert_string_equal(json_string_value(json_object_get(c, "path")), "cfg.yaml");
    const char *kept = json_string_value(json_object_get(c, "kept"));
    char path[512];
    struct gs_buf b = GS_BUF_INIT;
    path_at(path, sizeof(path), p->remote, kept);
    assert_int_equal(gs_test_slurp(path, &b), 0);
    assert_string_equal(b.data, "lr: 0.5\n");
    gs_buf_release(&b);
    json_decref(o);
    expect_same_tree_opts(p->local, p->remote, 1, NULL, "after the touch");
    expect_same_mtime(p, "cfg.yaml", 0);
}

/* A directory gpusync made, deleted locally, that a file replaced on the server: the file is
 * kept as a conflict copy and reported, not deleted (the delete used to carry no expectation). */
static void scenario_dir_replaced_by_a_file(struct proj *p)
{
    make_dirs(p->local, "out");
    push_compare_drop(p, "first push");
    remove_path(p->remote, "out");
    put_text(p->remote, "out", "a file made on the server\n", 0644);
    remove_path(p->local, "out");
    json_t *o = push_json_ex(p, 0, NULL);
    json_t *conflicts = json_object_get(o, "conflicts");
    if (json_array_size(conflicts) != 1)
        fail_msg("want the server's file reported as a conflict: %s", json_dumps(o, 0));
    json_t *c = json_array_get(conflicts, 0);
    assert_string_equal(json_string_value(json_object_get(c, "path")), "out");
    const char *kept = json_string_value(json_object_get(c, "kept"));
    char path[512];
    struct gs_buf b = GS_BUF_INIT;
    snprintf(path, sizeof(path), "%s/%s", p->remote, kept);
    assert_int_equal(gs_test_slurp(path, &b), 0);
    assert_string_equal(b.data, "a file made on the server\n");
    gs_buf_release(&b);
    json_decref(o);
    assert_false(exists(p->remote, "out"));
}

/* ---- agent transport ---- */

static void test_push__first_sync_mirrors_a_generated_tree(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_first_sync(&cur);
}

static void test_push__every_kind_of_change_is_mirrored(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_changes(&cur);
}

static void test_push__a_touch_reaches_the_server_without_the_bytes(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_touch(&cur, 1);
}

static void test_push__a_touch_never_stamps_a_copy_edited_on_the_server(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_touch_over_a_server_edit(&cur);
}

static void test_push__server_edit_is_kept_as_conflict_copy_and_reported(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_conflict(&cur);
}

static void test_push__directory_replaced_by_a_file_on_the_server_is_kept(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    scenario_dir_replaced_by_a_file(&cur);
}

static void test_push__server_edit_then_local_rename_is_kept_as_conflict(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    put_text(cur.local, "a.py", "original\n", 0644);
    push_compare_drop(&cur, "first push");
    put_text(cur.remote, "a.py", "edited on the server\n", 0644);
    move_path(cur.local, "a.py", "b.py");
    json_t *o = push_json_ex(&cur, 0, NULL);
    if (json_array_size(json_object_get(o, "conflicts")) != 1)
        fail_msg("the server's edit was not reported: %s", json_dumps(o, 0));
    json_decref(o);
    expect_same_tree_opts(cur.local, cur.remote, 1, NULL, "after a rename of an edited file");
}

static void test_push__hostile_names_round_trip(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    char long_name[256];
    memset(long_name, 'n', 255);
    memcpy(long_name + 251, ".txt", 5); /* 255 bytes, the NAME_MAX of ext4 and tmpfs */
    const char *names[] = {"with space.txt",
                           " leading space",
                           "trailing space ",
                           "new\nline.txt",
                           "-rf",
                           "--help",
                           "\xff\xfe not utf-8 \x80",
                           "q'uo\"te $x `y` \\*?[a]",
                           "tab\there",
                           long_name,
                           "dir -x\n/inner -y.txt",
                           "dir -x\n/\xc3(bad"};
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
        put_text(cur.local, names[i], names[i], i % 2 ? 0755 : 0644);
    make_link(cur.local, "link to -rf", "-rf");
    push_compare_drop(&cur, "hostile names, first push");
    /* names that are not UTF-8 still count, and still report conflicts, in --json output */
    put_text(cur.remote, names[6], "edited on the server\n", 0644);
    put_text(cur.local, names[6], "edited here\n", 0644);
    put_text(cur.local, "new \xff file", "new\n", 0644);
    json_t *st = status_json(&cur);
    expect_count(st, "pending", 2);
    assert_int_equal(json_array_size(json_object_get(st, "ops")), 2);
    json_decref(st);
    json_t *o = push_json_ex(&cur, 0, NULL);
    json_t *conflicts = json_object_get(o, "conflicts");
    if (json_array_size(conflicts) != 1)
        fail_msg("conflict on a non-UTF-8 name not reported: %s", json_dumps(o, 0));
    const char *shown = json_string_value(json_object_get(json_array_get(conflicts, 0), "path"));
    assert_non_null(strstr(shown, "\xef\xbf\xbd")); /* U+FFFD stands for the bad bytes */
    json_decref(o);
    expect_same_tree_opts(cur.local, cur.remote, 1, NULL, "conflict on a non-UTF-8 name");
    assert_int_equal(gs_test_sh("find '%s' -name '*" CONFLICT_TAG "*' -delete", cur.remote), 0);
    put_text(cur.local, "new\nline.txt", "changed\n", 0644);
    move_path(cur.local, "-rf", "--renamed\n\xff");
    remove_path(cur.local, long_name);
    move_path(cur.local, "dir -x\n", "dir \x01 renamed");
    push_compare_drop(&cur, "hostile names, changes");
}

/* Fails unless `text` is UTF-8 with no control byte but line ends, and holds each of `shown`. */
static void expect_terminal_safe(const char *text, const char *const *shown, const char *what)
{
    for (const char *c = text; *c;) {
        size_t n = gs_quote_utf8_len(c);
        if (!n || (n == 1 && ((unsigned char)*c < 0x20 && *c != '\n')) || *c == 0x7f)
            fail_msg("%s: raw byte 0x%02x at %zu reached the terminal: %s", what, (unsigned char)*c,
                     (size_t)(c - text), text);
        c += n;
    }
    for (size_t i = 0; shown && shown[i]; i++)
        if (!strstr(text, shown[i]))
            fail_msg("%s: want %s in: %s", what, shown[i], text);
}

/* Text output shows a name with a newline, an escape sequence, a tab or a byte that is not UTF-8
 * quoted with C escapes, never raw: status lists them so, push's conflict line too; the files
 * still arrive byte for byte. */
static void test_push__unusual_names_are_quoted_in_text_output(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    const char *names[] = {"new\nline.txt", "\x1b[31mred", "tab\there", "bad\xff.txt",
                           "donn\xc3\xa9"
                           "es.txt"};
    const char *shown[] = {"\"new\\nline.txt\"",
                           "\"\\e[31mred\"",
                           "\"tab\\there\"",
                           "\"bad\\xff.txt\"",
                           " donn\xc3\xa9"
                           "es.txt\n",
                           NULL};
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
        put_text(cur.local, names[i], "content\n", 0644);
    struct gs_test_result r = run_gpusync(cur.local, ARGS("status"));
    expect_status(&r, 0, "gpusync status");
    expect_terminal_safe(r.out.data, shown, "status");
    gs_test_result_release(&r);
    r = run_gpusync(cur.local, ARGS("push"));
    expect_status(&r, 0, "gpusync push");
    expect_terminal_safe(r.out.data, NULL, "push's stdout");
    expect_terminal_safe(r.err.data, NULL, "push's stderr");
    gs_test_result_release(&r);
    expect_same_tree_opts(cur.local, cur.remote, 0, NULL, "unusual names pushed");
    /* changed on both sides: the conflict line names both copies, quoted */
    put_text(cur.remote, names[1], "edited on the server\n", 0644);
    put_text(cur.local, names[1], "edited here\n", 0644);
    r = run_gpusync(cur.local, ARGS("push"));
    expect_status(&r, 0, "gpusync push after a conflict");
    expect_terminal_safe(r.out.data, NULL, "push's stdout after a conflict");
    expect_terminal_safe(r.err.data,
                         ((const char *[]){"conflict: \"\\e[31mred\" on the server",
                                           "kept as \"\\e[31mred" CONFLICT_TAG, NULL}),
                         "push's conflict line");
    gs_test_result_release(&r);
    expect_same_tree_opts(cur.local, cur.remote, 1, NULL, "unusual names after the conflict");
    r = run_gpusync(cur.local, ARGS("status"));
    expect_status(&r, 0, "gpusync status when synced");
    expect_terminal_safe(r.out.data, NULL, "status when synced");
    gs_test_result_release(&r);
}

static void test_push__symlink_out_of_the_tree_is_mirrored_not_followed(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    char outside[128], secret[160];
    snprintf(outside, sizeof(outside), "%s/outside", cur.dir);
    put_text(outside, "secret.txt", "not part of the project\n", 0600);
    snprintf(secret, sizeof(secret), "%s/secret.txt", outside);
    make_link(cur.local, "abs-file", secret);
    make_link(cur.local, "abs-dir", outside);
    make_link(cur.local, "rel-up", "../outside/secret.txt");
    put_text(cur.local, "real.txt", "real\n", 0644);
    json_t *o = push_and_compare(&cur, 0, "links out of the tree");
    expect_count(o, "sent", 1); /* only real.txt has content */
    json_decref(o);
    struct stat st;
    char path[256];
    snprintf(path, sizeof(path), "%s/abs-dir", cur.remote);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    /* the link turns into a real directory locally: the server must replace its link, never
     * write through it into the directory it points at */
    remove_path(cur.local, "abs-dir");
    put_text(cur.local, "abs-dir/inside.txt", "inside\n", 0644);
    remove_path(cur.local, "abs-file");
    put_text(cur.local, "abs-file", "now a file\n", 0644);
    push_compare_drop(&cur, "links replaced by real entries");
    char **left = list_dir(outside, "");
    assert_non_null(left[0]);
    assert_string_equal(left[0], "secret.txt");
    assert_null(left[1]);
    free_list(left);
    snprintf(path, sizeof(path), "%s/secret.txt", outside);
    struct gs_buf b = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(path, &b), 0);
    assert_string_equal(b.data, "not part of the project\n");
    gs_buf_release(&b);
}

static void test_push__gitignore_and_sync_exclude_are_respected(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    assert_int_equal(gs_test_sh("cd '%s' && git init -q .", cur.local), 0);
    put_text(cur.local, ".gitignore", "*.log\nbuild/\n!keep.log\n", 0644);
    put_text(cur.local, "src/sub/.gitignore", "secret-*\n", 0644);
    proj_add_config(&cur, "[sync]\n\texclude = data/*.bin\n\texclude = ckpt/\n");
    put_text(cur.local, "train.py", "x\n", 0644);
    put_text(cur.local, "run.log", "log\n", 0644);
    put_text(cur.local, "keep.log", "kept\n", 0644);
    put_text(cur.local, "build/out.o", "obj\n", 0644);
    put_text(cur.local, "src/sub/secret-key", "k\n", 0600);
    put_text(cur.local, "src/sub/public", "p\n", 0644);
    put_text(cur.local, "data/big.bin", "bin\n", 0644);
    put_text(cur.local, "data/labels.csv", "csv\n", 0644);
    put_text(cur.local, "ckpt/model.pt", "pt\n", 0644);
    const char *ignored[] = {"run.log",      "build", "src/sub/secret-key",
                             "data/big.bin", "ckpt",  NULL};
    json_t *o = push_json_ex(&cur, 0, NULL);
    json_decref(o);
    expect_same_tree_opts(cur.local, cur.remote, 0, ignored, "ignore rules");
    for (size_t i = 0; ignored[i]; i++)
        if (exists(cur.remote, ignored[i]))
            fail_msg("ignored path %s reached the server", ignored[i]);
    assert_true(exists(cur.remote, "keep.log"));
    assert_true(exists(cur.remote, ".gitignore"));
    assert_false(exists(cur.remote, ".git"));
    assert_false(exists(cur.remote, ".gpusync/index.db"));
}

/* A fingerprint of a tree (paths, kinds, modes, sizes, targets, bytes) as text. */
/* A file whose path, with the project's folder, is longer than the system can open (the project
 * was moved into a deeper folder after its first push). The push reports it as a failure (exit 1,
 * errno's ENAMETOOLONG named) and sends the rest, but deletes nothing of what the server holds
 * there: it cannot tell that the file is gone. Before, it skipped it with a log line, exited 0,
 * and deleted the server's copy. */
static void test_push__a_path_too_long_to_open_fails_and_deletes_nothing(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    /* 21 folders of 180 bytes: about 3,820 bytes below the project, which fits now */
    char rel[4096] = "deep", comp[181];
    memset(comp, 'd', 180);
    comp[180] = '\0';
    for (int i = 0; i < 21; i++)
        snprintf(rel + strlen(rel), sizeof(rel) - strlen(rel), "/%s", comp);
    make_dirs(cur.local, rel);
    strcat(rel, "/weights.txt");
    put_text(cur.local, rel, "the trained weights\n", 0644);
    push_compare_drop(&cur, "first push, the deep path fits");

    /* the project moves 251 bytes deeper: the deep file's path no longer fits in PATH_MAX (not
     * much deeper: SQLite opens no database whose path is over 512 bytes) */
    char moved[700];
    int n = snprintf(moved, sizeof(moved), "%s/%0250d", cur.dir, 0);
    assert_true(n > 0 && (size_t)n < sizeof(moved));
    assert_int_equal(gs_test_sh("mkdir -p '%s'", moved), 0);
    strcat(moved, "/local");
    assert_int_equal(rename(cur.local, moved), 0);
    put_text(moved, "fresh.py", "print('sent all the same')\n", 0644);
    struct gs_test_result r = run_gpusync(moved, ARGS("push", "--json"));
    expect_status(&r, 1, "push with a path too long to open");
    json_t *o = parse_json(&r, "push --json");
    gs_test_result_release(&r);
    char *text = json_dumps(o, 0);
    expect_count(o, "deleted", 0);
    json_t *failures = json_object_get(o, "failures");
    const char *err = json_string_value(json_object_get(json_array_get(failures, 0), "error"));
    if (json_array_size(failures) != 1 || !err || !strstr(err, "shorten it"))
        fail_msg("want one failure naming the path too long: %s", text);
    free(text);
    json_decref(o);
    char held[8192];
    snprintf(held, sizeof(held), "%s/%s", cur.remote, rel);
    assert_true(gs_test_sh("cmp -s '%s/fresh.py' '%s/fresh.py'", moved, cur.remote) == 0);
    if (gs_test_sh("grep -qx 'the trained weights' '%s'", held) != 0)
        fail_msg("the server's copy of the deep file is gone or changed");
    /* and status does not call it up to date: the path is pending, with why it cannot be sent */
    r = run_gpusync(moved, ARGS("status", "--json"));
    expect_status(&r, 0, "status with a path too long to open");
    o = parse_json(&r, "status --json");
    gs_test_result_release(&r);
    text = json_dumps(o, 0);
    json_t *op = json_array_get(json_object_get(o, "ops"), 0);
    if (strcmp(json_string_value(json_object_get(o, "state")), "pending") != 0 ||
        jint(o, "pending") != 1 || !json_is_string(json_object_get(op, "error")))
        fail_msg("status must list the path too long as pending, with its error: %s", text);
    free(text);
    json_decref(o);
    assert_int_equal(rename(moved, cur.local), 0); /* for the teardown */
}

static void fingerprint(const char *root, const char *rel, struct gs_buf *out)
{
    char **names = list_dir(root, rel);
    struct gs_buf content = GS_BUF_INIT;
    for (size_t i = 0; names[i]; i++) {
        char child[4096], path[4096];
        path_at(child, sizeof(child), rel, names[i]);
        path_at(path, sizeof(path), root, child);
        struct stat st;
        if (lstat(path, &st) != 0)
            continue;
        gs_buf_addf(out, "%s|%o|%lld|%lld\n", child, st.st_mode, (long long)st.st_size,
                    (long long)st.st_mtim.tv_sec);
        if (S_ISDIR(st.st_mode))
            fingerprint(root, child, out);
        else if (S_ISREG(st.st_mode) && gs_test_slurp(path, &content) == 0)
            gs_buf_add(out, content.data, content.len);
    }
    gs_buf_release(&content);
    free_list(names);
}

static void test_push__dry_run_changes_nothing(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 11);
    push_compare_drop(&cur, "first sync");
    put_text(cur.local, "added.py", "new\n", 0644);
    remove_path(cur.local, "src/f001.py");
    move_path(cur.local, "src/utils", "src/helpers");
    put_text(cur.local, "f000.txt", "changed\n", 0755);
    struct gs_buf before = GS_BUF_INIT, after = GS_BUF_INIT;
    fingerprint(cur.remote, "", &before);
    json_t *st0 = status_json(&cur);
    struct gs_test_result r = run_gpusync(cur.local, ARGS("push", "--dry-run", "--json"));
    expect_status(&r, 0, "push --dry-run --json");
    json_t *o = parse_json(&r, "push --dry-run --json");
    gs_test_result_release(&r);
    assert_true(json_is_true(json_object_get(o, "dry_run")));
    json_t *ops = json_object_get(o, "ops");
    assert_true(json_is_array(ops));
    assert_int_equal(json_array_size(ops), jint(st0, "pending"));
    expect_count(o, "sent", 0);
    json_decref(o);
    r = run_gpusync(cur.local, ARGS("push", "-n"));
    expect_status(&r, 0, "push -n");
    assert_non_null(strstr(r.out.data, "added.py"));
    gs_test_result_release(&r);
    fingerprint(cur.remote, "", &after);
    assert_int_equal(before.len, after.len);
    assert_memory_equal(before.data, after.data, before.len);
    json_t *st1 = status_json(&cur); /* the index did not move either */
    assert_int_equal(jint(st1, "pending"), jint(st0, "pending"));
    json_decref(st0);
    json_decref(st1);
    gs_buf_release(&before);
    gs_buf_release(&after);
    push_compare_drop(&cur, "the real push after the dry run");
}

static void test_push__paths_restrict_what_is_sent(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 13);
    push_compare_drop(&cur, "first sync");
    put_text(cur.local, "src/models/changed.py", "only this\n", 0644);
    put_text(cur.local, "scripts/later.py", "not yet\n", 0644);
    remove_path(cur.local, "src/models/f002.py");
    struct gs_test_result r = run_gpusync(cur.local, ARGS("push", "--json", "src/models"));
    expect_status(&r, 0, "push --json src/models");
    json_t *o = parse_json(&r, "push --json src/models");
    gs_test_result_release(&r);
    expect_count(o, "sent", 1);
    expect_count(o, "deleted", 1);
    json_decref(o);
    assert_true(exists(cur.remote, "src/models/changed.py"));
    assert_false(exists(cur.remote, "src/models/f002.py"));
    assert_false(exists(cur.remote, "scripts/later.py"));
    o = status_json(&cur);
    expect_count(o, "pending", 1); /* scripts/later.py */
    json_decref(o);
    push_compare_drop(&cur, "the rest");
}

/* A PATH neither in the project nor in the index is a typo: an error naming it (exit 1, "not
 * found"), where the push sent nothing and succeeded. A file or folder deleted since its sync is
 * in the index, and pushing it by name still sends the deletion. */
static void test_push__a_path_that_never_existed_is_an_error(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    put_text(cur.local, "gone.txt", "deleted later\n", 0644);
    put_text(cur.local, "olddir/x.py", "deleted later\n", 0644);
    push_compare_drop(&cur, "first sync");
    remove_path(cur.local, "gone.txt");
    remove_path(cur.local, "olddir");
    struct gs_test_result r = run_gpusync(cur.local, ARGS("push", "--json", "no-such-file.py"));
    expect_status(&r, 1, "push --json no-such-file.py");
    json_t *o = parse_json(&r, "push --json no-such-file.py");
    gs_test_result_release(&r);
    assert_string_equal(json_string_value(json_object_get(o, "error")), "not found");
    assert_non_null(strstr(json_string_value(json_object_get(o, "message")), "no-such-file.py"));
    json_decref(o);
    assert_true(exists(cur.remote, "gone.txt")); /* nothing was pushed */
    r = run_gpusync(cur.local, ARGS("push", "--json", "gone.txt", "olddir"));
    expect_status(&r, 0, "push --json gone.txt olddir (both deleted)");
    gs_test_result_release(&r);
    assert_false(exists(cur.remote, "gone.txt"));
    assert_false(exists(cur.remote, "olddir"));
    /* the same through a running watch daemon, which pushes for the command */
    r = run_gpusync(cur.local, ARGS("watch", "-d"));
    expect_status(&r, 0, "watch -d");
    gs_test_result_release(&r);
    r = run_gpusync(cur.local, ARGS("push", "--json", "no-such-file.py"));
    struct gs_test_result stop = run_gpusync(cur.local, ARGS("watch", "--stop"));
    gs_test_result_release(&stop);
    expect_status(&r, 1, "push --json no-such-file.py through the watch daemon");
    o = parse_json(&r, "push --json no-such-file.py through the watch daemon");
    gs_test_result_release(&r);
    assert_string_equal(json_string_value(json_object_get(o, "error")), "not found");
    json_decref(o);
}

static void test_status__json_counts_pending_changes(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    json_t *o = status_json(&cur);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "up_to_date");
    expect_count(o, "pending", 0);
    json_decref(o);
    put_text(cur.local, "a.py", "a\n", 0644);
    put_text(cur.local, "b.py", "b\n", 0644);
    put_text(cur.local, "c.py", "c\n", 0644);
    o = status_json(&cur);
    assert_string_equal(json_string_value(json_object_get(o, "state")), "pending");
    expect_count(o, "pending", 3);
    assert_int_equal(json_array_size(json_object_get(o, "ops")), 3);
    expect_count(o, "bytes_pending", 6);
    json_decref(o);
    push_compare_drop(&cur, "push");
    o = status_json(&cur);
    expect_count(o, "pending", 0);
    json_decref(o);
    put_text(cur.local, "a.py", "a2\n", 0644); /* modify */
    remove_path(cur.local, "b.py");            /* delete */
    put_text(cur.local, "d.py", "d\n", 0644);  /* create */
    o = status_json(&cur);
    expect_count(o, "pending", 3);
    json_decref(o);
    assert_int_equal(gs_test_sh("touch -d '2030-01-01' '%s/c.py'", cur.local), 0);
    o = status_json(&cur); /* a touch alone is a pending change too: its mtime goes */
    expect_count(o, "pending", 4);
    expect_count(o, "bytes_pending", 5); /* a2 and d: the touch sends no byte */
    json_decref(o);
}

static void test_pull__file_and_directory_arrive_whole(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    push_compare_drop(&cur, "empty project");
    put_random(cur.remote, "out/ckpt.bin", (1 << 20) + 123, 99, 0644);
    put_text(cur.remote, "out/logs/rank0.log", "epoch 1 loss 0.5\n", 0644);
    put_text(cur.remote, "out/logs/rank1.log", "", 0644);
    put_text(cur.remote, "out/metrics.json", "{\"acc\": 0.9}\n", 0644);
    /* an old local copy with a second hard link: an atomic replace leaves the link's bytes alone,
     * an in-place rewrite would change them */
    put_text(cur.local, "out/ckpt.bin", "old checkpoint\n", 0644);
    char a[256], b[256], r1[256];
    snprintf(a, sizeof(a), "%s/out/ckpt.bin", cur.local);
    snprintf(b, sizeof(b), "%s/old-link", cur.local);
    assert_int_equal(link(a, b), 0);
    struct gs_test_result r = run_gpusync(cur.local, ARGS("pull", "--json", "out/ckpt.bin"));
    expect_status(&r, 0, "pull a file");
    json_t *one = parse_json(&r, "pull --json FILE");
    expect_count(one, "bytes", (1 << 20) + 123);
    json_decref(one);
    gs_test_result_release(&r);
    snprintf(r1, sizeof(r1), "%s/out/ckpt.bin", cur.remote);
    assert_true(same_bytes(a, r1));
    struct gs_buf old = GS_BUF_INIT;
    assert_int_equal(gs_test_slurp(b, &old), 0);
    assert_string_equal(old.data, "old checkpoint\n");
    gs_buf_release(&old);

    char dest[256];
    snprintf(dest, sizeof(dest), "%s/results", cur.dir);
    r = run_gpusync(cur.local, ARGS("pull", "--json", "out", dest));
    expect_status(&r, 0, "pull a directory");
    json_t *o = parse_json(&r, "pull --json");
    assert_int_equal(json_array_size(json_object_get(o, "files")), 4);
    expect_count(o, "bytes", (1 << 20) + 123 + 17 + 13);
    json_decref(o);
    gs_test_result_release(&r);
    char src[256];
    snprintf(src, sizeof(src), "%s/out", cur.remote);
    struct diff d = {.lroot = dest, .rroot = src};
    if (diff_dir(&d, ""))
        fail_msg("pulled directory differs: %s", d.why);
    r = run_gpusync(cur.local, ARGS("pull", "no/such/file"));
    assert_int_not_equal(r.status, 0);
    gs_test_result_release(&r);
}

#define HUGE_SIZE    (320u << 20)
#define RSS_LIMIT_KB (100 * 1024) /* measured: about 20 MiB to push, 35-60 MiB to pull */

/* Whether peak RSS means anything: a sanitizer build of gpusync (run with ASAN_OPTIONS set, or
 * GS_TEST_NO_RSS) carries shadow memory and quarantine far above the limit. */
static int rss_checked(void)
{
    return !getenv("ASAN_OPTIONS") && !getenv("GS_TEST_NO_RSS");
}

/* "Large files stream without being held in memory", both ways. */
/* A small edit of a large file is pushed as a delta: the summary's bytes (what was handed to the
 * link) are a small part of the file, and the server holds the exact new bytes. */
static void test_push__small_edit_of_a_large_file_sends_a_delta(void **state)
{
    struct proj *p = &cur;
    *state = p;
    proj_new(p, 0, NULL);
    enum { SIZE = 3 << 20 };
    put_random(p->local, "nb.ipynb", SIZE, 42, 0644);
    push_compare_drop(p, "first push");
    char path[256];
    path_at(path, sizeof(path), p->local, "nb.ipynb");
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, SIZE / 2, SEEK_SET);
    fputs("{\"cell\": \"changed\"}", fp);
    fclose(fp);
    json_t *o = push_and_compare(p, 0, "push of the edit");
    expect_count(o, "sent", 1);
    expect_count(o, "bytes", SIZE); /* the file's size, as ever */
    if (jint(o, "link_bytes") >= 64 * 1024)
        fail_msg("the edit sent %lld bytes of a %d-byte file", jint(o, "link_bytes"), SIZE);
    json_decref(o);
}

static void test_push__large_file_streams_both_ways_in_bounded_memory(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    assert_int_equal(gs_test_sh("head -c %u /dev/urandom > '%s/weights.bin'", HUGE_SIZE, cur.local),
                     0);
    struct gs_test_result r = run_gpusync(cur.local, ARGS("push"));
    expect_status(&r, 0, "push of a large file");
    print_message("push of %u MiB: peak RSS %ld KiB\n", HUGE_SIZE >> 20, r.maxrss_kb);
    assert_true(!rss_checked() || r.maxrss_kb < RSS_LIMIT_KB);
    gs_test_result_release(&r);
    expect_same_tree_opts(cur.local, cur.remote, 0, NULL, "large file pushed");
    char dest[256], src[256];
    snprintf(dest, sizeof(dest), "%s/pulled.bin", cur.dir);
    snprintf(src, sizeof(src), "%s/weights.bin", cur.remote);
    r = run_gpusync(cur.local, ARGS("pull", "weights.bin", dest));
    expect_status(&r, 0, "pull of a large file");
    print_message("pull of %u MiB: peak RSS %ld KiB\n", HUGE_SIZE >> 20, r.maxrss_kb);
    assert_true(!rss_checked() || r.maxrss_kb < RSS_LIMIT_KB);
    gs_test_result_release(&r);
    assert_true(same_bytes(src, dest));
}

/* ---- faults: sshd killed, client killed, disk full ---- */

static struct wansim_proc wan;

static int wan_teardown(void **state)
{
    if (wan.pid)
        wansim_stop(&wan);
    memset(&wan, 0, sizeof(wan));
    return proj_teardown(state);
}

/* Writes `n` files of `size` random hex digits (about 2:1 for zstd) under root/hex. */
static void put_hex_tree(const char *root, int n, size_t size, unsigned seed)
{
    char *data = malloc(size);
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < size; k++)
            data[k] = k % 64 == 63 ? '\n' : "0123456789abcdef"[rand_r(&seed) % 16];
        char rel[64];
        snprintf(rel, sizeof(rel), "hex/h%02d.txt", i);
        put_bytes(root, rel, data, size, 0644);
    }
    free(data);
}

/* compress = auto behind an 8 Mbit/s link: the first push reads the link from the agent's
 * answers and raises the level to 9; the project keeps the rate, so the next push, a single small
 * file (too little to read a rate from), goes at level 9 from its start. On loopback the level
 * stays 1. Both trees arrive exact. */
static void test_push__a_slow_link_is_found_and_remembered(void **state)
{
    (void)state;
    char err[256];
    struct wansim_opts wo = {.target_port = sshd.port, .delay_ms = 5, .rate_mbit = 8};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    proj_new(&cur, wan.port, NULL);
    put_hex_tree(cur.local, 24, 128 * 1024, 5);
    json_t *o = push_and_compare(&cur, 0, "first push through 8 Mbit/s");
    assert_int_equal(jint(o, "compress_level"), 9);
    json_decref(o);
    put_text(cur.local, "small.py", "print('one small change')\n", 0644);
    o = push_and_compare(&cur, 0, "a small push after it");
    assert_int_equal(jint(o, "compress_level"), 9);
    json_decref(o);
    proj_free(&cur);
    proj_new(&cur, 0, NULL); /* loopback */
    put_hex_tree(cur.local, 48, 1024 * 1024, 6);
    o = push_and_compare(&cur, 0, "first push on loopback");
    assert_int_equal(jint(o, "compress_level"), 1);
    json_decref(o);
}

/* compress = auto to a server 50 ms away, nothing known of the link yet: a long SSH handshake
 * says a wide-area link, which starts at level 9 (a push too small to read the link's rate from,
 * as here, would otherwise go at level 1). */
static void test_push__a_far_server_starts_at_the_slow_links_level(void **state)
{
    (void)state;
    char err[256];
    struct wansim_opts wo = {.target_port = sshd.port, .delay_ms = 25};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    proj_new(&cur, wan.port, NULL);
    put_text(cur.local, "train.py", "print('far away')\n", 0644);
    json_t *o = push_and_compare(&cur, 0, "first push, 50 ms away");
    assert_int_equal(jint(o, "compress_level"), 9);
    json_decref(o);
}

#define BIG_FILES 10
#define BIG_SIZE  (1 << 20)

/* A pushed project behind a 16 Mbit/s link, then changes pending: BIG_FILES new 1 MiB files (about
 * 5 s to send), a rename, a delete and a modify. */
static void slow_project_with_pending_changes(void)
{
    char err[256];
    struct wansim_opts wo = {.target_port = sshd.port, .delay_ms = 5, .rate_mbit = 16};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    proj_new(&cur, wan.port, NULL);
    generate_tree(cur.local, 5);
    remove_path(cur.local, "data/raw/big.bin"); /* keep the first push short */
    push_compare_drop(&cur, "first push through the WAN simulator");
    for (int i = 0; i < BIG_FILES; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "ckpt/part-%02d.bin", i);
        put_random(cur.local, rel, BIG_SIZE, 1000 + (uint64_t)i, 0644);
    }
    move_path(cur.local, "src/f001.py", "src/f001-moved.py");
    remove_path(cur.local, "src/f008.py");
    put_text(cur.local, "scripts/f005.py", "modified before the fault\n", 0755);
}

/* Waits (bounded) until at least one of the big files is complete on the server: the push is then
 * mid-transfer. Returns 1, or 0 when `pid` ended first or the deadline passed. */
static int wait_mid_transfer(pid_t pid)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    while (gs_clock_mono_ms() < end) {
        for (int i = 0; i < BIG_FILES; i++) {
            char path[256];
            struct stat st;
            snprintf(path, sizeof(path), "%s/ckpt/part-%02d.bin", cur.remote, i);
            if (stat(path, &st) == 0 && st.st_size == BIG_SIZE)
                return 1;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return 0;
        usleep(2000);
    }
    return 0;
}

/* How many of the big files are complete on the server. */
static int big_files_on_server(void)
{
    int n = 0;
    for (int i = 0; i < BIG_FILES; i++) {
        char path[256];
        struct stat st;
        snprintf(path, sizeof(path), "%s/ckpt/part-%02d.bin", cur.remote, i);
        n += stat(path, &st) == 0 && st.st_size == BIG_SIZE;
    }
    return n;
}

/* Waits (bounded) until no temporary file of a dead agent is left under the remote tree. */
static int no_temporaries_left(const char *root)
{
    int64_t end = gs_clock_mono_ms() + 10000;
    while (gs_clock_mono_ms() < end) {
        if (gs_test_sh("find '%s' -name '" TMP_TAG "*' | grep -q .", root) != 0)
            return 1;
        usleep(20000);
    }
    return 0;
}

/* After a fault: the next push converges, leaves no temporaries or conflict copies (nothing
 * duplicated), and a push after it has nothing left to do. */
static void expect_convergence_after_fault(const char *what)
{
    json_t *o = push_and_compare(&cur, 0, what);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    if (!no_temporaries_left(cur.remote))
        fail_msg("%s: temporary files left on the server", what);
    expect_same_tree_opts(cur.local, cur.remote, 0, NULL, what);
    o = push_json_ex(&cur, 0, NULL);
    assert_int_equal(jint(o, "sent") + jint(o, "deleted") + jint(o, "renamed"), 0);
    json_decref(o);
}

static void test_push__sshd_killed_mid_push_then_push_converges(void **state)
{
    (void)state;
    slow_project_with_pending_changes();
    char log[128];
    snprintf(log, sizeof(log), "%s/push.log", cur.dir);
    pid_t pid = spawn_gpusync(cur.local, log, ARGS("push"));
    if (!wait_mid_transfer(pid))
        fail_msg("the push did not reach mid-transfer (or ended first)");
    gs_test_sshd_stop(&sshd); /* the listener and every connection it serves */
    int arrived = big_files_on_server();
    print_message("sshd killed with %d of %d big files on the server\n", arrived, BIG_FILES);
    assert_true(arrived < BIG_FILES); /* it really was mid-push */
    int st = wait_child(pid, 60000);
    struct gs_buf out = GS_BUF_INIT;
    gs_test_slurp(log, &out);
    print_message("push while sshd died: exit %d: %s", st, out.data ? out.data : "");
    if (st <= 0 || st >= 128)
        fail_msg("push should fail cleanly when sshd dies, got %d", st);
    gs_buf_release(&out);
    assert_int_equal(gs_test_sshd_restart(&sshd, 0), 0);
    assert_int_equal(wansim_command(&wan, "rate 0", NULL, 0), 0);
    expect_convergence_after_fault("push after sshd came back");
}

static void test_push__client_sigkilled_mid_push_then_push_converges(void **state)
{
    (void)state;
    slow_project_with_pending_changes();
    char log[128];
    snprintf(log, sizeof(log), "%s/push.log", cur.dir);
    pid_t pid = spawn_gpusync(cur.local, log, ARGS("push"));
    if (!wait_mid_transfer(pid))
        fail_msg("the push did not reach mid-transfer (or ended first)");
    kill(pid, SIGKILL);
    assert_int_equal(wait_child(pid, 10000), 128 + SIGKILL);
    int arrived = big_files_on_server();
    print_message("client killed with %d of %d big files on the server\n", arrived, BIG_FILES);
    assert_true(arrived < BIG_FILES); /* it really was mid-push */
    assert_int_equal(wansim_command(&wan, "rate 0", NULL, 0), 0);
    expect_convergence_after_fault("push after the client was killed");
}

#define MANY_FILES 2000

/* Waits (bounded) until no agent serves `root`: what a killed client still had in flight has then
 * landed on the server or died with the agent. */
static void await_no_agent_for(const char *root)
{
    int64_t end = gs_clock_mono_ms() + 30000;
    while (gs_test_sh("pgrep -f 'gpusync-agent.* serve --root %s$' >/dev/null", root) == 0) {
        if (gs_clock_mono_ms() > end)
            fail_msg("the agent for %s is still running 30 s after its client died", root);
        usleep(20000);
    }
}

/* How many of many/fNNNN are on the server; fills `there` (MANY_FILES flags). */
static int many_on_server(char *there)
{
    int n = 0;
    for (int i = 0; i < MANY_FILES; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "many/f%04d", i);
        there[i] = (char)exists(cur.remote, rel);
        n += there[i];
    }
    return n;
}

/* Deletes, renames or edits locally each file the server holds, so that a push must act on files
 * the killed push placed: a file it placed but never recorded would otherwise stay on the server
 * (delete, rename) or be taken for a server edit (edit: a conflict copy nobody caused). */
static void change_what_the_server_holds(const char *there)
{
    for (int i = 0; i < MANY_FILES; i++) {
        char rel[64], to[64];
        snprintf(rel, sizeof(rel), "many/f%04d", i);
        if (!there[i])
            continue;
        if (i % 3 == 0) {
            remove_path(cur.local, rel);
        } else if (i % 3 == 1) {
            snprintf(to, sizeof(to), "many/renamed-%04d", i);
            move_path(cur.local, rel, to);
        } else {
            put_text(cur.local, rel, "edited after the killed push\n", 0644);
        }
    }
}

/* Issue 11, point 2: `kill -9` a push of 2,000 files part way, then delete, rename and edit locally
 * files the killed push had already placed on the server, and push again (twice). Every request
 * the push sent was recorded as an intent before it left, so the next push asks the server about
 * them first and then deletes, renames and replaces what it placed, with no conflict copy. */
static void test_push__files_a_killed_push_placed_are_deleted_renamed_and_replaced(void **state)
{
    (void)state;
    char err[256];
    struct wansim_opts wo = {.target_port = sshd.port, .delay_ms = 25, .rate_mbit = 4};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    proj_new(&cur, wan.port, NULL);
    for (int i = 0; i < MANY_FILES; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "many/f%04d", i);
        put_random(cur.local, rel, 4096, 7000 + (uint64_t)i, 0644);
    }
    char log[128], there[MANY_FILES];
    snprintf(log, sizeof(log), "%s/push.log", cur.dir);
    pid_t pid = spawn_gpusync(cur.local, log, ARGS("push"));
    int64_t end = gs_clock_mono_ms() + 60000;
    while (many_on_server(there) < 200 && gs_clock_mono_ms() < end) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("the push ended before 200 files were on the server: see %s", log);
        usleep(5000);
    }
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(wait_child(pid, 10000), 128 + SIGKILL);
    await_no_agent_for(cur.remote);
    int placed = many_on_server(there);
    json_t *st = status_json(&cur);
    print_message("push killed; the server holds %d of %d files; %lld operations unconfirmed\n",
                  placed, MANY_FILES, jint(st, "unconfirmed"));
    json_decref(st);
    assert_true(placed >= 200 && placed < MANY_FILES); /* it really was mid-push */
    assert_int_equal(wansim_command(&wan, "rate 0", NULL, 0), 0);
    change_what_the_server_holds(there);
    for (int pass = 1; pass <= 2; pass++) {
        json_t *o = push_and_compare(&cur, 0, pass == 1 ? "first push after the kill" : "second");
        assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
        json_decref(o);
    }
    if (!no_temporaries_left(cur.remote))
        fail_msg("temporary files left on the server");
    st = status_json(&cur);
    assert_string_equal(json_string_value(json_object_get(st, "state")), "up_to_date");
    expect_count(st, "unconfirmed", 0);
    json_decref(st);
}

/* Servers are recreated often: the remote tree is gone while the index still describes it. */
static void test_push__server_tree_wiped_then_push_restores_it(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 17);
    push_compare_drop(&cur, "first sync");
    assert_int_equal(gs_test_sh("rm -rf '%s' && mkdir '%s'", cur.remote, cur.remote), 0);
    move_path(cur.local, "src/f001.py", "src/f001-moved.py");
    put_text(cur.local, "src/f008.py", "changed meanwhile\n", 0644);
    remove_path(cur.local, "scripts/f005.py");
    json_t *o = push_and_compare(&cur, 0, "push to a wiped server");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    assert_int_equal(gs_test_sh("rm -rf '%s'", cur.remote), 0); /* even the project directory */
    push_compare_drop(&cur, "push after the project directory itself went");
}

/* A new file sent while the agent starts (early) to a server that turns out to be recreated went
 * into the new server: it stays sent. It crossed the link twice (the reset planned everything
 * again), and on a disk with room for one copy the second failed "no space" though the file was
 * in place. link_bytes counts it once, and `bytes` counts it. */
static void test_push__a_new_file_sent_early_to_a_recreated_server_crosses_once(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    put_text(cur.local, "a.py", "print(1)\n", 0644);
    push_compare_drop(&cur, "first sync");
    assert_int_equal(gs_test_sh("rm -rf '%s' && mkdir '%s'", cur.remote, cur.remote), 0);
    assert_int_equal(gs_test_sh("head -c 2000000 /dev/urandom > '%s/big.bin'", cur.local), 0);
    json_t *o = push_and_compare(&cur, 0, "push of a new file to a recreated server");
    json_int_t link = json_integer_value(json_object_get(o, "link_bytes"));
    json_int_t bytes = json_integer_value(json_object_get(o, "bytes"));
    if (link >= 3000000 || bytes < 2000000) {
        char *text = json_dumps(o, JSON_COMPACT);
        fail_msg("the 2 MB file crossed the link more than once, or was not counted: %s", text);
    }
    json_decref(o);
}

/* A first push sends while the agent starts. On a server without this agent build (a new binary
 * here, so no cache there can hold it) those early bytes die with the failed start: the push must
 * then install the agent and send everything again, once, with no conflicts. */
static void test_push__first_push_to_a_server_without_the_agent_installs_it(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 29);
    assert_int_equal(gs_test_fresh_agent_begin(cur.dir), 0);
    json_t *o = push_and_compare(&cur, 0, "first push, agent not on the server");
    gs_test_fresh_agent_end(cur.dir);
    const char *transport = json_string_value(json_object_get(o, "transport"));
    if (!transport || !strstr(transport, "uploaded"))
        fail_msg("the agent was not uploaded: transport %s", transport ? transport : "(none)");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
}

/* Every push sends while the agent starts, not only the first. When gpusync was upgraded since
 * the last push (a new agent build, which no cache on the server holds), those early requests
 * die with the failed start: the push must install the agent and send the changes again, report
 * no failure, and leave the server holding every byte. */
static void test_push__a_later_push_to_a_server_without_this_agent_installs_it(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 37);
    push_compare_drop(&cur, "first push");
    put_random(cur.local, "src/changed.bin", 300 * 1024, 38, 0644); /* a delta would apply */
    put_text(cur.local, "src/new.py", "print('new')\n", 0644);
    remove_path(cur.local, "scripts/f005.py");
    assert_int_equal(gs_test_fresh_agent_begin(cur.dir), 0);
    json_t *o = push_and_compare(&cur, 0, "second push, agent not on the server");
    gs_test_fresh_agent_end(cur.dir);
    const char *transport = json_string_value(json_object_get(o, "transport"));
    if (!transport || !strstr(transport, "uploaded"))
        fail_msg("the agent was not uploaded: transport %s", transport ? transport : "(none)");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    assert_int_equal(json_array_size(json_object_get(o, "failures")), 0);
    json_decref(o);
    o = push_and_compare(&cur, 0, "third push: nothing left to send");
    assert_int_equal(jint(o, "sent") + jint(o, "deleted"), 0);
    json_decref(o);
}

/* The summary's `seconds` is what a user timing the push sees: connecting and installing the
 * agent count too. Through a 100 ms RTT link, a first push that installs the agent spends most of
 * its time there; planning again after the install used to restart the clock. */
static void test_push__summary_time_counts_connecting_and_starting_the_agent(void **state)
{
    (void)state;
    char err[256];
    struct wansim_opts wo = {.target_port = sshd.port, .delay_ms = 50};
    if (wansim_start(&wan, &wo, err, sizeof(err)) < 0)
        fail_msg("wansim: %s", err);
    proj_new(&cur, wan.port, NULL);
    put_text(cur.local, "a.txt", "one small file\n", 0644);
    assert_int_equal(gs_test_fresh_agent_begin(cur.dir), 0);
    int64_t start = gs_clock_mono_ms();
    json_t *o = push_and_compare(&cur, 0, "first push through a 100 ms RTT link");
    int64_t wall_ms = gs_clock_mono_ms() - start;
    gs_test_fresh_agent_end(cur.dir);
    double seconds = json_real_value(json_object_get(o, "seconds"));
    print_message("push took %lld ms; its summary says %.3f s\n", (long long)wall_ms, seconds);
    /* what is left out: starting the process, reading the config, closing (no round trip) */
    if (seconds * 1000 < (double)wall_ms - 300)
        fail_msg("summary says %.3f s of a %lld ms push", seconds, (long long)wall_ms);
    json_decref(o);
}

/* A server the static agent cannot serve (another arch, or GPUSYNC_AGENT_FORCE_BUILD) gets the
 * agent built there from agent/ and proto/ with only `cc`: that build must still work from the
 * layout the sources have, and the push must then mirror the tree. The sources are copied and
 * marked so that no build cached on the server can stand in for this one. */
static void test_push__agent_is_built_on_a_server_from_its_sources(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 31);
    const char *repo = gs_test_source_path(".");
    assert_int_equal(
        gs_test_sh("mkdir -p '%s/src' && cp -r '%s/agent' '%s/proto' '%s/src/' && "
                   "touch '%s/before-agent' && echo '/* test %d */' >>'%s/src/agent/main.c'",
                   cur.dir, repo, repo, cur.dir, cur.dir, (int)getpid(), cur.dir),
        0);
    char src[4200];
    snprintf(src, sizeof(src), "%s/src/agent", cur.dir);
    setenv("GPUSYNC_AGENT_SRC", src, 1);
    setenv("GPUSYNC_AGENT_FORCE_BUILD", "1", 1);
    json_t *o = push_and_compare(&cur, 0, "first push, agent built on the server");
    unsetenv("GPUSYNC_AGENT_FORCE_BUILD");
    gs_test_fresh_agent_end(cur.dir);
    const char *transport = json_string_value(json_object_get(o, "transport"));
    if (!transport || !strstr(transport, "built"))
        fail_msg("the agent was not built on the server: transport %s",
                 transport ? transport : "(none)");
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
}

/* The state a push killed at the worst instant leaves: the server renamed, the index never heard.
 * Made here by renaming on the server by hand, so the case is tested every run, not only when the
 * SIGKILL above happens to land between the agent's rename and the index commit. */
static void test_push__rename_done_on_server_but_not_recorded_converges(void **state)
{
    (void)state;
    proj_new(&cur, 0, NULL);
    generate_tree(cur.local, 21);
    push_compare_drop(&cur, "first sync");
    move_path(cur.local, "src/f001.py", "src/f001-renamed.py");
    move_path(cur.remote, "src/f001.py", "src/f001-renamed.py");
    move_path(cur.local, "src/utils", "src/helpers");
    move_path(cur.remote, "src/utils", "src/helpers");
    json_t *o = push_and_compare(&cur, 0, "push after renames the index missed");
    expect_count(o, "failed_count", 0);
    assert_int_equal(json_array_size(json_object_get(o, "conflicts")), 0);
    json_decref(o);
    o = push_json_ex(&cur, 0, NULL);
    expect_count(o, "sent", 0);
    expect_count(o, "renamed", 0);
    json_decref(o);
}

static void scenario_disk_full(const char *transport)
{
    proj_new(&cur, 0, transport);
    if (gs_test_sh("mount -t tmpfs -o size=2m gs-e2e-full '%s' 2>/dev/null", cur.remote) != 0) {
        print_message("cannot mount a tmpfs here (needs root); skipped\n");
        skip();
    }
    put_text(cur.local, "small.py", "print(1)\n", 0644);
    for (int i = 0; i < 5; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "weights/w%d.bin", i);
        put_random(cur.local, rel, 700 * 1024, 50 + (uint64_t)i, 0644);
    }
    char backup[128];
    snprintf(backup, sizeof(backup), "%s/backup", cur.dir);
    assert_int_equal(gs_test_sh("cp -a '%s' '%s'", cur.local, backup), 0);
    struct gs_test_result r = run_gpusync(cur.local, ARGS("push"));
    print_message("push to a full disk: exit %d: %s%s", r.status, r.out.data, r.err.data);
    assert_int_not_equal(r.status, 0);
    assert_true(r.status < 128);
    if (!strstr(r.err.data, "space") && !strstr(r.err.data, "full"))
        fail_msg("the error does not say the disk is full: %s", r.err.data);
    for (int i = 0; i < 5; i++) { /* said once, clearly: not "put X: put X: ..." */
        char twice[128];
        snprintf(twice, sizeof(twice), "put weights/w%d.bin: put weights/w%d.bin", i, i);
        if (strstr(r.err.data, twice))
            fail_msg("the error repeats itself: %s", r.err.data);
    }
    gs_test_result_release(&r);
    struct diff d = {.lroot = backup, .rroot = cur.local};
    if (diff_dir(&d, ""))
        fail_msg("local files changed by a failed push: %s", d.why);
    if (!no_temporaries_left(cur.remote))
        fail_msg("temporary files left on the full disk");
    json_t *o = status_json(&cur); /* what did not fit is still pending */
    if (jint(o, "pending") < 1)
        fail_msg("nothing pending after a push that did not fit: %s", json_dumps(o, 0));
    json_decref(o);
    assert_int_equal(gs_test_sh("mount -o remount,size=16m '%s'", cur.remote), 0);
    expect_convergence_after_fault("push after freeing space");
}

/* nftw callback over cur.remote: counts the regular files outside .gpusync/ (what pushes really
 * delivered) and sums their sizes; each must hold the bytes of the same path under held_local. */
static const char *held_local;
static size_t held_files;
static uint64_t held_bytes;

static int count_held(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag;
    const char *rel = path + ftw->base;
    for (const char *p = path; (p = strstr(p, "/.gpusync")) != NULL; p++)
        if (p[9] == '/' || p[9] == '\0')
            return 0;
    if (!S_ISREG(st->st_mode) || strstr(rel, TMP_TAG))
        return 0;
    char lp[4096];
    snprintf(lp, sizeof(lp), "%s/%s", held_local, path + strlen(cur.remote) + 1);
    if (!same_bytes(lp, path))
        fail_msg("the server holds %s, which matches no local file", path);
    held_files++;
    held_bytes += (uint64_t)st->st_size;
    return 0;
}

/* Fails unless `failures` (a push summary's) has `failed_count` entries, each path once, and none
 * of them on the server. */
static void expect_failures_true(json_t *o)
{
    char *text = json_dumps(o, 0);
    json_t *failures = json_object_get(o, "failures");
    if (jint(o, "failed_count") < 1 || (size_t)jint(o, "failed_count") != json_array_size(failures))
        fail_msg("failed_count and failures disagree: %s", text);
    for (size_t i = 0; i < json_array_size(failures); i++) {
        const char *path = json_string_value(json_object_get(json_array_get(failures, i), "path"));
        assert_non_null(path);
        if (exists(cur.remote, path))
            fail_msg("%s is listed as failed but reached the server: %s", path, text);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(path,
                        json_string_value(json_object_get(json_array_get(failures, j), "path"))))
                fail_msg("%s is listed as failed twice: %s", path, text);
    }
    free(text);
}

/* The summary of a push that ran out of space tells the truth: `sent` and `bytes` are the files
 * the server holds now, and each failed operation is listed once, and is missing there. */
static void scenario_disk_full_summary(const char *transport)
{
    proj_new(&cur, 0, transport);
    if (gs_test_sh("mount -t tmpfs -o size=2m gs-e2e-full '%s' 2>/dev/null", cur.remote) != 0) {
        print_message("cannot mount a tmpfs here (needs root); skipped\n");
        skip();
    }
    put_text(cur.local, "small.py", "print(1)\n", 0644);
    for (int i = 0; i < 5; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "weights/w%d.bin", i);
        put_random(cur.local, rel, 700 * 1024, 50 + (uint64_t)i, 0644);
    }
    json_t *o = push_json_ex(&cur, 1, NULL);
    char *text = json_dumps(o, 0);
    print_message("push to a full disk: %s\n", text);
    held_local = cur.local;
    held_files = 0;
    held_bytes = 0;
    assert_int_equal(nftw(cur.remote, count_held, 16, FTW_PHYS), 0);
    if (held_files == 0 || held_files == 6)
        fail_msg("the disk was not full part way: %zu files arrived", held_files);
    if (jint(o, "sent") != (long long)held_files || jint(o, "bytes") != (long long)held_bytes)
        fail_msg("the server holds %zu files (%llu B); the summary says: %s", held_files,
                 (unsigned long long)held_bytes, text);
    expect_failures_true(o);
    free(text);
    json_decref(o);
}

/* A push that meets a rename the server already did (the second pass, see
 * test_push__rename_done_on_server_but_not_recorded_converges) and a full disk: the second pass
 * sends what the rename left missing, not the refused files once more. */
static void scenario_disk_full_with_lost_rename(const char *transport)
{
    proj_new(&cur, 0, transport);
    if (gs_test_sh("mount -t tmpfs -o size=2m gs-e2e-full '%s' 2>/dev/null", cur.remote) != 0) {
        print_message("cannot mount a tmpfs here (needs root); skipped\n");
        skip();
    }
    put_text(cur.local, "a.py", "print('a')\n", 0644);
    put_text(cur.local, "b.py", "print('b')\n", 0644);
    push_compare_drop(&cur, "first sync");
    move_path(cur.local, "a.py", "a2.py");
    move_path(cur.remote, "a.py", "a2.py");
    for (int i = 0; i < 4; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "w%d.bin", i);
        put_random(cur.local, rel, 700 * 1024, 70 + (uint64_t)i, 0644);
    }
    json_t *o = push_json_ex(&cur, 1, NULL);
    char *text = json_dumps(o, 0);
    print_message("lost rename, then a full disk: %s\n", text);
    free(text);
    expect_failures_true(o);
    held_local = cur.local;
    held_files = 0;
    assert_int_equal(nftw(cur.remote, count_held, 16, FTW_PHYS), 0);
    assert_true(exists(cur.remote, "a2.py"));
    json_decref(o);
}

static void test_push__lost_rename_on_a_full_disk_reports_each_failure_once(void **state)
{
    (void)state;
    scenario_disk_full_with_lost_rename(NULL);
}

static void test_sftp__lost_rename_on_a_full_disk_reports_each_failure_once(void **state)
{
    (void)state;
    scenario_disk_full_with_lost_rename("sftp");
}

static void test_push__remote_disk_full_summary_counts_what_arrived(void **state)
{
    (void)state;
    scenario_disk_full_summary(NULL);
}

static void test_sftp__remote_disk_full_summary_counts_what_arrived(void **state)
{
    (void)state;
    scenario_disk_full_summary("sftp");
}

static void test_push__remote_disk_full_fails_clearly_then_converges(void **state)
{
    (void)state;
    scenario_disk_full(NULL);
}

static void test_sftp__remote_disk_full_fails_clearly_then_converges(void **state)
{
    (void)state;
    scenario_disk_full("sftp");
}

/* ---- SFTP fallback ---- */

static void test_sftp__first_sync_mirrors_a_generated_tree(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_first_sync(&cur);
    json_t *o = push_json_ex(&cur, 0, NULL);
    const char *t = json_string_value(json_object_get(o, "transport"));
    assert_non_null(t);
    assert_int_equal(strncmp(t, "sftp", 4), 0);
    json_decref(o);
}

static void test_sftp__every_kind_of_change_is_mirrored(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_changes(&cur);
}

static void test_sftp__a_touch_reaches_the_server_without_the_bytes(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_touch(&cur, 0);
}

static void test_sftp__a_touch_never_stamps_a_copy_edited_on_the_server(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_touch_over_a_server_edit(&cur);
}

static void test_sftp__server_edit_is_kept_as_conflict_copy_and_reported(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_conflict(&cur);
}

static void test_sftp__directory_replaced_by_a_file_on_the_server_is_kept(void **state)
{
    (void)state;
    proj_new(&cur, 0, "sftp");
    scenario_dir_replaced_by_a_file(&cur);
}

/* ---- randomised convergence ---- */

struct pool {
    char *files[4096], *dirs[4096], *links[4096];
    size_t nf, nd, nl;
};

static void pool_release(struct pool *p)
{
    for (size_t i = 0; i < p->nf; i++)
        free(p->files[i]);
    for (size_t i = 0; i < p->nd; i++)
        free(p->dirs[i]);
    for (size_t i = 0; i < p->nl; i++)
        free(p->links[i]);
    memset(p, 0, sizeof(*p));
}

/* Collects the tree's files, directories ("" is the root) and symlinks. */
static void pool_scan(struct pool *p, const char *root, const char *rel)
{
    if (!*rel)
        p->dirs[p->nd++] = strdup("");
    char **names = list_dir(root, rel);
    for (size_t i = 0; names[i]; i++) {
        char child[4096], path[4096];
        path_at(child, sizeof(child), rel, names[i]);
        if (!strcmp(child, ".gpusync"))
            continue;
        path_at(path, sizeof(path), root, child);
        struct stat st;
        if (lstat(path, &st) != 0 || p->nf == 4096 || p->nd == 4096 || p->nl == 4096)
            continue;
        if (S_ISLNK(st.st_mode)) {
            p->links[p->nl++] = strdup(child);
        } else if (S_ISDIR(st.st_mode)) {
            p->dirs[p->nd++] = strdup(child);
            pool_scan(p, root, child);
        } else {
            p->files[p->nf++] = strdup(child);
        }
    }
    free_list(names);
}

static const char *pick(char **v, size_t n, uint64_t *rng)
{
    return n ? v[rng_next(rng) % n] : NULL;
}

/* A fresh name under `dir` that does not exist yet. */
static void fresh_name(const char *root, const char *dir, const char *stem, uint64_t *rng,
                       char *out, size_t size)
{
    do {
        char name[64];
        static const char *const odd[] = {"", " sp ace", "-dash", "new\nline", "\xff\xfe"};
        snprintf(name, sizeof(name), "%s%u%s%s", stem, (unsigned)(rng_next(rng) % 100000),
                 odd[rng_next(rng) % 5], rng_next(rng) % 3 ? ".py" : "");
        path_at(out, size, dir, name);
    } while (exists(root, out));
}

/* Applies one random operation; appends a description to `log`. */
static void random_op(const char *root, uint64_t *rng, struct gs_buf *log)
{
    struct pool p = {0};
    pool_scan(&p, root, "");
    char path[4096], path2[4096];
    const char *dir = pick(p.dirs, p.nd, rng), *file = pick(p.files, p.nf, rng);
    switch (rng_next(rng) % 10) {
    case 0:
    case 1:
        fresh_name(root, dir, "f", rng, path, sizeof(path));
        put_random(root, path, rng_next(rng) % 20000, rng_next(rng), 0644);
        gs_buf_addf(log, " create %s;", path);
        break;
    case 2:
        if (file) {
            put_random(root, file, rng_next(rng) % 20000, rng_next(rng), 0644);
            gs_buf_addf(log, " modify %s;", file);
        }
        break;
    case 3:
        if (file || p.nl) {
            const char *victim = file && rng_next(rng) % 2 ? file : pick(p.links, p.nl, rng);
            victim = victim ? victim : file;
            remove_path(root, victim);
            gs_buf_addf(log, " delete %s;", victim);
        }
        break;
    case 4:
        if (file) {
            fresh_name(root, dir, "m", rng, path, sizeof(path));
            move_path(root, file, path);
            gs_buf_addf(log, " rename %s -> %s;", file, path);
        }
        break;
    case 5:
        fresh_name(root, dir, "d", rng, path, sizeof(path));
        make_dirs(root, path);
        gs_buf_addf(log, " mkdir %s;", path);
        break;
    case 6:
        if (p.nd > 1) {
            const char *d = p.dirs[1 + rng_next(rng) % (p.nd - 1)];
            remove_path(root, d);
            gs_buf_addf(log, " rmdir -r %s;", d);
        }
        break;
    case 7:
        if (file) {
            path_at(path, sizeof(path), root, file);
            struct stat st;
            assert_int_equal(lstat(path, &st), 0);
            assert_int_equal(chmod(path, (st.st_mode & 0777) ^ 0111), 0);
            gs_buf_addf(log, " chmod %s;", file);
        }
        break;
    case 8: {
        const char *link = p.nl && rng_next(rng) % 2 ? pick(p.links, p.nl, rng) : NULL;
        if (!link) {
            fresh_name(root, dir, "l", rng, path2, sizeof(path2));
            link = path2;
        }
        const char *target = file && rng_next(rng) % 4 ? file : "dangling/target";
        snprintf(path, sizeof(path), "%s", link);
        make_link(root, path, target);
        gs_buf_addf(log, " symlink %s -> %s;", path, target);
        break;
    }
    default:
        if (p.nd > 1) { /* rename a directory, never into itself */
            const char *d = p.dirs[1 + rng_next(rng) % (p.nd - 1)];
            size_t dl = strlen(d);
            if (!strncmp(dir, d, dl) && (dir[dl] == '/' || dir[dl] == '\0'))
                dir = "";
            fresh_name(root, dir, "D", rng, path, sizeof(path));
            move_path(root, d, path);
            gs_buf_addf(log, " rename dir %s -> %s;", d, path);
        }
        break;
    }
    pool_release(&p);
}

/* Runs `batches` batches of random changes on a project with `transport`, pushing after each and
 * comparing the trees every time. */
static void random_convergence(const char *transport, int batches)
{
    const char *env = getenv("GS_TEST_SEED");
    uint64_t seed =
        env && *env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    print_message("randomised convergence: seed %llu (rerun with GS_TEST_SEED=%llu)\n",
                  (unsigned long long)seed, (unsigned long long)seed);
    uint64_t rng = seed | 1;
    proj_new(&cur, 0, transport);
    generate_tree(cur.local, seed);
    push_compare_drop(&cur, "random: first sync");
    if (getenv("GS_TEST_BATCHES")) /* a longer hunt, by hand */
        batches = atoi(getenv("GS_TEST_BATCHES"));
    for (int batch = 0; batch < batches; batch++) {
        struct gs_buf log = GS_BUF_INIT;
        int n = 1 + (int)(rng_next(&rng) % 8);
        for (int i = 0; i < n; i++)
            random_op(cur.local, &rng, &log);
        json_t *o = push_json_ex(&cur, 0, NULL);
        struct diff d = {.lroot = cur.local, .rroot = cur.remote};
        if (jint(o, "failed_count") != 0 || diff_dir(&d, ""))
            fail_msg("seed %llu, batch %d (%s): %s\npush: %s", (unsigned long long)seed, batch,
                     log.data, d.why, json_dumps(o, 0));
        json_decref(o);
        gs_buf_release(&log);
    }
}

static void test_push__random_changes_converge_every_batch(void **state)
{
    (void)state;
    random_convergence(NULL, 30);
}

static void test_sftp__random_changes_converge_every_batch(void **state)
{
    (void)state;
    random_convergence("sftp", 15);
}

int main(void)
{
#define T(fn)  cmocka_unit_test_teardown(fn, proj_teardown)
#define TW(fn) cmocka_unit_test_teardown(fn, wan_teardown)
    const struct CMUnitTest tests[] = {
        T(test_push__first_sync_mirrors_a_generated_tree),
        T(test_push__every_kind_of_change_is_mirrored),
        T(test_push__a_touch_reaches_the_server_without_the_bytes),
        T(test_push__a_touch_never_stamps_a_copy_edited_on_the_server),
        T(test_push__times_past_what_nanoseconds_hold_are_settled),
        T(test_push__server_edit_is_kept_as_conflict_copy_and_reported),
        T(test_push__directory_replaced_by_a_file_on_the_server_is_kept),
        T(test_push__server_edit_then_local_rename_is_kept_as_conflict),
        T(test_push__hostile_names_round_trip),
        T(test_push__unusual_names_are_quoted_in_text_output),
        T(test_push__symlink_out_of_the_tree_is_mirrored_not_followed),
        T(test_push__gitignore_and_sync_exclude_are_respected),
        T(test_push__a_path_too_long_to_open_fails_and_deletes_nothing),
        T(test_push__dry_run_changes_nothing),
        T(test_push__paths_restrict_what_is_sent),
        T(test_push__a_path_that_never_existed_is_an_error),
        T(test_status__json_counts_pending_changes),
        T(test_pull__file_and_directory_arrive_whole),
        T(test_push__large_file_streams_both_ways_in_bounded_memory),
        T(test_push__small_edit_of_a_large_file_sends_a_delta),
        TW(test_push__sshd_killed_mid_push_then_push_converges),
        TW(test_push__client_sigkilled_mid_push_then_push_converges),
        TW(test_push__files_a_killed_push_placed_are_deleted_renamed_and_replaced),
        T(test_push__rename_done_on_server_but_not_recorded_converges),
        T(test_push__server_tree_wiped_then_push_restores_it),
        T(test_push__a_new_file_sent_early_to_a_recreated_server_crosses_once),
        T(test_push__first_push_to_a_server_without_the_agent_installs_it),
        TW(test_push__summary_time_counts_connecting_and_starting_the_agent),
        T(test_push__agent_is_built_on_a_server_from_its_sources),
        T(test_push__a_later_push_to_a_server_without_this_agent_installs_it),
        TW(test_push__a_slow_link_is_found_and_remembered),
        TW(test_push__a_far_server_starts_at_the_slow_links_level),
        T(test_push__remote_disk_full_fails_clearly_then_converges),
        T(test_push__remote_disk_full_summary_counts_what_arrived),
        T(test_push__lost_rename_on_a_full_disk_reports_each_failure_once),
        T(test_sftp__first_sync_mirrors_a_generated_tree),
        T(test_sftp__every_kind_of_change_is_mirrored),
        T(test_sftp__a_touch_reaches_the_server_without_the_bytes),
        T(test_sftp__a_touch_never_stamps_a_copy_edited_on_the_server),
        T(test_sftp__times_outside_what_sftp_holds_are_settled),
        T(test_sftp__server_edit_is_kept_as_conflict_copy_and_reported),
        T(test_sftp__directory_replaced_by_a_file_on_the_server_is_kept),
        T(test_sftp__remote_disk_full_fails_clearly_then_converges),
        T(test_sftp__remote_disk_full_summary_counts_what_arrived),
        T(test_sftp__lost_rename_on_a_full_disk_reports_each_failure_once),
        T(test_push__random_changes_converge_every_batch),
        T(test_sftp__random_changes_converge_every_batch),
    };
    /* GS_TEST_FILTER=PATTERN runs only the matching tests (cmocka's * wildcard) */
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#undef T
#undef TW
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
