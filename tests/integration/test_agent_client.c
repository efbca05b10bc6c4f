/* Integration tests for the agent client's puts (remote/agent_client.c) against the sandbox sshd
 * and the built agent: small files travel as one PUT frame and are checked against the plan's
 * hash here, large ones stream; many small puts batched into full SSH packets all arrive. The
 * server is this machine, so the remote tree is inspected directly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/clock.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "remote/agent_client.h"
#include "remote/agent_install.h"
#include "remote/ssh.h"
#include "tools/wansim_harness.h"

#define MAX_DONE 512

struct fx {
    char base[64];    /* temporary folder: local/ and remote/ */
    char local[128];  /* files to upload */
    char remote[128]; /* the agent's root, seen directly */
    struct gs_agent *agent;
    struct gs_fileops *ops;
    int n_done, n_ok;
    int err_no[MAX_DONE];
};

static struct gs_test_sshd g_sshd;
static struct gs_ssh *g_ssh;
static struct wansim_proc g_wan;  /* a slow link, for the tests that need one */
static struct gs_ssh *g_slow_ssh; /* through it */

static void on_done(void *cb_ctx, void *req_ctx, const struct gs_fop_result *r)
{
    struct fx *f = cb_ctx;
    intptr_t i = (intptr_t)req_ctx;
    assert_true(i >= 0 && i < MAX_DONE);
    f->n_done++;
    f->n_ok += r->ok;
    f->err_no[i] = r->ok ? 0 : r->err_no;
}

