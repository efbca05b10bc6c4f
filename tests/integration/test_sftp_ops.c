/* Integration tests for the SFTP transport (remote/sftp_ops.c) against the sandbox sshd: the
 * server runs as root on this machine, so every test inspects the remote tree directly on the
 * local filesystem and compares it byte for byte, with modes and mtimes, to what was sent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fixtures/sshd.h"
#include "remote/sftp_ops.h"
#include "remote/ssh.h"

#define MAX_DONE 256

/* One completion as the callback saw it (strings copied: they live only during the callback). */
struct done {
    intptr_t ctx;
    int ok, noop, err_no;
    char message[1024];
    char kept[PATH_MAX];
    int has_kept;
};

struct fx {
    char base[64];    /* temporary folder: local/, remote/, outside/ */
    char local[128];  /* files to upload */
    char remote[128]; /* the transport's root, seen directly */
    struct gs_fileops *ops;
    struct done done[MAX_DONE];
    int n_done;
    int mounted;
};

static struct gs_test_sshd g_sshd;
static struct gs_ssh *g_ssh;

/* ---- helpers ------------------------------------------------------------------------------- */

static void on_done(void *cb_ctx, void *req_ctx, const struct gs_fop_result *r)
{
    struct fx *f = cb_ctx;
    assert_true(f->n_done < MAX_DONE);
    struct done *d = &f->done[f->n_done++];
    memset(d, 0, sizeof(*d));
    d->ctx = (intptr_t)req_ctx;
    d->ok = r->ok;
    d->noop = r->noop;
    d->err_no = r->err_no;
    if (r->message)
        snprintf(d->message, sizeof(d->message), "%s", r->message);
    if (r->kept) {
        d->has_kept = 1;
        snprintf(d->kept, sizeof(d->kept), "%s", r->kept);
    }
}

static int connect_ssh(struct gs_test_sshd *d, struct gs_ssh **out)
{
    struct gs_ssh_opts o;
    struct gs_error err = {0};
    memset(&o, 0, sizeof(o));
    o.host = "127.0.0.1";
    o.port = d->port;
    o.user = "root";
    o.dead_after_ms = 4000;
    int rc = gs_ssh_connect(out, &o, &err);
    if (rc < 0)
        fprintf(stderr, "connect: %s\n", err.msg);
    return rc;
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start(&g_sshd, NULL) < 0)
        return -1;
    gs_test_sshd_use_home(&g_sshd, 1);
    return connect_ssh(&g_sshd, &g_ssh) < 0 ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_ssh_free(g_ssh);
    gs_test_sshd_destroy(&g_sshd);
    return 0;
}

/* Opens the transport on root `root` (relative names are under f->base). */
static void open_ops(struct fx *f, const char *root)
{
    struct gs_error err = {0};
    int rc = gs_sftp_ops_open(&f->ops, g_ssh, root, &err);
    if (rc < 0)
        fail_msg("gs_sftp_ops_open(%s): %s", root, err.msg);
    f->ops->done = on_done;
    f->ops->done_ctx = f;
}

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    snprintf(f->base, sizeof(f->base), "/tmp/gs-sftp-ops.XXXXXX");
    if (!mkdtemp(f->base))
        return -1;
    snprintf(f->local, sizeof(f->local), "%s/local", f->base);
    snprintf(f->remote, sizeof(f->remote), "%s/remote/proj", f->base);
    mkdir(f->local, 0755);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    char cmd[256];
    if (f->ops)
        f->ops->close(f->ops);
    if (f->mounted)
        umount2(f->remote, MNT_DETACH);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->base);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->base);
    free(f);
    return 0;
}

/* Writes `len` bytes of `data` to dir/rel (creating parents) with `mode`. */
static void write_local(const char *dir, const char *rel, const void *data, size_t len, mode_t mode)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    for (char *p = path + strlen(dir) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        mkdir(path, 0755);
        *p = '/';
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    assert_int_equal(chmod(path, mode), 0);
}

/* Reads dir/rel whole; returns a malloc'd buffer and its length in *len, or NULL. */
static char *read_all(const char *dir, const char *rel, size_t *len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    struct stat st;
    fstat(fileno(fp), &st);
    char *buf = malloc((size_t)st.st_size + 1);
    *len = fread(buf, 1, (size_t)st.st_size, fp);
    fclose(fp);
    return buf;
}

static struct stat lstat_at(const char *dir, const char *rel)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    if (lstat(path, &st) < 0)
        memset(&st, 0, sizeof(st));
    return st;
}

static int exists_at(const char *dir, const char *rel)
{
    return lstat_at(dir, rel).st_mode != 0;
}

/* Asserts remote/rel holds exactly the bytes of local/rel. */
static void assert_same_bytes(struct fx *f, const char *rel)
{
    size_t a_len = 0, b_len = 0;
    char *a = read_all(f->local, rel, &a_len);
    char *b = read_all(f->remote, rel, &b_len);
    assert_non_null(a);
    if (!b)
        fail_msg("remote %s missing", rel);
    assert_int_equal(a_len, b_len);
    assert_memory_equal(a, b, a_len);
    free(a);
    free(b);
}

