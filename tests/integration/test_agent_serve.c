/* Integration tests for `gpusync-agent serve`: the real built agent is spawned over pipes
 * (GS_BUILD_DIR/agent/gpusync-agent) and driven with the shared protocol codec; every test
 * asserts on the files the agent leaves in (and outside) its root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "integration/agent_harness.h"

struct fx {
    char base[64];     /* temporary directory holding root/ and outside/ */
    char root[256];    /* the agent's root */
    char outside[256]; /* must never be touched */
    int mounted;
    struct agent_h a;
    int started;
    struct agent_h b; /* a second session on the same root */
    int b_started;
};

/* A reply copied out of the harness buffer. */
struct rep {
    uint8_t type;
    uint32_t id, flags;
    int err;
    char kept[PATH_MAX];
    char text[2048];
};

/* ---- helpers ----------------------------------------------------------------------------- */

static void copy_reply(const struct gs_proto_msg *m, struct rep *r)
{
    memset(r, 0, sizeof(*r));
    r->type = m->type;
    r->id = m->id;
    r->flags = m->flags;
    r->err = m->err;
    snprintf(r->kept, sizeof(r->kept), "%.*s", (int)m->path2.len, m->path2.p);
    snprintf(r->text, sizeof(r->text), "%.*s", (int)m->text.len, m->text.p);
}

static struct rep call(struct fx *f, struct gs_proto_msg *m)
{
    struct gs_proto_msg r;
    struct rep out;
    assert_int_equal(agent_h_call(&f->a, m, &r), 0);
    assert_int_equal(r.id, m->id);
    copy_reply(&r, &out);
    return out;
}

static struct gs_proto_msg req(uint8_t type, const char *path)
{
    struct gs_proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.path = gs_proto_cstr(path);
    m.path2 = gs_proto_cstr("");
    m.meta.mode = 0644;
    return m;
}

static struct gs_proto_msg put_msg(const char *path, const char *data, uint8_t expect,
                                   const char *expected_content)
{
    struct gs_proto_msg m = req(GS_MSG_PUT, path);
    m.data.p = data;
    m.data.len = (uint32_t)strlen(data);
    m.meta.mtime_sec = 1600000000;
    m.expect.kind = expect;
    if (expected_content)
        agent_h_hash(expected_content, strlen(expected_content), m.expect.hash);
    return m;
}

static struct rep put(struct fx *f, const char *path, const char *data)
{
    struct gs_proto_msg m = put_msg(path, data, GS_EXPECT_FORCE, NULL);
    return call(f, &m);
}

static void at(struct fx *f, const char *rel, char *out)
{
    snprintf(out, PATH_MAX, "%s/%s", f->root, rel);
}

/* Reads a whole file (NUL-terminated copy); NULL if it cannot be read. */
static char *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, fp);
    fclose(fp);
    buf[got] = '\0';
    if (len)
        *len = got;
    return buf;
}

static void assert_content(struct fx *f, const char *rel, const char *want)
{
    char p[PATH_MAX];
    at(f, rel, p);
    char *got = slurp(p, NULL);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void write_file(const char *path, const char *data)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(data, fp);
    fclose(fp);
}

/* Counts entries of dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL)
        if (!strncmp(de->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

static int count_entries(const char *dir)
{
    return count_prefixed(dir, "") - 2; /* minus . and .. */
}

/* Lists path and returns how many entries came back (-1 on an error reply). */
static int list_count(struct fx *f, const char *path, uint32_t flags)
{
    struct gs_proto_msg l = req(GS_MSG_LIST, path), r;
    l.flags = flags;
    agent_h_queue(&f->a, &l);
    int n = 0;
    for (;;) {
        assert_int_equal(agent_h_recv(&f->a, &r), 0);
        assert_int_equal(r.id, l.id);
        if (r.type == GS_MSG_ERROR)
            return -1;
        if (r.type == GS_MSG_LIST_END)
            break;
        assert_int_equal(r.type, GS_MSG_LIST_ENTRIES);
        n += (int)r.count;
    }
    assert_true(r.size == (uint64_t)n);
    return n;
}

/* ---- fixture ----------------------------------------------------------------------------- */

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    if (!agent_h_binary() || access(agent_h_binary(), X_OK) != 0) {
        fprintf(stderr, "GS_BUILD_DIR unset or agent not built\n");
        free(f);
        return -1;
    }
    snprintf(f->base, sizeof(f->base), "/tmp/gs-agent-test-XXXXXX");
    if (!mkdtemp(f->base))
        return -1;
    snprintf(f->root, sizeof(f->root), "%s/root", f->base);
    snprintf(f->outside, sizeof(f->outside), "%s/outside", f->base);
    if (mkdir(f->outside, 0755) < 0)
        return -1;
    *state = f;
    return 0;
}

static void start(struct fx *f)
{
    char got[PATH_MAX];
    assert_int_equal(agent_h_open(&f->a, f->root, got, sizeof(got)), 0);
    f->started = 1;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    char cmd[PATH_MAX + 32];
    if (f->started)
        agent_h_close(&f->a);
    if (f->b_started)
        agent_h_close(&f->b);
    if (f->mounted)
        umount(f->root);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->base);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->base);
    free(f);
    return 0;
}

/* ---- handshake --------------------------------------------------------------------------- */

static void test_serve__handshake_reports_versions_and_creates_absolute_root(void **state)
{
    struct fx *f = *state;
    char got[PATH_MAX], want[PATH_MAX + 16];
    snprintf(f->root, sizeof(f->root), "%s/root/deep/er", f->base);
    assert_int_equal(agent_h_open(&f->a, f->root, got, sizeof(got)), 0);
    f->started = 1;
    assert_non_null(realpath(f->root, want));
    assert_string_equal(got, want);
    assert_int_equal(got[0], '/');
}

static void test_serve__version_mismatch_is_a_clear_error(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg m = {0}, r;
    assert_int_equal(agent_h_start(&f->a, f->root, NULL), 0);
    m.type = GS_MSG_HELLO;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION + 41;
    assert_int_equal(agent_h_call(&f->a, &m, &r), 0);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EPROTONOSUPPORT);
    struct rep c;
    copy_reply(&r, &c);
    assert_non_null(strstr(c.text, "version mismatch"));
    assert_int_equal(agent_h_close(&f->a), 2);
}

static void test_serve__version_flag_prints_agent_and_protocol_versions(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16], line[256] = "";
    snprintf(cmd, sizeof(cmd), "'%s' --version", agent_h_binary());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(line, sizeof(line), p));
    assert_int_equal(pclose(p), 0);
    char want[64];
    snprintf(want, sizeof(want), "(protocol %d)", GS_PROTO_VERSION);
    assert_non_null(strstr(line, want));
    assert_non_null(strstr(line, "gpusync-agent "));
}

static void test_serve__usage_errors_go_to_stderr_not_stdout(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 64], out[64] = "";
    snprintf(cmd, sizeof(cmd), "'%s' serve 2>/dev/null; echo \"rc=$?\"", agent_h_binary());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(out, sizeof(out), p));
    pclose(p);
    assert_string_equal(out, "rc=2\n"); /* nothing before the status line: stdout is clean */
}

static void test_serve__fsync_mode_still_writes_files(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg m = {0}, r;
    assert_int_equal(agent_h_start(&f->a, f->root, "--fsync"), 0);
    f->started = 1;
    m.type = GS_MSG_HELLO;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION;
    m.flags = GS_HELLO_FSYNC;
    assert_int_equal(agent_h_call(&f->a, &m, &r), 0);
    assert_int_equal(r.type, GS_MSG_HELLO_OK);
    assert_int_equal(put(f, "synced/file", "durable").type, GS_MSG_DONE);
    assert_content(f, "synced/file", "durable");
}

/* Starts a session asking for the sync id; returns it (static storage). */
static const char *hello_sync_id(struct fx *f)
{
    static char id[128];
    struct gs_proto_msg m = {0}, r;
    assert_int_equal(agent_h_start(&f->a, f->root, NULL), 0);
    f->started = 1;
    m.type = GS_MSG_HELLO;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION;
    m.flags = GS_HELLO_SYNC_ID;
    assert_int_equal(agent_h_call(&f->a, &m, &r), 0);
    assert_int_equal(r.type, GS_MSG_HELLO_OK);
    snprintf(id, sizeof(id), "%.*s", (int)r.path.len, r.path.p);
    assert_int_equal(agent_h_close(&f->a), 0);
    f->started = 0;
    return id;
}

static void test_serve__hello_creates_the_sync_id_once_and_answers_it(void **state)
{
    struct fx *f = *state;
    char first[128], path[512], stored[128] = "";
    snprintf(first, sizeof(first), "%s", hello_sync_id(f));
    assert_int_equal(strlen(first), 32);
    assert_int_equal(strspn(first, "0123456789abcdef"), 32);
    snprintf(path, sizeof(path), "%s/.gpusync/sync-id", f->root);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    assert_non_null(fgets(stored, sizeof(stored), fp));
    fclose(fp);
    assert_int_equal(strncmp(stored, first, 32), 0);
    assert_string_equal(hello_sync_id(f), first); /* a second session keeps it */
}

static void test_serve__sync_id_behind_a_symlink_is_not_followed(void **state)
{
    struct fx *f = *state;
    char link[512], escaped[512];
    snprintf(link, sizeof(link), "%s/.gpusync", f->root);
    assert_true(mkdir(f->root, 0755) == 0 || errno == EEXIST);
    assert_int_equal(symlink(f->outside, link), 0);
    assert_string_equal(hello_sync_id(f), "");
    snprintf(escaped, sizeof(escaped), "%s/sync-id", f->outside);
    assert_int_equal(access(escaped, F_OK), -1);
}

/* ---- puts -------------------------------------------------------------------------------- */

static void test_serve__pipelined_puts_are_answered_in_order(void **state)
{
    struct fx *f = *state;
    enum { N = 500 };
    static char names[N][32], bodies[N][32];
    start(f);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "d%d/f%03d.txt", i % 7, i);
        snprintf(bodies[i], sizeof(bodies[i]), "body %d\n", i);
        struct gs_proto_msg m = put_msg(names[i], bodies[i], GS_EXPECT_ABSENT, NULL);
        m.id = 1000 + (uint32_t)i;
        agent_h_queue(&f->a, &m);
    }
    for (int i = 0; i < N; i++) {
        struct gs_proto_msg r;
        assert_int_equal(agent_h_recv(&f->a, &r), 0);
        assert_int_equal(r.type, GS_MSG_DONE);
        assert_int_equal(r.id, 1000 + (uint32_t)i);
        assert_int_equal(r.flags & GS_DONE_KEPT, 0);
    }
    for (int i = 0; i < N; i++)
        assert_content(f, names[i], bodies[i]);
}