static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start(&g_sshd, NULL) < 0)
        return -1;
    gs_test_sshd_use_home(&g_sshd, 1);
    struct gs_ssh_opts o = {.host = "127.0.0.1", .port = g_sshd.port, .user = "root"};
    struct gs_error err = {0};
    if (gs_ssh_connect(&g_ssh, &o, &err) < 0) {
        fprintf(stderr, "connect: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    gs_ssh_free(g_ssh);
    gs_test_sshd_destroy(&g_sshd);
    return 0;
}

/* A fixture whose agent is `agent` (a path under the build folder), reached through `ssh`. */
static int setup_on(void **state, struct gs_ssh *ssh, const char *agent)
{
    struct fx *f = calloc(1, sizeof(*f));
    snprintf(f->base, sizeof(f->base), "/tmp/gs-agent-client.XXXXXX");
    if (!f || !mkdtemp(f->base))
        return -1;
    snprintf(f->local, sizeof(f->local), "%s/local", f->base);
    snprintf(f->remote, sizeof(f->remote), "%s/remote", f->base);
    mkdir(f->local, 0755);
    struct gs_buf cmd = GS_BUF_INIT;
    struct gs_error err = {0};
    gs_agent_serve_command(gs_test_build_path(agent), f->remote, &cmd);
    int rc = gs_agent_open(&f->agent, ssh, cmd.data, 1, &err);
    if (rc == 0)
        rc = gs_agent_wait_ready(f->agent, &err);
    gs_buf_release(&cmd);
    if (rc < 0) {
        fprintf(stderr, "agent: %s\n", err.msg);
        return -1;
    }
    f->ops = gs_agent_fileops(f->agent);
    f->ops->done = on_done;
    f->ops->done_ctx = f;
    *state = f;
    return 0;
}

static int setup_with(void **state, const char *agent)
{
    return setup_on(state, g_ssh, agent);
}

/* The agent behind an 8 Mbit/s link with 10 ms round trips (wansim). */
static int setup_slow(void **state)
{
    char why[256];
    struct wansim_opts wo = {.target_port = g_sshd.port, .delay_ms = 5, .rate_mbit = 8};
    if (wansim_start(&g_wan, &wo, why, sizeof(why)) < 0) {
        fprintf(stderr, "wansim: %s\n", why);
        return -1;
    }
    struct gs_ssh_opts o = {
        .host = "127.0.0.1", .port = g_wan.port, .user = "root", .accept_new_host_key = 1};
    struct gs_error err = {0};
    if (gs_ssh_connect(&g_slow_ssh, &o, &err) < 0) {
        fprintf(stderr, "connect through wansim: %s\n", err.msg);
        return -1;
    }
    return setup_on(state, g_slow_ssh, "agent/gpusync-agent");
}

static int setup(void **state)
{
    return setup_with(state, "agent/gpusync-agent");
}

/* The agent as a server without libzstd builds it. */
static int setup_plain(void **state)
{
    return setup_with(state, "agent/gpusync-agent-plain");
}

static int teardown(void **state)
{
    struct fx *f = *state;
    f->ops->close(f->ops);
    gs_test_sh("rm -rf '%s'", f->base);
    free(f);
    return 0;
}

static int teardown_slow(void **state)
{
    teardown(state);
    gs_ssh_free(g_slow_ssh);
    g_slow_ssh = NULL;
    wansim_stop(&g_wan);
    return 0;
}

/* Writes local NAME with `len` bytes of a pattern seeded by `seed`; returns the bytes (malloc'd).
 */
static char *make_file(struct fx *f, const char *name, size_t len, unsigned seed)
{
    char path[256];
    char *data = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        data[i] = (char)((i * 31 + seed) % 251);
    snprintf(path, sizeof(path), "%s/%s", f->local, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    fclose(fp);
    return data;
}

static void hash_of(const void *p, size_t n, uint8_t out[16])
{
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
    memcpy(out, c.digest, 16);
}

/* Submits a put of local NAME (planned content `planned`, `len` bytes) as request `i`. */
static void submit_put(struct fx *f, const char *name, const char *planned, size_t len, int i)
{
    char local[256];
    snprintf(local, sizeof(local), "%s/%s", f->local, name);
    struct gs_fop_req req = {.type = GS_FOP_PUT,
                             .path = name,
                             .local_file = local,
                             .size = len,
                             .mode = 0644,
                             .mtime_ns = 1700000000LL * 1000000000LL,
                             .expect = GS_FOP_EXPECT_ABSENT,
                             .ctx = (void *)(intptr_t)i};
    hash_of(planned, len, req.content_hash);
    struct gs_error err = {0};
    assert_int_equal(f->ops->submit(f->ops, &req, &err), 0);
}

static void drain(struct fx *f)
{
    struct gs_error err = {0};
    if (f->ops->drain(f->ops, &err) < 0)
        fail_msg("drain: %s", err.msg);
}

/* Fails unless remote NAME holds exactly data[0..len). */
static void expect_remote(struct fx *f, const char *name, const char *data, size_t len)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", f->remote, name);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("%s is not on the server", name);
    char *got = malloc(len + 1);
    size_t n = fread(got, 1, len + 1, fp);
    fclose(fp);
    assert_int_equal(n, len);
    assert_memory_equal(got, data, len);
    free(got);
}

static void test_agent_client__small_and_large_puts_arrive_byte_for_byte(void **state)
{
    struct fx *f = *state;
    char *small = make_file(f, "small.txt", 4096, 1);
    char *edge = make_file(f, "edge.bin", 64 << 10, 2);
    char *large = make_file(f, "large.bin", (64 << 10) + 1, 3);
    char *empty = make_file(f, "empty", 0, 4);
    submit_put(f, "small.txt", small, 4096, 0);
    submit_put(f, "edge.bin", edge, 64 << 10, 1);
    submit_put(f, "large.bin", large, (64 << 10) + 1, 2);
    submit_put(f, "empty", empty, 0, 3);
    drain(f);
    assert_int_equal(f->n_ok, 4);
    expect_remote(f, "small.txt", small, 4096);
    expect_remote(f, "edge.bin", edge, 64 << 10);
    expect_remote(f, "large.bin", large, (64 << 10) + 1);
    expect_remote(f, "empty", empty, 0);
    free(small);
    free(edge);
    free(large);
    free(empty);
}

/* The file changed after the plan hashed it: its bytes are not what the index would record, so
 * nothing is sent and the put reports it (the next sync sends the new content). */
static void test_agent_client__small_file_changed_since_hashed_is_not_sent(void **state)
{
    struct fx *f = *state;
    char *now = make_file(f, "moving.txt", 100, 5);
    char planned[100];
    memcpy(planned, now, sizeof(planned));
    planned[0] ^= 1;
    submit_put(f, "moving.txt", planned, sizeof(planned), 0);
    drain(f);
    assert_int_equal(f->n_done, 1);
    assert_int_equal(f->n_ok, 0);
    assert_int_equal(f->err_no[0], EAGAIN);
    char path[256];
    snprintf(path, sizeof(path), "%s/moving.txt", f->remote);
    assert_int_equal(access(path, F_OK), -1);
    free(now);
}

/* The same for a file large enough to be streamed, which the agent checks only once every byte
 * arrived (a file still being written during a push): refused as changed, like the small one
 * (EAGAIN), not as a malformed request, and the server is left without it. */
static void test_agent_client__streamed_file_changed_since_hashed_is_not_committed(void **state)
{
    struct fx *f = *state;
    size_t len = (64 << 10) + 1;
    char *now = make_file(f, "moving.bin", len, 6);
    char *planned = malloc(len);
    memcpy(planned, now, len);
    planned[len - 1] ^= 1;
    submit_put(f, "moving.bin", planned, len, 0);
    drain(f);
    assert_int_equal(f->n_done, 1);
    assert_int_equal(f->n_ok, 0);
    assert_int_equal(f->err_no[0], EAGAIN);
    char path[256];
    snprintf(path, sizeof(path), "%s/moving.bin", f->remote);
    assert_int_equal(access(path, F_OK), -1);
    free(planned);
    free(now);
}

/* The remote project path holds a file: the serve command cannot make the folder, and the shell
 * ends before the agent starts. The SSH connection is fine, so that is a remote error naming the
 * path, not GS_E_DISCONNECTED (which push reported as "connection lost" and a caller retries). */
static void test_agent_client__a_file_at_the_root_path_is_a_remote_error(void **state)
{
    struct fx *f = *state;
    char root[160];
    snprintf(root, sizeof(root), "%s/a-file", f->base);
    assert_int_equal(gs_test_sh("echo not-a-folder > '%s'", root), 0);
    struct gs_buf cmd = GS_BUF_INIT;
    struct gs_error err = {0};
    struct gs_agent *a = NULL;
    gs_agent_serve_command(gs_test_build_path("agent/gpusync-agent"), root, &cmd);
    int rc = gs_agent_open(&a, g_ssh, cmd.data, 1, &err);
    if (rc == 0)
        rc = gs_agent_wait_ready(a, &err);
    gs_agent_close(a);
    gs_buf_release(&cmd);
    assert_int_equal(rc, GS_E_REMOTE);
    assert_non_null(strstr(err.msg, root));
}

/* Hundreds of small puts, written in batches of whole packets, all arrive and are answered. */
static void test_agent_client__many_small_puts_all_arrive(void **state)
{
    struct fx *f = *state;
    enum { N = 300 };
    static char *data[N];
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%03d", i);
        data[i] = make_file(f, name, (size_t)(i * 13 % 700), (unsigned)i);
        submit_put(f, name, data[i], (size_t)(i * 13 % 700), i);
    }
    drain(f);
    assert_int_equal(f->n_ok, N);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof(name), "f%03d", i);
        expect_remote(f, name, data[i], (size_t)(i * 13 % 700));
        free(data[i]);
    }
}