static void submit(struct fx *f, struct gs_fop_req *req)
{
    struct gs_error err = {0};
    int rc = f->ops->submit(f->ops, req, &err);
    if (rc < 0)
        fail_msg("submit %s: %s", req->path, err.msg);
}

/* Submits one op and returns its completion. */
static struct done *run(struct fx *f, struct gs_fop_req req)
{
    int before = f->n_done;
    req.ctx = (void *)(intptr_t)(before + 1);
    submit(f, &req);
    struct gs_error err = {0};
    assert_int_equal(f->ops->drain(f->ops, &err), 0);
    assert_int_equal(f->n_done, before + 1);
    assert_int_equal(f->done[before].ctx, before + 1);
    return &f->done[before];
}

static struct gs_fop_req put_req(struct fx *f, const char *rel, uint32_t mode, int64_t mtime_ns,
                                 enum gs_fop_expect expect)
{
    static char local[PATH_MAX];
    struct gs_fop_req r;
    memset(&r, 0, sizeof(r));
    snprintf(local, sizeof(local), "%s/%s", f->local, rel);
    struct stat st;
    assert_int_equal(stat(local, &st), 0);
    r.type = GS_FOP_PUT;
    r.path = rel;
    r.local_file = local;
    r.size = (uint64_t)st.st_size;
    r.mode = mode;
    r.mtime_ns = mtime_ns;
    r.expect = expect;
    return r;
}

static struct gs_fop_req op_req(enum gs_fop_type type, const char *path, const char *path2,
                                uint32_t mode)
{
    struct gs_fop_req r;
    memset(&r, 0, sizeof(r));
    r.type = type;
    r.path = path;
    r.path2 = path2;
    r.mode = mode;
    return r;
}

/* Writes a small local file and puts it with FORCE; asserts success. */
static void put_text(struct fx *f, const char *rel, const char *text)
{
    write_local(f->local, rel, text, strlen(text), 0644);
    struct done *d = run(f, put_req(f, rel, 0644, 1700000000LL * 1000000000, GS_FOP_EXPECT_FORCE));
    if (!d->ok)
        fail_msg("put %s: %s", rel, d->message);
}

/* Counts entries under dir whose name contains `needle` (recursively). */
static int count_names(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    if (!d)
        return 0;
    while ((de = readdir(d))) {
        char sub[PATH_MAX];
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        n += strstr(de->d_name, needle) != NULL;
        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
        if (de->d_type == DT_DIR)
            n += count_names(sub, needle);
    }
    closedir(d);
    return n;
}

/* ---- tests --------------------------------------------------------------------------------- */

struct tree_file {
    const char *rel;
    mode_t mode;
    size_t size;
};

static void test_sftp_ops__put_tree_with_hostile_names_matches_bytes_modes_and_mtimes(void **state)
{
    struct fx *f = *state;
    char long_name[256];
    memset(long_name, 'n', 255);
    long_name[255] = '\0';
    struct tree_file files[] = {
        {"plain.txt", 0644, 100},
        {"with space.txt", 0600, 4096},
        {"new\nline", 0755, 17},
        {"-leading-dash", 0444, 1},
        {"\xff\xfe-not-utf8", 0640, 333},
        {long_name, 0644, 2000},
        {"a/b/c/deep.bin", 0700, (9u << 20) + 123}, /* three 4 MiB writes */
        {"a/empty", 0664, 0},
        {"a/b/x-ok", 0777, 10},
    };
    size_t n = sizeof(files) / sizeof(files[0]);
    char *data = malloc((9u << 20) + 123 + 16); /* file i starts at data + i */
    uint64_t total = 0;
    srand(42);
    for (size_t i = 0; i < (9u << 20) + 123 + 16; i++)
        data[i] = (char)(rand() & 0xff);
    open_ops(f, f->remote);
    for (size_t i = 0; i < n; i++) {
        write_local(f->local, files[i].rel, data + i, files[i].size, files[i].mode);
        int64_t mtime_ns = (1600000000LL + (int64_t)i * 1000) * 1000000000 + 123456789;
        struct done *d =
            run(f, put_req(f, files[i].rel, files[i].mode, mtime_ns, GS_FOP_EXPECT_FORCE));
        if (!d->ok)
            fail_msg("put %zu: %s", i, d->message);
        assert_false(d->has_kept);
        total += files[i].size;
    }
    free(data);
    for (size_t i = 0; i < n; i++) {
        assert_same_bytes(f, files[i].rel);
        struct stat st = lstat_at(f->remote, files[i].rel);
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(st.st_mode & 07777, files[i].mode);
        assert_int_equal(st.st_mtime, 1600000000LL + (int64_t)i * 1000);
    }
    assert_int_equal(f->ops->bytes_sent, total);
    assert_int_equal(count_names(f->remote, ".gpusync-tmp-"), 0);
}

static void test_sftp_ops__put_replaces_existing_file_and_keeps_no_copy_when_forced(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    put_text(f, "r.txt", "first version");
    put_text(f, "r.txt", "second, longer version");
    assert_same_bytes(f, "r.txt");
    assert_int_equal(count_names(f->remote, "gpusync-"), 0);
}