static void test_serve__put_replaces_atomically_via_temp_and_rename(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX], dir[PATH_MAX];
    struct stat before, after;
    start(f);
    assert_int_equal(put(f, "sub/model.bin", "old complete content").type, GS_MSG_DONE);
    at(f, "sub/model.bin", p);
    at(f, "sub", dir);
    int oldfd = open(p, O_RDONLY);
    assert_true(oldfd >= 0);
    assert_int_equal(fstat(oldfd, &before), 0);

    struct gs_proto_msg m = req(GS_MSG_PUT_BEGIN, "sub/model.bin");
    m.id = 77;
    m.size = 21;
    agent_h_queue(&f->a, &m);
    struct gs_proto_msg d = req(GS_MSG_PUT_DATA, "");
    d.id = 77;
    d.data = gs_proto_cstr("new half");
    agent_h_queue(&f->a, &d);
    struct gs_proto_msg st = req(GS_MSG_STAT, "sub/model.bin");
    struct rep sr = call(f, &st); /* its reply proves the DATA frame was executed */
    assert_int_equal(sr.type, GS_MSG_STAT_R);
    assert_content(f, "sub/model.bin", "old complete content");
    assert_int_equal(count_prefixed(dir, GS_PROTO_TMP_PREFIX), 1);
    assert_int_equal(list_count(f, "sub", 0), 1);           /* only model.bin */
    assert_int_equal(list_count(f, "sub", GS_LIST_TMP), 2); /* and the temporary */

    d.data = gs_proto_cstr(" and the rest");
    agent_h_queue(&f->a, &d);
    struct gs_proto_msg e = req(GS_MSG_PUT_END, "");
    e.id = 77;
    e.flags = GS_PUTEND_VERIFY;
    agent_h_hash("new half and the rest", 21, e.hash);
    struct rep er = call(f, &e);
    assert_int_equal(er.type, GS_MSG_DONE);
    assert_content(f, "sub/model.bin", "new half and the rest");
    assert_int_equal(stat(p, &after), 0);
    assert_true(after.st_ino != before.st_ino); /* replaced by rename, not rewritten */
    char old[64] = "";
    assert_int_equal(pread(oldfd, old, sizeof(old) - 1, 0), 20);
    assert_string_equal(old, "old complete content");
    close(oldfd);
    assert_int_equal(count_prefixed(dir, GS_PROTO_TMP_PREFIX), 0);
}

static void test_serve__put_end_with_wrong_hash_or_size_leaves_target_untouched(void **state)
{
    struct fx *f = *state;
    start(f);
    put(f, "x", "keep");
    struct gs_proto_msg m = req(GS_MSG_PUT_BEGIN, "x"), d = req(GS_MSG_PUT_DATA, "");
    struct gs_proto_msg e = req(GS_MSG_PUT_END, "");
    m.id = d.id = e.id = 5;
    m.size = 9;
    d.data = gs_proto_cstr("corrupted");
    e.flags = GS_PUTEND_VERIFY; /* hash of zeros: wrong */
    agent_h_queue(&f->a, &m);
    agent_h_queue(&f->a, &d);
    struct rep r = call(f, &e);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EBADMSG);
    assert_content(f, "x", "keep");
    assert_int_equal(count_prefixed(f->root, GS_PROTO_TMP_PREFIX), 0);

    /* A chunk lost on the way (fewer bytes than announced) is refused the same way. */
    m.size = 10;
    e.flags = 0;
    agent_h_queue(&f->a, &m);
    agent_h_queue(&f->a, &d);
    r = call(f, &e);
    assert_int_equal(r.err, EBADMSG);
    assert_content(f, "x", "keep");
    assert_int_equal(count_prefixed(f->root, GS_PROTO_TMP_PREFIX), 0);
}

static void test_serve__mode_and_mtime_are_preserved(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    struct stat st;
    start(f);
    struct gs_proto_msg m = put_msg("bin/run.sh", "#!/bin/sh\n", GS_EXPECT_ABSENT, NULL);
    m.meta.mode = 0751;
    m.meta.mtime_sec = 1234567890;
    m.meta.mtime_nsec = 123456789;
    assert_int_equal(call(f, &m).type, GS_MSG_DONE);
    at(f, "bin/run.sh", p);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0751);
    assert_int_equal(st.st_mtim.tv_sec, 1234567890);
    assert_int_equal(st.st_mtim.tv_nsec, 123456789);

    struct gs_proto_msg s = req(GS_MSG_STAT, "bin/run.sh"), r;
    agent_h_queue(&f->a, &s);
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.type, GS_MSG_STAT_R);
    assert_int_equal(r.kind, GS_KIND_FILE);
    assert_int_equal(r.meta.mode, 0751);
    assert_true(r.meta.mtime_sec == 1234567890);
    assert_int_equal(r.meta.mtime_nsec, 123456789);
    assert_true(r.size == 10);

    struct gs_proto_msg c = req(GS_MSG_CHMOD, "bin/run.sh");
    c.meta.mode = 0600;
    assert_int_equal(call(f, &c).type, GS_MSG_DONE);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
}

/* A v10 CHMOD carrying the mtime and the hash of the content the client believes the server holds
 * (a `touch` sent without the bytes). */
static struct gs_proto_msg stamp_msg(const char *path, uint32_t mode, int64_t sec, uint32_t nsec,
                                     const char *content)
{
    struct gs_proto_msg c = req(GS_MSG_CHMOD, path);
    c.has_hash = 1;
    c.meta = (struct gs_proto_meta){mode, sec, nsec};
    agent_h_hash(content, strlen(content), c.hash);
    return c;
}

/* The mode and mtime land only on the content named: an edit made on the server that kept the
 * size and the second is not stamped (ESTALE, file untouched), nor is what replaced the file. */
static void test_serve__chmod_with_a_hash_stamps_only_that_content(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    struct stat st;
    start(f);
    assert_int_equal(put(f, "src/a.c", "int a;\n").type, GS_MSG_DONE);
    struct gs_proto_msg c = stamp_msg("src/a.c", 0640, -31536000, 123456789, "int a;\n");
    assert_int_equal(call(f, &c).type, GS_MSG_DONE); /* 1969-01-01, to the nanosecond */
    at(f, "src/a.c", p);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_true(st.st_mtim.tv_sec == -31536000);
    assert_int_equal(st.st_mtim.tv_nsec, 123456789);

    write_file(p, "int b;\n"); /* edited on the server: same size */
    struct timespec was[2] = {{0, UTIME_OMIT}, {-31536000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, was, 0), 0);
    c = stamp_msg("src/a.c", 0600, 1700000000, 5, "int a;\n");
    struct rep r = call(f, &c);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, ESTALE);
    assert_non_null(strstr(r.text, "src/a.c"));
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0640);
    assert_true(st.st_mtim.tv_sec == -31536000);
    assert_int_equal(st.st_mtim.tv_nsec, 0);
    assert_content(f, "src/a.c", "int b;\n");

    at(f, "src", p);
    assert_int_equal(lstat(p, &st), 0);
    unsigned dir_mode = st.st_mode & 07777;
    c = stamp_msg("src", 0700 ^ dir_mode, 1700000000, 0, "int a;\n"); /* a folder: no content */
    assert_int_equal(call(f, &c).err, ESTALE);
    assert_int_equal(lstat(p, &st), 0);
    assert_int_equal(st.st_mode & 07777, dir_mode);
    c = stamp_msg("src/gone.c", 0600, 1700000000, 0, "int a;\n");
    assert_int_equal(call(f, &c).err, ENOENT);
    at(f, "src/l", p);
    assert_int_equal(symlink("a.c", p), 0);
    c = stamp_msg("src/l", 0600, 1700000000, 0, "a.c");
    assert_int_equal(call(f, &c).err, ELOOP);
}

/* The unreadable case, driven by an agent that is not root: returns 0, or the line that failed. */
static int stamp_unreadable_steps(const char *root)
{
    struct agent_h a;
    struct gs_proto_msg m = put_msg("w", "secret\n", GS_EXPECT_ABSENT, NULL), r;
    char p[PATH_MAX];
    struct stat st;
    m.meta.mode = 0200;
    snprintf(p, sizeof(p), "%s/w", root);
    if (agent_h_open(&a, root, NULL, 0) < 0)
        return __LINE__;
    int line = agent_h_call(&a, &m, &r) < 0 || r.type != GS_MSG_DONE ? __LINE__ : 0;
    m = stamp_msg("w", 0200, 1500000000, 7, "not what it holds"); /* still unreadable: unchecked */
    if (!line && (agent_h_call(&a, &m, &r) < 0 || r.type != GS_MSG_DONE))
        line = __LINE__;
    if (!line && (lstat(p, &st) < 0 || st.st_mtim.tv_sec != 1500000000 || st.st_mtim.tv_nsec != 7))
        line = __LINE__;
    m = stamp_msg("w", 0600, 1600000000, 0, "not what it holds"); /* mode first, then hashed */
    if (!line && (agent_h_call(&a, &m, &r) < 0 || r.type != GS_MSG_ERROR || r.err != ESTALE))
        line = __LINE__;
    if (!line &&
        (lstat(p, &st) < 0 || (st.st_mode & 07777) != 0600 || st.st_mtim.tv_sec != 1500000000))
        line = __LINE__;
    m = stamp_msg("w", 0400, 1600000000, 0, "secret\n");
    if (!line && (agent_h_call(&a, &m, &r) < 0 || r.type != GS_MSG_DONE))
        line = __LINE__;
    if (!line &&
        (lstat(p, &st) < 0 || (st.st_mode & 07777) != 0400 || st.st_mtim.tv_sec != 1600000000))
        line = __LINE__;
    agent_h_close(&a);
    return line;
}

/* A file whose mode keeps a non-root agent from reading it (0200) gets the asked mode first and
 * is hashed then; still unreadable, its mtime is set unchecked, as a plain chmod would. As root,
 * the steps run in a child that is `nobody`, on a root that nobody owns. */