/* Writes local NAME with `len` bytes from /dev/urandom (incompressible); returns them. */
static char *random_file(struct fx *f, const char *name, size_t len)
{
    char *data = malloc(len + 1), path[256];
    FILE *rnd = fopen("/dev/urandom", "rb");
    assert_non_null(rnd);
    assert_int_equal(fread(data, 1, len, rnd), len);
    fclose(rnd);
    snprintf(path, sizeof(path), "%s/%s", f->local, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    fclose(fp);
    return data;
}

/* Frame bytes and wire bytes sent so far. */
static void sent(struct fx *f, unsigned long long *frames, unsigned long long *wire)
{
    gs_agent_compression(f->agent, frames, wire);
}

/* Source-like data shrinks on the wire and arrives byte for byte; random data goes about as it
 * is (one try, then plain); empty and one-byte files are fine; and a pull (the reply
 * direction) brings the compressible file back exact. */
static void test_agent_client__compressed_both_ways_and_exact(void **state)
{
    struct fx *f = *state;
    unsigned long long frames0, wire0, frames1, wire1, frames2, wire2;
    assert_int_equal(gs_agent_compression(f->agent, &frames0, &wire0), 1);
    enum { BIG = 3 << 20 };
    char *text = make_file(f, "text.bin", BIG, 7), *one = make_file(f, "one", 1, 8);
    char *empty = make_file(f, "empty", 0, 9);
    submit_put(f, "text.bin", text, BIG, 0);
    submit_put(f, "one", one, 1, 1);
    submit_put(f, "empty", empty, 0, 2);
    drain(f);
    sent(f, &frames1, &wire1);
    assert_true(frames1 - frames0 > BIG);
    assert_true(wire1 - wire0 < (frames1 - frames0) / 4); /* a periodic pattern: far smaller */
    char *noise = random_file(f, "noise.bin", BIG);
    submit_put(f, "noise.bin", noise, BIG, 3);
    drain(f);
    sent(f, &frames2, &wire2);
    assert_true(frames2 - frames1 > BIG);
    /* at most one batch of it went through zstd (stored raw), the rest plain: about as big */
    assert_true(wire2 - wire1 <= frames2 - frames1 + (frames2 - frames1) / 100);
    assert_int_equal(f->n_ok, 4);
    expect_remote(f, "text.bin", text, BIG);
    expect_remote(f, "one", one, 1);
    expect_remote(f, "empty", empty, 0);
    expect_remote(f, "noise.bin", noise, BIG);
    char back[300];
    struct gs_error err = {0};
    snprintf(back, sizeof(back), "%s/text.back", f->local);
    if (gs_agent_get(f->agent, "text.bin", back, NULL, NULL, NULL, &err) < 0)
        fail_msg("get: %s", err.msg);
    FILE *fp = fopen(back, "rb");
    char *got = malloc(BIG);
    assert_int_equal(fread(got, 1, BIG, fp), BIG);
    fclose(fp);
    assert_memory_equal(got, text, BIG);
    free(got);
    free(text), free(one), free(empty), free(noise);
}

/* A file past 2 GiB, sparse here (mostly zeros, a marker at each end and on both sides of 2^31),
 * streams through the compressed session and arrives whole: offsets and sizes over 32 bits, and a
 * zstd stream that carries gigabytes of zeros in a few megabytes. */
static void test_agent_client__a_sparse_file_past_2_gib_arrives_whole(void **state)
{
    struct fx *f = *state;
    const off_t size = (2LL << 30) + 3, marks[] = {0, (1LL << 31) - 1, 1LL << 31, size - 1};
    char path[256];
    snprintf(path, sizeof(path), "%s/sparse.bin", f->local);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        assert_int_equal(pwrite(fd, "ABCD" + i, 1, marks[i]), 1);
    char *planned = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(planned != MAP_FAILED);
    unsigned long long frames0, wire0, frames1, wire1;
    gs_agent_compression(f->agent, &frames0, &wire0);
    submit_put(f, "sparse.bin", planned, (size_t)size, 0);
    drain(f);
    gs_agent_compression(f->agent, &frames1, &wire1);
    munmap(planned, (size_t)size);
    close(fd);
    unlink(path);
    assert_int_equal(f->n_ok, 1); /* PUT_END's hash of all 2 GiB matched on the server */
    assert_true(wire1 - wire0 < (64u << 20));
    snprintf(path, sizeof(path), "%s/sparse.bin", f->remote);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    assert_int_equal(sb.st_size, size);
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        char c = 0;
        assert_int_equal(pread(fd, &c, 1, marks[i]), 1);
        assert_int_equal(c, "ABCD"[i]);
    }
    close(fd);
    unlink(path);
}