static void test_sftp_ops__put_over_directory_fails_with_eisdir_when_forced(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->remote, "d/inside", "keep", 4, 0644);
    write_local(f->local, "d", "x", 1, 0644);
    struct done *d = run(f, put_req(f, "d", 0644, 0, GS_FOP_EXPECT_FORCE));
    assert_false(d->ok);
    assert_int_equal(d->err_no, EISDIR);
    assert_non_null(strstr(d->message, "d"));
    assert_true(exists_at(f->remote, "d/inside"));
    assert_int_equal(count_names(f->remote, ".gpusync-tmp-"), 0);
}

static void test_sftp_ops__absent_put_keeps_conflict_copy_of_different_file(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->remote, "sub/c.txt", "edited on the server", 20, 0600);
    write_local(f->local, "sub/c.txt", "from the laptop", 15, 0644);
    struct done *d = run(f, put_req(f, "sub/c.txt", 0644, 0, GS_FOP_EXPECT_ABSENT));
    assert_true(d->ok);
    assert_true(d->has_kept);
    assert_int_equal(strncmp(d->kept, "sub/c.txt.gpusync-conflict-", 27), 0);
    assert_int_equal(strlen(d->kept), strlen("sub/c.txt.gpusync-conflict-20260101-000000"));
    size_t len;
    char *kept = read_all(f->remote, d->kept, &len);
    assert_non_null(kept);
    assert_int_equal(len, 20);
    assert_memory_equal(kept, "edited on the server", 20);
    free(kept);
    assert_same_bytes(f, "sub/c.txt");
}

/* SFTP v3 carries unsigned 32-bit seconds: a file of 1969 gets 1970-01-01, the nearest time it
 * can have, not a wrapped one (2106). */
static void test_sftp_ops__put_before_1970_gets_the_nearest_time(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->local, "old.txt", "1969", 4, 0644);
    struct done *d =
        run(f, put_req(f, "old.txt", 0644, -86400LL * 1000000000 + 5, GS_FOP_EXPECT_FORCE));
    assert_true(d->ok);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/old.txt", f->remote);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mtime, 0);
}

/* put_req with the content hash push.c gives a PUT (the XXH3-128 of the bytes to send). */
static struct gs_fop_req put_req_hashed(struct fx *f, const char *rel, enum gs_fop_expect expect)
{
    struct gs_fop_req r = put_req(f, rel, 0644, 0, expect);
    size_t len;
    char *bytes = read_all(f->local, rel, &len);
    assert_non_null(bytes);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(bytes, len));
    memcpy(r.content_hash, c.digest, 16);
    free(bytes);
    return r;
}

/* A new file's path that holds a file of its size on the server: the bytes decide. Other bytes
 * are someone's file, kept as a conflict copy (size alone once let this PUT replace it); the
 * same bytes are what an interrupted push left, replaced without a copy. */
static void test_sftp_ops__absent_put_over_same_sized_file_keeps_it_when_it_differs(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->remote, "s.txt", "aaaa", 4, 0644);
    write_local(f->local, "s.txt", "bbbb", 4, 0644);
    struct done *d = run(f, put_req_hashed(f, "s.txt", GS_FOP_EXPECT_ABSENT));
    assert_true(d->ok);
    assert_true(d->has_kept);
    size_t len;
    char *kept = read_all(f->remote, d->kept, &len);
    assert_non_null(kept);
    assert_int_equal(len, 4);
    assert_memory_equal(kept, "aaaa", 4);
    free(kept);
    assert_same_bytes(f, "s.txt");

    write_local(f->remote, "t.txt", "cccc", 4, 0644);
    write_local(f->local, "t.txt", "cccc", 4, 0644);
    d = run(f, put_req_hashed(f, "t.txt", GS_FOP_EXPECT_ABSENT));
    assert_true(d->ok);
    assert_false(d->has_kept);
    assert_same_bytes(f, "t.txt");
    assert_int_equal(count_names(f->remote, "gpusync-conflict"), 1);
}

static void test_sftp_ops__hash_put_keeps_directory_in_the_way(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->remote, "w/inside", "server data", 11, 0644);
    write_local(f->local, "w", "a file now", 10, 0644);
    struct done *d = run(f, put_req(f, "w", 0644, 0, GS_FOP_EXPECT_HASH));
    assert_true(d->ok);
    assert_true(d->has_kept);
    char inside[PATH_MAX + 16];
    snprintf(inside, sizeof(inside), "%s/inside", d->kept);
    assert_true(exists_at(f->remote, inside));
    assert_same_bytes(f, "w");
}

static void test_sftp_ops__conflict_copy_of_255_byte_name_fits_name_max(void **state)
{
    struct fx *f = *state;
    char name[256];
    memset(name, 'L', 255);
    name[255] = '\0';
    open_ops(f, f->remote);
    write_local(f->remote, name, "old", 3, 0644);
    write_local(f->local, name, "new content", 11, 0644);
    struct done *d = run(f, put_req(f, name, 0644, 0, GS_FOP_EXPECT_ABSENT));
    if (!d->ok)
        fail_msg("%s", d->message);
    assert_true(d->has_kept);
    assert_true(strlen(d->kept) <= 255);
    assert_true(exists_at(f->remote, d->kept));
    assert_same_bytes(f, name);
}