static void test_serve__chmod_with_a_hash_on_an_unreadable_file(void **state)
{
    struct fx *f = *state;
    if (geteuid() != 0) {
        assert_int_equal(stamp_unreadable_steps(f->root), 0);
        return;
    }
    assert_int_equal(chmod(f->base, 0755), 0);
    assert_int_equal(mkdir(f->root, 0755), 0);
    assert_int_equal(chown(f->root, 65534, 65534), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int line = setgid(65534) < 0 || setuid(65534) < 0 ? __LINE__ : 0;
        line = line ? line : stamp_unreadable_steps(f->root);
        if (line)
            fprintf(stderr, "test_agent_serve.c:%d: failed\n", line);
        _exit(line ? 1 : 0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- conflicts --------------------------------------------------------------------------- */

/* Checks that kept names a conflict copy of rel holding want. */
static void assert_kept(struct fx *f, const struct rep *r, const char *rel, const char *want)
{
    char prefix[PATH_MAX];
    assert_true(r->flags & GS_DONE_KEPT);
    snprintf(prefix, sizeof(prefix), "%s%s", rel, GS_PROTO_CONFLICT_TAG);
    assert_int_equal(strncmp(r->kept, prefix, strlen(prefix)), 0);
    assert_true(strlen(r->kept) >= strlen(prefix) + 15); /* YYYYmmdd-HHMMSS */
    assert_content(f, r->kept, want);
}

static void test_serve__put_conflict_keeps_server_copy_and_reports_it(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    start(f);
    put(f, "cfg/train.yaml", "lr: 0.1\n");
    at(f, "cfg/train.yaml", p);
    write_file(p, "lr: 0.5  # edited on the server\n");

    struct gs_proto_msg m = put_msg("cfg/train.yaml", "lr: 0.2\n", GS_EXPECT_HASH, "lr: 0.1\n");
    struct rep r = call(f, &m);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_kept(f, &r, "cfg/train.yaml", "lr: 0.5  # edited on the server\n");
    assert_content(f, "cfg/train.yaml", "lr: 0.2\n");

    /* A second conflict within the same second gets a -N suffix: nothing overwritten. */
    write_file(p, "second edit\n");
    struct rep r2 = call(f, &m);
    assert_true(r2.flags & GS_DONE_KEPT);
    assert_string_not_equal(r2.kept, r.kept);
    assert_content(f, r2.kept, "second edit\n");
    assert_content(f, r.kept, "lr: 0.5  # edited on the server\n");
}

static void test_serve__expected_absent_but_present_is_kept_unless_identical(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    start(f);
    at(f, "new.py", p);
    write_file(p, "made on the server\n");
    struct gs_proto_msg m = put_msg("new.py", "print(1)\n", GS_EXPECT_ABSENT, NULL);
    struct rep r = call(f, &m);
    assert_kept(f, &r, "new.py", "made on the server\n");
    /* Resuming after a crash: the same content already there is no conflict. */
    struct rep again = call(f, &m);
    assert_int_equal(again.type, GS_MSG_DONE);
    assert_int_equal(again.flags & GS_DONE_KEPT, 0);
    assert_int_equal(count_prefixed(f->root, "new.py" GS_PROTO_CONFLICT_TAG), 1);
}

static void test_serve__delete_conflict_keeps_server_copy(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    start(f);
    put(f, "a.txt", "v1");
    put(f, "b.txt", "v1");
    at(f, "a.txt", p);
    write_file(p, "edited");

    struct gs_proto_msg d = req(GS_MSG_DELETE, "a.txt");
    d.expect.kind = GS_EXPECT_HASH;
    agent_h_hash("v1", 2, d.expect.hash);
    struct rep r = call(f, &d);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_kept(f, &r, "a.txt", "edited");
    assert_int_equal(access(p, F_OK), -1);

    d.path = gs_proto_cstr("b.txt"); /* matches: really deleted, nothing kept */
    r = call(f, &d);
    assert_int_equal(r.flags & GS_DONE_KEPT, 0);
    at(f, "b.txt", p);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_prefixed(f->root, "b.txt"), 0);

    r = call(f, &d); /* already gone */
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_true(r.flags & GS_DONE_NOOP);
}

/* A directory gpusync made and now deletes may have been replaced on the server by a file or a
 * symlink: with GS_EXPECT_DIR that is kept as a conflict copy (before v5 the client sent FORCE
 * for directories and the file was unlinked). A directory there is deleted as before. */
static void test_serve__delete_expecting_a_directory_keeps_what_replaced_it(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    start(f);
    at(f, "was_dir", p);
    write_file(p, "a file made on the server");
    struct gs_proto_msg d = req(GS_MSG_DELETE, "was_dir");
    d.flags = GS_DEL_RECURSIVE;
    d.expect.kind = GS_EXPECT_DIR;
    struct rep r = call(f, &d);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_kept(f, &r, "was_dir", "a file made on the server");
    assert_int_equal(access(p, F_OK), -1);

    at(f, "link_dir", p);
    assert_int_equal(symlink(f->outside, p), 0);
    d.path = gs_proto_cstr("link_dir");
    r = call(f, &d);
    assert_true(r.flags & GS_DONE_KEPT);
    assert_int_equal(access(p, F_OK), -1);

    put(f, "real_dir/x", "1");
    d.path = gs_proto_cstr("real_dir");
    r = call(f, &d);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_int_equal(r.flags & GS_DONE_KEPT, 0);
    at(f, "real_dir", p);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_prefixed(f->root, "real_dir"), 0);
}

/* ---- path safety ------------------------------------------------------------------------- */

static void test_serve__path_escapes_are_refused(void **state)
{
    struct fx *f = *state;
    char abs_target[PATH_MAX + 8], link[PATH_MAX], victim[PATH_MAX];
    start(f);
    snprintf(abs_target, sizeof(abs_target), "%s/x", f->outside);
    const char *bad[] = {"../outside/x", "/tmp/x", abs_target, "a/../../outside/x",
                         "a//b",         "",       "./a",      "a/.",
                         "a/",           ".."};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct rep r = put(f, bad[i], "escape");
        assert_int_equal(r.type, GS_MSG_ERROR);
        assert_int_equal(r.err, EPERM);
    }
    struct gs_proto_msg nul = put_msg("a", "x", GS_EXPECT_FORCE, NULL);
    nul.path.p = "a\0b";
    nul.path.len = 3;
    assert_int_equal(call(f, &nul).err, EPERM);

    /* Symlinked parent directories, relative and absolute, are never followed. */
    snprintf(victim, sizeof(victim), "%s/victim", f->outside);
    write_file(victim, "precious");
    at(f, "rel", link);
    assert_int_equal(symlink("../outside", link), 0);
    at(f, "abs", link);
    assert_int_equal(symlink(f->outside, link), 0);
    const char *via[] = {"rel/x", "abs/x", "rel/new/deeper"};
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(put(f, via[i], "escape").err, ELOOP);
    struct gs_proto_msg mk = req(GS_MSG_MKDIR, "abs/sub");
    assert_int_equal(call(f, &mk).err, ELOOP);
    struct gs_proto_msg del = req(GS_MSG_DELETE, "rel/victim");
    assert_int_equal(call(f, &del).err, ELOOP);
    struct gs_proto_msg mv = req(GS_MSG_RENAME, "abs/victim");
    mv.path2 = gs_proto_cstr("stolen");
    assert_int_equal(call(f, &mv).type, GS_MSG_ERROR);
    struct gs_proto_msg get = req(GS_MSG_GET, "abs/victim");
    assert_int_equal(call(f, &get).err, ELOOP);

    /* A symlink as the last component: acted on as a link, never through it. */
    at(f, "lnk", link);
    assert_int_equal(symlink(victim, link), 0);
    get.path = gs_proto_cstr("lnk");
    assert_int_equal(call(f, &get).err, ELOOP);
    struct gs_proto_msg ch = req(GS_MSG_CHMOD, "lnk");
    ch.meta.mode = 0777;
    assert_int_equal(call(f, &ch).err, ELOOP);
    assert_int_equal(put(f, "lnk", "replaces the link").type, GS_MSG_DONE);
    assert_content(f, "lnk", "replaces the link");

    struct stat st;
    assert_int_equal(stat(victim, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    char *v = slurp(victim, NULL);
    assert_string_equal(v, "precious");
    free(v);
    assert_int_equal(count_entries(f->outside), 1);
}

#define RACE_MS 2500 /* how long each op of the symlink-swap race runs */

/* Mode bits of path (lstat), or -1. */
static int mode_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) < 0 ? -1 : (int)(st.st_mode & 07777);
}

/* In a child: swaps root/a and root/b (atomically, RENAME_EXCHANGE) until killed. */
static pid_t start_swapper(struct fx *f, const char *a, const char *b)
{
    char pa[PATH_MAX], pb[PATH_MAX];
    at(f, a, pa);
    at(f, b, pb);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        for (;;)
            if (renameat2(AT_FDCWD, pa, AT_FDCWD, pb, RENAME_EXCHANGE) < 0)
                _exit(1);
    return pid;
}

/* Sends count requests of type for path, mode 0757, pipelined, and reads every reply: DONE,
 * or an ERROR for what the agent refuses (ELOOP for a link, ENXIO or EEXIST for a socket). */
static void mode_burst(struct fx *f, uint8_t type, const char *path, int count)
{
    for (int i = 0; i < count; i++) {
        struct gs_proto_msg m = req(type, path);
        m.meta.mode = 0757;
        agent_h_queue(&f->a, &m);
    }
    for (int i = 0; i < count; i++) {
        struct gs_proto_msg r;
        assert_int_equal(agent_h_recv(&f->a, &r), 0);
        assert_true(r.type == GS_MSG_DONE || r.type == GS_MSG_ERROR);
    }
}

/* Binds a UNIX socket at root/rel: a file that open(2) refuses (ENXIO), even for root. */
static void make_socket_file(struct fx *f, const char *rel)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char p[PATH_MAX];
    at(f, rel, p);
    assert_true(strlen(p) < sizeof(sa.sun_path));
    strcpy(sa.sun_path, p);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
}

/* Runs bursts of type on root/name while name and a symlink to the victim swap places, for
 * RACE_MS, or until the victim's mode changed. */
static void swap_and_burst(struct fx *f, uint8_t type, const char *name, const char *victim)
{
    char p[PATH_MAX], link[64];
    snprintf(link, sizeof(link), "%s.lnk", name);
    at(f, link, p);
    assert_int_equal(symlink(victim, p), 0);
    pid_t swapper = start_swapper(f, name, link);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        mode_burst(f, type, name, 500);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (mode_of(victim) == 0600 &&
             (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < RACE_MS);
    kill(swapper, SIGKILL);
    waitpid(swapper, NULL, 0);
}

/* CHMOD and MKDIR check that the entry is no symlink before they change its mode. A symlink
 * swapped in right after that check must not be followed: before the fix, an entry that could
 * not be opened (a socket, or the swapped-in link refused by O_NOFOLLOW) fell back to fchmodat,
 * which follows links, and a file outside the root went from 0600 to 0757. The swap is a race:
 * each op runs for RACE_MS (the old agent lost it after 0.1 to 2 s of this on a loaded 2-core
 * machine, at once on an idle one); the fixed agent never follows a link, whatever the timing. */
/* A folder the server will not let the agent write (immutable here; the same EPERM as other
 * refusals of the file system) is reported as such, not as a path the agent refused. */
static void test_serve__a_real_eperm_is_not_reported_as_a_refused_path(void **state)
{
    struct fx *f = *state;
    char dir[PATH_MAX], cmd[PATH_MAX + 32];
    start(f);
    assert_int_equal(put(f, "ro/a", "1").type, GS_MSG_DONE);
    at(f, "ro", dir);
    snprintf(cmd, sizeof(cmd), "chattr +i '%s' 2>/dev/null", dir);
    if (system(cmd) != 0) /* needs root and a file system with the attribute */
        skip();
    struct rep r = put(f, "ro/a", "2");
    snprintf(cmd, sizeof(cmd), "chattr -i '%s'", dir);
    assert_int_equal(system(cmd), 0); /* before any assert: teardown must remove it */
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EPERM);
    assert_non_null(strstr(r.text, strerror(EPERM)));
    assert_null(strstr(r.text, "path refused"));
    assert_content(f, "ro/a", "1");
}

static void test_serve__chmod_and_mkdir_never_follow_a_symlink_swapped_in(void **state)
{
    struct fx *f = *state;
    char victim[PATH_MAX], p[PATH_MAX];
    start(f);
    snprintf(victim, sizeof(victim), "%s/victim", f->outside);
    write_file(victim, "precious");
    assert_int_equal(chmod(victim, 0600), 0);
    at(f, "d", p);
    assert_int_equal(mkdir(p, 0700), 0);
    swap_and_burst(f, GS_MSG_MKDIR, "d", victim);
    assert_int_equal(mode_of(victim), 0600);
    make_socket_file(f, "sock");
    swap_and_burst(f, GS_MSG_CHMOD, "sock", victim);
    assert_int_equal(mode_of(victim), 0600);
}

/* setuid and setgid are never mirrored (where the agent runs as root, a pushed file would become
 * a root set-id program); every other bit is, sticky included, on every path that sets a mode. */