/* An agent built where there is no libzstd declines in the handshake: the same puts go plain. */
static void test_agent_client__an_agent_without_zstd_is_spoken_to_plainly(void **state)
{
    struct fx *f = *state;
    unsigned long long frames, wire;
    assert_int_equal(gs_agent_compression(f->agent, &frames, &wire), 0);
    char *text = make_file(f, "text.bin", 1 << 20, 7);
    submit_put(f, "text.bin", text, 1 << 20, 0);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    expect_remote(f, "text.bin", text, 1 << 20);
    free(text);
}

/* Probe (the question reconciling asks after a crash) reports, in one pipelined batch, what the
 * server really holds: a file with its content hash, a directory, a symlink with the hash of its
 * target string, nothing (also below a missing directory), for more paths than one round trip's
 * chunk; and it follows earlier, unanswered requests rather than overtaking them. */
/* Writes local NAME with `len` random hex digits and newlines (about 2:1 for zstd, like dense
 * source: enough stays to keep a slow link busy); returns the bytes (malloc'd). */
static char *hex_file(struct fx *f, const char *name, size_t len, unsigned seed)
{
    char path[256];
    char *data = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        data[i] = i % 64 == 63 ? '\n' : "0123456789abcdef"[rand_r(&seed) % 16];
    snprintf(path, sizeof(path), "%s/%s", f->local, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, len, fp), len);
    fclose(fp);
    return data;
}