static void test_sftp_ops__mkdir_creates_parents_with_exact_mode_then_is_noop(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    struct done *d = run(f, op_req(GS_FOP_MKDIR, "x/y z/-w", NULL, 0770));
    assert_true(d->ok);
    assert_false(d->noop);
    struct stat st = lstat_at(f->remote, "x/y z/-w");
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0770);
    d = run(f, op_req(GS_FOP_MKDIR, "x/y z/-w", NULL, 0770));
    assert_true(d->ok);
    assert_true(d->noop);
    d = run(f, op_req(GS_FOP_MKDIR, "x/y z/-w", NULL, 0700));
    assert_true(d->ok);
    assert_int_equal(lstat_at(f->remote, "x/y z/-w").st_mode & 07777, 0700);
}

static void test_sftp_ops__rename_replaces_target_and_creates_parents(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    put_text(f, "a.txt", "content of a");
    put_text(f, "b.txt", "content of b, to be replaced");
    struct gs_fop_req r = op_req(GS_FOP_RENAME, "a.txt", "b.txt", 0);
    struct done *d = run(f, r);
    assert_true(d->ok);
    assert_false(exists_at(f->remote, "a.txt"));
    size_t len;
    char *b = read_all(f->remote, "b.txt", &len);
    assert_int_equal(len, 12);
    assert_memory_equal(b, "content of a", 12);
    free(b);
    d = run(f, op_req(GS_FOP_RENAME, "b.txt", "new dir/\n/c.txt", 0));
    assert_true(d->ok);
    assert_true(S_ISREG(lstat_at(f->remote, "new dir/\n/c.txt").st_mode));
    d = run(f, op_req(GS_FOP_RENAME, "gone", "elsewhere", 0));
    assert_false(d->ok);
    assert_int_equal(d->err_no, ENOENT);
    assert_non_null(strstr(d->message, "gone"));
}

static void test_sftp_ops__absent_rename_keeps_what_was_at_the_destination(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    put_text(f, "from", "moved");
    write_local(f->remote, "to", "server file", 11, 0644);
    struct gs_fop_req r = op_req(GS_FOP_RENAME, "from", "to", 0);
    r.expect = GS_FOP_EXPECT_ABSENT;
    struct done *d = run(f, r);
    assert_true(d->ok);
    assert_true(d->has_kept);
    size_t len;
    char *kept = read_all(f->remote, d->kept, &len);
    assert_int_equal(len, 11);
    free(kept);
    char *to = read_all(f->remote, "to", &len);
    assert_int_equal(len, 5);
    assert_memory_equal(to, "moved", 5);
    free(to);
}

static void test_sftp_ops__symlink_stores_target_verbatim_and_replaces_old_link(void **state)
{
    struct fx *f = *state;
    char buf[PATH_MAX], path[PATH_MAX];
    open_ops(f, f->remote);
    struct done *d = run(f, op_req(GS_FOP_SYMLINK, "links/l", "../no such target", 0));
    if (!d->ok)
        fail_msg("%s", d->message);
    snprintf(path, sizeof(path), "%s/links/l", f->remote);
    ssize_t n = readlink(path, buf, sizeof(buf));
    assert_int_equal(n, strlen("../no such target"));
    assert_memory_equal(buf, "../no such target", (size_t)n);
    d = run(f, op_req(GS_FOP_SYMLINK, "links/l", "-other", 0));
    assert_true(d->ok);
    assert_false(d->noop);
    n = readlink(path, buf, sizeof(buf));
    assert_int_equal(n, 6);
    assert_memory_equal(buf, "-other", 6);
    d = run(f, op_req(GS_FOP_SYMLINK, "links/l", "-other", 0));
    assert_true(d->ok);
    assert_true(d->noop);
}

static void test_sftp_ops__chmod_sets_mode_and_reports_missing_path(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    put_text(f, "m.sh", "#!/bin/sh\n");
    struct done *d = run(f, op_req(GS_FOP_CHMOD, "m.sh", NULL, 0751));
    assert_true(d->ok);
    assert_int_equal(lstat_at(f->remote, "m.sh").st_mode & 07777, 0751);
    d = run(f, op_req(GS_FOP_CHMOD, "missing file", NULL, 0644));
    assert_false(d->ok);
    assert_int_equal(d->err_no, ENOENT);
    assert_non_null(strstr(d->message, "missing file"));
}

static void test_sftp_ops__delete_file_link_tree_without_following_links(void **state)
{
    struct fx *f = *state;
    char outside[PATH_MAX], link[PATH_MAX];
    open_ops(f, f->remote);
    snprintf(outside, sizeof(outside), "%s/outside", f->base);
    mkdir(outside, 0755);
    write_local(outside, "precious", "do not delete", 13, 0644);
    put_text(f, "t/one", "1");
    put_text(f, "t/sub/two", "2");
    snprintf(link, sizeof(link), "%s/t/sub/escape", f->remote);
    assert_int_equal(symlink(outside, link), 0);
    put_text(f, "lone", "x");

    struct done *d = run(f, op_req(GS_FOP_DELETE, "lone", NULL, 0));
    assert_true(d->ok);
    assert_false(exists_at(f->remote, "lone"));
    d = run(f, op_req(GS_FOP_DELETE, "t", NULL, 0));
    assert_false(d->ok);
    assert_int_equal(d->err_no, ENOTEMPTY);
    assert_true(exists_at(f->remote, "t/one"));
    struct gs_fop_req r = op_req(GS_FOP_DELETE, "t", NULL, 0);
    r.recursive = 1;
    d = run(f, r);
    assert_true(d->ok);
    assert_false(exists_at(f->remote, "t"));
    assert_true(exists_at(outside, "precious"));
    d = run(f, op_req(GS_FOP_DELETE, "t", NULL, 0));
    assert_true(d->ok);
    assert_true(d->noop);
}

