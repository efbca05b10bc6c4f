/* Integration tests for deltas of large files (PUT_DELTA: remote/agent_client.c, remote/delta.c,
 * agent/serve_delta.c) against the sandbox sshd and the built agent: only the changed blocks
 * cross, the server rebuilds exact bytes, a server copy changed under the delta is kept as a
 * conflict copy, a rebuilt file with the wrong hash is refused with the target untouched, and a
 * delta cut off by a killed sshd leaves the old file whole and goes through on the next session.
 * The server is this machine, so the remote tree is inspected directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "remote/agent_client.h"
#include "remote/agent_install.h"
#include "remote/delta.h"
#include "remote/ssh.h"

#define BIG (4u << 20)

struct fx {
    char base[64];    /* temporary folder: local/, remote/ and sigs/ */
    char local[128];  /* files to upload */
    char remote[128]; /* the agent's root, seen directly */
    char sigs[128];   /* the client's signature store */
    struct gs_agent *agent;
    struct gs_fileops *ops;
    int plain; /* the agent built without librsync (and libzstd) */
    int n_done, n_ok, err_no;
    char kept[512];
};

static struct gs_test_sshd g_sshd;
static struct gs_ssh *g_ssh;

static void on_done(void *cb_ctx, void *req_ctx, const struct gs_fop_result *r)
{
    struct fx *f = cb_ctx;
    (void)req_ctx;
    f->n_done++;
    f->n_ok += r->ok;
    f->err_no = r->ok ? 0 : r->err_no;
    snprintf(f->kept, sizeof(f->kept), "%s", r->kept ? r->kept : "");
}