static void test_serve__setuid_and_setgid_bits_are_never_mirrored(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX];
    uint8_t data[100] = {0};
    start(f);
    struct gs_proto_msg m = put_msg("bin/tool", "#!/bin/sh\n", GS_EXPECT_ABSENT, NULL);
    m.meta.mode = 06755;
    assert_int_equal(call(f, &m).type, GS_MSG_DONE);
    at(f, "bin/tool", p);
    assert_int_equal(mode_of(p), 0755);

    struct gs_proto_msg b = req(GS_MSG_PUT_BEGIN, "bin/streamed");
    b.size = sizeof(data);
    b.meta.mode = 04711;
    agent_h_queue(&f->a, &b);
    struct gs_proto_msg d = req(GS_MSG_PUT_DATA, "");
    d.id = b.id;
    d.data.p = (const char *)data;
    d.data.len = sizeof(data);
    agent_h_queue(&f->a, &d);
    struct gs_proto_msg e = req(GS_MSG_PUT_END, "");
    e.id = b.id;
    assert_int_equal(call(f, &e).type, GS_MSG_DONE);
    at(f, "bin/streamed", p);
    assert_int_equal(mode_of(p), 0711);

    struct gs_proto_msg c = req(GS_MSG_CHMOD, "bin/tool");
    c.meta.mode = 04750;
    assert_int_equal(call(f, &c).type, GS_MSG_DONE);
    at(f, "bin/tool", p);
    assert_int_equal(mode_of(p), 0750);

    struct gs_proto_msg mk = req(GS_MSG_MKDIR, "shared");
    mk.meta.mode = 03775;
    assert_int_equal(call(f, &mk).type, GS_MSG_DONE);
    at(f, "shared", p);
    assert_int_equal(mode_of(p), 01775);
}

static void test_serve__hostile_names_work(void **state)
{
    struct fx *f = *state;
    char longname[256], toolong[300], path[400];
    memset(longname, 'n', 255);
    longname[255] = '\0';
    memset(toolong, 'n', 256);
    toolong[256] = '\0';
    const char *names[] = {"with space",        "new\nline", "-leading-dash",
                           "bytes\xff\xfe\x80", "tab\there", longname};
    start(f);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "h/%s", names[i]);
        assert_int_equal(put(f, path, names[i]).type, GS_MSG_DONE);
        assert_content(f, path, names[i]);
    }
    snprintf(path, sizeof(path), "h/%s", toolong);
    assert_int_equal(put(f, path, "x").err, ENAMETOOLONG);

    /* A conflict on a 255-byte name still fits a legal file name. */
    char p[PATH_MAX];
    snprintf(path, sizeof(path), "h/%s", longname);
    at(f, path, p);
    write_file(p, "server edit");
    struct gs_proto_msg m = put_msg(path, "client", GS_EXPECT_HASH, longname);
    struct rep r = call(f, &m);
    assert_true(r.flags & GS_DONE_KEPT);
    assert_content(f, r.kept, "server edit");

    struct gs_proto_msg l = req(GS_MSG_LIST, "h"), lr;
    l.flags = GS_LIST_HASH;
    agent_h_queue(&f->a, &l);
    int found = 0, entries = 0;
    for (;;) {
        assert_int_equal(agent_h_recv(&f->a, &lr), 0);
        if (lr.type == GS_MSG_LIST_END)
            break;
        assert_int_equal(lr.type, GS_MSG_LIST_ENTRIES);
        size_t pos = 0;
        struct gs_proto_entry e;
        while (gs_proto_list_next(&lr, &pos, &e) == 1) {
            entries++;
            snprintf(path, sizeof(path), "h/%s", names[1]);
            if (e.path.len == strlen(path) && !memcmp(e.path.p, path, e.path.len)) {
                uint8_t want[GS_PROTO_HASH_LEN];
                agent_h_hash(names[1], strlen(names[1]), want);
                assert_true(e.has_hash);
                assert_memory_equal(e.hash, want, GS_PROTO_HASH_LEN);
                found = 1;
            }
        }
    }
    assert_true(found);
    assert_int_equal(entries, 7); /* six names and one conflict copy */
}

/* What one LIST returned: entries, and the LIST_SKIPPED reports (errno and path length). */
struct listing {
    int entries, skipped, err[8];
    size_t len[8];
};

static struct listing list_all(struct fx *f, const char *path)
{
    struct gs_proto_msg l = req(GS_MSG_LIST, path), r;
    struct listing out = {0};
    agent_h_queue(&f->a, &l);
    for (;;) {
        assert_int_equal(agent_h_recv(&f->a, &r), 0);
        assert_int_equal(r.id, l.id);
        if (r.type == GS_MSG_ERROR)
            fail_msg("LIST %s: %.*s", path, (int)r.text.len, r.text.p);
        if (r.type == GS_MSG_LIST_END)
            break;
        if (r.type == GS_MSG_LIST_SKIPPED && out.skipped < 8) {
            out.err[out.skipped] = r.err;
            out.len[out.skipped++] = r.path.len;
            continue;
        }
        assert_int_equal(r.type, GS_MSG_LIST_ENTRIES);
        out.entries += (int)r.count;
    }
    assert_true(r.size == (uint64_t)out.entries);
    return out;
}

/* Creates a chain of n directories named name below dirfd (closed here); returns the deepest,
 * open. Paths this long only work relative to a descriptor. */
static int make_chain(int dirfd, const char *name, int n)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(mkdirat(dirfd, name, 0755), 0);
        int sub = openat(dirfd, name, O_RDONLY | O_DIRECTORY);
        assert_true(sub >= 0);
        close(dirfd);
        dirfd = sub;
    }
    return dirfd;
}

/* One entry whose path passes GS_PROTO_MAX_PATH, or a tree deeper than GS_PROTO_LIST_DEPTH, is
 * skipped and reported (LIST_SKIPPED), and the rest of the listing arrives; before v5 either made
 * the whole LIST fail with ENAMETOOLONG. */
static void test_serve__list_skips_and_reports_too_long_paths_and_too_deep_trees(void **state)
{
    struct fx *f = *state;
    char name[256];
    start(f);
    put(f, "ok.txt", "listed");
    int before = list_all(f, "").entries; /* ok.txt and the agent's own .gpusync files */
    memset(name, 'n', 255);
    name[255] = '\0';
    int root = open(f->root, O_RDONLY | O_DIRECTORY);
    int deepest = make_chain(root, name, 16); /* 16 * 256 - 1 = 4095 bytes: still listed */
    int fd = openat(deepest, "tail", O_WRONLY | O_CREAT, 0644); /* 4100 bytes */
    assert_true(fd >= 0);
    close(fd);
    close(make_chain(deepest, name, 1)); /* 4351 bytes, with a directory below */
    struct listing l = list_all(f, "");
    assert_int_equal(l.entries, before + 16);
    assert_int_equal(l.skipped, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(l.err[i], ENAMETOOLONG);
        assert_true(l.len[i] == 4100 || l.len[i] == 4351);
    }

    struct gs_proto_msg d = req(GS_MSG_DELETE, name);
    d.flags = GS_DEL_RECURSIVE;
    assert_int_equal(call(f, &d).type, GS_MSG_DONE);
    root = open(f->root, O_RDONLY | O_DIRECTORY);
    close(make_chain(root, "d", (int)GS_PROTO_LIST_DEPTH + 44));
    l = list_all(f, "");
    assert_int_equal(l.entries, before + (int)GS_PROTO_LIST_DEPTH + 1);
    assert_int_equal(l.skipped, 1);
    assert_int_equal(l.err[0], ELOOP);
    assert_int_equal(l.len[0], 2 * (GS_PROTO_LIST_DEPTH + 1) - 1); /* d/d/.../d, 257 levels */
}

/* ---- large files ------------------------------------------------------------------------- */

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (uint8_t)(seed >> 56);
    }
}

/* Streams data as PUT_BEGIN/PUT_DATA/PUT_END with id and returns the reply. */
static struct rep stream_put(struct fx *f, uint32_t id, const char *path, const uint8_t *data,
                             size_t n, uint8_t expect, const uint8_t *expect_hash)
{
    struct gs_proto_msg b = req(GS_MSG_PUT_BEGIN, path);
    b.id = id;
    b.size = n;
    b.meta.mode = 0640;
    b.expect.kind = expect;
    if (expect_hash)
        memcpy(b.expect.hash, expect_hash, GS_PROTO_HASH_LEN);
    agent_h_queue(&f->a, &b);
    for (size_t off = 0; off < n; off += GS_PROTO_CHUNK) {
        struct gs_proto_msg d = req(GS_MSG_PUT_DATA, "");
        d.id = id;
        d.data.p = (const char *)data + off;
        d.data.len = (uint32_t)(n - off < GS_PROTO_CHUNK ? n - off : GS_PROTO_CHUNK);
        agent_h_queue(&f->a, &d);
        if (f->a.tx.len > (8u << 20))
            assert_int_equal(agent_h_flush(&f->a), 0);
    }
    struct gs_proto_msg e = req(GS_MSG_PUT_END, "");
    e.id = id;
    e.flags = GS_PUTEND_VERIFY;
    agent_h_hash(data, n, e.hash);
    return call(f, &e);
}

/* What one CHECK listed as differing ("," after each path) and LIST_END's count, or its ERROR. */
struct checked {
    char listed[1024];
    uint64_t examined;
    int err;
};

/* The entry a client would send for root/rel as it is now (kind NONE when missing). */
static struct gs_proto_entry believed(struct fx *f, const char *rel, char *link, size_t cap)
{
    struct gs_proto_entry e;
    memset(&e, 0, sizeof(e));
    e.path = gs_proto_cstr(rel);
    e.link = gs_proto_cstr("");
    char p[PATH_MAX];
    at(f, rel, p);
    struct stat st;
    if (lstat(p, &st) < 0)
        return e;
    e.kind = S_ISREG(st.st_mode)   ? GS_KIND_FILE
             : S_ISDIR(st.st_mode) ? GS_KIND_DIR
                                   : GS_KIND_SYMLINK;
    e.meta.mode = st.st_mode & 07777;
    e.meta.mtime_sec = st.st_mtim.tv_sec;
    e.meta.mtime_nsec = (uint32_t)st.st_mtim.tv_nsec;
    e.size = (uint64_t)st.st_size;
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlink(p, link, cap - 1);
        assert_true(n >= 0);
        link[n] = '\0';
        e.link = gs_proto_cstr(link);
    }
    return e;
}

/* Sends a CHECK with `flags` and entries e[0..n) (and, with GS_CHECK_SAVED, `saved`, the digest
 * of the saved set to start from) and reads its answer. */
static struct checked check_from(struct fx *f, uint32_t flags, const uint8_t *saved,
                                 const struct gs_proto_entry *e, size_t n)
{
    static uint32_t id = 700000;
    struct gs_proto_buf b;
    size_t mark;
    gs_proto_buf_init(&b);
    assert_int_equal(gs_proto_list_begin(&b, GS_MSG_CHECK, ++id, flags, &mark), 0);
    if (saved) /* the digest follows the flags word */
        memcpy(b.data + mark + GS_PROTO_HDR + 4, saved, GS_PROTO_HASH_LEN);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(gs_proto_list_add(&b, mark, GS_PROTO_MAX_PAYLOAD, &e[i]), 0);
    gs_proto_list_end(&b, mark);
    agent_h_queue_raw(&f->a, b.data, b.len);
    gs_proto_buf_release(&b);
    struct checked out = {0};
    for (;;) {
        struct gs_proto_msg r;
        assert_int_equal(agent_h_recv(&f->a, &r), 0);
        assert_int_equal(r.id, id);
        if (r.type == GS_MSG_ERROR) {
            out.err = r.err;
            return out;
        }
        if (r.type == GS_MSG_LIST_END) {
            out.examined = r.size;
            return out;
        }
        assert_int_equal(r.type, GS_MSG_LIST_ENTRIES);
        size_t pos = 0;
        struct gs_proto_entry got;
        while (gs_proto_list_next(&r, &pos, &got) == 1)
            snprintf(out.listed + strlen(out.listed), sizeof(out.listed) - strlen(out.listed),
                     "%.*s%s,", (int)got.path.len, got.path.p, got.kind ? "" : "(none)");
    }
}

static struct checked check_beliefs(struct fx *f, uint32_t flags, const struct gs_proto_entry *e,
                                    size_t n)
{
    return check_from(f, flags, NULL, e, n);
}