/* XXH3-128 of dir/rel in canonical bytes, as the index keeps it. */
static void hash_of(const char *dir, const char *rel, uint8_t out[16])
{
    size_t len;
    char *data = read_all(dir, rel, &len);
    assert_non_null(data);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, len));
    memcpy(out, c.digest, 16);
    free(data);
}

/* Flips one byte in the middle of dir/rel, in place: same size, same kind, other content. */
static void edit_in_place(const char *dir, const char *rel)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, rel);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t mid = lseek(fd, 0, SEEK_END) / 2;
    char c;
    assert_int_equal(pread(fd, &c, 1, mid), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(fd, &c, 1, mid), 1);
    close(fd);
}

/* Asserts that `kept` (relative to the remote root) holds the bytes of local file `want`. */
static void assert_kept_bytes(struct fx *f, const struct done *d, const char *want_path)
{
    size_t a_len = 0, b_len = 0;
    assert_true(d->has_kept);
    char *a = read_all(f->base, want_path, &a_len), *b = read_all(f->remote, d->kept, &b_len);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a_len, b_len);
    assert_memory_equal(a, b, a_len);
    free(a);
    free(b);
}

/* A server edit of a file gpusync wrote is kept before a PUT or DELETE replaces it, whatever its
 * size: the content is compared, not only the kind (files over 8 MiB once were not hashed, and
 * an edit of one was overwritten or deleted without a copy). */
static void test_sftp_ops__server_edit_of_a_large_file_is_kept_before_put_and_delete(void **state)
{
    struct fx *f = *state;
    size_t n = (9u << 20) + 7;
    char *data = malloc(n);
    uint8_t ours[16];
    for (size_t i = 0; i < n; i++)
        data[i] = (char)(i * 2654435761u >> 13);
    open_ops(f, f->remote);
    write_local(f->local, "ckpt.bin", data, n, 0644);
    struct done *d = run(f, put_req(f, "ckpt.bin", 0644, 0, GS_FOP_EXPECT_ABSENT));
    assert_true(d->ok);
    hash_of(f->remote, "ckpt.bin", ours);

    edit_in_place(f->remote, "ckpt.bin");
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof(cmd), "cp '%s/ckpt.bin' '%s/edited'", f->remote, f->base);
    assert_int_equal(system(cmd), 0);
    data[0] ^= 1; /* the laptop's next version */
    write_local(f->local, "ckpt.bin", data, n, 0644);
    struct gs_fop_req r = put_req(f, "ckpt.bin", 0644, 0, GS_FOP_EXPECT_HASH);
    memcpy(r.hash, ours, 16);
    d = run(f, r);
    assert_true(d->ok);
    assert_kept_bytes(f, d, "edited");
    assert_same_bytes(f, "ckpt.bin");

    hash_of(f->remote, "ckpt.bin", ours);
    edit_in_place(f->remote, "ckpt.bin");
    snprintf(cmd, sizeof(cmd), "cp '%s/ckpt.bin' '%s/edited'", f->remote, f->base);
    assert_int_equal(system(cmd), 0);
    struct gs_fop_req del = op_req(GS_FOP_DELETE, "ckpt.bin", NULL, 0);
    del.expect = GS_FOP_EXPECT_HASH;
    memcpy(del.hash, ours, 16);
    d = run(f, del);
    assert_true(d->ok);
    assert_kept_bytes(f, d, "edited");
    assert_false(exists_at(f->remote, "ckpt.bin"));
    free(data);
}

/* Asserts that op failed with ELOOP naming the symlinked directory `via`, and left `outside` as
 * it was (one file, "precious", 0600). */
static void assert_refused_via(struct fx *f, struct gs_fop_req req, const char *via,
                               const char *outside)
{
    struct done *d = run(f, req);
    if (d->ok || d->err_no != ELOOP)
        fail_msg("%s %s: ok %d, errno %d (%s)", req.type == GS_FOP_PUT ? "put" : "op", req.path,
                 d->ok, d->err_no, d->message);
    assert_non_null(strstr(d->message, via));
    assert_int_equal(count_names(outside, ""), 1);
    assert_int_equal(lstat_at(outside, "precious").st_mode & 07777, 0600);
    size_t len;
    char *v = read_all(outside, "precious", &len);
    assert_int_equal(len, 13);
    assert_memory_equal(v, "do not change", 13);
    free(v);
}

/* A directory replaced on the server by a symlink (here to a folder outside the root) is never
 * written, deleted, renamed or chmod'ed through, at any depth: the agent refuses such paths with
 * ELOOP, and so does the SFTP transport now (it used to write through the link). */