/* Puts `n` hex files of `len` bytes each and drains; fails unless all arrive exact. */
static void put_hex_files(struct fx *f, int n, size_t len)
{
    char *data[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "h%02d.txt", i);
        data[i] = hex_file(f, name, len, (unsigned)i + 1);
        submit_put(f, name, data[i], len, i);
    }
    drain(f);
    assert_int_equal(f->n_ok, n);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "h%02d.txt", i);
        expect_remote(f, name, data[i], len);
        free(data[i]);
    }
}

/* compress = auto on a link far faster than 60 Mbit/s (loopback): whatever the answers show, the
 * level stays 1, which costs the least CPU. */
static void test_agent_client__the_level_stays_1_on_a_fast_link(void **state)
{
    struct fx *f = *state;
    put_hex_files(f, 48, 1024 * 1024); /* longer than the 250 ms a judgement takes */
    double rate = gs_agent_link_rate(f->agent);
    print_message("loopback: %.0f Mbit/s read from the answers, level %d\n", rate * 8 / 1e6,
                  gs_agent_compress_level(f->agent));
    assert_int_equal(gs_agent_compress_level(f->agent), 1);
    assert_true(rate == 0 || rate >= GS_AGENT_SLOW_LINK_BPS); /* not read (never busy), or fast */
}

/* compress = auto on an 8 Mbit/s link: the socket buffers and the link's queue take megabytes at
 * once, but the agent's answers come at the link's pace, and the level rises to 9; the rate read
 * from them is the link's, within a margin, and every file arrives exact. */
static void test_agent_client__a_slow_link_raises_the_level(void **state)
{
    struct fx *f = *state;
    put_hex_files(f, 24, 128 * 1024);
    double rate = gs_agent_link_rate(f->agent);
    print_message("8 Mbit/s link: %.1f Mbit/s read from the answers, level %d\n", rate * 8 / 1e6,
                  gs_agent_compress_level(f->agent));
    assert_int_equal(gs_agent_compress_level(f->agent), GS_AGENT_SLOW_LEVEL);
    assert_true(rate > 0.5e6 && rate < 1.2e6); /* 8 Mbit/s is 1e6 bytes a second */
}

/* The level is raised early in a first session on a slow link: what is packed waits for the
 * judgment once 1 MB (compressed) waits for answers, instead of going at level 1 into the socket
 * buffers and the link's queue, which take megabytes (measured with this hex, about 0.4
 * compressed: 4.1 MB packed ahead of the answers when the level was raised, the last batch
 * included; 5.6-6.5 MB without the wait). */
static void test_agent_client__a_slow_link_is_judged_before_most_is_packed(void **state)
{
    struct fx *f = *state;
    put_hex_files(f, 64, 192 * 1024); /* 12.6 MB, about 5 s at 8 Mbit/s */
    uint64_t ahead = gs_agent_level_raised_ahead(f->agent);
    print_message("level raised with %.1f MB packed ahead of the answers\n", ahead / 1e6);
    assert_true(ahead > 0 && ahead < 4600000);
}

static void test_agent_client__probe_reports_what_the_server_holds(void **state)
{
    struct fx *f = *state;
    char *data = make_file(f, "put-first", 1000, 3);
    submit_put(f, "put-first", data, 1000, 0); /* not drained: probe must wait for it */
    gs_test_sh("cd '%s' && mkdir -p d && printf abc > d/file && ln -s some/target link", f->remote);
    enum { N = 1500 };
    const char **paths = calloc(N, sizeof(*paths));
    static const char *const named[] = {"put-first", "d", "d/file", "link", "none", "no/dir/x"};
    for (int i = 0; i < N; i++)
        paths[i] = i < 6 ? named[i] : "d/file";
    struct gs_fop_stat *st = calloc(N, sizeof(*st));
    struct gs_error err = {0};
    if (f->ops->probe(f->ops, paths, N, st, &err) < 0)
        fail_msg("probe: %s", err.msg);
    assert_int_equal(f->n_ok, 1);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, 1000));
    assert_int_equal(st[0].kind, GS_FOP_KIND_FILE);
    assert_true(st[0].has_hash && memcmp(st[0].hash, c.digest, 16) == 0);
    assert_int_equal(st[0].size, 1000);
    assert_int_equal(st[1].kind, GS_FOP_KIND_DIR);
    assert_int_equal(st[1].has_hash, 0);
    XXH128_canonicalFromHash(&c, XXH3_128bits("abc", 3));
    for (int i = 2; i < N; i += i == 2 ? 4 : 1) /* path 2 and every one from 6 on: d/file */
        assert_true(st[i].kind == GS_FOP_KIND_FILE && memcmp(st[i].hash, c.digest, 16) == 0);
    XXH128_canonicalFromHash(&c, XXH3_128bits("some/target", 11));
    assert_int_equal(st[3].kind, GS_FOP_KIND_SYMLINK);
    assert_true(st[3].has_hash && memcmp(st[3].hash, c.digest, 16) == 0);
    assert_int_equal(st[4].kind, GS_FOP_KIND_NONE);
    assert_int_equal(st[5].kind, GS_FOP_KIND_NONE);
    free(st);
    free(paths);
    free(data);
}