/* The digest that names a saved set of entries e[0..n) (proto/sync.h: their bytes, nsec 0). */
static void digest_of(const struct gs_proto_entry *e, size_t n, uint8_t out[GS_PROTO_HASH_LEN])
{
    struct gs_proto_buf b;
    gs_proto_buf_init(&b);
    for (size_t i = 0; i < n; i++) {
        struct gs_proto_entry c = e[i];
        c.meta.mtime_nsec = 0;
        assert_int_equal(gs_proto_entry_append(&b, &c), 0);
    }
    agent_h_hash(b.data ? (const void *)b.data : "", b.len, out);
    gs_proto_buf_release(&b);
}

/* CHECK lists only the paths where the server holds something else than the client believes
 * (missing ones as kind NONE), by itself or with the beliefs kept for the session and updated by
 * later checks; beliefs out of order are refused and drop what was kept. */
static void test_serve__check_lists_what_differs_and_keeps_beliefs_for_the_session(void **state)
{
    struct fx *f = *state;
    start(f);
    put(f, "a.txt", "aaa");
    put(f, "d/b.txt", "bbb");
    char l1[64], l2[64], lp[PATH_MAX];
    at(f, "l", lp);
    assert_int_equal(symlink("a.txt", lp), 0);
    struct gs_proto_entry all[6];
    all[0] = believed(f, "a.txt", NULL, 0);
    all[1] = believed(f, "d", NULL, 0);
    all[2] = believed(f, "d/b.txt", NULL, 0);
    all[3] = believed(f, "gone.txt", NULL, 0);
    all[3].kind = GS_KIND_FILE;
    all[4] = believed(f, "l", l1, sizeof(l1));
    all[5] = believed(f, "nodir/x", NULL, 0);
    all[5].kind = GS_KIND_FILE;

    struct checked c = check_beliefs(f, 0, all, 6);
    assert_string_equal(c.listed, "gone.txt(none),nodir/x(none),");
    assert_int_equal(c.examined, 6);

    /* behind the client's back: a.txt grows, b.txt's mode, l's target */
    put(f, "a.txt", "aaaa");
    char p[PATH_MAX];
    at(f, "d/b.txt", p);
    assert_int_equal(chmod(p, 0600), 0);
    assert_int_equal(unlink(lp), 0);
    assert_int_equal(symlink("d", lp), 0);
    c = check_beliefs(f, GS_CHECK_KEEP, all, 6);
    assert_string_equal(c.listed, "a.txt,d/b.txt,gone.txt(none),l,nodir/x(none),");

    /* only the changes: a.txt as it is now, two paths no longer believed */
    struct gs_proto_entry changes[3] = {believed(f, "a.txt", NULL, 0), all[3], all[5]};
    changes[1].kind = changes[2].kind = GS_KIND_NONE;
    c = check_beliefs(f, GS_CHECK_KEEP, changes, 3);
    assert_string_equal(c.listed, "d/b.txt,l,");
    assert_int_equal(c.examined, 4);

    /* a set sent in parts: the deferred part only updates */
    struct gs_proto_entry link_now = believed(f, "l", l2, sizeof(l2));
    c = check_beliefs(f, GS_CHECK_KEEP | GS_CHECK_DEFER, &link_now, 1);
    assert_int_equal(c.err, 0);
    assert_int_equal(c.examined, 0);
    assert_string_equal(c.listed, "");
    c = check_beliefs(f, GS_CHECK_KEEP, NULL, 0);
    assert_string_equal(c.listed, "d/b.txt,");
    assert_int_equal(c.examined, 4);

    /* out of order: refused, and nothing is kept after it */
    struct gs_proto_entry backwards[2] = {all[2], all[0]};
    c = check_beliefs(f, GS_CHECK_KEEP, backwards, 2);
    assert_int_equal(c.err, EBADMSG);
    c = check_beliefs(f, GS_CHECK_KEEP, NULL, 0);
    assert_int_equal(c.err, 0);
    assert_int_equal(c.examined, 0);
}

/* A session that kept beliefs saves them as it ends; the next session starts from them when it
 * names them by their digest (a push is a session of its own: it then sends only what changed),
 * and is refused (ESTALE, nothing kept) when it names another set. */
static void test_serve__kept_beliefs_are_saved_for_the_next_session(void **state)
{
    struct fx *f = *state;
    start(f);
    put(f, "a.txt", "aaa");
    put(f, "d/b.txt", "bbb");
    struct gs_proto_entry all[3] = {believed(f, "a.txt", NULL, 0), believed(f, "d", NULL, 0),
                                    believed(f, "d/b.txt", NULL, 0)};
    struct checked c = check_beliefs(f, GS_CHECK_KEEP, all, 3);
    assert_int_equal(c.examined, 3);
    assert_int_equal(agent_h_close(&f->a), 0);
    f->started = 0;

    start(f);
    char p[PATH_MAX];
    at(f, "d/b.txt", p);
    assert_int_equal(chmod(p, 0600), 0);
    uint8_t wrong[GS_PROTO_HASH_LEN] = {1}, right[GS_PROTO_HASH_LEN];
    c = check_from(f, GS_CHECK_KEEP | GS_CHECK_SAVED, wrong, NULL, 0);
    assert_int_equal(c.err, ESTALE);
    c = check_beliefs(f, GS_CHECK_KEEP, NULL, 0);
    assert_int_equal(c.examined, 0); /* nothing kept after the refusal */
    digest_of(all, 3, right);
    c = check_from(f, GS_CHECK_KEEP | GS_CHECK_SAVED, right, NULL, 0);
    assert_int_equal(c.err, 0);
    assert_int_equal(c.examined, 3);
    assert_string_equal(c.listed, "d/b.txt,");
}

/* Folders the agent (pid) watches with inotify: the inode numbers its fdinfo lists, ","-joined. */
static void watched_inodes(pid_t pid, char *out, size_t cap)
{
    char dir[64], path[PATH_MAX], line[512];
    snprintf(dir, sizeof(dir), "/proc/%d/fdinfo", (int)pid);
    out[0] = '\0';
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        FILE *fp = fopen(path, "r");
        while (fp && fgets(line, sizeof(line), fp)) {
            char *ino = strstr(line, " ino:");
            if (strncmp(line, "inotify wd:", 11) == 0 && ino)
                snprintf(out + strlen(out), cap - strlen(out), "%llu,",
                         strtoull(ino + 5, NULL, 16));
        }
        if (fp)
            fclose(fp);
    }
    closedir(d);
}

static int watches(struct fx *f, const char *rel)
{
    char p[PATH_MAX], list[4096], want[32];
    struct stat st;
    at(f, rel, p);
    assert_int_equal(stat(p, &st), 0);
    watched_inodes(f->a.pid, list, sizeof(list));
    snprintf(want, sizeof(want), "%llu,", (unsigned long long)st.st_ino);
    return strncmp(list, want, strlen(want)) == 0 || strstr(list, want) != NULL;
}

/* A kept set is examined again only where the folders the agent watches saw a change, so every
 * kind of change behind the client's back must still be listed by the next check: a write, a
 * mode, a deletion, a folder renamed away or replaced by a symlink, a file renamed over another,
 * a write through a second hard link in a folder nobody watches. */
/* A write through a shared mapping (numpy.memmap, a checkpoint written with mmap) raises no
 * inotify event, but moves the file's mtime: a kept check finds it once the agent examines
 * everything again, at least every GPUSYNC_AGENT_FULL_CHECK_MS (30 s unless set; 300 ms here). */
static void test_serve__kept_checks_find_a_write_through_a_mapping(void **state)
{
    struct fx *f = *state;
    setenv("GPUSYNC_AGENT_FULL_CHECK_MS", "300", 1);
    start(f);
    unsetenv("GPUSYNC_AGENT_FULL_CHECK_MS");
    put(f, "d/w.bin", "0123456789abcdef");
    char p[PATH_MAX];
    at(f, "d/w.bin", p);
    int fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    char *map = mmap(NULL, 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(map != MAP_FAILED);
    close(fd); /* IN_CLOSE_WRITE is not watched; the mapping outlives the descriptor */
    struct gs_proto_entry e = believed(f, "d/w.bin", NULL, 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, &e, 1).listed, "");
    usleep(20 * 1000); /* past the kernel's coarse clock tick, so that mtime moves */
    map[0] = 'X';      /* the page fault moves mtime; no event */
    assert_int_equal(msync(map, 16, MS_SYNC), 0);
    munmap(map, 16);
    usleep(400 * 1000); /* the period under test: no event marks its end */
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "d/w.bin,");
}

static void test_serve__kept_checks_see_changes_in_watched_folders(void **state)
{
    struct fx *f = *state;
    start(f);
    put(f, "a.txt", "aaa");
    put(f, "d/b.txt", "bbb");
    put(f, "d/e/c.txt", "ccc");
    put(f, "m/x.txt", "xxx");
    put(f, "m/y.txt", "yyyyy");
    put(f, "h.txt", "hhh");
    char h[PATH_MAX], other[PATH_MAX];
    at(f, "h.txt", h);
    snprintf(other, sizeof(other), "%s/h-link", f->base); /* outside the root: not watched */
    assert_int_equal(link(h, other), 0);
    const char *names[] = {"a.txt", "d", "d/b.txt", "d/e",    "d/e/c.txt",
                           "h.txt", "m", "m/x.txt", "m/y.txt"};
    enum { N = sizeof(names) / sizeof(names[0]) };
    struct gs_proto_entry all[N];
    for (int i = 0; i < N; i++)
        all[i] = believed(f, names[i], NULL, 0);
    struct checked c = check_beliefs(f, GS_CHECK_KEEP, all, N);
    assert_string_equal(c.listed, "");
    assert_true(watches(f, "") && watches(f, "d") && watches(f, "d/e") && watches(f, "m"));
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "");

    put(f, "a.txt", "aaaa"); /* a write */
    c = check_beliefs(f, GS_CHECK_KEEP, NULL, 0);
    assert_string_equal(c.listed, "a.txt,");
    assert_int_equal(c.examined, N);
    struct gs_proto_entry a_now = believed(f, "a.txt", NULL, 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, &a_now, 1).listed, "");

    char p[PATH_MAX], q[PATH_MAX];
    at(f, "d/e/c.txt", p); /* a mode, two folders down */
    assert_int_equal(chmod(p, 0600), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "d/e/c.txt,");
    assert_int_equal(chmod(p, 0644), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "");

    FILE *fp = fopen(other, "a"); /* through the other link, in a folder nobody watches */
    assert_non_null(fp);
    fputs("more", fp);
    fclose(fp);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "h.txt,");
    assert_int_equal(unlink(other), 0);
    struct gs_proto_entry h_now = believed(f, "h.txt", NULL, 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, &h_now, 1).listed, "");

    at(f, "m/x.txt", p); /* renamed over another */
    at(f, "m/y.txt", q);
    assert_int_equal(rename(p, q), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "m/x.txt(none),m/y.txt,");
    struct gs_proto_entry m_now[2] = {believed(f, "m/x.txt", NULL, 0),
                                      believed(f, "m/y.txt", NULL, 0)}; /* x: kind NONE */
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, m_now, 2).listed, "");

    at(f, "d", p); /* a folder renamed away, then a symlink in its place */
    snprintf(q, sizeof(q), "%s/d-moved", f->base);
    assert_int_equal(rename(p, q), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed,
                        "d(none),d/b.txt(none),d/e(none),d/e/c.txt(none),");
    assert_int_equal(symlink(q, p), 0);
    /* (what lies below a symlink cannot be examined: not listed, as CHECK says) */
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "d,");
    /* and the folder itself back: as believed again, watched again */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rename(q, p), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "");
    assert_true(watches(f, "d/e"));
    at(f, "d/e/c.txt", p); /* a watch that followed the folder out and back still reports */
    assert_int_equal(truncate(p, 0), 0);
    assert_string_equal(check_beliefs(f, GS_CHECK_KEEP, NULL, 0).listed, "d/e/c.txt,");
}