static int connect_ssh(void)
{
    struct gs_ssh_opts o = {.host = "127.0.0.1", .port = g_sshd.port, .user = "root"};
    struct gs_error err = {0};
    if (gs_ssh_connect(&g_ssh, &o, &err) < 0) {
        fprintf(stderr, "connect: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start(&g_sshd, NULL) < 0)
        return -1;
    gs_test_sshd_use_home(&g_sshd, 1);
    return connect_ssh();
}

static int group_teardown(void **state)
{
    (void)state;
    gs_ssh_free(g_ssh);
    gs_test_sshd_destroy(&g_sshd);
    return 0;
}

/* Starts an agent session on f->remote with deltas on (the agent built as on a server without
 * librsync, when f->plain); with `wait`, waits for the handshake's answer, as a push that has
 * nothing to send before it does. Returns 0 or -1. */
static int open_agent_as(struct fx *f, int wait)
{
    struct gs_buf cmd = GS_BUF_INIT;
    struct gs_error err = {0};
    const char *agent = f->plain ? "agent/gpusync-agent-plain" : "agent/gpusync-agent";
    gs_agent_serve_command(gs_test_build_path(agent), f->remote, &cmd);
    int rc = gs_agent_open(&f->agent, g_ssh, cmd.data, 1, &err);
    if (rc == 0 && wait)
        rc = gs_agent_wait_ready(f->agent, &err);
    gs_buf_release(&cmd);
    if (rc < 0) {
        fprintf(stderr, "agent: %s\n", err.msg);
        return -1;
    }
    gs_agent_set_delta_dir(f->agent, f->sigs);
    f->ops = gs_agent_fileops(f->agent);
    f->ops->done = on_done;
    f->ops->done_ctx = f;
    return 0;
}

static int open_agent(struct fx *f)
{
    return open_agent_as(f, 1);
}

static int setup_as(void **state, int plain)
{
    struct fx *f = calloc(1, sizeof(*f));
    f->plain = plain;
    snprintf(f->base, sizeof(f->base), "/tmp/gs-delta.XXXXXX");
    if (!f || !mkdtemp(f->base))
        return -1;
    snprintf(f->local, sizeof(f->local), "%s/local", f->base);
    snprintf(f->remote, sizeof(f->remote), "%s/remote", f->base);
    snprintf(f->sigs, sizeof(f->sigs), "%s/sigs", f->base);
    mkdir(f->local, 0755);
    *state = f;
    return open_agent(f);
}

static int setup(void **state)
{
    return setup_as(state, 0);
}

static int setup_plain(void **state)
{
    return setup_as(state, 1);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    if (f->ops)
        f->ops->close(f->ops);
    gs_test_sh("rm -rf '%s'", f->base);
    free(f);
    return 0;
}

static void hash_of(const void *p, size_t n, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

/* len random bytes (incompressible: what crosses is the delta, not what zstd makes of it). */
static char *random_bytes(size_t len)
{
    char *data = malloc(len);
    FILE *rnd = fopen("/dev/urandom", "rb");
    assert_non_null(rnd);
    assert_int_equal(fread(data, 1, len, rnd), len);
    fclose(rnd);
    return data;
}

static void write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    fclose(fp);
}

/* Writes local NAME as data and submits its put; `basis` (NULL: none) is what the server is
 * believed to hold. Returns the content bytes the client handed to the transport for it. */
static uint64_t put(struct fx *f, const char *name, const char *data, size_t len, const char *basis,
                    size_t basis_len)
{
    char local[256];
    write_file(f->local, name, data, len);
    snprintf(local, sizeof(local), "%s/%s", f->local, name);
    struct gs_fop_req req = {.type = GS_FOP_PUT,
                             .path = name,
                             .local_file = local,
                             .size = len,
                             .mode = 0644,
                             .mtime_ns = 1700000000LL * 1000000000LL,
                             .expect = basis ? GS_FOP_EXPECT_HASH : GS_FOP_EXPECT_ABSENT};
    if (basis)
        hash_of(basis, basis_len, req.hash);
    hash_of(data, len, req.content_hash);
    uint64_t before = f->ops->bytes_sent;
    struct gs_error err = {0};
    assert_int_equal(f->ops->submit(f->ops, &req, &err), 0);
    return f->ops->bytes_sent - before;
}

static void drain(struct fx *f)
{
    struct gs_error err = {0};
    if (f->ops->drain(f->ops, &err) < 0)
        fail_msg("drain: %s", err.msg);
}

/* Fails unless DIR/NAME holds exactly data[0..len). */
static void expect_bytes(const char *dir, const char *name, const char *data, size_t len)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("%s is not there", path);
    char *got = malloc(len + 1);
    size_t n = fread(got, 1, len + 1, fp);
    fclose(fp);
    assert_int_equal(n, len);
    assert_memory_equal(got, data, len);
    free(got);
}

/* Names under dir that start with prefix. */
static int count_named(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* Names under dir that end with suffix. */
static int count_suffixed(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    size_t k = strlen(suffix);
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        n += len >= k && strcmp(e->d_name + len - k, suffix) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

/* Sends v1 whole, then v2 (v1 with a few scattered edits) as a delta. Returns v2; *v1 too. */
static char *send_v1_then_edit(struct fx *f, char **v1_out)
{
    char *v1 = random_bytes(BIG), *v2 = malloc(BIG);
    assert_true(put(f, "nb.ipynb", v1, BIG, NULL, 0) >= BIG);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    memcpy(v2, v1, BIG);
    memcpy(v2 + BIG / 3, "one cell changed", 16);
    memcpy(v2 + BIG / 2, "and another one", 15);
    *v1_out = v1;
    return v2;
}

/* A small edit of a large file crosses as a delta of a few blocks, and the server holds the
 * exact new bytes; the next edit is a delta against that new content. */
static void test_delta__small_edit_sends_only_changed_blocks(void **state)
{
    struct fx *f = *state;
    char *v1, *v2 = send_v1_then_edit(f, &v1);
    uint64_t sent = put(f, "nb.ipynb", v2, BIG, v1, BIG);
    drain(f);
    assert_int_equal(f->n_ok, 2);
    assert_true(sent > 0 && sent < 64 * 1024); /* a few 4 KiB blocks, not 4 MiB */
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    char *v3 = malloc(BIG);
    memcpy(v3, v2, BIG);
    memcpy(v3 + 10, "third", 5);
    sent = put(f, "nb.ipynb", v3, BIG, v2, BIG);
    drain(f);
    assert_int_equal(f->n_ok, 3);
    assert_true(sent < 64 * 1024);
    expect_bytes(f->remote, "nb.ipynb", v3, BIG);
    assert_int_equal(count_named(f->remote, ".gpusync-tmp-"), 0);
    free(v1), free(v2), free(v3);
}

/* The server's copy was edited there after v1 was sent: the delta cannot apply, so the file goes
 * whole and the edited copy is kept, byte for byte, as a conflict copy. */
static void test_delta__server_copy_changed_under_it_is_kept(void **state)
{
    struct fx *f = *state;
    char *v1, *v2 = send_v1_then_edit(f, &v1);
    char *theirs = malloc(BIG);
    memcpy(theirs, v1, BIG);
    memcpy(theirs + 100, "edited on the server", 20);
    write_file(f->remote, "nb.ipynb", theirs, BIG);
    put(f, "nb.ipynb", v2, BIG, v1, BIG);
    drain(f);
    assert_int_equal(f->n_done, 2);
    assert_int_equal(f->n_ok, 2);
    assert_true(strstr(f->kept, "nb.ipynb.gpusync-conflict-") == f->kept);
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    expect_bytes(f->remote, f->kept, theirs, BIG);
    free(v1), free(v2), free(theirs);
}

/* A delta made against a signature that does not describe the server's copy (a corrupt store)
 * rebuilds other bytes: the agent refuses it (EBADMSG) and the target keeps v1; the next put of
 * the file goes whole and arrives exact. */
static void test_delta__rebuilt_file_with_another_hash_is_refused(void **state)
{
    struct fx *f = *state;
    char *v1, *v2 = send_v1_then_edit(f, &v1);
    char *other = random_bytes(BIG);
    struct gs_buf sig = GS_BUF_INIT;
    uint8_t h1[16];
    hash_of(v1, BIG, h1);
    assert_int_equal(gs_delta_signature(other, BIG, &sig, NULL), 0);
    assert_int_equal(gs_delta_sig_save(f->sigs, h1, sig.data, sig.len, NULL), 0);
    memcpy(other + 5, "edit", 4); /* the new content: mostly blocks of `other` */
    assert_true(put(f, "nb.ipynb", other, BIG, v1, BIG) < 64 * 1024);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    assert_int_equal(f->err_no, EBADMSG);
    expect_bytes(f->remote, "nb.ipynb", v1, BIG);
    assert_int_equal(count_named(f->remote, ".gpusync-tmp-"), 0);
    assert_true(put(f, "nb.ipynb", v2, BIG, v1, BIG) >= BIG);
    drain(f);
    assert_int_equal(f->n_ok, 2);
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    gs_buf_release(&sig);
    free(v1), free(v2), free(other);
}

/* An agent built without librsync does not offer deltas: the edit goes whole, exact. */
static void test_delta__an_agent_without_librsync_gets_whole_files(void **state)
{
    struct fx *f = *state;
    char *v1, *v2 = send_v1_then_edit(f, &v1);
    assert_true(put(f, "nb.ipynb", v2, BIG, v1, BIG) >= BIG);
    drain(f);
    assert_int_equal(f->n_ok, 2);
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    free(v1), free(v2);
}

/* A push sends before the agent has answered HELLO, taking deltas for granted (the cached agent
 * is this build, which takes them). One built without librsync refuses the delta once it has
 * answered (ENOSYS): the file then goes whole, and the server holds it exactly. */
static void test_delta__a_delta_sent_before_the_handshake_goes_whole_if_refused(void **state)
{
    struct fx *f = *state;
    char *v1 = random_bytes(BIG), *v2 = malloc(BIG);
    assert_true(put(f, "nb.ipynb", v1, BIG, NULL, 0) >= BIG);
    drain(f);
    memcpy(v2, v1, BIG);
    memcpy(v2 + BIG / 3, "one cell changed", 16);
    uint8_t h1[16];
    hash_of(v1, BIG, h1);
    gs_delta_keep(f->sigs, h1, v1, BIG); /* as a session with a delta-taking agent kept it */
    f->ops->close(f->ops);
    assert_int_equal(open_agent_as(f, 0), 0);
    uint64_t sent = put(f, "nb.ipynb", v2, BIG, v1, BIG);
    assert_true(sent < BIG / 2); /* a delta went, before the answer */
    drain(f);
    assert_int_equal(f->n_ok, 2);
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    free(v1), free(v2);
}

/* The pid of the agent serving f->remote, or -1. */
/* A file past the delta size limit (a checkpoint, a data shard) gets no signature: keeping one
 * would cost a second read and BLAKE2 over every byte of every send. One at the limit gets one. */
static void test_delta__files_past_64_mib_keep_no_signature(void **state)
{
    struct fx *f = *state;
    size_t limit = (size_t)64 << 20;
    char *data = random_bytes(limit + 1);
    put(f, "shard.bin", data, limit + 1, NULL, 0);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    assert_int_equal(count_suffixed(f->sigs, ".sig"), 0);
    put(f, "at-limit.bin", data, limit, NULL, 0);
    drain(f);
    assert_int_equal(f->n_ok, 2);
    assert_int_equal(count_suffixed(f->sigs, ".sig"), 1);
    expect_bytes(f->remote, "shard.bin", data, limit + 1);
    free(data);
}

static pid_t agent_pid(const struct fx *f)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = -1;
    while (d && found < 0 && (e = readdir(d))) {
        char path[300], cmd[4096] = "";
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *fp = fopen(path, "rb");
        size_t n = fp ? fread(cmd, 1, sizeof(cmd) - 1, fp) : 0;
        if (fp)
            fclose(fp);
        for (size_t i = 0; i < n; i++)
            cmd[i] = cmd[i] ? cmd[i] : ' ';
        if (strstr(cmd, "gpusync-agent") && strstr(cmd, " serve") && strstr(cmd, f->remote))
            found = atoi(e->d_name);
    }
    if (d)
        closedir(d);
    return found;
}

/* sshd is killed while a large delta is on its way (the agent stopped with part of it read):
 * the server keeps v1 whole under the final name, and the next session sends the delta again
 * and the server holds v2 exactly, with no temporary file left. */
static void test_delta__interrupted_delta_leaves_old_file_and_resumes(void **state)
{
    struct fx *f = *state;
    char *v1, *v2 = send_v1_then_edit(f, &v1);
    char *noise = random_bytes(BIG / 4);
    memcpy(v2 + BIG / 8, noise, BIG / 4); /* a 1 MiB delta: more than the pipes hold */
    pid_t pid = agent_pid(f);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    assert_true(put(f, "nb.ipynb", v2, BIG, v1, BIG) > BIG / 4);
    gs_test_sshd_kill(&g_sshd);
    f->ops->close(f->ops);
    f->ops = NULL;
    gs_ssh_free(g_ssh);
    expect_bytes(f->remote, "nb.ipynb", v1, BIG);
    /* only the server's v1 has a signature: v2's is made once the server confirms v2 */
    assert_int_equal(count_suffixed(f->sigs, ".sig"), 1);
    assert_int_equal(gs_test_sshd_restart(&g_sshd, 0), 0);
    gs_test_clear_stale_pyenv_lock();
    assert_int_equal(connect_ssh(), 0);
    assert_int_equal(open_agent(f), 0);
    f->n_ok = 0;
    uint64_t sent = put(f, "nb.ipynb", v2, BIG, v1, BIG);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    assert_true(sent < BIG / 2);
    expect_bytes(f->remote, "nb.ipynb", v2, BIG);
    assert_int_equal(count_named(f->remote, ".gpusync-tmp-"), 0);
    assert_int_equal(count_suffixed(f->sigs, ".sig"), 1); /* v2's, which replaced v1's */
    assert_int_equal(count_suffixed(f->sigs, ".pending"), 0);
    free(v1), free(v2), free(noise);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_delta__small_edit_sends_only_changed_blocks, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_delta__server_copy_changed_under_it_is_kept, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_delta__rebuilt_file_with_another_hash_is_refused,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_delta__an_agent_without_librsync_gets_whole_files,
                                        setup_plain, teardown),
        cmocka_unit_test_setup_teardown(
            test_delta__a_delta_sent_before_the_handshake_goes_whole_if_refused, setup_plain,
            teardown),
        cmocka_unit_test_setup_teardown(test_delta__files_past_64_mib_keep_no_signature, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_delta__interrupted_delta_leaves_old_file_and_resumes,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