static void test_sftp_ops__a_symlinked_directory_is_never_written_through(void **state)
{
    struct fx *f = *state;
    char outside[PATH_MAX], link[PATH_MAX];
    open_ops(f, f->remote);
    snprintf(outside, sizeof(outside), "%s/outside", f->base);
    mkdir(outside, 0755);
    write_local(outside, "precious", "do not change", 13, 0600);
    put_text(f, "real/keep", "inside");
    snprintf(link, sizeof(link), "%s/link", f->remote);
    assert_int_equal(symlink(outside, link), 0);
    snprintf(link, sizeof(link), "%s/real/deeper", f->remote);
    assert_int_equal(symlink("../../../outside", link), 0);
    write_local(f->local, "link/new", "escape", 6, 0644);
    write_local(f->local, "real/deeper/new", "escape", 6, 0644);

    assert_refused_via(f, put_req(f, "link/new", 0644, 0, GS_FOP_EXPECT_ABSENT), "link", outside);
    assert_refused_via(f, put_req(f, "real/deeper/new", 0644, 0, GS_FOP_EXPECT_FORCE),
                       "real/deeper", outside);
    struct gs_fop_req over = put_req(f, "link/new", 0644, 0, GS_FOP_EXPECT_FORCE);
    over.path = "link/precious";
    assert_refused_via(f, over, "link", outside);
    assert_refused_via(f, op_req(GS_FOP_MKDIR, "link/sub/more", NULL, 0755), "link", outside);
    struct gs_fop_req del = op_req(GS_FOP_DELETE, "real/deeper/precious", NULL, 0);
    assert_refused_via(f, del, "real/deeper", outside);
    assert_refused_via(f, op_req(GS_FOP_CHMOD, "link/precious", NULL, 0777), "link", outside);
    assert_refused_via(f, op_req(GS_FOP_RENAME, "link/precious", "stolen", 0), "link", outside);
    assert_refused_via(f, op_req(GS_FOP_RENAME, "real/keep", "link/planted", 0), "link", outside);
    assert_refused_via(f, op_req(GS_FOP_SYMLINK, "link/l", "x", 0), "link", outside);

    /* What the link points to is not reported as the server's either. */
    const char *paths[] = {"link/precious", "real/keep"};
    struct gs_fop_stat seen[2];
    struct gs_error err = {0};
    assert_int_equal(f->ops->probe(f->ops, paths, 2, seen, &err), 0);
    assert_int_equal(seen[0].kind, GS_FOP_KIND_UNKNOWN);
    assert_int_equal(seen[1].kind, GS_FOP_KIND_FILE);
    assert_true(exists_at(f->remote, "real/keep"));
}

/* A DELETE that expects a directory keeps whatever else is there (a file that replaced the
 * directory on the server) as a conflict copy, and removes a directory as before. */
static void test_sftp_ops__delete_expecting_a_directory_keeps_a_file_in_its_place(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->remote, "was_a_dir", "server file", 11, 0644);
    write_local(f->base, "server_copy", "server file", 11, 0644);
    struct gs_fop_req r = op_req(GS_FOP_DELETE, "was_a_dir", NULL, 0);
    r.expect = GS_FOP_EXPECT_DIR;
    r.recursive = 1;
    struct done *d = run(f, r);
    assert_true(d->ok);
    assert_kept_bytes(f, d, "server_copy");
    assert_false(exists_at(f->remote, "was_a_dir"));

    put_text(f, "still_a_dir/x", "1");
    r.path = "still_a_dir";
    d = run(f, r);
    assert_true(d->ok);
    assert_false(d->has_kept);
    assert_false(exists_at(f->remote, "still_a_dir"));
    assert_int_equal(count_names(f->remote, "gpusync-conflict"), 1);
}

/* setuid and setgid never reach the server (sftp-server may run as root, and a pushed file
 * would become a root set-id program), on every path that sets a mode; the sticky bit does. */
static void test_sftp_ops__setuid_and_setgid_bits_are_never_mirrored(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->local, "small", "#!/bin/sh\n", 10, 0755);
    char *big = calloc(1, 512u << 10);
    write_local(f->local, "big", big, 512u << 10, 0755);
    free(big);
    assert_true(run(f, put_req(f, "small", 06755, 0, GS_FOP_EXPECT_ABSENT))->ok); /* window */
    assert_true(run(f, put_req(f, "big", 04711, 0, GS_FOP_EXPECT_ABSENT))->ok);   /* alone */
    assert_int_equal(lstat_at(f->remote, "small").st_mode & 07777, 0755);
    assert_int_equal(lstat_at(f->remote, "big").st_mode & 07777, 0711);
    assert_true(run(f, op_req(GS_FOP_CHMOD, "small", NULL, 04750))->ok);
    assert_int_equal(lstat_at(f->remote, "small").st_mode & 07777, 0750);
    assert_true(run(f, op_req(GS_FOP_MKDIR, "shared", NULL, 03775))->ok);
    assert_int_equal(lstat_at(f->remote, "shared").st_mode & 07777, 01775);
}