/* The beliefs a client would send for the files under the agent's root (paths[0..n), sorted),
 * read from the server's copies; `links` keeps symlink targets. */
static void believe(struct fx *f, const char *const *paths, size_t n, struct gs_fop_belief *out,
                    char (*links)[64])
{
    for (size_t i = 0; i < n; i++) {
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", f->remote, paths[i]);
        struct stat st;
        assert_int_equal(lstat(p, &st), 0);
        out[i] = (struct gs_fop_belief){.path = paths[i],
                                        .kind = S_ISREG(st.st_mode)   ? GS_FOP_KIND_FILE
                                                : S_ISDIR(st.st_mode) ? GS_FOP_KIND_DIR
                                                                      : GS_FOP_KIND_SYMLINK,
                                        .mode = st.st_mode & 07777,
                                        .size = (uint64_t)st.st_size,
                                        .mtime_ns =
                                            st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec};
        if (S_ISLNK(st.st_mode)) {
            ssize_t len = readlink(p, links[i], 63);
            assert_true(len >= 0);
            links[i][len] = '\0';
            out[i].link = links[i];
        }
    }
}

/* Frame bytes sent to the agent so far. */
static unsigned long long sent_so_far(struct fx *f)
{
    unsigned long long frames = 0, wire = 0;
    gs_agent_compression(f->agent, &frames, &wire);
    return frames;
}

static void check(struct fx *f, const struct gs_fop_belief *b, size_t n, struct gs_fop_stat *out)
{
    struct gs_error err = {0};
    if (f->ops->check_send(f->ops, b, n, &err) < 0 || f->ops->check_wait(f->ops, out, &err) < 0)
        fail_msg("check: %s", err.msg);
}

/* check: the paths where the server differs from the beliefs, and only those; a second check on
 * the connection sends the beliefs that changed (a few bytes, not 3,000 paths' worth), including
 * paths no longer believed (or the agent would report them, which the client refuses). */
enum { CHECKED_N = 3000 }; /* paths checked: more than one CHECK frame */

/* A tree on the server, the beliefs about it, and the answers to a check of them. */
struct checked {
    char names[CHECKED_N][16], links[CHECKED_N][64];
    const char *paths[CHECKED_N]; /* d, d/f1000 .. d/f3997, link: in path order */
    struct gs_fop_belief b[CHECKED_N];
    struct gs_fop_stat out[CHECKED_N];
};

/* Makes d/ with 2,998 files and a link on the server, and the beliefs about them. */
static struct checked *checked_tree(struct fx *f)
{
    static struct checked t; /* 300 KB: not on the stack */
    assert_int_equal(gs_test_sh("cd '%s' && mkdir d && for i in $(seq 1000 3997); do echo $i > "
                                "d/f$i; done && ln -s d/f1000 link",
                                f->remote),
                     0);
    t.paths[0] = "d";
    for (int i = 1; i < CHECKED_N - 1; i++) {
        snprintf(t.names[i], sizeof(t.names[i]), "d/f%d", 999 + i);
        t.paths[i] = t.names[i];
    }
    t.paths[CHECKED_N - 1] = "link";
    believe(f, t.paths, CHECKED_N, t.b, t.links);
    return &t;
}