static void test_serve__large_file_streams_byte_identical_both_ways(void **state)
{
    struct fx *f = *state;
    size_t n = 64u << 20;
    uint8_t *data = malloc(n), want[GS_PROTO_HASH_LEN];
    char p[PATH_MAX];
    assert_non_null(data);
    fill_random(data, n, 42);
    start(f);
    struct rep r = stream_put(f, 1000, "ckpt/big.bin", data, n, GS_EXPECT_ABSENT, NULL);
    assert_int_equal(r.type, GS_MSG_DONE);
    at(f, "ckpt/big.bin", p);
    size_t len;
    char *disk = slurp(p, &len);
    assert_int_equal(len, n);
    assert_memory_equal(disk, data, n);
    free(disk);

    /* GET streams it back in chunks; the bytes and the hash match. */
    struct gs_proto_msg g = req(GS_MSG_GET, "ckpt/big.bin"), m;
    agent_h_queue(&f->a, &g);
    size_t off = 0;
    for (;;) {
        assert_int_equal(agent_h_recv(&f->a, &m), 0);
        assert_int_equal(m.id, g.id);
        if (m.type != GS_MSG_GET_DATA)
            break;
        assert_true(off + m.data.len <= n);
        assert_memory_equal(m.data.p, data + off, m.data.len);
        off += m.data.len;
    }
    assert_int_equal(m.type, GS_MSG_GET_END);
    assert_int_equal(off, n);
    assert_true(m.size == n);
    agent_h_hash(data, n, want);
    assert_memory_equal(m.hash, want, GS_PROTO_HASH_LEN);
    assert_int_equal(m.meta.mode, 0640);
    free(data);
}

/* Writes `n` bytes of `data` to `path` at `off`, truncating first when `trunc` (torch.save opens
 * with O_TRUNC; dd conv=notrunc writes in place). */
static void job_writes(const char *path, const uint8_t *data, size_t n, off_t off, int trunc)
{
    int fd = open(path, O_WRONLY | (trunc ? O_TRUNC : 0));
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, data, n, off), (ssize_t)n);
    assert_int_equal(close(fd), 0);
}

/* GETs `rel` and, once its first GET_DATA arrived (the agent has opened the file and blocks on
 * the full pipe, a few MiB in), lets `change` rewrite it; returns the type and errno of the
 * reply that ends the stream. */
static struct rep get_while_changed(struct fx *f, const char *rel, void (*change)(const char *))
{
    char p[PATH_MAX];
    at(f, rel, p);
    struct gs_proto_msg g = req(GS_MSG_GET, rel), m;
    agent_h_queue(&f->a, &g);
    assert_int_equal(agent_h_recv(&f->a, &m), 0);
    assert_int_equal(m.type, GS_MSG_GET_DATA);
    change(p);
    do
        assert_int_equal(agent_h_recv(&f->a, &m), 0);
    while (m.type == GS_MSG_GET_DATA);
    assert_int_equal(m.id, g.id);
    return (struct rep){.type = m.type, .err = m.err};
}

static uint8_t changed_data[12u << 20];

static void save_smaller(const char *path)
{
    job_writes(path, changed_data, sizeof(changed_data), 0, 1);
}

/* Behind the read (the first GET_DATA has arrived: its bytes were read) and ahead of it. Both
 * ahead would be no change to refuse: the bytes sent would be the file as it now is. */
static void write_in_place(const char *path)
{
    job_writes(path, changed_data, 4096, 0, 0);
    job_writes(path, changed_data, 4096, 35u << 20, 0);
}

/* A GET of a file that a job rewrites while the agent reads it (truncated and saved smaller, or
 * written in place at two offsets) ends in ERROR EAGAIN, not GET_END: the bytes sent were neither
 * version. The file read again, unchanged, comes whole. */
static void test_serve__get_of_a_file_changed_while_read_is_refused(void **state)
{
    struct fx *f = *state;
    size_t n = 40u << 20;
    uint8_t *data = malloc(n);
    assert_non_null(data);
    fill_random(data, n, 7);
    fill_random(changed_data, sizeof(changed_data), 8);
    start(f);
    assert_int_equal(stream_put(f, 1000, "res/ck.pt", data, n, GS_EXPECT_ABSENT, NULL).type,
                     GS_MSG_DONE);
    struct rep r = get_while_changed(f, "res/ck.pt", save_smaller);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EAGAIN);
    assert_int_equal(stream_put(f, 1001, "res/ck.pt", data, n, GS_EXPECT_FORCE, NULL).type,
                     GS_MSG_DONE);
    r = get_while_changed(f, "res/ck.pt", write_in_place);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EAGAIN);
    /* left alone, the same file streams whole */
    struct gs_proto_msg g = req(GS_MSG_GET, "res/ck.pt"), m;
    agent_h_queue(&f->a, &g);
    uint64_t got = 0;
    do {
        assert_int_equal(agent_h_recv(&f->a, &m), 0);
        got += m.type == GS_MSG_GET_DATA ? m.data.len : 0;
    } while (m.type == GS_MSG_GET_DATA);
    assert_int_equal(m.type, GS_MSG_GET_END);
    assert_true(got == n && m.size == n);
    free(data);
}

static void append_block(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, changed_data, 4096), 4096);
    assert_int_equal(close(fd), 0);
}

static uint8_t larger_data[48u << 20];

static void save_larger(const char *path)
{
    job_writes(path, larger_data, sizeof(larger_data), 0, 1);
}

/* A GET of a file that only grows while the agent reads it (a training log, TensorBoard's event
 * file) ends in GET_END with the file as it was when opened, its n bytes whole; it used to be
 * refused as changed, so a live log could not be pulled over a slow link. A file saved larger
 * in its place (same inode, other bytes) is still refused. */
static void test_serve__get_of_a_file_appended_while_read_sends_it_as_it_was(void **state)
{
    struct fx *f = *state;
    size_t n = 40u << 20;
    uint8_t *data = malloc(n), want[GS_PROTO_HASH_LEN];
    assert_non_null(data);
    fill_random(data, n, 9);
    fill_random(changed_data, sizeof(changed_data), 10);
    fill_random(larger_data, sizeof(larger_data), 11);
    start(f);
    assert_int_equal(stream_put(f, 1000, "logs/train.log", data, n, GS_EXPECT_ABSENT, NULL).type,
                     GS_MSG_DONE);
    char p[PATH_MAX];
    at(f, "logs/train.log", p);
    struct gs_proto_msg g = req(GS_MSG_GET, "logs/train.log"), m;
    agent_h_queue(&f->a, &g);
    size_t off = 0;
    for (;;) {
        assert_int_equal(agent_h_recv(&f->a, &m), 0);
        if (m.type != GS_MSG_GET_DATA)
            break;
        assert_true(off + m.data.len <= n);
        assert_memory_equal(m.data.p, data + off, m.data.len);
        if (off == 0) /* the agent has the file open and blocks on the full pipe */
            append_block(p);
        off += m.data.len;
    }
    assert_int_equal(m.type, GS_MSG_GET_END);
    assert_int_equal(off, n);
    assert_true(m.size == n);
    agent_h_hash(data, n, want);
    assert_memory_equal(m.hash, want, GS_PROTO_HASH_LEN);
    struct rep r = get_while_changed(f, "logs/train.log", save_larger);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EAGAIN);
    free(data);
}

/* A child that opens `path` with `flags` and holds it open until *release is written to. */
static pid_t hold_open(const char *path, int flags, int *release)
{
    int p[2], ready[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char c;
        int fd = open(path, flags);
        if (fd < 0 || write(ready[1], "r", 1) != 1)
            _exit(1);
        _exit(read(p[0], &c, 1) == 1 ? 0 : 1);
    }
    close(p[0]);
    close(ready[1]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1); /* it has the file open */
    close(ready[0]);
    *release = p[1];
    return pid;
}

static void let_go(pid_t pid, int release)
{
    assert_int_equal(write(release, "x", 1), 1);
    close(release);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
}

/* The reply that ends a GET of rel (its data read and dropped): its type, and in *text what
 * GET_END says of a writer (NUL-terminated, cap bytes). */
static uint8_t get_ends_with(struct fx *f, const char *rel, char *text, size_t cap)
{
    struct gs_proto_msg g = req(GS_MSG_GET, rel), m;
    agent_h_queue(&f->a, &g);
    do
        assert_int_equal(agent_h_recv(&f->a, &m), 0);
    while (m.type == GS_MSG_GET_DATA);
    size_t n = m.type == GS_MSG_GET_END && m.text.len < cap ? m.text.len : 0;
    if (n)
        memcpy(text, m.text.p, n);
    text[n] = '\0';
    return m.type;
}

/* A file a process holds open for writing, not appending (a job that opened its checkpoint and
 * is still at it, between two writes; or a log opened with 'w') comes with the writer named: its
 * bytes so far are the file as it was, maybe a part of what is being written. Pull said nothing
 * of it. Held open for appending, or let go, it comes with none. */
static void test_serve__get_of_a_file_open_for_writing_names_the_writer(void **state)
{
    struct fx *f = *state;
    int release;
    char text[128], want[64];
    start(f);
    assert_int_equal(stream_put(f, 1000, "res/half.pt", (const uint8_t *)"first half", 10,
                                GS_EXPECT_ABSENT, NULL)
                         .type,
                     GS_MSG_DONE);
    char p[PATH_MAX];
    at(f, "res/half.pt", p);
    pid_t job = hold_open(p, O_WRONLY, &release);
    assert_int_equal(get_ends_with(f, "res/half.pt", text, sizeof(text)), GS_MSG_GET_END);
    snprintf(want, sizeof(want), "pid %ld (", (long)job);
    assert_true(strncmp(text, want, strlen(want)) == 0);
    let_go(job, release);
    assert_int_equal(get_ends_with(f, "res/half.pt", text, sizeof(text)), GS_MSG_GET_END);
    assert_string_equal(text, "");
    job = hold_open(p, O_WRONLY | O_APPEND, &release);
    assert_int_equal(get_ends_with(f, "res/half.pt", text, sizeof(text)), GS_MSG_GET_END);
    assert_string_equal(text, "");
    let_go(job, release);
}

/* A file with long runs of zeros (a zeroed numpy.memmap, a disk image: sparse where it was
 * made) lands sparse: the zero blocks are holes, the content and size exactly as sent, also when
 * it ends in zeros. It used to take its full size of the server's disk. */
static void test_serve__zero_blocks_of_a_streamed_file_are_holes(void **state)
{
    struct fx *f = *state;
    size_t mib = 1u << 20, n = 26 * mib;
    uint8_t *data = calloc(1, n);
    assert_non_null(data);
    fill_random(data, mib, 12);                  /* 1 MiB of data, 16 of zeros, */
    fill_random(data + 17 * mib, mib - 100, 13); /* a MiB less 100 bytes, then zeros to the end */
    start(f);
    assert_int_equal(stream_put(f, 1000, "img/disk.raw", data, n, GS_EXPECT_ABSENT, NULL).type,
                     GS_MSG_DONE);
    char p[PATH_MAX];
    at(f, "img/disk.raw", p);
    size_t len = 0;
    char *back = slurp(p, &len);
    assert_int_equal(len, n);
    assert_memory_equal(back, data, n);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true((uint64_t)st.st_blocks * 512 <= 3 * mib); /* the 2 MiB of data, not 26 */
    free(back);
    free(data);
}