static void test_sftp_ops__completions_arrive_in_submission_order(void **state)
{
    struct fx *f = *state;
    open_ops(f, f->remote);
    write_local(f->local, "o1", "one", 3, 0644);
    struct gs_fop_req reqs[4] = {
        put_req(f, "o1", 0644, 0, GS_FOP_EXPECT_FORCE),
        op_req(GS_FOP_CHMOD, "not there", NULL, 0600),
        op_req(GS_FOP_MKDIR, "o2", NULL, 0755),
        op_req(GS_FOP_RENAME, "o1", "o2/o1", 0),
    };
    for (int i = 0; i < 4; i++) {
        reqs[i].ctx = (void *)(intptr_t)(100 + i);
        submit(f, &reqs[i]);
    }
    struct gs_error err = {0};
    assert_int_equal(f->ops->drain(f->ops, &err), 0);
    assert_int_equal(f->n_done, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(f->done[i].ctx, 100 + i);
        assert_int_equal(f->done[i].ok, i != 1);
    }
    assert_int_equal(f->done[1].err_no, ENOENT);
    assert_true(exists_at(f->remote, "o2/o1"));
}

/* Many small PUTs in flight at once (the overlapped window), with the unusual cases mixed in:
 * missing parents created by several entries at once, a conflict, a vanished local file. */