static void test_agent_client__check_reports_what_differs_and_sends_only_changes(void **state)
{
    struct fx *f = *state;
    struct checked *t = checked_tree(f);
    struct gs_fop_belief *b = t->b;
    struct gs_fop_stat *out = t->out;
    unsigned long long before = sent_so_far(f);
    check(f, b, CHECKED_N, out);
    unsigned long long first = sent_so_far(f) - before;
    for (int i = 0; i < CHECKED_N; i++)
        assert_int_equal(out[i].kind, GS_FOP_KIND_UNKNOWN);

    /* behind its back: f1500 deleted, f2000's mode, the link retargeted; the client no longer
     * believes in f3997 (deleted on both sides) */
    assert_int_equal(gs_test_sh("cd '%s' && rm d/f1500 d/f3997 && chmod 600 d/f2000 && "
                                "ln -sfn d/f1001 link",
                                f->remote),
                     0);
    before = sent_so_far(f);
    check(f, b, CHECKED_N - 2, out); /* ..., d/f3996 */
    for (int i = 0; i < CHECKED_N - 2; i++) {
        enum gs_fop_kind want = i == 501    ? GS_FOP_KIND_NONE
                                : i == 1001 ? GS_FOP_KIND_FILE
                                            : GS_FOP_KIND_UNKNOWN;
        if (out[i].kind != want)
            fail_msg("%s: kind %d, expected %d", t->paths[i], out[i].kind, want);
    }
    assert_int_equal(out[1001].mode, 0600);
    unsigned long long second = sent_so_far(f) - before;
    print_message("first check %llu bytes, second %llu\n", first, second);
    assert_true(first > 100000 && second < 200);

    b[CHECKED_N - 3] = b[CHECKED_N - 1]; /* believed again: the link, at its old target */
    check(f, b, CHECKED_N - 2, out);
    assert_int_equal(out[CHECKED_N - 3].kind, GS_FOP_KIND_SYMLINK);
    assert_true(out[CHECKED_N - 3].has_hash);
}

/* Ends the session (as a push does when it is done) and starts another on the same root, which
 * reads the checked paths the last one kept from `file`. Waits until the old agent has ended
 * cleanly (it empties the writer lock then, after saving what it kept), or the new one would
 * fence it out first, and there would be nothing saved to start from. */
static void next_session(struct fx *f, const char *file)
{
    f->ops->close(f->ops);
    char lock[256];
    snprintf(lock, sizeof(lock), "%s/.gpusync/writer.lock", f->remote);
    struct stat st;
    int64_t deadline = gs_clock_mono_ms() + 10000;
    while ((stat(lock, &st) != 0 || st.st_size != 0) && gs_clock_mono_ms() < deadline)
        usleep(10 * 1000); /* the agent's end is seen only in its files */
    assert_int_equal(st.st_size, 0);
    struct gs_buf cmd = GS_BUF_INIT;
    struct gs_error err = {0};
    gs_agent_serve_command(gs_test_build_path("agent/gpusync-agent"), f->remote, &cmd);
    if (gs_agent_open(&f->agent, g_ssh, cmd.data, 1, &err) < 0 ||
        gs_agent_wait_ready(f->agent, &err) < 0)
        fail_msg("agent: %s", err.msg);
    gs_buf_release(&cmd);
    gs_agent_set_check_file(f->agent, file);
    f->ops = gs_agent_fileops(f->agent);
    f->ops->done = on_done;
    f->ops->done_ctx = f;
}

/* A push is a session of its own: its check starts from the paths the last session's agent saved
 * (named by their digest, mirrored in a local file), and sends only what changed since, not every
 * path again; a server that saved something else (or nothing) is asked about all of them. */
static void test_agent_client__a_new_session_starts_from_what_the_last_one_checked(void **state)
{
    struct fx *f = *state;
    struct checked *t = checked_tree(f);
    struct gs_fop_belief *b = t->b;
    struct gs_fop_stat *out = t->out;
    char file[160];
    snprintf(file, sizeof(file), "%s/check-kept", f->local);
    gs_agent_set_check_file(f->agent, file); /* none yet */
    unsigned long long before = sent_so_far(f);
    check(f, b, CHECKED_N, out);
    unsigned long long first = sent_so_far(f) - before;

    next_session(f, file);
    assert_int_equal(gs_test_sh("rm '%s/d/f1500'", f->remote), 0);
    before = sent_so_far(f);
    check(f, b, CHECKED_N, out);
    unsigned long long again = sent_so_far(f) - before;
    for (int i = 0; i < CHECKED_N; i++)
        if (out[i].kind != (i == 501 ? GS_FOP_KIND_NONE : GS_FOP_KIND_UNKNOWN))
            fail_msg("%s: kind %d", t->paths[i], out[i].kind);

    next_session(f, file);
    assert_int_equal(gs_test_sh("rm '%s/.gpusync/check-kept'", f->remote), 0);
    before = sent_so_far(f);
    check(f, b, CHECKED_N, out);
    unsigned long long lost = sent_so_far(f) - before;
    assert_int_equal(out[501].kind, GS_FOP_KIND_NONE);
    print_message("first session %llu bytes, the next %llu, after the server lost its set %llu\n",
                  first, again, lost);
    assert_true(first > 100000 && again < 200 && lost > 100000);
}