static void test_serve__disk_full_removes_temp_and_keeps_target(void **state)
{
    struct fx *f = *state;
    assert_int_equal(mkdir(f->root, 0755), 0);
    if (mount("gs-agent-test", f->root, "tmpfs", 0, "size=1m") < 0)
        skip();
    f->mounted = 1;
    start(f);
    assert_int_equal(put(f, "data/f.bin", "keep me").type, GS_MSG_DONE);
    size_t n = 3u << 20;
    uint8_t *data = malloc(n), h[GS_PROTO_HASH_LEN];
    assert_non_null(data);
    fill_random(data, n, 14); /* zeros would be holes, and fit */
    agent_h_hash("keep me", 7, h);
    struct rep r = stream_put(f, 9, "data/f.bin", data, n, GS_EXPECT_HASH, h);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, ENOSPC);
    assert_non_null(strstr(r.text, "data/f.bin"));
    assert_content(f, "data/f.bin", "keep me");
    char dir[PATH_MAX];
    at(f, "data", dir);
    assert_int_equal(count_entries(dir), 1); /* no temp file left */

    /* Single-frame put too, and the session goes on afterwards. */
    struct gs_proto_msg big = put_msg("data/g.bin", "", GS_EXPECT_ABSENT, NULL);
    big.data.p = (const char *)data;
    big.data.len = 2u << 20;
    r = call(f, &big);
    assert_int_equal(r.err, ENOSPC);
    assert_int_equal(count_entries(dir), 1);
    assert_int_equal(put(f, "data/small", "fits").type, GS_MSG_DONE);
    free(data);
}

/* ---- other operations -------------------------------------------------------------------- */

/* MKDIR where the server holds something else (a job's output file, a symlink gpusync never
 * wrote): that is kept aside as a conflict copy, never followed, and the directory is made. It
 * used to fail with EEXIST or ELOOP, at every sync of the folder, for good. */
static void test_serve__mkdir_keeps_what_stood_in_its_place(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX], victim[PATH_MAX];
    struct stat st;
    start(f);
    at(f, "results", p);
    write_file(p, "a job wrote this");
    struct gs_proto_msg mk = req(GS_MSG_MKDIR, "results");
    mk.meta.mode = 0755;
    struct rep r = call(f, &mk);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_non_null(strstr(r.kept, "results.gpusync-conflict-"));
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_content(f, r.kept, "a job wrote this");

    snprintf(victim, sizeof(victim), "%s/elsewhere", f->outside);
    assert_int_equal(mkdir(victim, 0700), 0);
    at(f, "linked", p);
    assert_int_equal(symlink(victim, p), 0);
    struct gs_proto_msg mk2 = req(GS_MSG_MKDIR, "linked");
    mk2.meta.mode = 0755;
    r = call(f, &mk2);
    assert_int_equal(r.type, GS_MSG_DONE);
    char kept[256];
    snprintf(kept, sizeof(kept), "%.200s", r.kept);
    at(f, kept, p);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* the link itself, moved, not followed */
    assert_int_equal(mode_of(victim), 0700);
}

static void test_serve__mkdir_rename_symlink_and_recursive_delete(void **state)
{
    struct fx *f = *state;
    char p[PATH_MAX], t[PATH_MAX];
    struct stat st;
    start(f);
    struct gs_proto_msg mk = req(GS_MSG_MKDIR, "a/b/c");
    mk.meta.mode = 0750;
    assert_int_equal(call(f, &mk).type, GS_MSG_DONE);
    at(f, "a/b/c", p);
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0750);
    assert_true(call(f, &mk).flags & GS_DONE_NOOP);

    put(f, "a/b/c/f", "content");
    struct gs_proto_msg mv = req(GS_MSG_RENAME, "a/b/c/f");
    mv.path2 = gs_proto_cstr("moved/g");
    mv.expect.kind = GS_EXPECT_ABSENT;
    assert_int_equal(call(f, &mv).type, GS_MSG_DONE);
    assert_content(f, "moved/g", "content");
    mv.path = mv.path2; /* onto itself: nothing to do, nothing mistaken for a conflict */
    struct rep self = call(f, &mv);
    assert_true(self.flags & GS_DONE_NOOP);
    assert_content(f, "moved/g", "content");
    assert_int_equal(count_prefixed(f->root, "moved/g" GS_PROTO_CONFLICT_TAG), 0);

    /* Onto a file the server changed: that file is kept, the rename happens. */
    put(f, "moved/h", "from the client");
    at(f, "moved/g", p);
    mv.path = gs_proto_cstr("moved/h");
    mv.path2 = gs_proto_cstr("moved/g");
    mv.expect.kind = GS_EXPECT_HASH;
    agent_h_hash("something else", 14, mv.expect.hash);
    struct rep kept = call(f, &mv);
    assert_int_equal(kept.type, GS_MSG_DONE);
    assert_kept(f, &kept, "moved/g", "content");
    assert_content(f, "moved/g", "from the client");

    struct gs_proto_msg sl = req(GS_MSG_SYMLINK, "moved/link");
    sl.path2 = gs_proto_cstr("../../outside/anything");
    sl.expect.kind = GS_EXPECT_ABSENT;
    assert_int_equal(call(f, &sl).type, GS_MSG_DONE);
    at(f, "moved/link", p);
    ssize_t n = readlink(p, t, sizeof(t) - 1);
    assert_int_equal(n, 22);
    t[n] = '\0';
    assert_string_equal(t, "../../outside/anything");
    struct gs_proto_msg h = req(GS_MSG_HASH, "moved/link"), hr;
    agent_h_queue(&f->a, &h);
    assert_int_equal(agent_h_recv(&f->a, &hr), 0);
    uint8_t want[GS_PROTO_HASH_LEN];
    agent_h_hash(t, (size_t)n, want);
    assert_memory_equal(hr.hash, want, GS_PROTO_HASH_LEN);

    struct gs_proto_msg del = req(GS_MSG_DELETE, "a");
    assert_int_equal(call(f, &del).err, ENOTEMPTY);
    del.flags = GS_DEL_RECURSIVE;
    assert_int_equal(call(f, &del).type, GS_MSG_DONE);
    at(f, "a", p);
    assert_int_equal(access(p, F_OK), -1);
    del.path = gs_proto_cstr("moved/link");
    assert_int_equal(call(f, &del).type, GS_MSG_DONE);
    assert_int_equal(count_entries(f->outside), 0);

    struct gs_proto_msg s = req(GS_MSG_STAT, "nothing/here"), sr;
    agent_h_queue(&f->a, &s);
    assert_int_equal(agent_h_recv(&f->a, &sr), 0);
    assert_int_equal(sr.type, GS_MSG_STAT_R);
    assert_int_equal(sr.kind, GS_KIND_NONE);
}

/* ---- one writer per root (fence.h) ------------------------------------------------------- */

/* Writes `data` to root/rel, creating the missing directories. */
static void plant(struct fx *f, const char *rel, const char *data)
{
    char p[PATH_MAX], cmd[PATH_MAX + 32];
    at(f, rel, p);
    snprintf(cmd, sizeof(cmd), "mkdir -p \"$(dirname '%s')\"", p);
    assert_int_equal(system(cmd), 0);
    write_file(p, data);
}

static int exists(struct fx *f, const char *rel)
{
    char p[PATH_MAX];
    struct stat st;
    at(f, rel, p);
    return lstat(p, &st) == 0;
}

/* The bytes of root/.gpusync/writer.lock ("" if empty or missing), in a static buffer. */
static const char *lock_content(struct fx *f)
{
    static char buf[64];
    char p[PATH_MAX];
    at(f, ".gpusync/writer.lock", p);
    char *got = slurp(p, NULL);
    snprintf(buf, sizeof(buf), "%s", got ? got : "");
    free(got);
    return buf;
}

/* Entries in /proc/PID/fd: 0 once the process has closed its files on its way out. */
static int open_fds(pid_t pid)
{
    char p[64];
    snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
    int n = count_entries(p);
    return n < 0 ? 0 : n;
}

/* A process that is not a gpusync agent holds the writer lock: a child of this test. */
static pid_t hold_lock_elsewhere(struct fx *f)
{
    char p[PATH_MAX];
    int ready[2];
    plant(f, ".gpusync/writer.lock", "");
    at(f, ".gpusync/writer.lock", p);
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
        int fd = open(p, O_RDWR);
        if (fd < 0 || fcntl(fd, F_SETLK, &l) < 0 || write(ready[1], "L", 1) != 1)
            _exit(1);
        for (;;)
            pause();
    }
    char c = 0;
    close(ready[1]);
    assert_int_equal(read(ready[0], &c, 1), 1); /* the child holds the lock now */
    close(ready[0]);
    return pid;
}

/* A session whose link hangs (its agent stopped, a request still in its pipe) is fenced out by the
 * next one: the old agent has exited before the new one answers HELLO, and its request never
 * lands, not even once it could run again. */
static void test_serve__a_new_session_kills_a_stopped_one_and_its_requests_never_land(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg r;
    start(f);
    pid_t old = f->a.pid;
    assert_int_equal(kill(old, SIGSTOP), 0);
    struct gs_proto_msg stale = put_msg("f.txt", "stale", GS_EXPECT_FORCE, NULL);
    agent_h_queue(&f->a, &stale);
    assert_int_equal(agent_h_flush(&f->a), 0); /* in the stopped agent's stdin */

    assert_int_equal(agent_h_open(&f->b, f->root, NULL, 0), 0);
    f->b_started = 1;
    int fds_at_hello = open_fds(old); /* 0: exited (its lock went with its files) */
    kill(old, SIGCONT);               /* had it survived, it would run the stale put now */
    f->started = 0;
    int old_status = agent_h_close(&f->a);
    assert_int_equal(fds_at_hello, 0);
    assert_int_equal(old_status, 128 + SIGKILL);

    struct gs_proto_msg st = req(GS_MSG_STAT, "f.txt");
    assert_int_equal(agent_h_call(&f->b, &st, &r), 0);
    assert_int_equal(r.type, GS_MSG_STAT_R);
    assert_int_equal(r.kind, GS_KIND_NONE);
    struct gs_proto_msg fresh = put_msg("f.txt", "fresh", GS_EXPECT_ABSENT, NULL);
    assert_int_equal(agent_h_call(&f->b, &fresh, &r), 0);
    assert_int_equal(r.type, GS_MSG_DONE);
    assert_int_equal(r.flags & GS_DONE_KEPT, 0);
    f->b_started = 0;
    assert_int_equal(agent_h_close(&f->b), 0);
    assert_content(f, "f.txt", "fresh");
    assert_int_equal(count_prefixed(f->root, "f.txt" GS_PROTO_CONFLICT_TAG), 0);
}

/* A lock holder that is not a gpusync agent is never killed: the session is refused with EBUSY
 * (naming the pid and the root), and nothing queued behind HELLO is executed. */