static void test_sftp_ops__many_small_puts_overlap_and_complete_in_order(void **state)
{
    struct fx *f = *state;
    enum { N = 120 };
    static char names[N][64];
    static struct gs_fop_req reqs[N];
    open_ops(f, f->remote);
    write_local(f->remote, "d1/f7", "server copy, longer", 19, 0644);
    for (int i = 0; i < N; i++) {
        char body[64];
        int len = snprintf(body, sizeof(body), "file %d %.*s", i, i % 40,
                           "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
        snprintf(names[i], sizeof(names[i]), "d%d/f%d", i % 6, i);
        write_local(f->local, names[i], body, (size_t)len, i % 2 ? 0640 : 0755);
        reqs[i] = put_req(f, names[i], i % 2 ? 0640 : 0755, (1500000000LL + i) * 1000000000,
                          i == 7 ? GS_FOP_EXPECT_ABSENT : GS_FOP_EXPECT_FORCE);
        reqs[i].ctx = (void *)(intptr_t)(1000 + i);
    }
    char gone[PATH_MAX];
    snprintf(gone, sizeof(gone), "%s/%s", f->local, names[11]);
    unlink(gone);
    for (int i = 0; i < N; i++) {
        char local[sizeof(f->local) + sizeof(names[i]) + 1];
        snprintf(local, sizeof(local), "%s/%.63s", f->local, names[i]);
        reqs[i].local_file = local; /* put_req's buffer is shared; submit copies what it keeps */
        submit(f, &reqs[i]);
    }
    struct gs_error err = {0};
    assert_int_equal(f->ops->drain(f->ops, &err), 0);
    assert_int_equal(f->n_done, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(f->done[i].ctx, 1000 + i);
        if (i == 11) {
            assert_false(f->done[i].ok);
            assert_int_equal(f->done[i].err_no, ENOENT);
            assert_false(exists_at(f->remote, names[i]));
            continue;
        }
        if (!f->done[i].ok)
            fail_msg("put %s: %s", names[i], f->done[i].message);
        assert_int_equal(f->done[i].has_kept, i == 7);
        assert_same_bytes(f, names[i]);
        struct stat st = lstat_at(f->remote, names[i]);
        assert_int_equal(st.st_mode & 07777, i % 2 ? 0640 : 0755);
        assert_int_equal(st.st_mtime, 1500000000LL + i);
    }
    assert_int_equal(strncmp(f->done[7].kept, "d1/f7.gpusync-conflict-", 23), 0);
    assert_int_equal(count_names(f->remote, ".gpusync-tmp-"), 0);
}

static void test_sftp_ops__close_without_drain_finishes_puts_in_flight(void **state)
{
    struct fx *f = *state;
    char names[20][16];
    open_ops(f, f->remote);
    for (int i = 0; i < 20; i++) {
        snprintf(names[i], sizeof(names[i]), "c%02d", i);
        write_local(f->local, names[i], names[i], 3, 0644);
        struct gs_fop_req r = put_req(f, names[i], 0644, 0, GS_FOP_EXPECT_FORCE);
        submit(f, &r);
    }
    int before = f->n_done;
    f->ops->close(f->ops);
    f->ops = NULL;
    assert_int_equal(f->n_done, before); /* no completions from close */
    for (int i = 0; i < 20; i++)
        assert_same_bytes(f, names[i]);
    assert_int_equal(count_names(f->remote, ".gpusync-tmp-"), 0);
}

static void test_sftp_ops__relative_root_is_created_under_home(void **state)
{
    struct fx *f = *state;
    char rel[128], home_root[PATH_MAX], cmd[PATH_MAX + 16];
    struct passwd *pw = getpwnam("root");
    assert_non_null(pw);
    snprintf(rel, sizeof(rel), "gs-sftp-rel-%d/proj/", (int)getpid());
    snprintf(home_root, sizeof(home_root), "%s/gs-sftp-rel-%d", pw->pw_dir, (int)getpid());
    open_ops(f, rel);
    put_text(f, "here.txt", "relative");
    snprintf(cmd, sizeof(cmd), "%s/proj/here.txt", home_root);
    struct stat st;
    int found = stat(cmd, &st) == 0;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", home_root);
    assert_int_equal(system(cmd), 0);
    assert_true(found);
}

static void test_sftp_ops__full_disk_reports_enospc_and_leaves_old_file(void **state)
{
    struct fx *f = *state;
    char parent[PATH_MAX];
    size_t big = 3u << 20, len;
    snprintf(parent, sizeof(parent), "%s/remote", f->base);
    mkdir(parent, 0755);
    mkdir(f->remote, 0755);
    if (mount("tmpfs", f->remote, "tmpfs", 0, "size=1m") < 0) {
        fprintf(stderr, "cannot mount a tmpfs (%s): skipped\n", strerror(errno));
        skip();
    }
    f->mounted = 1;
    open_ops(f, f->remote);
    put_text(f, "keep.txt", "old content");
    char *data = calloc(1, big);
    write_local(f->local, "big.bin", data, big, 0644);
    write_local(f->local, "keep.txt", data, big, 0644);
    free(data);
    struct done *d = run(f, put_req(f, "big.bin", 0644, 0, GS_FOP_EXPECT_FORCE));
    assert_false(d->ok);
    assert_int_equal(d->err_no, ENOSPC);
    assert_non_null(strstr(d->message, "big.bin"));
    d = run(f, put_req(f, "keep.txt", 0644, 0, GS_FOP_EXPECT_FORCE));
    assert_int_equal(d->err_no, ENOSPC);
    char *old = read_all(f->remote, "keep.txt", &len);
    assert_int_equal(len, 11);
    assert_memory_equal(old, "old content", 11);
    free(old);
    assert_int_equal(count_names(f->remote, ".gpusync-tmp-"), 0);
    assert_false(exists_at(f->remote, "big.bin"));
    put_text(f, "small", "fits after the failed upload was cleaned up");
}

/* ---- transport failure --------------------------------------------------------------------- */

/* The link dies under the transport (its socket shut down, as when a laptop drops off the
 * network with a RST): submit and drain fail, and no completion is reported for the lost op. */
static void test_sftp_ops__lost_connection_fails_submit_without_completion(void **state)
{
    struct fx *f = *state;
    struct gs_ssh *ssh;
    struct gs_error err = {0};
    assert_int_equal(connect_ssh(&g_sshd, &ssh), 0);
    assert_int_equal(gs_sftp_ops_open(&f->ops, ssh, f->remote, &err), 0);
    f->ops->done = on_done;
    f->ops->done_ctx = f;
    put_text(f, "before", "ok");
    assert_int_equal(shutdown(gs_ssh_fd(ssh), SHUT_RDWR), 0);
    write_local(f->local, "after", "x", 1, 0644);
    struct gs_fop_req r = put_req(f, "after", 0644, 0, GS_FOP_EXPECT_FORCE);
    int rc = f->ops->submit(f->ops, &r, &err);
    assert_true(rc < 0);
    assert_true(err.msg[0] != '\0');
    assert_int_equal(f->n_done, 1);
    assert_true(f->ops->drain(f->ops, &err) < 0);
    assert_true(f->ops->submit(f->ops, &r, &err) < 0);
    assert_int_equal(f->n_done, 1);
    f->ops->close(f->ops);
    f->ops = NULL;
    gs_ssh_free(ssh);
}

int main(void)
{
    const struct CMUnitTest shared[] = {
#define T(name) cmocka_unit_test_setup_teardown(test_sftp_ops__##name, setup, teardown)
        T(put_tree_with_hostile_names_matches_bytes_modes_and_mtimes),
        T(put_replaces_existing_file_and_keeps_no_copy_when_forced),
        T(put_over_directory_fails_with_eisdir_when_forced),
        T(absent_put_keeps_conflict_copy_of_different_file),
        T(absent_put_over_same_sized_file_keeps_it_when_it_differs),
        T(put_before_1970_gets_the_nearest_time),
        T(hash_put_keeps_directory_in_the_way),
        T(conflict_copy_of_255_byte_name_fits_name_max),
        T(mkdir_creates_parents_with_exact_mode_then_is_noop),
        T(rename_replaces_target_and_creates_parents),
        T(absent_rename_keeps_what_was_at_the_destination),
        T(symlink_stores_target_verbatim_and_replaces_old_link),
        T(chmod_sets_mode_and_reports_missing_path),
        T(delete_file_link_tree_without_following_links),
        T(server_edit_of_a_large_file_is_kept_before_put_and_delete),
        T(a_symlinked_directory_is_never_written_through),
        T(delete_expecting_a_directory_keeps_a_file_in_its_place),
        T(setuid_and_setgid_bits_are_never_mirrored),
        T(completions_arrive_in_submission_order),
        T(many_small_puts_overlap_and_complete_in_order),
        T(close_without_drain_finishes_puts_in_flight),
        T(relative_root_is_created_under_home),
        T(full_disk_reports_enospc_and_leaves_old_file),
        T(lost_connection_fails_submit_without_completion),
#undef T
    };
    int failed = cmocka_run_group_tests_name("sftp_ops", shared, group_setup, group_teardown);
    return failed;
}