/* What a listing handed to its callback. */
struct seen {
    int entries, skipped, skip_errno, has_a;
    size_t skip_len;
};

static int on_entry(void *ctx, const struct gs_agent_entry *e)
{
    struct seen *s = ctx;
    if (e->skipped) {
        s->skipped++;
        s->skip_errno = e->skipped;
        s->skip_len = strlen(e->path);
        assert_int_equal(e->kind, 0);
    } else {
        s->entries++;
        s->has_a |= strcmp(e->path, "a") == 0;
    }
    return 0;
}

/* A tree too deep for the agent's walk costs one skipped entry, handed to the callback with its
 * path and errno, and the rest of the listing arrives (the whole LIST used to fail). */
static void test_agent_client__list_hands_over_what_the_agent_skipped(void **state)
{
    struct fx *f = *state;
    gs_test_sh("cd '%s' && touch a && mkdir -p $(printf 'd/%%.0s' $(seq 300))", f->remote);
    struct seen s = {0};
    struct gs_error err = {0};
    if (gs_agent_list(f->agent, "", 0, on_entry, &s, &err) < 0)
        fail_msg("list: %s", err.msg);
    assert_true(s.has_a);
    assert_int_equal(s.skipped, 1);
    assert_int_equal(s.skip_errno, ELOOP);
    assert_int_equal(s.skip_len, 2 * 257 - 1); /* d/d/.../d: the directory 257 levels down */
    assert_true(s.entries >= 1 + 257);
}

/* A DELETE expecting a directory (what push sends for one) keeps a file that replaced it on the
 * server as a conflict copy instead of unlinking it. */
static void test_agent_client__delete_expecting_a_directory_keeps_a_file(void **state)
{
    struct fx *f = *state;
    gs_test_sh("printf 'made on the server' > '%s/dir'", f->remote);
    struct gs_fop_req req = {.type = GS_FOP_DELETE,
                             .path = "dir",
                             .recursive = 1,
                             .expect = GS_FOP_EXPECT_DIR,
                             .ctx = (void *)(intptr_t)0};
    struct gs_error err = {0};
    assert_int_equal(f->ops->submit(f->ops, &req, &err), 0);
    drain(f);
    assert_int_equal(f->n_ok, 1);
    assert_int_equal(gs_test_sh("test ! -e '%s/dir' && grep -qx 'made on the server' "
                                "'%s'/dir.gpusync-conflict-*",
                                f->remote, f->remote),
                     0);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER"))
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_agent_client__small_and_large_puts_arrive_byte_for_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__small_file_changed_since_hashed_is_not_sent, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__streamed_file_changed_since_hashed_is_not_committed, setup,
            teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__a_file_at_the_root_path_is_a_remote_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__the_level_stays_1_on_a_fast_link, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__a_slow_link_raises_the_level, setup_slow,
                                        teardown_slow),
        cmocka_unit_test_setup_teardown(
            test_agent_client__a_slow_link_is_judged_before_most_is_packed, setup_slow,
            teardown_slow),
        cmocka_unit_test_setup_teardown(test_agent_client__compressed_both_ways_and_exact, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__an_agent_without_zstd_is_spoken_to_plainly, setup_plain, teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__a_sparse_file_past_2_gib_arrives_whole,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__many_small_puts_all_arrive, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__probe_reports_what_the_server_holds,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__check_reports_what_differs_and_sends_only_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__a_new_session_starts_from_what_the_last_one_checked, setup,
            teardown),
        cmocka_unit_test_setup_teardown(test_agent_client__list_hands_over_what_the_agent_skipped,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_agent_client__delete_expecting_a_directory_keeps_a_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