static void test_serve__a_holder_that_is_no_agent_is_left_alone_and_refused(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg m = {0}, r;
    pid_t holder = hold_lock_elsewhere(f);
    assert_int_equal(agent_h_start(&f->a, f->root, NULL), 0);
    m.type = GS_MSG_HELLO;
    m.magic = GS_PROTO_MAGIC;
    m.version = GS_PROTO_VERSION;
    agent_h_queue(&f->a, &m);
    struct gs_proto_msg p = put_msg("never.txt", "no", GS_EXPECT_FORCE, NULL);
    agent_h_queue(&f->a, &p);
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    struct rep c;
    copy_reply(&r, &c);
    assert_int_equal(c.type, GS_MSG_ERROR);
    assert_int_equal(c.err, EBUSY);
    char pid[32], real[PATH_MAX];
    snprintf(pid, sizeof(pid), "pid %d", (int)holder);
    assert_non_null(realpath(f->root, real));
    assert_non_null(strstr(c.text, pid));
    assert_non_null(strstr(c.text, real));
    assert_int_equal(agent_h_close(&f->a), 2);
    assert_int_equal(waitpid(holder, NULL, WNOHANG), 0); /* still alive */
    assert_false(exists(f, "never.txt"));
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
}

/* After an unclean end (the lock file still names a writer), the next session removes the agent
 * temporaries it finds anywhere (.gpusync/runs aside), and nothing else. */
static void test_serve__an_unclean_end_is_swept_before_hello(void **state)
{
    struct fx *f = *state;
    static const char *const swept[] = {".gpusync-tmp-4242-7", "sub/deeper/.gpusync-tmp-999999-1",
                                        ".gpusync/.gpusync-tmp-77-3"};
    static const char *const kept[] = {"sub/.gpusync-tmp-123",
                                       "sub/.gpusync-tmp-12-",
                                       "sub/.gpusync-tmp-1-2x",
                                       "sub/normal.txt",
                                       ".gpusync/runs/r1/.gpusync-tmp-5-1",
                                       "sub/.gpusync-tmp-a-1"};
    for (size_t i = 0; i < 3; i++)
        plant(f, swept[i], "partial");
    for (size_t i = 0; i < 6; i++)
        plant(f, kept[i], "keep");
    char outside_tmp[PATH_MAX], link[PATH_MAX];
    snprintf(outside_tmp, sizeof(outside_tmp), "%s/.gpusync-tmp-1-1", f->outside);
    write_file(outside_tmp, "outside");
    at(f, "link", link);
    assert_int_equal(symlink(f->outside, link), 0);
    plant(f, ".gpusync/writer.lock", "4242\n");
    start(f);
    for (size_t i = 0; i < 3; i++)
        assert_false(exists(f, swept[i]));
    for (size_t i = 0; i < 6; i++)
        assert_true(exists(f, kept[i]));
    assert_int_equal(access(outside_tmp, F_OK), 0);
    char want[32];
    snprintf(want, sizeof(want), "%d\n", (int)f->a.pid);
    assert_string_equal(lock_content(f), want);
}

/* A clean end empties the lock file and the next session sweeps nothing; an agent killed
 * mid-upload leaves its writer's pid there, and then the next session removes its partial file. */
static void test_serve__only_an_unclean_end_triggers_the_sweep(void **state)
{
    struct fx *f = *state;
    char want[32];
    start(f);
    snprintf(want, sizeof(want), "%d\n", (int)f->a.pid);
    assert_string_equal(lock_content(f), want);
    f->started = 0;
    assert_int_equal(agent_h_close(&f->a), 0);
    assert_string_equal(lock_content(f), "");

    plant(f, "d/.gpusync-tmp-31337-1", "planted");
    start(f); /* after a clean end: no sweep */
    assert_true(exists(f, "d/.gpusync-tmp-31337-1"));
    struct gs_proto_msg b = req(GS_MSG_PUT_BEGIN, "d/big.bin"), d = req(GS_MSG_PUT_DATA, "");
    b.id = d.id = 40;
    b.size = 100;
    d.data = gs_proto_cstr("the first part of a file that never completes");
    agent_h_queue(&f->a, &b);
    agent_h_queue(&f->a, &d);
    struct gs_proto_msg st = req(GS_MSG_STAT, "d/big.bin");
    assert_int_equal(call(f, &st).type, GS_MSG_STAT_R); /* the DATA frame was written */
    char dir[PATH_MAX];
    at(f, "d", dir);
    assert_int_equal(count_prefixed(dir, GS_PROTO_TMP_PREFIX), 2);
    assert_int_equal(kill(f->a.pid, SIGKILL), 0);
    f->started = 0;
    assert_int_equal(agent_h_close(&f->a), 128 + SIGKILL);
    assert_true(lock_content(f)[0] != '\0');

    start(f);
    assert_int_equal(count_prefixed(dir, GS_PROTO_TMP_PREFIX), 0);
    assert_false(exists(f, "d/big.bin"));
}

/* ---- hostile input ----------------------------------------------------------------------- */

static void test_serve__garbage_before_handshake_is_an_error_and_clean_exit(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg r;
    static const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(agent_h_start(&f->a, f->root, NULL), 0);
    agent_h_queue_raw(&f->a, junk, sizeof(junk) - 1);
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(agent_h_close(&f->a), 2);
}

static void test_serve__oversized_frame_is_an_error_and_clean_exit(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg r;
    static const uint8_t huge[] = {0x7f, 0xff, 0xff, 0xff, GS_MSG_PUT, 0, 0, 0, 3};
    start(f);
    agent_h_queue_raw(&f->a, huge, sizeof(huge));
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.type, GS_MSG_ERROR);
    assert_int_equal(r.err, EMSGSIZE);
    assert_int_equal(r.id, 3);
    f->started = 0;
    assert_int_equal(agent_h_close(&f->a), 2);
}

static void test_serve__unknown_and_malformed_frames_get_errors_and_session_goes_on(void **state)
{
    struct fx *f = *state;
    struct gs_proto_msg r;
    static const uint8_t unknown[] = {0, 0, 0, 7, 0x3e, 0, 0, 0, 11, 'h', 'i'};
    static const uint8_t reply_type[] = {0, 0, 0, 5, GS_MSG_DONE, 0, 0, 0, 12};
    static const uint8_t short_put[] = {0, 0, 0, 9, GS_MSG_PUT, 0, 0, 0, 13, 0, 0, 0, 9};
    start(f);
    agent_h_queue_raw(&f->a, unknown, sizeof(unknown));
    agent_h_queue_raw(&f->a, reply_type, sizeof(reply_type));
    agent_h_queue_raw(&f->a, short_put, sizeof(short_put));
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.id, 11);
    assert_int_equal(r.err, ENOSYS);
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.id, 12);
    assert_int_equal(r.err, ENOSYS);
    assert_int_equal(agent_h_recv(&f->a, &r), 0);
    assert_int_equal(r.id, 13);
    assert_int_equal(r.err, EBADMSG);
    assert_int_equal(put(f, "still/works", "yes").type, GS_MSG_DONE);
    struct gs_proto_msg orphan = req(GS_MSG_PUT_DATA, "");
    orphan.id = 99;
    assert_int_equal(call(f, &orphan).err, EBADF);
}

static void test_serve__truncated_frame_at_end_of_input_exits_cleanly(void **state)
{
    struct fx *f = *state;
    static const uint8_t cut[] = {0, 0, 0, 40, GS_MSG_PUT, 0, 0, 0, 1, 0, 0};
    start(f);
    agent_h_queue_raw(&f->a, cut, sizeof(cut));
    f->started = 0;
    assert_int_equal(agent_h_close(&f->a), 2);
    /* Nothing but the session's own writer lock (.gpusync/writer.lock, protocol v4). */
    char meta[PATH_MAX];
    at(f, ".gpusync", meta);
    assert_int_equal(count_entries(f->root), 1);
    assert_int_equal(count_entries(meta), 1);
    assert_int_equal(count_prefixed(meta, "writer.lock"), 1);
}

static void test_serve__random_garbage_never_crashes_or_writes_outside(void **state)
{
    struct fx *f = *state;
    uint8_t buf[4096];
    for (uint64_t seed = 1; seed <= 20; seed++) {
        start(f);
        fill_random(buf, sizeof(buf), seed);
        /* Keep lengths small so frames parse and reach the handlers. */
        for (size_t i = 0; i + 9 < sizeof(buf); i += 4 + buf[i + 3]) {
            buf[i] = buf[i + 1] = buf[i + 2] = 0;
            buf[i + 3] = (uint8_t)(5 + buf[i + 3] % 64);
            buf[i + 4] = (uint8_t)(0x10 + buf[i + 4] % 0x10);
        }
        agent_h_queue_raw(&f->a, buf, sizeof(buf));
        int status = agent_h_close(&f->a);
        f->started = 0;
        assert_true(status == 0 || status == 2);
        assert_int_equal(count_entries(f->outside), 0);
    }
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_serve__handshake_reports_versions_and_creates_absolute_root),
        T(test_serve__version_mismatch_is_a_clear_error),
        T(test_serve__version_flag_prints_agent_and_protocol_versions),
        T(test_serve__usage_errors_go_to_stderr_not_stdout),
        T(test_serve__fsync_mode_still_writes_files),
        T(test_serve__hello_creates_the_sync_id_once_and_answers_it),
        T(test_serve__sync_id_behind_a_symlink_is_not_followed),
        T(test_serve__pipelined_puts_are_answered_in_order),
        T(test_serve__put_replaces_atomically_via_temp_and_rename),
        T(test_serve__put_end_with_wrong_hash_or_size_leaves_target_untouched),
        T(test_serve__mode_and_mtime_are_preserved),
        T(test_serve__chmod_with_a_hash_stamps_only_that_content),
        T(test_serve__chmod_with_a_hash_on_an_unreadable_file),
        T(test_serve__put_conflict_keeps_server_copy_and_reports_it),
        T(test_serve__expected_absent_but_present_is_kept_unless_identical),
        T(test_serve__delete_conflict_keeps_server_copy),
        T(test_serve__delete_expecting_a_directory_keeps_what_replaced_it),
        T(test_serve__path_escapes_are_refused),
        T(test_serve__a_real_eperm_is_not_reported_as_a_refused_path),
        T(test_serve__chmod_and_mkdir_never_follow_a_symlink_swapped_in),
        T(test_serve__setuid_and_setgid_bits_are_never_mirrored),
        T(test_serve__hostile_names_work),
        T(test_serve__list_skips_and_reports_too_long_paths_and_too_deep_trees),
        T(test_serve__check_lists_what_differs_and_keeps_beliefs_for_the_session),
        T(test_serve__kept_checks_see_changes_in_watched_folders),
        T(test_serve__kept_checks_find_a_write_through_a_mapping),
        T(test_serve__kept_beliefs_are_saved_for_the_next_session),
        T(test_serve__large_file_streams_byte_identical_both_ways),
        T(test_serve__get_of_a_file_changed_while_read_is_refused),
        T(test_serve__get_of_a_file_appended_while_read_sends_it_as_it_was),
        T(test_serve__get_of_a_file_open_for_writing_names_the_writer),
        T(test_serve__zero_blocks_of_a_streamed_file_are_holes),
        T(test_serve__disk_full_removes_temp_and_keeps_target),
        T(test_serve__mkdir_rename_symlink_and_recursive_delete),
        T(test_serve__mkdir_keeps_what_stood_in_its_place),
        T(test_serve__a_new_session_kills_a_stopped_one_and_its_requests_never_land),
        T(test_serve__a_holder_that_is_no_agent_is_left_alone_and_refused),
        T(test_serve__an_unclean_end_is_swept_before_hello),
        T(test_serve__only_an_unclean_end_triggers_the_sweep),
        T(test_serve__garbage_before_handshake_is_an_error_and_clean_exit),
        T(test_serve__oversized_frame_is_an_error_and_clean_exit),
        T(test_serve__unknown_and_malformed_frames_get_errors_and_session_goes_on),
        T(test_serve__truncated_frame_at_end_of_input_exits_cleanly),
        T(test_serve__random_garbage_never_crashes_or_writes_outside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
